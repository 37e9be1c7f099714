"""The lifecycle of every create and delete osas has in hand, in one place.

One call per intent (accept creates, accept a DeleteNodes or DecreaseTargetSize plan, a reloaded
configuration, drop what is queued at shutdown) or outcome (a worker takes a create and finishes
it; a delete's result; a listing to settle), each returning its ``Orders``: servers to delete,
whether to send a create again, and events worth telling the operator. The engine does
the I/O and reports back; it never edits this state itself, and every question about the
lifecycle (what may be cancelled, what Nova made that no listing showed yet, what is being
deleted) is answered here. The ledger also holds the configuration in force: a reload is one
call. The invariants osas promises live here:

- **At most one server per create request is ever kept.** A create is sent again only after an
  outcome that proves Nova never received it. After an ambiguous one it is *in doubt*: counted
  and reported as creating, settled when a listing shows its server, reported failed when the
  doubt window passes. A server that appears for a request given up, cancelled or failed is an
  orphan and is deleted, never adopted; two servers for one request this process sent: one is
  kept.
- **osas deletes on its own initiative only what this process asked Nova for** (``DeleteReason``
  lists every reason). What an earlier life or another hand left that breaks a rule (servers
  sharing a request id, a group above max_size) is reported, never deleted.
- **Never above max_size by osas's doing.** IncreaseSize cannot pass max_size; a reload that
  lowers it cancels the creates not yet sent beyond it (reported failed, as CA expects of a
  create that will not happen), lets those in flight finish, and deletes no server. In Nova
  too: a create waits while a DELETE CA asked for, not yet taken by Nova, would leave the group
  beyond max_size if the create landed first (``create_waits``).
- Nothing is deleted that a listing did not show carrying this cluster's marks (the snapshot
  holds only such servers; the worker checks the marks again right before deleting).
- The generation of a group's answers is bumped by the few primitives that change what CA sees
  of it (``_changed``), and by the snapshot's own: never by hand in a flow.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum, StrEnum

from osas.domain.ids import placeholder_id
from osas.domain.promises import Promises
from osas.domain.servers import ErrorClass, ErrorInfo, Server
from osas.domain.snapshot import Snapshot, SnapshotDiff
from osas.domain.specs import ClusterSpec

IN_DOUBT_CODE = "CreateOutcomeUnknown"


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    # Sends of a create whose every failure proved it never reached Nova.
    create_attempts: int = 3
    # How long a create in doubt may take to appear before it is reported failed. Must exceed
    # the client's api_timeout plus the longest a Nova API worker may take to store a server.
    create_doubt_window: float = 180.0
    # How long ids of removed instances are remembered, so that a repeated DeleteNodes is
    # harmless, and request ids given up, so that a late server of theirs is deleted.
    removed_memory: float = 15 * 60.0
    given_up_memory: float = 24 * 3600.0
    # A delete sent this long ago whose server is still listed is sent again.
    delete_retry_after: float = 120.0


class CreateState(Enum):
    QUEUED = "queued"  # accepted, no worker has it: the only state that can be cancelled
    SENDING = "sending"  # a worker is sending it to Nova
    IN_DOUBT = "in-doubt"  # sent, outcome unknown: waiting for a listing to show its server
    CREATED = "created"  # Nova answered with the server; no listing has shown it yet
    FAILED = "failed"  # certainly not made; reported with error info until CA removes it


# Creates Nova may hold a server of, not listed yet.
_SENT = frozenset({CreateState.SENDING, CreateState.IN_DOUBT, CreateState.CREATED})


@dataclass(slots=True)
class Create:
    request_id: str
    group_id: str
    accepted_at: float
    state: CreateState = CreateState.QUEUED
    sends: int = 0
    server_id: str | None = None
    answered_generation: int = 0  # the sync generation current when Nova answered
    doubt_until: float = 0.0
    error: ErrorInfo | None = None
    # Promised by an earlier holder (its record said so): it may reach Nova until doubt_until.
    # If it does not, it is dropped, not failed: most likely it was never sent at all.
    inherited: bool = False


# -- what workers report -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Created:
    """Nova answered with the server (carrying this cluster's marks)."""

    server: Server


@dataclass(frozen=True, slots=True)
class Refused:
    """A definite refusal (4xx: quota, bad flavor...): no server was made."""

    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class NotSent:
    """Proof that the create never reached Nova: it may be sent again. ``counts``: it used
    one of ``create_attempts``; a create Nova refused for the token it carried (401: Nova did
    nothing) was not sent at all, and is sent again with a fresh token. ``paced``: the cloud's
    rate limit refused it, and the cloud adapter times the next send (no backoff of its own)."""

    error: ErrorInfo
    counts: bool = True
    paced: bool = False


@dataclass(frozen=True, slots=True)
class InDoubt:
    """Sent, and the outcome is unknown (timeout, 5xx, connection dropped, answer lost)."""

    reason: str


CreateOutcome = Created | Refused | NotSent | InDoubt


class DeleteOutcome(Enum):
    SENT = "sent"  # Nova accepted the delete; the server goes once a listing no longer shows it
    GONE = "gone"  # Nova answered 404: the server is gone already
    NOT_OURS = "not-ours"  # a fresh read showed the server without this group's marks
    FAILED = "failed"  # the delete did not go through; it is sent again later


# -- what the ledger orders ---------------------------------------------------------------------


class DeleteReason(StrEnum):
    """Every reason osas deletes a server, complete. CA asks for the first two; ``RESEND``
    repeats a delete already ordered. ``ORPHAN`` and ``DUPLICATE`` are the only deletes osas
    orders on its own initiative, and both are of servers this process asked Nova for (or
    whose create CA removed): never one an earlier life or another hand made."""

    REQUESTED = "requested"  # CA's DeleteNodes of the server (or of the create that made it)
    GIVEN_UP = "given-up"  # the server of a create CA removed while it was being sent
    # The server of a request this process gave up (in doubt past the window), cancelled (a
    # reload lowered max_size), or saw fail; or of a placeholder CA's DeleteNodes removed.
    ORPHAN = "orphan"
    DUPLICATE = "duplicate"  # a second server of a create this process sent
    RESEND = "resend"  # sent long ago, and the server is still listed
    # A server claimed from a warm pool that was not ACTIVE within the pool's start_timeout
    # of its claim (the claim mark in Nova says when): a cold create takes its place.
    CLAIM_FAILED = "claim-failed"


# The reasons osas deletes without CA asking (docs/rpc-semantics.md lists the same).
OWN_INITIATIVE = frozenset({DeleteReason.ORPHAN, DeleteReason.DUPLICATE, DeleteReason.CLAIM_FAILED})


@dataclass(frozen=True, slots=True)
class DeleteOrder:
    server_id: str
    group_id: str
    reason: DeleteReason


class EventKind(StrEnum):
    CREATE_IN_DOUBT = "create-in-doubt"
    CREATE_FAILED = "create-failed"
    CREATE_SETTLED = "create-settled"
    CREATE_GIVEN_UP = "create-given-up"  # in doubt for longer than the window
    CREATE_VANISHED = "create-vanished"  # Nova made it, a later complete listing did not show it
    CREATE_DROPPED = "create-dropped"  # queued at shutdown, never sent
    SERVER_DELETED = "server-deleted"
    DELETE_REFUSED = "delete-refused"  # the server lost this group's marks before the delete
    DELETE_NOT_SENT = "delete-not-sent"  # CA's delete did not reach Nova: CA was told so
    MARKS_LOST = "marks-lost"  # a server of the inventory lost an ownership mark: not ours now
    CREATE_CANCELLED = "create-cancelled"  # unsent: a reload lowered max_size or removed its group
    STRAY_ADOPTED = "stray-adopted"  # listed after start for a request this process never made
    ABOVE_MAX_KEPT = "above-max-kept"  # above max_size with nothing that may be deleted
    SHARED_REQUEST_KEPT = "shared-request-kept"  # servers of one request not sent here: reported
    UNKNOWN_PLACEHOLDER = "unknown-placeholder"  # DeleteNodes of a placeholder not known here
    CREATE_INHERITED = "create-inherited"  # an earlier holder's promise: counted until it lands
    INHERITED_CREATE_LAPSED = "inherited-create-lapsed"  # it did not land within the window
    DELETE_INHERITED = "delete-inherited"  # an earlier holder's accepted delete: sent again
    CLAIM_REPLACED = "claim-replaced"  # a claimed warm server did not start: a cold create instead


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    kind: EventKind
    group_id: str
    request_id: str | None = None
    server_id: str | None = None
    detail: str = ""
    error: ErrorInfo | None = None  # what a failed or cancelled create is reported with


@dataclass(frozen=True, slots=True)
class Orders:
    """What the ledger orders after a call: servers to delete, events to tell the operator,
    and whether a create must be sent again. The engine carries them out
    (``osas.engine.events.carry_out``); the ledger has already changed its state."""

    deletes: tuple[DeleteOrder, ...] = ()
    events: tuple[LedgerEvent, ...] = ()
    retry: bool = False  # finish_create: send the create again (it never reached Nova)

    def count(self, kind: EventKind) -> int:
        return sum(1 for event in self.events if event.kind is kind)


@dataclass(slots=True)
class _Draft:
    """The orders a ledger call collects while it works."""

    deletes: list[DeleteOrder] = field(default_factory=list)
    events: list[LedgerEvent] = field(default_factory=list)

    def event(
        self,
        kind: EventKind,
        group_id: str,
        *,
        request_id: str | None = None,
        server_id: str | None = None,
        detail: str = "",
        error: ErrorInfo | None = None,
    ) -> None:
        self.events.append(LedgerEvent(kind, group_id, request_id, server_id, detail, error))

    def done(self, *, retry: bool = False) -> Orders:
        return Orders(tuple(self.deletes), tuple(self.events), retry)


@dataclass(slots=True)
class _DeleteMark:
    group_id: str
    reason: DeleteReason
    generation: int  # the sync generation current when the server was marked
    sent_at: float  # when the delete was last handed to a worker or sent
    taken: bool = False  # Nova took the DELETE (answered it, or the server was gone)


# -- plans the controller accepts ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeletePlan:
    """DeleteNodes, decided (see ``sizing.plan_delete``)."""

    group_id: str
    servers: tuple[str, ...] = ()  # server ids to mark deleting and delete through the queue
    failures: tuple[str, ...] = ()  # request ids of failed creates to forget
    cancels: tuple[str, ...] = ()  # request ids of queued creates to cancel
    give_ups: tuple[str, ...] = ()  # request ids of creates being sent or in doubt
    unknown: tuple[str, ...] = ()  # request ids of placeholders this process does not know
    repeats: int = 0  # nodes already being deleted or gone: nothing to do

    @property
    def removals(self) -> int:
        return len(self.servers) + len(self.failures) + len(self.cancels) + len(self.give_ups)


@dataclass(frozen=True, slots=True)
class DecreasePlan:
    failures: tuple[str, ...]  # request ids of failed creates to forget
    cancels: tuple[str, ...]  # request ids of queued creates to cancel


MAX_SIZE_LOWERED = "MaxSizeLowered"


class Ledger:
    """Creates and deletes in hand, over the snapshot of what Nova showed, under the
    configuration in force."""

    def __init__(
        self, cluster: ClusterSpec, snapshot: Snapshot, settings: LedgerSettings | None = None
    ) -> None:
        self._cluster = cluster
        self._snapshot = snapshot
        self.settings = settings or LedgerSettings()
        self._creates: dict[str, Create] = {}
        # The same creates per group (oldest first), so that a group's count is O(1).
        self._creates_by_group: dict[str, dict[str, Create]] = {}
        self._by_server: dict[str, str] = {}  # server id -> request id, for CREATED creates
        self._given_up: dict[str, float] = {}  # request id -> when
        # Servers osas is deleting, listed or not: the one record of deletion marks.
        self._deleting: dict[str, _DeleteMark] = {}
        self._deleting_by_group: dict[str, set[str]] = {}
        self._removed: dict[str, float] = {}  # instance id -> when
        # Instance ids of servers that lost an ownership mark (by hand): never deleted, and
        # a DeleteNodes naming one is refused with the reason rather than taken as done.
        self._unowned: dict[str, float] = {}
        # Until then (the engine's clock), IncreaseSize spends no headroom: creates an
        # earlier osas sent may still reach Nova (``hold_headroom``). Nor after it, until a
        # listing begun since has settled (``_hold_listing``: its generation, once one began).
        self._headroom_held_until = 0.0
        self._hold_settled = True
        self._hold_listing: int | None = None
        self._sent: set[str] = set()  # request ids this process sent to Nova
        # A request is known to be ours (a server of it that turns up is no stray) while a
        # create of it is in hand, a server of it is listed, or it is in one of these two sets
        # until the next complete listing. Not one set of every listed server's request id:
        # at 50,000 servers that would copy the snapshot's index (2 MiB) to answer a question
        # only a server new to the snapshot asks.
        self._settled: set[str] = set()  # request ids of creates settled since then
        # Request ids of servers that left the snapshot since then: the only ones a complete
        # listing may have to forget (in _sent too).
        self._gone_requests: set[str] = set()
        self._above_max: set[str] = set()  # groups reported ABOVE_MAX_KEPT
        self._shared_reported: set[str] = set()  # requests reported SHARED_REQUEST_KEPT
        self._generations: dict[str, int] = {}
        # Bumped with every group's generation (creates, marks, holds): what CA is told of any
        # group may have changed.
        self.changes = 0
        self._generation = 0
        self._first_sync_done = False
        # False on a standby: the servers another process (the writer) makes are adopted
        # silently, since no rule of this process's can apply to them (``set_writer``).
        self._writer = True
        # Bumped whenever something is promised that the record must hold before the answer.
        self._promised = 0

    # -- configuration ----------------------------------------------------------------------------

    @property
    def cluster(self) -> ClusterSpec:
        """The configuration in force: every part of osas reads it from here."""
        return self._cluster

    def use_cluster(self, cluster: ClusterSpec, now: float) -> Orders:
        """A reloaded configuration, planned like any intent. A removed group's queued creates
        are cancelled and its failures forgotten (CA no longer sees the group; were it added
        back, they would back it off). A group whose target now passes max_size has its
        queued creates cancelled beyond it, newest first, reported failed as CA expects of a
        create that will not happen; creates in flight finish, and no server is deleted: what
        stays above max_size is reported for CA's scale-down or a person."""
        orders = _Draft()
        self._cluster = cluster
        configured = {spec.group_id for spec in cluster.node_groups}
        for group_id in [g for g in self._creates_by_group if g not in configured]:
            for create in self.creates_of(group_id):
                if create.state in {CreateState.QUEUED, CreateState.FAILED}:
                    self._give_up(create, now)
                    orders.event(
                        EventKind.CREATE_CANCELLED,
                        group_id,
                        request_id=create.request_id,
                        detail="node group removed from the configuration",
                    )
        for spec in cluster.node_groups:
            self._changed(spec.group_id)
            self._cancel_above_max(spec.group_id, spec.max_size, orders)
            self._report_above_max(spec.group_id, orders)
        return orders.done()

    def _cancel_above_max(self, group_id: str, max_size: int, orders: _Draft) -> None:
        failed, queued = self.cancellable(group_id)
        excess = self.target_size(group_id) - len(failed) - max_size
        for request_id in reversed(queued[len(queued) - min(excess, len(queued)) :]):
            create = self._creates[request_id]
            error = ErrorInfo(
                MAX_SIZE_LOWERED,
                f"max_size of node group {group_id!r} was lowered to {max_size} before this "
                "create was sent: it was cancelled",
                ErrorClass.OTHER,
            )
            self._fail(create, error, orders, kind=EventKind.CREATE_CANCELLED)

    # -- queries ----------------------------------------------------------------------------------

    def create(self, request_id: str) -> Create | None:
        return self._creates.get(request_id)

    def create_of_server(self, server_id: str) -> Create | None:
        request_id = self._by_server.get(server_id)
        return None if request_id is None else self._creates.get(request_id)

    def creates_of(self, group_id: str) -> Iterator[Create]:
        """Creates in hand for a group, oldest first."""
        return iter(list(self._creates_by_group.get(group_id, {}).values()))

    def creates(self) -> Iterable[Create]:
        return self._creates.values()

    def failures_of(self, group_id: str) -> list[Create]:
        """Creates reported failed, until CA removes them."""
        return [c for c in self.creates_of(group_id) if c.state is CreateState.FAILED]

    def cancellable(self, group_id: str) -> tuple[list[str], list[str]]:
        """The creates of a group that can go without a server going: those reported failed,
        and those no worker has taken (one being sent or in doubt may be a server already).
        Request ids, oldest first."""
        failed, queued = [], []
        for create in self.creates_of(group_id):
            if create.state is CreateState.FAILED:
                failed.append(create.request_id)
            elif create.state is CreateState.QUEUED:
                queued.append(create.request_id)
        return failed, queued

    def created_unlisted(self, shown: Container[str]) -> list[str]:
        """Servers Nova returned to a create of this process that ``shown`` does not hold."""
        return [
            create.server_id
            for create in self._creates.values()
            if create.state is CreateState.CREATED
            and create.server_id is not None
            and create.server_id not in shown
        ]

    def is_marked(self, server_id: str) -> bool:
        return server_id in self._deleting

    def is_deleting(self, server: Server) -> bool:
        return server.server_id in self._deleting or server.is_deleting

    def deleting_ids(self) -> list[str]:
        return sorted(self._deleting)

    def recently_removed(self, instance_id: str) -> bool:
        return instance_id in self._removed

    def lost_marks(self, instance_id: str) -> bool:
        """The server left the inventory because it lost an ownership mark."""
        return instance_id in self._unowned

    def headroom_held(self, now: float) -> float | None:
        """Seconds until IncreaseSize may spend headroom again (0 once the hold's time is over
        while no listing begun since has settled), None when it may now."""
        left = self._headroom_held_until - now
        if left > 0:
            return left
        return None if self._hold_settled else 0.0

    def reported_max(self, group_id: str, max_size: int, min_size: int, now: float) -> int:
        """The max size CA is told: the configured one, or while headroom is held the
        target (never below min_size), so that CA plans no scale-up it would be refused
        (an IncreaseSize error would back the group off)."""
        if self.headroom_held(now) is None:
            return max_size
        return min(max_size, max(min_size, self.target_size(group_id)))

    def is_given_up(self, request_id: str) -> bool:
        """A server of this request must not be kept: given up, cancelled, or failed."""
        create = self._creates.get(request_id)
        return request_id in self._given_up or (
            create is not None and create.state is CreateState.FAILED
        )

    def target_size(self, group_id: str) -> int:
        """Servers not being deleted, plus creates in hand (failed ones until CA removes them).
        O(servers osas is deleting in the group)."""
        taken, untaken = self._marked_standing(group_id)
        creates = len(self._creates_by_group.get(group_id, ()))
        return self._snapshot.counted(group_id) - taken - untaken + creates

    def _marked_standing(self, group_id: str) -> tuple[int, int]:
        """The group's servers marked deleting that Nova still shows and is not deleting:
        those whose DELETE Nova took (a listing will show it), and those whose it has not."""
        snapshot, deleting = self._snapshot, self._deleting
        taken = untaken = 0
        for server_id in self._deleting_by_group.get(group_id, ()):
            server = snapshot.get(server_id)
            if server is None or server.is_deleting:
                continue  # gone, or Nova is deleting it: not counted
            if deleting[server_id].taken:
                taken += 1
            else:
                untaken += 1
        return taken, untaken

    def generation(self, group_id: str) -> int:
        """Bumped by every change of the ledger CA could see of the group."""
        return self._generations.get(group_id, 0)

    # -- intents ----------------------------------------------------------------------------------

    def accept_creates(self, group_id: str, count: int, now: float) -> tuple[str, ...]:
        """IncreaseSize: ``count`` new creates, queued; their request ids."""
        request_ids = tuple(uuid.uuid4().hex for _ in range(count))
        group = self._creates_by_group.setdefault(group_id, {})
        for request_id in request_ids:
            create = Create(request_id, group_id, now)
            self._creates[request_id] = create
            group[request_id] = create
        if request_ids:
            self._changed(group_id)
            self._promised += 1
        return request_ids

    def replace_claim(self, server_id: str, reason: str, now: float) -> tuple[str, Orders] | None:
        """A server claimed from a warm pool did not start in time (or its start failed): it
        is marked deleting and a create accepted in its place, in one step, so the group's
        target does not move and CA's scale-up is kept. The new create's request id, or None
        when the server is not one of the snapshot's or is being deleted already."""
        server = self._snapshot.get(server_id)
        if server is None or server_id in self._deleting or server.is_deleting:
            return None
        orders = _Draft()
        (request_id,) = self.accept_creates(server.group_id, 1, now)
        self._mark(server_id, server.group_id, DeleteReason.CLAIM_FAILED, now, orders)
        orders.event(
            EventKind.CLAIM_REPLACED,
            server.group_id,
            request_id=request_id,
            server_id=server_id,
            detail=reason,
        )
        return request_id, orders.done()

    def refuse_creates(self, group_id: str, count: int, error: ErrorInfo, now: float) -> Orders:
        """IncreaseSize's part that cannot be created (the project's quota has no room for
        it): ``count`` creates failed at once with ``error``, never sent. CA sees them failed
        and backs the group off, as for a refusal of Nova's, without the POSTs."""
        orders = _Draft()
        group = self._creates_by_group.setdefault(group_id, {})
        for _ in range(count):
            create = Create(uuid.uuid4().hex, group_id, now)
            self._creates[create.request_id] = create
            group[create.request_id] = create
            self._fail(create, error, orders)
        if count:
            self._changed(group_id)
        return orders.done()

    def queued(self, group_id: str) -> int:
        """The group's creates no worker has taken yet."""
        return sum(
            1
            for create in self._creates_by_group.get(group_id, {}).values()
            if create.state is CreateState.QUEUED
        )

    def creates_in_hand(self) -> dict[str, int]:
        """Per group, creates in hand that have not failed: queued, being sent, in doubt, or
        answered and not listed yet (Nova may not count any of them in its usage yet)."""
        counts: dict[str, int] = {}
        for create in self._creates.values():
            if create.state is not CreateState.FAILED:
                counts[create.group_id] = counts.get(create.group_id, 0) + 1
        return counts

    def accept_delete(self, plan: DeletePlan, now: float) -> Orders:
        orders = _Draft()
        for server_id in plan.servers:
            create = self.create_of_server(server_id)
            if create is not None:
                self._give_up(create, now)
            self._mark(server_id, plan.group_id, DeleteReason.REQUESTED, now, orders)
        if plan.servers:
            self._promised += 1
        for request_id in (*plan.failures, *plan.cancels, *plan.give_ups):
            create = self._creates.get(request_id)
            if create is not None:
                self._give_up(create, now)
        for request_id in plan.unknown:
            self._removed[placeholder_id(plan.group_id, request_id)] = now
            # A create of an earlier process, perhaps still on its way: its server, if it ever
            # appears, is not wanted. One that is listed already is left alone.
            if request_id not in self._creates and not self._snapshot.of_request(request_id):
                self._given_up[request_id] = now
            orders.event(EventKind.UNKNOWN_PLACEHOLDER, plan.group_id, request_id=request_id)
        return orders.done()

    def accept_decrease(self, plan: DecreasePlan, now: float) -> Orders:
        for request_id in (*plan.failures, *plan.cancels):
            create = self._creates.get(request_id)
            if create is not None:
                self._give_up(create, now)
        return Orders()

    def set_writer(self, writer: bool) -> None:
        """Whether this process writes (it holds the leader Lease, or election is off). A
        standby's new servers are the writer's creates: not strays, not shared requests to
        report; once it writes, what turns up unknown is a stray again."""
        self._writer = writer

    def hold_headroom(self, until: float) -> None:
        """Creates an earlier osas sent (a process killed, a lease holder that lost it) may
        still be in Nova's API, stored up to ``create_doubt_window`` after they were sent,
        and no listing can show them before: until ``until``, and then until a listing begun
        at ``until`` or later has settled (the place out of reach meanwhile, the last listing
        may not show what landed), IncreaseSize spends no headroom, so that they can never
        take a group beyond max_size."""
        self._headroom_held_until = max(self._headroom_held_until, until)
        self._hold_settled = False
        self._hold_listing = None
        for group_id in [spec.group_id for spec in self._cluster.node_groups]:
            self._changed(group_id)

    # -- the promise record ----------------------------------------------------------------------

    @property
    def promised(self) -> int:
        """Bumped by every intent that adds a promise: an answer that makes one may be given
        only once a record written at this revision or later is kept."""
        return self._promised

    def promises(self) -> Promises:
        """What is promised and not yet confirmed: creates not failed (queued, being sent, in
        doubt, answered and not listed) and the deletes CA asked for whose server a listing
        still may show. O(creates in hand + servers being deleted)."""
        creates = {
            request_id: (create.group_id, create.accepted_at)
            for request_id, create in self._creates.items()
            if create.state is not CreateState.FAILED
        }
        deletes = {
            server_id: mark.group_id
            for server_id, mark in self._deleting.items()
            if mark.reason is DeleteReason.REQUESTED
        }
        return Promises(creates, deletes)

    def withdraw_creates(self, request_ids: Iterable[str]) -> None:
        """Creates just accepted whose promise could not be recorded (the call fails): never
        queued, so forgotten as if never accepted; a DecreaseTargetSize meanwhile may have
        cancelled some already."""
        for request_id in request_ids:
            create = self._creates.get(request_id)
            if create is not None and create.state is CreateState.QUEUED:
                self._forget_create(create)

    def inherit(self, promises: Promises, now: float) -> Orders:
        """A new writer takes over an earlier holder's record. Each create not listed yet is
        counted in its group as in doubt until its request id is listed or
        ``create_doubt_window`` has passed (from now: it was sent, if ever, before now), so
        that it can never take its group beyond max_size; nothing else is held. Each delete is
        marked and ordered again; the worker reads the server first, as for any delete."""
        orders = _Draft()
        window = self.settings.create_doubt_window
        configured = {spec.group_id for spec in self._cluster.node_groups}
        for request_id, (group_id, _) in promises.creates.items():
            if (
                group_id not in configured
                or request_id in self._creates
                or self._snapshot.has_request(request_id)
            ):
                continue  # listed already, or of a group no longer configured
            create = Create(
                request_id, group_id, now, CreateState.IN_DOUBT, doubt_until=now + window
            )
            create.inherited = True
            self._creates[request_id] = create
            self._creates_by_group.setdefault(group_id, {})[request_id] = create
            self._changed(group_id)
            orders.event(EventKind.CREATE_INHERITED, group_id, request_id=request_id)
        for server_id, group_id in promises.deletes.items():
            if server_id in self._deleting or group_id not in configured:
                continue
            self._mark(server_id, group_id, DeleteReason.REQUESTED, now, orders)
            orders.event(EventKind.DELETE_INHERITED, group_id, server_id=server_id)
        if promises:
            self._promised += 1
        return orders.done()

    def drop_queued(self, request_ids: Iterable[str], now: float) -> Orders:
        """Shutting down: queued creates are forgotten unsent (CA asks again)."""
        orders = _Draft()
        for request_id in request_ids:
            create = self._creates.get(request_id)
            if create is not None and create.state is CreateState.QUEUED:
                self._give_up(create, now)
                orders.event(EventKind.CREATE_DROPPED, create.group_id, request_id=request_id)
        return orders.done()

    # -- outcomes ---------------------------------------------------------------------------------

    def create_waits(self, request_id: str) -> bool:
        """Whether this queued create must wait before it is sent. A server CA deleted leaves
        the target at once, but stays in Nova until Nova takes its DELETE, and a create sent
        meanwhile may land first. The create waits while sending it could take the group's
        servers in Nova (those it is not deleting, and creates sent and not listed) beyond
        max_size because of such DELETEs; never for anything else. O(the group's deletes
        and creates in hand)."""
        create = self._creates.get(request_id)
        if create is None or create.state is not CreateState.QUEUED:
            return False
        group_id = create.group_id
        spec = self._cluster.group(group_id)
        if spec is None:
            return False
        taken, untaken = self._marked_standing(group_id)
        if not untaken:
            return False
        sent = sum(
            1 for other in self._creates_by_group.get(group_id, {}).values() if other.state in _SENT
        )
        return self._snapshot.counted(group_id) - taken + sent + 1 > spec.max_size

    def take_create(self, request_id: str) -> Create | None:
        """A worker is about to send this create; None when it must not (cancelled, settled)."""
        create = self._creates.get(request_id)
        if create is None or create.state is not CreateState.QUEUED:
            return None
        self._set_state(create, CreateState.SENDING)
        create.sends += 1
        self._sent.add(request_id)
        return create

    def finish_create(self, request_id: str, outcome: CreateOutcome, now: float) -> Orders:
        orders = _Draft()
        create = self._creates.get(request_id)
        if create is None or create.state is not CreateState.SENDING:
            # Given up while it was being sent, or already settled by a listing.
            if isinstance(outcome, Created) and request_id in self._given_up:
                server = outcome.server
                self._mark(server.server_id, server.group_id, DeleteReason.GIVEN_UP, now, orders)
            return orders.done()
        group_id = create.group_id
        match outcome:
            case Created(server):
                create.server_id = server.server_id
                create.answered_generation = self._generation
                self._by_server[server.server_id] = request_id
                self._set_state(create, CreateState.CREATED)
                if self._snapshot.of_request(request_id) or server.server_id in self._snapshot:
                    self._settle_create(create, orders)
            case Refused(error):
                self._fail(create, error, orders)
            case NotSent(error, counts=counts):
                if not counts:
                    create.sends -= 1  # it never left (refused credentials): not a send
                if create.sends < self.settings.create_attempts:
                    self._set_state(create, CreateState.QUEUED)
                    return orders.done(retry=True)
                self._fail(create, error, orders)
            case InDoubt(reason):
                create.doubt_until = now + self.settings.create_doubt_window
                self._set_state(create, CreateState.IN_DOUBT)
                orders.event(
                    EventKind.CREATE_IN_DOUBT, group_id, request_id=request_id, detail=reason
                )
        return orders.done()

    def finish_delete(self, server_id: str, outcome: DeleteOutcome, now: float) -> Orders:
        orders = _Draft()
        mark = self._deleting.get(server_id)
        if outcome is DeleteOutcome.SENT:
            if mark is not None:
                mark.sent_at = now
                mark.taken = True
        elif outcome is DeleteOutcome.GONE:
            server = self._snapshot.forget(server_id)
            if server is not None and server.request_id:
                self._gone_requests.add(server.request_id)
            self._removed[self._cluster.provider_ids.format(server_id)] = now
            group_id = mark.group_id if mark is not None else server.group_id if server else None
            if group_id is not None:
                # The mark stays until a listing begun after this answer: one begun before
                # may still show the server, and must not bring it back as running.
                reason = mark.reason if mark is not None else DeleteReason.REQUESTED
                self._unmark(server_id)
                mark = _DeleteMark(group_id, reason, self._generation, now, taken=True)
                self._deleting[server_id] = mark
                self._deleting_by_group.setdefault(group_id, set()).add(server_id)
                self._changed(group_id)
        elif outcome is DeleteOutcome.NOT_OURS:
            group_id = mark.group_id if mark is not None else None
            self._unmark(server_id)
            self._lose(server_id, now, orders)
            if group_id is not None:
                orders.event(EventKind.DELETE_REFUSED, group_id, server_id=server_id)
        return orders.done()

    def delete_not_sent(self, server_id: str, reason: str, now: float) -> Orders:
        """A delete CA asked for is not known to have reached Nova before the answer, and CA
        is told so: the server stays, counted again (osas will not delete it later on its own;
        a DELETE already on the wire may still land, and a listing then sees it go)."""
        del now
        orders = _Draft()
        mark = self._deleting.get(server_id)
        if mark is not None and mark.reason is DeleteReason.REQUESTED:
            self._unmark(server_id)
            orders.event(
                EventKind.DELETE_NOT_SENT, mark.group_id, server_id=server_id, detail=reason
            )
        return orders.done()

    def marks_lost(self, server_ids: Iterable[str], now: float) -> Orders:
        """Fresh reads show these servers without this cluster's marks for their group (a
        mark deleted or changed by hand): they leave CA's view, and are never deleted."""
        orders = _Draft()
        self._lose_all(server_ids, now, orders)
        return orders.done()

    def _lose(self, server_id: str, now: float, orders: _Draft) -> None:
        """The server is no longer ours: out of the snapshot and of any create, unmarked;
        should its marks come back, a listing adopts it again (never as an orphan)."""
        server = self._snapshot.forget(server_id)
        create = self.create_of_server(server_id)
        if create is not None:
            self._forget_create(create)
        if server is not None:
            group_id = server.group_id
            if server.request_id:
                self._gone_requests.add(server.request_id)
        elif create is not None:
            group_id = create.group_id
        else:
            return
        self._unowned[self._cluster.provider_ids.format(server_id)] = now
        orders.event(EventKind.MARKS_LOST, group_id, server_id=server_id)

    # -- listings ---------------------------------------------------------------------------------

    def begin_sync(self, now: float | None = None) -> int:
        """A generation number for a listing about to be made, begun at ``now`` (the clock of
        ``hold_headroom``; a listing begun at no time said ends no hold)."""
        self._generation += 1
        if (
            not self._hold_settled
            and self._hold_listing is None
            and now is not None
            and now >= self._headroom_held_until
        ):
            self._hold_listing = self._generation
        return self._generation

    def settle_complete(
        self,
        generation: int,
        changed: Iterable[Server],
        gone: Iterable[str],
        now: float,
        *,
        unowned: Iterable[str] = (),
    ) -> Orders:
        """A complete listing that began at ``generation``, given as its difference from the
        snapshot: servers new or changed, the listed ids it no longer shows (a mark or a
        create settles by absence), and those it shows without one of this cluster's marks
        (``unowned``: they leave CA's view, never deleted), in O(changed)."""
        orders = _Draft()
        self._lose_all(unowned, now, orders)
        diff = self._snapshot.apply_changes(changed, gone, now)
        return self._settle(diff, generation, now, full=True, gone=set(), orders=orders)

    def settle_changes(
        self,
        generation: int,
        changed: Iterable[Server],
        gone: Iterable[str],
        now: float,
        *,
        unowned: Iterable[str] = (),
    ) -> Orders:
        """An incremental listing: servers changed since the last one, ids known gone (Nova
        shows them deleted), ids shown without one of this cluster's marks."""
        orders = _Draft()
        self._lose_all(unowned, now, orders)
        gone = set(gone)
        diff = self._snapshot.apply_changes(changed, gone, now)
        return self._settle(diff, generation, now, full=False, gone=gone, orders=orders)

    def _lose_all(self, server_ids: Iterable[str], now: float, orders: _Draft) -> None:
        for server_id in server_ids:
            self._unmark(server_id)
            self._lose(server_id, now, orders)

    def _settle(
        self,
        diff: SnapshotDiff,
        generation: int,
        now: float,
        *,
        full: bool,
        gone: set[str],
        orders: _Draft,
    ) -> Orders:
        if self._hold_listing is not None and generation >= self._hold_listing:
            # Begun after the hold's time: it shows whatever an earlier osas's creates made.
            self._hold_settled, self._hold_listing = True, None
            for spec in self._cluster.node_groups:
                self._changed(spec.group_id)
        self._settle_deletions(diff, generation, now, full=full, gone=gone, orders=orders)
        self._settle_creates(generation, now, full=full, gone=gone, orders=orders)
        # Only what this listing brought can be an orphan, a duplicate or a stray: a request is
        # given up only while no server of it is listed, so earlier servers were checked when
        # they came (the first listing brings them all).
        strays = self._check_requests(diff.touched(), diff, now, orders)
        groups = (
            {spec.group_id for spec in self._cluster.node_groups}
            if full
            else {server.group_id for server in diff.touched()}
        )
        for group_id in groups:
            for server in strays.get(group_id, ()):
                orders.event(
                    EventKind.STRAY_ADOPTED,
                    group_id,
                    request_id=server.request_id,
                    server_id=server.server_id,
                )
            self._report_above_max(group_id, orders)
        self._resend_stale_deletes(now, orders)
        self._forget_old(now, full=full)
        if full:
            # What was there at start is adopted whole (made by an earlier process): it is
            # listed, so known.
            self._first_sync_done = True
        return orders.done()

    def _settle_deletions(
        self,
        diff: SnapshotDiff,
        generation: int,
        now: float,
        *,
        full: bool,
        gone: set[str],
        orders: _Draft,
    ) -> None:
        ids = self._cluster.provider_ids
        for server in diff.gone:
            self._removed[ids.format(server.server_id)] = now
            if server.request_id:
                self._gone_requests.add(server.request_id)
        dropped = {server.server_id for server in diff.gone}
        for server_id, mark in list(self._deleting.items()):
            # A mark goes once a listing no longer shows the server. A listing begun after the
            # mark proves it gone even if no listing ever showed it: a complete one by leaving
            # it out, an incremental one by naming it gone.
            later = generation > mark.generation and server_id not in self._snapshot
            if server_id in dropped or (later and (full or server_id in gone)):
                self._unmark(server_id)
                self._removed[ids.format(server_id)] = now
                orders.event(EventKind.SERVER_DELETED, mark.group_id, server_id=server_id)

    def _settle_creates(
        self, generation: int, now: float, *, full: bool, gone: set[str], orders: _Draft
    ) -> None:
        for create in list(self._creates.values()):
            if create.state is CreateState.FAILED:
                continue  # a server of it, if one turns up, is an orphan
            if self._snapshot.of_request(create.request_id) or (
                create.server_id is not None and create.server_id in self._snapshot
            ):
                self._settle_create(create, orders)
            elif create.state is CreateState.IN_DOUBT and now >= create.doubt_until:
                if create.inherited:
                    self._forget_create(create)
                    orders.event(
                        EventKind.INHERITED_CREATE_LAPSED,
                        create.group_id,
                        request_id=create.request_id,
                        detail=f"no server within {self.settings.create_doubt_window:.0f}s of "
                        "the takeover; a server of it appearing later would be adopted",
                    )
                    continue
                error = ErrorInfo(
                    IN_DOUBT_CODE,
                    f"create {create.request_id} was sent but its outcome is unknown, and no "
                    f"server appeared within {self.settings.create_doubt_window:.0f}s; any "
                    "server it made later will be deleted",
                    ErrorClass.OTHER,
                )
                self._fail(create, error, orders, kind=EventKind.CREATE_GIVEN_UP)
            elif create.state is CreateState.CREATED and (
                (full and generation > create.answered_generation) or create.server_id in gone
            ):
                # Listed after Nova answered, yet absent, or read and found gone: deleted
                # behind osas's back (while Nova was still scheduling it, it may leave no
                # DELETED row for changes-since).
                self._give_up(create, now)
                if create.server_id is not None:
                    self._removed[self._cluster.provider_ids.format(create.server_id)] = now
                orders.event(
                    EventKind.CREATE_VANISHED,
                    create.group_id,
                    request_id=create.request_id,
                    server_id=create.server_id,
                )

    def _check_requests(
        self, fresh: Iterable[Server], diff: SnapshotDiff, now: float, orders: _Draft
    ) -> dict[str, list[Server]]:
        """Orphans and duplicates among servers a listing brought are marked (of requests this
        process sent or gave up: never an earlier life's); strays (new servers of requests
        this process never made, after its first listing) are returned per group."""
        added = {server.server_id for server in diff.added}
        strays: dict[str, list[Server]] = {}
        seen: set[str] = set()
        for server in fresh:
            if server.server_id not in self._snapshot:
                continue  # gone in this listing
            request_id = server.request_id
            if request_id is not None and self.is_given_up(request_id):
                self._mark(server.server_id, server.group_id, DeleteReason.ORPHAN, now, orders)
                continue
            if not self._writer:
                continue  # the writer's: listed, so known once this process writes
            if request_id is not None and request_id not in seen:
                seen.add(request_id)
                self._check_shared(request_id, now, orders)
            if (
                server.server_id in added
                and self._first_sync_done
                and not self._is_known(request_id, added)
            ):
                strays.setdefault(server.group_id, []).append(server)
        return strays

    def _is_known(self, request_id: str | None, added: set[str]) -> bool:
        """Whether a server of ``request_id`` that this listing added is of a request known
        before it: one in hand, one settled or whose server went since the last complete
        listing, or one with a server listed earlier (a stray's second server is its
        request's, not a new stray)."""
        if request_id is None:
            return False
        if (
            request_id in self._creates
            or request_id in self._settled
            or request_id in self._gone_requests
        ):
            return True
        return any(s.server_id not in added for s in self._snapshot.of_request(request_id))

    def _check_shared(self, request_id: str, now: float, orders: _Draft) -> None:
        """Two live servers of one request: if this process sent it, the second is deleted;
        if not (an earlier life, another tool, Nova's multi-create), both are reported once
        and kept."""
        live = [s for s in self._snapshot.of_request(request_id) if not self.is_deleting(s)]
        if len(live) < 2:  # noqa: PLR2004 - one server per request is the rule
            self._shared_reported.discard(request_id)
            return
        keep = min(live, key=_keep_order)
        if request_id in self._sent:
            for server in live:
                if server is not keep:
                    reason = DeleteReason.DUPLICATE
                    self._mark(server.server_id, server.group_id, reason, now, orders)
        elif request_id not in self._shared_reported:
            self._shared_reported.add(request_id)
            orders.event(
                EventKind.SHARED_REQUEST_KEPT,
                keep.group_id,
                request_id=request_id,
                detail=f"{len(live)} servers carry this request id; osas did not make them "
                "(an earlier osas, another tool, a copied template) and deletes none",
            )

    def _report_above_max(self, group_id: str, orders: _Draft) -> None:
        """A group above max_size with servers osas may not delete (of an earlier life, or a
        lowered max_size): reported once, left for CA's scale-down or a person."""
        spec = self._cluster.group(group_id)
        failed, _ = self.cancellable(group_id)
        excess = 0 if spec is None else self.target_size(group_id) - len(failed) - spec.max_size
        if excess <= 0:
            self._above_max.discard(group_id)
        elif spec is not None and group_id not in self._above_max:
            self._above_max.add(group_id)
            orders.event(
                EventKind.ABOVE_MAX_KEPT,
                group_id,
                detail=f"target {self.target_size(group_id)} > max_size {spec.max_size}",
            )

    def _resend_stale_deletes(self, now: float, orders: _Draft) -> None:
        for server_id, mark in self._deleting.items():
            if (
                server_id in self._snapshot
                and now - mark.sent_at >= self.settings.delete_retry_after
            ):
                mark.sent_at = now
                orders.deletes.append(DeleteOrder(server_id, mark.group_id, DeleteReason.RESEND))

    def _forget_old(self, now: float, *, full: bool) -> None:
        if not full:
            return  # kept cheap: incremental syncs cost what they bring
        settings = self.settings
        for memory, keep_for in (
            (self._removed, settings.removed_memory),
            (self._unowned, settings.given_up_memory),
            (self._given_up, settings.given_up_memory),
        ):
            for key in [k for k, when in memory.items() if now - when > keep_for]:
                del memory[key]
        # A request is forgotten once no server of it is listed and no create of it is in hand;
        # a settled one is listed (known by that) or its server has gone since.
        for request_id in self._gone_requests:
            if not self._snapshot.has_request(request_id) and request_id not in self._creates:
                self._sent.discard(request_id)
        self._gone_requests.clear()
        self._settled.clear()

    # -- transitions: the only code that changes a create or a mark ---------------------------

    def _changed(self, group_id: str) -> None:
        self._generations[group_id] = self._generations.get(group_id, 0) + 1
        self.changes += 1

    def _set_state(self, create: Create, state: CreateState) -> None:
        create.state = state
        self._changed(create.group_id)

    def _settle_create(self, create: Create, orders: _Draft) -> None:
        self._forget_create(create)
        self._settled.add(create.request_id)
        server_id = create.server_id
        if server_id is None:  # in doubt, Nova's answer lost: the server a listing showed
            listed = self._snapshot.of_request(create.request_id)
            server_id = listed[0].server_id if listed else None
        orders.event(
            EventKind.CREATE_SETTLED,
            create.group_id,
            request_id=create.request_id,
            server_id=server_id,
        )

    def _fail(
        self,
        create: Create,
        error: ErrorInfo,
        orders: _Draft,
        *,
        kind: EventKind = EventKind.CREATE_FAILED,
    ) -> None:
        create.error = error
        self._set_state(create, CreateState.FAILED)
        orders.event(
            kind,
            create.group_id,
            request_id=create.request_id,
            detail=f"{error.code}: {error.message}",
            error=error,
        )

    def _give_up(self, create: Create, now: float) -> None:
        """The create is no longer wanted: whatever server it makes from now on is an orphan."""
        self._forget_create(create)
        self._given_up[create.request_id] = now
        self._removed[placeholder_id(create.group_id, create.request_id)] = now

    def _forget_create(self, create: Create) -> None:
        del self._creates[create.request_id]
        group = self._creates_by_group[create.group_id]
        del group[create.request_id]
        if not group:
            del self._creates_by_group[create.group_id]
        if create.server_id is not None:
            self._by_server.pop(create.server_id, None)
        self._changed(create.group_id)

    def _mark(
        self, server_id: str, group_id: str, reason: DeleteReason, now: float, orders: _Draft
    ) -> None:
        if server_id in self._deleting:
            return
        self._deleting[server_id] = _DeleteMark(group_id, reason, self._generation, now)
        self._deleting_by_group.setdefault(group_id, set()).add(server_id)
        self._changed(group_id)
        orders.deletes.append(DeleteOrder(server_id, group_id, reason))

    def _unmark(self, server_id: str) -> None:
        mark = self._deleting.pop(server_id, None)
        if mark is None:
            return
        group = self._deleting_by_group[mark.group_id]
        group.discard(server_id)
        if not group:
            del self._deleting_by_group[mark.group_id]
        self._changed(mark.group_id)


def _keep_order(server: Server) -> tuple[int, float, str]:
    """Which of several servers made for one request to keep: the furthest along, then the
    oldest (one without a time first, as its text sorted before)."""
    rank = {"ACTIVE": 0, "BUILD": 1}.get(server.status, 2)
    created = server.created
    return rank, -math.inf if created is None else created, server.server_id
