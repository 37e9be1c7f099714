"""The ledger's invariants under any order of events, without I/O.

A hypothesis state machine drives the domain alone — ``Inventory`` with its ``Ledger`` — the way
the engine does, against a model of Nova that can store a create late, twice, or never, lose the
answer, refuse it, and forget everything osas had in memory (a restart). After every
convergence (the faults stop, deletes are carried out, a complete listing is settled):

- at most one server per create request this process sent is kept; several servers of one
  request an earlier life sent are kept and reported, never deleted;
- the servers of the group plus the creates in hand never exceed max_size;
- the target never exceeds max_size, at any step (after a reload lowered it, only what was
  already there may stay above it until CA scales down; nothing is added, nothing deleted);
- only servers the ledger was shown are ever deleted.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from osas.domain.errors import OsasError
from osas.domain.ids import ProviderIdFormat, placeholder_id
from osas.domain.inventory import InstanceState, Inventory, NodeAnswer
from osas.domain.ledger import (
    Created,
    CreateOutcome,
    CreateState,
    DeleteOrder,
    DeleteOutcome,
    DeleteReason,
    EventKind,
    InDoubt,
    LedgerSettings,
    NotSent,
    Orders,
    Refused,
)
from osas.domain.limits import NodeInfo, check_node
from osas.domain.quota import Allowance, ProjectQuota
from osas.domain.servers import ErrorClass, ErrorInfo, Server
from osas.domain.sizing import plan_decrease, plan_delete, plan_increase
from osas.domain.specs import ClusterSpec, NodeGroupSpec

MAX_SIZE = 4
WINDOW = 10.0
SETTINGS = LedgerSettings(create_doubt_window=WINDOW, delete_retry_after=5.0)


def cluster(max_size: int) -> ClusterSpec:
    return ClusterSpec(
        "prod",
        (
            NodeGroupSpec(
                group_id="workers",
                min_size=0,
                max_size=max_size,
                flavor="m1.small",
                image="img",
                networks=("net",),
            ),
        ),
    )


IDS = ProviderIdFormat()
QUOTA = ErrorInfo("QuotaExceeded", "Quota exceeded for instances", ErrorClass.OUT_OF_RESOURCES)
DOWN = ErrorInfo("CreateNotSent", "connection refused", ErrorClass.OTHER)


@dataclass
class NovaServer:
    server: Server
    deleted: bool = False


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.nova: dict[str, NovaServer] = {}
        self.late: list[str] = []  # request ids Nova will store later (an answer lost)
        self.shown: set[str] = set()  # server ids any listing showed osas
        self.deletes: list[DeleteOrder] = []  # orders the workers have not carried out yet
        self.queued: list[str] = []  # request ids in the task queue
        self.want = 0  # the size CA is after
        self.max_size = MAX_SIZE  # in the configuration in force
        self._boot()

    def _boot(self) -> None:
        self.inventory = Inventory(cluster(self.max_size), SETTINGS)
        # Creates the last quota read left room for: none read yet in this process.
        self.quota_room: int | None = None
        self.accepted_since_read = 0
        self.ledger = self.inventory.ledger
        self.queued = []
        self.deletes = []
        # Requests CA gave up in this process's lifetime: a server of theirs must never be kept.
        self.given_up: set[str] = set()
        self.sent: set[str] = set()  # requests this process sent
        self.reported_shared: set[str] = set()  # requests reported as shared by servers
        self._list(full=True)
        # A kill can lose an accepted delete (memory only): the next process adopts the server,
        # even above max_size, and leaves it to CA's scale-down. It never adds to that.
        self.bound = max(self.max_size, self.ledger.target_size("workers"))

    # -- the model of Nova ------------------------------------------------------------------------

    def _store(self, request_id: str) -> Server:
        server_id = str(uuid.uuid4())
        server = Server(
            server_id=server_id,
            name_stem=f"prod-workers-{request_id[:10]}",
            group_id="workers",
            status="BUILD",
            task_state=None,
            request_id=request_id,
            fault=None,
            created=self.now + len(self.nova) * 1e-6,  # unique, in the order stored
        )
        self.nova[server_id] = NovaServer(server)
        return server

    def _live(self) -> list[Server]:
        return [entry.server for entry in self.nova.values() if not entry.deleted]

    def _list(self, *, full: bool) -> None:
        generation = self.ledger.begin_sync()
        listed = self._live()
        self.shown.update(s.server_id for s in listed)
        if full:
            gone = [
                i for i in self.inventory.snapshot.ids() if i not in {s.server_id for s in listed}
            ]
            self._follow(self.ledger.settle_complete(generation, listed, gone, self.now))
        else:
            self._follow(self.ledger.settle_changes(generation, listed, [], self.now))

    def _follow(self, orders: Orders) -> None:
        for order in orders.deletes:
            assert order.server_id in self.shown or order.server_id in self.nova, order
            if order.reason is DeleteReason.DUPLICATE:
                # Only a second server of a request this process sent.
                request_id = self.nova[order.server_id].server.request_id
                assert request_id in self.sent, order
        self.deletes.extend(orders.deletes)
        self.reported_shared.update(
            e.request_id for e in orders.events if e.kind is EventKind.SHARED_REQUEST_KEPT
        )

    # -- CA ---------------------------------------------------------------------------------------

    @rule(delta=st.integers(1, 3))
    def increase(self, delta: int) -> None:
        target = self.ledger.target_size("workers")
        if self._increase(delta):
            self.want = max(self.want, target + delta)

    def _increase(self, delta: int) -> bool:
        try:
            plan = plan_increase(self.ledger.cluster, self.inventory, "workers", delta, self.now)
        except OsasError:
            return False
        self.queued.extend(self.ledger.accept_creates("workers", plan.creates, self.now))
        self.inventory.quota.spend("workers", plan.creates)
        self.accepted_since_read += plan.creates
        if plan.error is not None:
            # Failed at once, never queued: CA removes them as it does Nova's refusals.
            self._follow(self.ledger.refuse_creates("workers", plan.refused, plan.error, self.now))
        return True

    @rule(room=st.integers(0, 4))
    def project_quota_read(self, room: int) -> None:
        """The project's quota, read: room for ``room`` more servers than Nova counts (the
        operator changed it, or other servers of the project came and went)."""
        used = len(self._live())
        unsent = self.ledger.creates_in_hand()
        quota = ProjectQuota(Allowance(used + room, used), Allowance(None), Allowance(None))
        self.inventory.quota.read(quota, unsent)
        self.quota_room = max(0, room - unsent.get("workers", 0))
        self.accepted_since_read = 0

    @rule()
    def ask_again(self) -> None:
        """CA's next loop: the target is short of what it wants (failures cleaned up, a
        restart forgot creates): it asks for the rest."""
        missing = self.want - self.ledger.target_size("workers")
        if missing > 0:
            self._increase(missing)

    def _accept_delete(self, instance_ids: list[str]) -> bool:
        try:
            plan = plan_delete(
                self.ledger.cluster, self.inventory, "workers", [(i, i) for i in instance_ids]
            )
        except OsasError:
            return False
        self._follow(self.ledger.accept_delete(plan, self.now))
        self.given_up.update((*plan.failures, *plan.cancels, *plan.give_ups))
        return True

    @rule(data=st.data())
    def delete_nodes(self, data: st.DataObject) -> None:
        instances = self.inventory.instances("workers")
        if not instances:
            return
        chosen = data.draw(
            st.lists(st.sampled_from(instances), min_size=1, max_size=3, unique=True)
        )
        try:
            plan = plan_delete(
                self.ledger.cluster,
                self.inventory,
                "workers",
                [(i.instance_id, i.instance_id) for i in chosen],
            )
        except OsasError:
            return
        self._follow(self.ledger.accept_delete(plan, self.now))

    @rule()
    def clean_up_failures(self) -> None:
        """CA's deleteCreatedNodesWithErrors."""
        failed = [i.instance_id for i in self.inventory.instances("workers") if i.error]
        if failed:
            assert self._accept_delete(failed)

    @rule(delta=st.integers(-2, -1))
    def decrease(self, delta: int) -> None:
        try:
            plan = plan_decrease(self.ledger.cluster, self.inventory, "workers", delta)
        except OsasError:
            return
        self.ledger.accept_decrease(plan, self.now)
        self.given_up.update((*plan.failures, *plan.cancels))
        self.want = max(0, self.want + delta)

    @rule(max_size=st.integers(1, MAX_SIZE))
    def reload(self, max_size: int) -> None:
        """An operator changes max_size: creates not sent beyond it are cancelled (reported
        failed), those in flight finish, no server is deleted."""
        deletes = len(self.deletes)
        orders = self.ledger.use_cluster(cluster(max_size), self.now)
        self._follow(orders)
        assert len(self.deletes) == deletes  # a reload deletes nothing
        cancelled = [e.request_id for e in orders.events if e.kind is EventKind.CREATE_CANCELLED]
        self.queued = [r for r in self.queued if r not in cancelled]
        self.max_size = max_size
        self.bound = max(self.bound, max_size)
        self.want = min(self.want, max_size)
        failed, queued = self.ledger.cancellable("workers")
        target = self.ledger.target_size("workers")
        assert not queued or target - len(failed) <= max_size  # nothing queued beyond it

    # -- workers ----------------------------------------------------------------------------------

    # One rule per outcome, so that sending creates is drawn as often as everything else.

    @rule(data=st.data())
    def create_succeeds(self, data: st.DataObject) -> None:
        self._send(data, "created")

    @rule(data=st.data())
    def create_listed_before_its_answer(self, data: st.DataObject) -> None:
        self._send(data, "created-listed-first")

    @rule(data=st.data())
    def create_refused(self, data: st.DataObject) -> None:
        self._send(data, "refused")

    @rule(data=st.data())
    def create_never_sent(self, data: st.DataObject) -> None:
        self._send(data, "not-sent")

    @rule(data=st.data(), when=st.sampled_from(["doubt-stored", "doubt-late", "doubt-never"]))
    def create_in_doubt(self, data: st.DataObject, when: str) -> None:
        self._send(data, when)

    @rule(data=st.data())
    def create_resent_behind_our_back(self, data: st.DataObject) -> None:
        self._send(data, "doubt-twice")

    def _send(self, data: st.DataObject, outcome: str) -> None:
        if not self.queued:
            return
        request_id = data.draw(st.sampled_from(self.queued))
        self.queued.remove(request_id)
        if self.ledger.take_create(request_id) is None:
            return
        self.sent.add(request_id)
        sends = 0
        while True:
            sends += 1
            assert sends <= SETTINGS.create_attempts, "a create was taken again without NotSent"
            result = self._outcome(request_id, outcome)
            orders = self.ledger.finish_create(request_id, result, self.now)
            self._follow(orders)
            if not orders.retry:
                break
            outcome = data.draw(st.sampled_from(["created", "not-sent", "doubt-late"]))
            if self.ledger.take_create(request_id) is None:
                break
        # Never sent again: once answered or in doubt, it is never handed out.
        assert self.ledger.take_create(request_id) is None

    def _outcome(self, request_id: str, outcome: str) -> CreateOutcome:  # noqa: PLR0911 - one per kind
        match outcome:
            case "created":
                return Created(self._store(request_id))
            case "created-listed-first":
                server = self._store(request_id)
                self._list(full=False)
                return Created(server)
            case "refused":
                return Refused(QUOTA)
            case "not-sent":
                return NotSent(DOWN)
            case "doubt-stored":
                self._store(request_id)
                return InDoubt("503")
            case "doubt-late":
                self.late.append(request_id)
                return InDoubt("timeout")
            case "doubt-twice":  # a client resent the POST behind osas's back
                self._store(request_id)
                self._store(request_id)
                return InDoubt("connection dropped")
            case _:
                return InDoubt("timeout")

    @rule(data=st.data())
    def nova_stores_late(self, data: st.DataObject) -> None:
        if not self.late:
            return
        request_id = data.draw(st.sampled_from(self.late))
        self.late.remove(request_id)
        self._store(request_id)

    @rule(data=st.data(), works=st.booleans())
    def carry_out_delete(self, data: st.DataObject, works: bool) -> None:
        if not self.deletes:
            return
        order = data.draw(st.sampled_from(self.deletes))
        self.deletes.remove(order)
        entry = self.nova.get(order.server_id)
        if entry is None or entry.deleted:
            outcome = DeleteOutcome.GONE
        elif works:
            entry.deleted = True
            outcome = DeleteOutcome.SENT
        else:
            outcome = DeleteOutcome.FAILED
        self._follow(self.ledger.finish_delete(order.server_id, outcome, self.now))

    # -- time, listings, restarts -----------------------------------------------------------------

    @rule(seconds=st.sampled_from([1.0, 5.0, 20.0]))
    def headroom_held(self, seconds: float) -> None:
        """Creates an earlier holder sent may still land (a takeover, a restart): no headroom
        spent until the time is over and a listing begun since has settled."""
        self.ledger.hold_headroom(self.now + seconds)

    @rule(seconds=st.sampled_from([0.5, 3.0, 6.0, 12.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(full=st.booleans())
    def listing(self, full: bool) -> None:
        self._list(full=full)

    @rule()
    def restart(self) -> None:
        """osas killed: everything in memory is gone; Nova keeps what it has, and what it was
        still going to store."""
        self._boot()

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def target_never_passes_max_size(self) -> None:
        assert self.ledger.target_size("workers") <= self.bound

    @invariant()
    def creates_never_promised_beyond_the_quota(self) -> None:
        """Since the last read of the quota, IncreaseSize has queued no more creates than
        it had room for (what it had in hand at the read taken off)."""
        if self.quota_room is not None:
            assert self.accepted_since_read <= self.quota_room

    @invariant()
    def instances_and_target_agree(self) -> None:
        instances = self.inventory.instances("workers")
        counted = [i for i in instances if i.state is not InstanceState.DELETING]
        assert len(counted) == self.ledger.target_size("workers")
        assert len({i.instance_id for i in instances}) == len(instances)

    @invariant()
    def kept_node_answers_are_the_direct_ones(self) -> None:
        """NodeGroupForNode's kept answers (``Inventory.node_answer``) are never stale: for
        every server Nova ever held, every create's placeholder and a stranger, the answer
        given (kept from an earlier step when nothing it is made of changed) is the one worked
        out afresh now. Asked at every step, so that each step's changes meet kept answers."""
        ids = ProviderIdFormat()
        nodes = [(s.server.name, ids.format(s.server.server_id)) for s in self.nova.values()]
        nodes += [("", placeholder_id("workers", c.request_id)) for c in self.ledger.creates()]
        nodes += [("stranger", ids.format(str(uuid.UUID(int=1)))), ("prod-workers-x", "")]
        for name, provider_id in nodes:
            node = NodeInfo(name, provider_id, fingerprint=hash((name, provider_id)))
            given = self.inventory.node_answer(node, self.now, check_node)
            assert given == self._direct_answer(name, provider_id), (name, provider_id)

    @invariant()
    def snapshot_look_ups_agree_with_its_servers(self) -> None:
        """The snapshot's indexes (by name built at the first look-up, after any number of
        listings, and kept from then on) find exactly the listed servers of that name or
        request, whatever was added, changed or gone since."""
        snapshot = self.inventory.snapshot
        listed = list(snapshot.servers())
        for entry in self.nova.values():
            name, request_id = entry.server.name, entry.server.request_id
            assert request_id is not None
            by_id = lambda found: sorted(s.server_id for s in found)  # noqa: E731
            assert by_id(snapshot.named(name)) == by_id(s for s in listed if s.name == name)
            assert by_id(snapshot.of_request(request_id)) == by_id(
                s for s in listed if s.request_id == request_id
            )

    def _direct_answer(self, name: str, provider_id: str) -> NodeAnswer:
        group_id = self.inventory.group_for_node(name, provider_id)
        spec = None if group_id is None else self.inventory.cluster.group(group_id)
        return None if spec is None else (spec, self.inventory.reported_max(spec, self.now))

    def _scale_down_what_ca_did_not_ask_for(self) -> None:
        excess = self.ledger.target_size("workers") - self.want
        running = [
            i.instance_id
            for i in self.inventory.instances("workers")
            if i.state is not InstanceState.DELETING and i.error is None
        ]
        if excess > 0 and running:
            assert self._accept_delete(running[:excess])

    def teardown(self) -> None:
        self.converge()

    def converge(self) -> None:
        for request_id in list(self.late):
            self._store(request_id)
        self.late.clear()
        self.queued.clear()  # CA would ask again; what is still queued is dropped
        self.ledger.drop_queued(
            [c.request_id for c in self.ledger.creates() if c.state is CreateState.QUEUED],
            self.now,
        )
        self.now += WINDOW + 1  # every doubt resolved one way or the other
        for _ in range(10):
            self._list(full=True)
            self.clean_up_failures()
            self._scale_down_what_ca_did_not_ask_for()
            while self.deletes:
                order = self.deletes.pop()
                entry = self.nova.get(order.server_id)
                if entry is not None:
                    entry.deleted = True
                self._follow(
                    self.ledger.finish_delete(order.server_id, DeleteOutcome.SENT, self.now)
                )
            self.now += SETTINGS.delete_retry_after
        self._list(full=True)
        live = self._live()
        per_request = Counter(s.request_id for s in live)
        shared = {request_id for request_id, count in per_request.items() if count > 1}
        assert not shared & self.sent, per_request  # this process's: one server each
        assert shared <= self.reported_shared, per_request  # an earlier life's: reported
        pending = sum(1 for _ in self.ledger.creates_of("workers"))
        assert len(live) + pending <= self.max_size, (len(live), pending)
        assert not self.deletes
        kept_given_up = [s for s in live if s.request_id in self.given_up]
        assert not kept_given_up, kept_given_up


TestLedgerInvariants = LedgerMachine.TestCase
TestLedgerInvariants.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, derandomize=True
)
