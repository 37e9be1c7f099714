"""Node groups' warm pools: servers prepared once, kept stopped (or paused, suspended,
offloaded), and claimed by IncreaseSize before any cold create.

A warm server carries this cluster's marks and the warm mark (``META_WARM``): it is not a
node of its group until claimed, so the ``Snapshot`` (every read CA makes) never holds it, and
nothing that acts on the group's servers (targets, deletes, problems) sees it. The pool keeps
them apart, per group, from the same listings: a complete listing replaces it whole, an
incremental one changes what it shows.

A claim replaces the server's metadata in one write: the warm mark goes, the create's request
id and the claim mark (``META_CLAIMED``) come, with what the node needs to join. From then on
the server is a node of its group like any other, counted by the create CA asked for; until it
is ACTIVE it is *starting* (CA sees it creating), and the claim mark, kept in Nova, lets any
holder finish the start or replace the server by a cold create once ``start_timeout`` passed.

The decisions here are pure: what is ready to claim, what to recycle and why, what a pool
still needs. The engine (``osas.engine.warm``) does the I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from osas.domain.servers import (
    META_CLAIMED,
    META_CLUSTER,
    META_GROUP,
    META_JOIN_TOKEN,
    META_NODE_LABELS,
    META_NODE_TAINTS,
    META_REQUEST,
    META_WARM,
    META_WARM_STATE,
    OwnershipMarks,
    ServerRecord,
    WarmServer,
)
from osas.domain.specs import NodeGroupSpec, WarmPoolSpec, WarmState

# Nova's metadata values are at most 255 characters: longer lists go in numbered chunks.
_CHUNK = 255


@dataclass(frozen=True, slots=True)
class StateRules:
    """How a warm state looks in Nova and how a server leaves it."""

    ready: frozenset[str]  # Nova statuses of a server ready to claim
    resume: str  # the server action that starts it
    # The action that takes a prepared server into the state; None: the guest powers itself
    # off. With one, a prepared guest stays up (ACTIVE) and says so on its console.
    settle: str | None


RULES: Mapping[WarmState, StateRules] = {
    WarmState.SHUTOFF: StateRules(frozenset({"SHUTOFF"}), "os-start", None),
    WarmState.PAUSED: StateRules(frozenset({"PAUSED"}), "unpause", "pause"),
    WarmState.SUSPENDED: StateRules(frozenset({"SUSPENDED"}), "resume", "suspend"),
    # Shelved but not yet offloaded (shelved_offload_time > 0) is claimable too. Nova refuses
    # metadata writes on a shelved server (409): a claim unshelves it first, and its guest,
    # prepared already, waits for the claim's metadata, as for paused and suspended.
    WarmState.SHELVED_OFFLOADED: StateRules(
        frozenset({"SHELVED_OFFLOADED", "SHELVED"}), "unshelve", "shelve"
    ),
}
# Nova statuses in which a server's metadata cannot be written: a claim starts it first.
SHELVED = RULES[WarmState.SHELVED_OFFLOADED].ready
# What a guest prints on its console once prepared, for the states osas settles it into
# while it runs (paused, suspended).
PREPARED_MARKER = "osas-warm-prepared"
# Every status a claimed server may be started from (a claim made under another state).
STARTABLE = {status for rules in RULES.values() for status in rules.ready}


def resume_action(status: str) -> str | None:
    """The action that starts a claimed server in this Nova status, None when none does."""
    for rules in RULES.values():
        if status in rules.ready:
            return rules.resume
    return None


class RecycleReason(StrEnum):
    STALE = "stale"  # prepared from another image, flavor, user data or template
    AGED = "aged"  # older than the pool's max_age
    FAILED = "failed"  # ERROR, or a start after a claim that failed before the claim took
    PREPARE_TIMEOUT = "prepare-timeout"  # still preparing past the pool's prepare_timeout
    UNCONFIGURED = "unconfigured"  # its group has no warm pool (any more)
    # Beyond what the pool should hold (the target rose by cold creates, max_size lowered):
    # a warm server past max_size - target could never be claimed, and holds quota.
    SURPLUS = "surplus"


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """What one group's pool needs now."""

    ready: tuple[WarmServer, ...]  # claimable
    preparing: tuple[WarmServer, ...]  # on their way to ready (building, preparing, settling)
    watch: tuple[WarmServer, ...]  # running, and only their console says whether prepared
    recycle: tuple[tuple[WarmServer, RecycleReason], ...]
    wanted: int  # servers the pool should hold
    missing: int  # creates to send to fill it (before quota and pace)


def pool_size(spec: NodeGroupSpec, target: int) -> int:
    """How many servers the group's pool should hold: its size, never more than the group
    could still grow by (a warm server beyond that could never be claimed)."""
    pool = spec.warm_pool
    if pool is None:
        return 0
    room = max(0, spec.max_size - target)
    return room if pool.size is None else min(pool.size, room)


def plan_pool(
    spec: NodeGroupSpec,
    servers: Iterable[WarmServer],
    fingerprint: str,
    target: int,
    now: float,
    *,
    busy: frozenset[str] = frozenset(),
    refilling: int = 0,
    claims_coming: int = 0,
) -> PoolPlan:
    """One group's pool as Nova shows it, judged. ``busy``: servers being claimed or
    recycled (left alone); ``refilling``: creates sent that no listing showed yet;
    ``claims_coming``: creates queued that will take ready servers first."""
    pool = spec.warm_pool
    rules = RULES[pool.state] if pool is not None else None
    ready: list[WarmServer] = []
    preparing: list[WarmServer] = []
    watch: list[WarmServer] = []
    recycle: list[tuple[WarmServer, RecycleReason]] = []
    for server in servers:
        if server.server_id in busy or server.task_state == "deleting":
            continue
        reason = _recycle_reason(pool, server, fingerprint, now)
        if reason is not None:
            recycle.append((server, reason))
            continue
        if rules is None:  # no pool: every server was recycled above
            continue
        if server.task_state is not None or server.status == "BUILD":
            preparing.append(server)
        elif server.status in rules.ready:
            ready.append(server)
        elif server.status == "ACTIVE" and rules.settle is not None:
            watch.append(server)  # prepared once its console says so
            preparing.append(server)
        else:
            preparing.append(server)  # ACTIVE: the guest is preparing
    ready.sort(key=_age_order)
    wanted = pool_size(spec, target)
    held = len(ready) + len(preparing) + refilling - claims_coming
    missing = max(0, wanted - held)
    # The newest go first, those still preparing before those ready.
    surplus = [s for s in sorted(preparing, key=_age_order, reverse=True) if s not in watch]
    surplus += reversed(ready[claims_coming:])
    recycle.extend((server, RecycleReason.SURPLUS) for server in surplus[: max(0, held - wanted)])
    return PoolPlan(tuple(ready), tuple(preparing), tuple(watch), tuple(recycle), wanted, missing)


def _recycle_reason(
    pool: WarmPoolSpec | None, server: WarmServer, fingerprint: str, now: float
) -> RecycleReason | None:
    if pool is None:
        return RecycleReason.UNCONFIGURED
    if server.status == "ERROR":
        return RecycleReason.FAILED
    if server.prepared_from != fingerprint:
        return RecycleReason.STALE
    age = None if server.created is None else now - server.created
    if age is not None and age > pool.max_age:
        return RecycleReason.AGED
    rules = RULES[pool.state]
    if (
        age is not None
        and age > pool.prepare_timeout
        and server.status not in rules.ready
        # ACTIVE in a pool osas settles: a prepared guest waits there too; only its console
        # tells a hung preparation from a finished one (``prepare_overdue``, after the read).
        and not (server.status == "ACTIVE" and rules.settle is not None)
    ):
        return RecycleReason.PREPARE_TIMEOUT
    return None


def prepare_overdue(pool: WarmPoolSpec, server: WarmServer, console: str, now: float) -> bool:
    """A running server of a pool osas settles (paused, suspended, offloaded) whose console,
    just read, still lacks the marker past ``prepare_timeout``: its preparation hung, and it
    is recycled rather than counted as preparing for ever."""
    if PREPARED_MARKER in console or server.created is None:
        return False
    return now - server.created > pool.prepare_timeout


def _age_order(server: WarmServer) -> tuple[float, str]:
    """Oldest first: a claim takes the server nearest its max_age."""
    return (0.0 if server.created is None else server.created), server.server_id


def warm_metadata(
    marks: OwnershipMarks, spec: NodeGroupSpec, request_id: str, fingerprint: str
) -> dict[str, str]:
    """The metadata of a server made to refill the group's pool: the operator's, the
    ownership marks, and the warm mark with the state the guest is kept in."""
    state = WarmState.SHUTOFF if spec.warm_pool is None else spec.warm_pool.state
    return {
        **spec.metadata,
        **marks.metadata(spec.group_id, request_id),
        META_WARM: fingerprint,
        META_WARM_STATE: state.value,
    }


def node_metadata(spec: NodeGroupSpec, join_token: str | None) -> dict[str, str]:
    """What the node reads from the metadata service to join (a warm-pool group's claimed
    servers and cold creates alike): its join token, and the group's labels and taints as
    comma-separated lists in chunks of at most 255 characters."""
    found: dict[str, str] = {}
    labels = [f"{key}={value}" for key, value in sorted(spec.labels.items())]
    taints = [f"{t.key}={t.value}:{t.effect.value}" for t in spec.taints]
    found.update(_chunked(META_NODE_LABELS, labels))
    found.update(_chunked(META_NODE_TAINTS, taints))
    if join_token is not None:
        found[META_JOIN_TOKEN] = join_token
    return found


def claim_metadata(
    marks: OwnershipMarks,
    spec: NodeGroupSpec,
    request_id: str,
    claimed_at: float,
    join_token: str | None,
) -> dict[str, str]:
    """All the metadata of a claimed server, written in one replace: the warm mark gone, the
    create's request id and the claim mark come, with what the node needs to join."""
    return {
        **spec.metadata,
        **node_metadata(spec, join_token),
        **marks.metadata(spec.group_id, request_id),
        META_CLAIMED: str(int(claimed_at)),
    }


def finished_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """A started server's metadata once its claim is over: the claim mark off. The join token
    stays until it expires (its ttl), as a cold create's does: ACTIVE says the domain runs,
    not that the guest has read its metadata (it reads tens of seconds later, through the
    metadata service's cache)."""
    return {k: v for k, v in metadata.items() if k != META_CLAIMED}


def _of_group(marks: OwnershipMarks, group_id: str, record: ServerRecord) -> bool:
    return (
        record.metadata.get(META_CLUSTER) == marks.cluster_name
        and marks.cluster_tag in record.tags
        and record.metadata.get(META_GROUP) == group_id
    )


def claimable_by(
    marks: OwnershipMarks, group_id: str, request_id: str, *, started: bool = False
) -> Callable[[ServerRecord], bool]:
    """Whether a fresh read still shows the server waiting in the group's pool, ready to
    start (``started``: ACTIVE, unshelved for this claim), or claimed by this very create
    already (its write answered late, sent again)."""
    statuses = {"ACTIVE"} if started else STARTABLE

    def still(record: ServerRecord) -> bool:
        if not _of_group(marks, group_id, record):
            return False
        metadata = record.metadata
        if metadata.get(META_REQUEST) == request_id and META_CLAIMED in metadata:
            return True
        return (
            META_WARM in metadata
            and record.task_state is None
            and record.status.upper() in statuses
        )

    return still


def still_warm(marks: OwnershipMarks, group_id: str) -> Callable[[ServerRecord], bool]:
    """Whether a fresh read still shows the server waiting in the group's pool (never
    claimed meanwhile): the check before a warm server is deleted."""

    def still(record: ServerRecord) -> bool:
        return _of_group(marks, group_id, record) and META_WARM in record.metadata

    return still


def still_claimed(marks: OwnershipMarks, group_id: str) -> Callable[[ServerRecord], bool]:
    """Whether a fresh read shows the server claimed for the group and running: the check
    before its claim mark is taken off."""

    def still(record: ServerRecord) -> bool:
        return (
            _of_group(marks, group_id, record)
            and META_CLAIMED in record.metadata
            and META_WARM not in record.metadata
            and record.status.upper() == "ACTIVE"
        )

    return still


def _chunked(key: str, items: list[str]) -> dict[str, str]:
    chunks: list[str] = []
    for item in items:
        if len(item) > _CHUNK:
            raise ValueError(f"{key}: {item[:40]}... is longer than {_CHUNK} characters")
        if chunks and len(chunks[-1]) + 1 + len(item) <= _CHUNK:
            chunks[-1] = f"{chunks[-1]},{item}"
        else:
            chunks.append(item)
    return {key if n == 0 else f"{key}-{n + 1}": chunk for n, chunk in enumerate(chunks)}


class WarmPool:
    """Warm servers by node group, and those being claimed (reserved: claimed by no one
    else, recycled by no one)."""

    def __init__(self) -> None:
        self._by_group: dict[str, dict[str, WarmServer]] = {}
        self._group_of: dict[str, str] = {}  # server id -> group id
        self._reserved: set[str] = set()
        # Per group: the fingerprint its servers are prepared from now, and the statuses a
        # ready one shows (set by the engine from the configuration).
        self._current: dict[str, tuple[str, frozenset[str]]] = {}
        self.version = 0  # bumped by every change: what is claimable may have changed
        self._counted_at = -1
        self._counted: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._group_of)

    def __contains__(self, server_id: object) -> bool:
        return server_id in self._group_of

    def groups(self) -> list[str]:
        return list(self._by_group)

    def of_group(self, group_id: str) -> list[WarmServer]:
        return list(self._by_group.get(group_id, {}).values())

    def get(self, server_id: str) -> WarmServer | None:
        group_id = self._group_of.get(server_id)
        return None if group_id is None else self._by_group[group_id].get(server_id)

    def census(self, group_id: str) -> dict[str, int]:
        """The group's warm servers by Nova's status (SHUTOFF, BUILD, SHELVED_OFFLOADED...)."""
        return dict(Counter(s.status for s in self._by_group.get(group_id, {}).values()))

    def use(self, group_id: str, fingerprint: str, state: WarmState | None) -> None:
        """What the group's servers must be prepared from now, and the state they wait in
        (None: the group has no pool)."""
        if state is None:
            changed = self._current.pop(group_id, None) is not None
        else:
            wanted = (fingerprint, RULES[state].ready)
            changed = self._current.get(group_id) != wanted
            self._current[group_id] = wanted
        if changed:
            self.version += 1

    def _ready(self, group_id: str) -> list[WarmServer]:
        current = self._current.get(group_id)
        if current is None:
            return []
        fingerprint, statuses = current
        return sorted(
            (
                s
                for s in self._by_group.get(group_id, {}).values()
                if s.prepared_from == fingerprint
                and s.status in statuses
                and s.task_state is None
                and s.server_id not in self._reserved
            ),
            key=_age_order,
        )

    def claimable(self, group_id: str) -> int:
        """Ready servers of the group no claim has taken. Counted once per change of the
        pool: the max size CA is told asks at every NodeGroupForNode."""
        if group_id not in self._current:
            return 0
        if self._counted_at != self.version:
            self._counted_at, self._counted = self.version, {}
        found = self._counted.get(group_id)
        if found is None:
            found = self._counted[group_id] = len(self._ready(group_id))
        return found

    def take(self, group_id: str) -> WarmServer | None:
        """The oldest ready server of the group, reserved for a claim (``release`` it if the
        claim does not take)."""
        ready = self._ready(group_id)
        if not ready:
            return None
        self.reserve(ready[0].server_id)
        return ready[0]

    def reserve(self, server_id: str) -> None:
        self._reserved.add(server_id)
        self.version += 1

    def release(self, server_id: str) -> None:
        self._reserved.discard(server_id)
        self.version += 1

    @property
    def reserved(self) -> frozenset[str]:
        return frozenset(self._reserved)

    def replace(self, servers: Iterable[WarmServer]) -> None:
        """A complete listing: every warm server it showed, and no other."""
        self._by_group.clear()
        self._group_of.clear()
        self.update(servers, ())
        # A reserved server no longer warm was claimed (or is gone): no longer the pool's.
        self._reserved &= self._group_of.keys()

    def update(self, changed: Iterable[WarmServer], gone: Iterable[str]) -> None:
        """An incremental listing: warm servers it showed, and ids that are no longer warm
        (deleted, or claimed: the warm mark taken off)."""
        for server_id in gone:
            self._drop(server_id)
            self._reserved.discard(server_id)  # claimed (or gone): no longer the pool's
        for server in changed:
            self._drop(server.server_id)
            if server.status == "DELETED":
                continue
            self._by_group.setdefault(server.group_id, {})[server.server_id] = server
            self._group_of[server.server_id] = server.group_id
        self.version += 1

    def _drop(self, server_id: str) -> None:
        group_id = self._group_of.pop(server_id, None)
        if group_id is None:
            return
        group = self._by_group[group_id]
        del group[server_id]
        if not group:
            del self._by_group[group_id]
