"""The lifecycle of every create and delete osas has in hand, in one place.

One call per intent (accept creates, accept a DeleteNodes or DecreaseTargetSize plan, drop what
is queued at shutdown) or outcome (a worker takes a create and finishes it; a delete's result;
a listing to settle), each returning what must happen next: servers to delete, whether to send a
create again, and events worth telling the operator. The engine does the I/O and reports back;
it never edits this state itself. The invariants osas promises live here:

- **At most one server per create request is ever kept.** A create is sent again only after an
  outcome that proves Nova never received it. After an ambiguous one it is *in doubt*: counted
  and reported as creating, settled when a listing shows its server, reported failed when the
  doubt window passes. A server that appears for a request given up, cancelled or failed is an
  orphan and is deleted, never adopted; two servers for one request: one is kept.
- **Never above max_size.** The target counts servers not being deleted and creates in hand;
  IncreaseSize cannot pass max_size, orphans and duplicates are not counted, and a server that
  turns up after start for a request this process never made (a late create of an earlier
  process) is deleted if it would take its group above max_size.
- Nothing is deleted that a listing did not show carrying this cluster's marks (the snapshot
  holds only such servers; the worker checks the marks again right before deleting).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum, StrEnum

from osas.domain.ids import placeholder_id
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
    doubt_window: float = 180.0
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
    """Proof that the create never reached Nova: it may be sent again."""

    error: ErrorInfo


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


# -- what must happen next -----------------------------------------------------------------------


class DeleteReason(StrEnum):
    REQUESTED = "requested"  # CA's DeleteNodes
    GIVEN_UP = "given-up"  # the server of a create CA gave up while it was being sent
    ORPHAN = "orphan"  # appeared for a request that was given up, cancelled or failed
    DUPLICATE = "duplicate"  # a second server for one create request
    ABOVE_MAX = "above-max"  # a late server of a request this process never made, past max_size
    RESEND = "resend"  # sent long ago, and the server is still listed


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
    STRAY_ADOPTED = "stray-adopted"  # listed after start for a request this process never made
    ABOVE_MAX_KEPT = "above-max-kept"  # above max_size with nothing that may be deleted
    UNKNOWN_PLACEHOLDER = "unknown-placeholder"  # DeleteNodes of a placeholder not known here


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    kind: EventKind
    group_id: str
    request_id: str | None = None
    server_id: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Next:
    deletes: tuple[DeleteOrder, ...] = ()
    events: tuple[LedgerEvent, ...] = ()
    retry: bool = False  # finish_create: send the create again (it never reached Nova)

    def count(self, kind: EventKind) -> int:
        return sum(1 for event in self.events if event.kind is kind)


@dataclass(slots=True)
class _Steps:
    """What a ledger call collects while it works."""

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
    ) -> None:
        self.events.append(LedgerEvent(kind, group_id, request_id, server_id, detail))

    def done(self, *, retry: bool = False) -> Next:
        return Next(tuple(self.deletes), tuple(self.events), retry)


@dataclass(slots=True)
class _DeleteMark:
    group_id: str
    reason: DeleteReason
    generation: int  # the sync generation current when the server was marked
    sent_at: float  # when the delete was last handed to a worker or sent


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


class Ledger:
    """Creates and deletes in hand, over the snapshot of what Nova showed."""

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
        self._deleting: dict[str, _DeleteMark] = {}
        self._removed: dict[str, float] = {}  # instance id -> when
        self._own: set[str] = set()  # request ids this process made and kept the server of
        # Request ids of servers that left the snapshot since the last complete listing: the
        # only entries of _own that complete listing may have to forget.
        self._own_unlisted: set[str] = set()
        self._above_max: set[str] = set()  # groups reported ABOVE_MAX_KEPT
        self._generation = 0
        self._first_sync_done = False

    def use_cluster(self, cluster: ClusterSpec) -> None:
        """A new configuration (node groups added, removed or resized)."""
        self._cluster = cluster
        for spec in cluster.node_groups:
            self._snapshot.touch(spec.group_id)

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

    def is_marked(self, server_id: str) -> bool:
        return server_id in self._deleting

    def is_deleting(self, server: Server) -> bool:
        return server.server_id in self._deleting or server.is_deleting

    def deleting_ids(self) -> list[str]:
        return sorted(self._deleting)

    def recently_removed(self, instance_id: str) -> bool:
        return instance_id in self._removed

    def is_given_up(self, request_id: str) -> bool:
        """A server of this request must not be kept: given up, cancelled, or failed."""
        create = self._creates.get(request_id)
        return request_id in self._given_up or (
            create is not None and create.state is CreateState.FAILED
        )

    def target_size(self, group_id: str) -> int:
        """Servers not being deleted, plus creates in hand (failed ones until CA removes them).
        O(1): both are counted as they change."""
        return self._snapshot.counted(group_id) + len(self._creates_by_group.get(group_id, ()))

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
            self._snapshot.touch(group_id)
        return request_ids

    def accept_delete(self, plan: DeletePlan, now: float) -> Next:
        steps = _Steps()
        for server_id in plan.servers:
            create = self.create_of_server(server_id)
            if create is not None:
                self._give_up(create, now)
            self._mark(server_id, plan.group_id, DeleteReason.REQUESTED, now, steps)
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
            steps.event(EventKind.UNKNOWN_PLACEHOLDER, plan.group_id, request_id=request_id)
        return steps.done()

    def accept_decrease(self, plan: DecreasePlan, now: float) -> Next:
        for request_id in (*plan.failures, *plan.cancels):
            create = self._creates.get(request_id)
            if create is not None:
                self._give_up(create, now)
        return Next()

    def drop_queued(self, request_ids: Iterable[str], now: float) -> Next:
        """Shutting down: queued creates are forgotten unsent (CA asks again)."""
        steps = _Steps()
        for request_id in request_ids:
            create = self._creates.get(request_id)
            if create is not None and create.state is CreateState.QUEUED:
                self._give_up(create, now)
                steps.event(EventKind.CREATE_DROPPED, create.group_id, request_id=request_id)
        return steps.done()

    # -- outcomes ---------------------------------------------------------------------------------

    def take_create(self, request_id: str) -> Create | None:
        """A worker is about to send this create; None when it must not (cancelled, settled)."""
        create = self._creates.get(request_id)
        if create is None or create.state is not CreateState.QUEUED:
            return None
        create.state = CreateState.SENDING
        create.sends += 1
        return create

    def finish_create(self, request_id: str, outcome: CreateOutcome, now: float) -> Next:
        steps = _Steps()
        create = self._creates.get(request_id)
        if create is None or create.state is not CreateState.SENDING:
            # Given up while it was being sent, or already settled by a listing.
            if isinstance(outcome, Created) and request_id in self._given_up:
                server = outcome.server
                self._mark(server.server_id, server.group_id, DeleteReason.GIVEN_UP, now, steps)
            return steps.done()
        group_id = create.group_id
        self._snapshot.touch(group_id)
        match outcome:
            case Created(server):
                create.state = CreateState.CREATED
                create.server_id = server.server_id
                create.answered_generation = self._generation
                self._by_server[server.server_id] = request_id
                if self._snapshot.of_request(request_id) or server.server_id in self._snapshot:
                    self._settle_create(create, steps)
            case Refused(error):
                self._fail(create, error, steps)
            case NotSent(error):
                if create.sends < self.settings.create_attempts:
                    create.state = CreateState.QUEUED
                    return steps.done(retry=True)
                self._fail(create, error, steps)
            case InDoubt(reason):
                create.state = CreateState.IN_DOUBT
                create.doubt_until = now + self.settings.doubt_window
                steps.event(
                    EventKind.CREATE_IN_DOUBT, group_id, request_id=request_id, detail=reason
                )
        return steps.done()

    def finish_delete(self, server_id: str, outcome: DeleteOutcome, now: float) -> Next:
        steps = _Steps()
        mark = self._deleting.get(server_id)
        if outcome is DeleteOutcome.SENT:
            if mark is not None:
                mark.sent_at = now
        elif outcome is DeleteOutcome.GONE:
            server = self._snapshot.forget(server_id)
            if server is not None and server.request_id:
                self._own_unlisted.add(server.request_id)
            self._removed[self._cluster.provider_ids.format(server_id)] = now
            group_id = mark.group_id if mark is not None else server.group_id if server else None
            if group_id is not None:
                # The mark stays until a listing begun after this answer: one begun before
                # may still show the server, and must not bring it back as running.
                reason = mark.reason if mark is not None else DeleteReason.REQUESTED
                self._deleting[server_id] = _DeleteMark(group_id, reason, self._generation, now)
                self._snapshot.mark(server_id)
                self._snapshot.touch(group_id)
        elif outcome is DeleteOutcome.NOT_OURS and mark is not None:
            del self._deleting[server_id]
            self._snapshot.unmark(server_id)
            self._snapshot.touch(mark.group_id)
            steps.event(EventKind.DELETE_REFUSED, mark.group_id, server_id=server_id)
        return steps.done()

    # -- listings ---------------------------------------------------------------------------------

    def begin_sync(self) -> int:
        """A generation number for a listing about to be made."""
        self._generation += 1
        return self._generation

    def settle_full(self, generation: int, listed: Iterable[Server], now: float) -> Next:
        """A complete listing that began at ``generation``: every server it showed."""
        diff = self._snapshot.apply_full(listed, now)
        return self._settle(diff, generation, now, full=True, gone=set())

    def settle_complete(
        self, generation: int, changed: Iterable[Server], gone: Iterable[str], now: float
    ) -> Next:
        """A complete listing that began at ``generation``, given as its difference from the
        snapshot: servers new or changed, and the listed ids it no longer shows. The same
        facts as ``settle_full`` (a mark or a create settles by absence), in O(changed)."""
        diff = self._snapshot.apply_changes(changed, gone, now)
        return self._settle(diff, generation, now, full=True, gone=set())

    def settle_changes(
        self, generation: int, changed: Iterable[Server], gone: Iterable[str], now: float
    ) -> Next:
        """An incremental listing: servers changed since the last one, ids known gone."""
        gone = set(gone)
        diff = self._snapshot.apply_changes(changed, gone, now)
        return self._settle(diff, generation, now, full=False, gone=gone)

    def _settle(
        self, diff: SnapshotDiff, generation: int, now: float, *, full: bool, gone: set[str]
    ) -> Next:
        steps = _Steps()
        self._settle_deletions(diff, generation, now, full=full, gone=gone, steps=steps)
        self._settle_creates(generation, now, full=full, steps=steps)
        # Only what this listing brought can be an orphan, a duplicate or a stray: a request is
        # given up only while no server of it is listed, so earlier servers were checked when
        # they came (the first listing brings them all).
        strays = self._check_requests(diff.touched(), diff, now, steps)
        groups = (
            {spec.group_id for spec in self._cluster.node_groups}
            if full
            else {server.group_id for server in diff.touched()}
        )
        for group_id in groups:
            self._keep_within_max(group_id, strays.get(group_id, []), now, steps)
        self._resend_stale_deletes(now, steps)
        self._forget_old(now, full=full)
        if full and not self._first_sync_done:
            # What was there at start is adopted whole: made by an earlier process.
            self._own.update(s.request_id for s in self._snapshot.servers() if s.request_id)
            self._first_sync_done = True
        return steps.done()

    def _settle_deletions(
        self,
        diff: SnapshotDiff,
        generation: int,
        now: float,
        *,
        full: bool,
        gone: set[str],
        steps: _Steps,
    ) -> None:
        ids = self._cluster.provider_ids
        for server in diff.gone:
            self._removed[ids.format(server.server_id)] = now
            if server.request_id:
                self._own_unlisted.add(server.request_id)
        dropped = {server.server_id for server in diff.gone}
        for server_id, mark in list(self._deleting.items()):
            # A mark goes once a listing no longer shows the server. A listing begun after the
            # mark proves it gone even if no listing ever showed it: a complete one by leaving
            # it out, an incremental one by naming it gone.
            later = generation > mark.generation and server_id not in self._snapshot
            if server_id in dropped or (later and (full or server_id in gone)):
                del self._deleting[server_id]
                self._snapshot.unmark(server_id)
                self._removed[ids.format(server_id)] = now
                self._snapshot.touch(mark.group_id)
                steps.event(EventKind.SERVER_DELETED, mark.group_id, server_id=server_id)

    def _settle_creates(self, generation: int, now: float, *, full: bool, steps: _Steps) -> None:
        for create in list(self._creates.values()):
            if create.state is CreateState.FAILED:
                continue  # a server of it, if one turns up, is an orphan
            if self._snapshot.of_request(create.request_id) or (
                create.server_id is not None and create.server_id in self._snapshot
            ):
                self._settle_create(create, steps)
            elif create.state is CreateState.IN_DOUBT and now >= create.doubt_until:
                error = ErrorInfo(
                    IN_DOUBT_CODE,
                    f"create {create.request_id} was sent but its outcome is unknown, and no "
                    f"server appeared within {self.settings.doubt_window:.0f}s; any server it "
                    "made later will be deleted",
                    ErrorClass.OTHER,
                )
                self._fail(create, error, steps, kind=EventKind.CREATE_GIVEN_UP)
            elif (
                create.state is CreateState.CREATED
                and full
                and generation > create.answered_generation
            ):
                # Listed after Nova answered, yet absent: deleted behind osas's back.
                self._give_up(create, now)
                if create.server_id is not None:
                    self._removed[self._cluster.provider_ids.format(create.server_id)] = now
                steps.event(
                    EventKind.CREATE_VANISHED,
                    create.group_id,
                    request_id=create.request_id,
                    server_id=create.server_id,
                )

    def _check_requests(
        self, fresh: Iterable[Server], diff: SnapshotDiff, now: float, steps: _Steps
    ) -> dict[str, list[Server]]:
        """Orphans and duplicates among servers a listing brought are marked; strays (new
        servers of requests this process never made, after its first listing) are returned
        per group."""
        added = {server.server_id for server in diff.added}
        strays: dict[str, list[Server]] = {}
        seen: set[str] = set()
        for server in fresh:
            if server.server_id not in self._snapshot:
                continue  # gone in this listing
            request_id = server.request_id
            if request_id is not None and self.is_given_up(request_id):
                self._mark(server.server_id, server.group_id, DeleteReason.ORPHAN, now, steps)
                continue
            if request_id is not None and request_id not in seen:
                seen.add(request_id)
                self._drop_duplicates(request_id, now, steps)
            known = request_id is not None and (
                request_id in self._own or request_id in self._creates
            )
            if server.server_id in added and self._first_sync_done and not known:
                strays.setdefault(server.group_id, []).append(server)
        return strays

    def _drop_duplicates(self, request_id: str, now: float, steps: _Steps) -> None:
        live = [s for s in self._snapshot.of_request(request_id) if not self.is_deleting(s)]
        if len(live) < 2:  # noqa: PLR2004 - one server per request is the rule
            return
        keep = min(live, key=_keep_order)
        for server in live:
            if server is not keep:
                self._mark(server.server_id, server.group_id, DeleteReason.DUPLICATE, now, steps)

    def _keep_within_max(
        self, group_id: str, strays: list[Server], now: float, steps: _Steps
    ) -> None:
        """Strays just listed are adopted, but never above max_size: the newest go first."""
        spec = self._cluster.group(group_id)
        excess = 0 if spec is None else self.target_size(group_id) - spec.max_size
        strays = sorted(strays, key=lambda s: (s.created, s.server_id), reverse=True)
        for index, server in enumerate(strays):
            if index < excess:
                self._mark(server.server_id, group_id, DeleteReason.ABOVE_MAX, now, steps)
            else:
                steps.event(
                    EventKind.STRAY_ADOPTED,
                    group_id,
                    request_id=server.request_id,
                    server_id=server.server_id,
                )
        excess -= len(strays)
        if excess <= 0:
            self._above_max.discard(group_id)
        elif spec is not None and group_id not in self._above_max:
            # Above max_size with servers that were there before (an accepted delete lost to
            # a kill, max_size lowered): running nodes, left for CA's scale-down. Said once.
            self._above_max.add(group_id)
            steps.event(
                EventKind.ABOVE_MAX_KEPT,
                group_id,
                detail=f"target {self.target_size(group_id)} > max_size {spec.max_size}",
            )

    def _resend_stale_deletes(self, now: float, steps: _Steps) -> None:
        for server_id, mark in self._deleting.items():
            if (
                server_id in self._snapshot
                and now - mark.sent_at >= self.settings.delete_retry_after
            ):
                mark.sent_at = now
                steps.deletes.append(DeleteOrder(server_id, mark.group_id, DeleteReason.RESEND))

    def _forget_old(self, now: float, *, full: bool) -> None:
        if not full:
            return  # kept cheap: incremental syncs cost what they bring
        settings = self.settings
        for memory, keep_for in (
            (self._removed, settings.removed_memory),
            (self._given_up, settings.given_up_memory),
        ):
            for key in [k for k, when in memory.items() if now - when > keep_for]:
                del memory[key]
        # A request is forgotten once no server of it is listed and no create of it is in hand.
        for request_id in self._own_unlisted:
            if not self._snapshot.has_request(request_id) and request_id not in self._creates:
                self._own.discard(request_id)
        self._own_unlisted.clear()

    # -- transitions ------------------------------------------------------------------------------

    def _settle_create(self, create: Create, steps: _Steps) -> None:
        self._forget_create(create)
        self._own.add(create.request_id)
        steps.event(
            EventKind.CREATE_SETTLED,
            create.group_id,
            request_id=create.request_id,
            server_id=create.server_id,
        )

    def _fail(
        self,
        create: Create,
        error: ErrorInfo,
        steps: _Steps,
        *,
        kind: EventKind = EventKind.CREATE_FAILED,
    ) -> None:
        create.state = CreateState.FAILED
        create.error = error
        self._snapshot.touch(create.group_id)
        steps.event(
            kind,
            create.group_id,
            request_id=create.request_id,
            detail=f"{error.code}: {error.message}",
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
        self._snapshot.touch(create.group_id)

    def _mark(
        self, server_id: str, group_id: str, reason: DeleteReason, now: float, steps: _Steps
    ) -> None:
        if server_id in self._deleting:
            return
        self._deleting[server_id] = _DeleteMark(group_id, reason, self._generation, now)
        self._snapshot.mark(server_id)
        self._snapshot.touch(group_id)
        steps.deletes.append(DeleteOrder(server_id, group_id, reason))


def _keep_order(server: Server) -> tuple[int, str, str]:
    """Which of several servers made for one request to keep: the furthest along, then the
    oldest."""
    rank = {"ACTIVE": 0, "BUILD": 1}.get(server.status, 2)
    return rank, server.created, server.server_id
