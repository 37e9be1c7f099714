"""Servers an operator has to look at: surfaced, never acted on.

osas deletes only what CA asks for and what its own ledger proves unwanted (of requests this
process sent). Five other states need a person, and ``ProblemWatch`` tells when a server enters
or leaves one, once each:

- ``error``: Nova shows the server in ERROR (CA sees it as a failed create and usually deletes
  it; one that stays is worth a look);
- ``build-stuck``: in BUILD for longer than ``stuck_build_after``;
- ``delete-stuck``: being deleted (marked by osas, or Nova's ``task_state=deleting``) and
  still listed after ``stuck_delete_after``;
- ``unconfigured-group``: this cluster's marks and tag, and a node group that is not
  configured (a group removed from the configuration, a typo by hand): never reported to CA,
  never deleted;
- ``shared-request-id``: one of several live servers that carry the same create request id
  and that osas did not make here (an earlier osas, another tool, a copied template, Nova's
  multi-create): reported to CA like any server, never deleted by osas.

The watch sees only what listings bring (``observe``) plus the few servers that can still
change state by time alone, so a review costs what is building, failing or being deleted, not
the size of the cluster. Times are wall-clock seconds (Nova's ``created`` is wall-clock too).

One problem belongs to a node group rather than to a server, and ``JoinWatch`` tells it:

- ``deleted-before-joining``: CA deleted ``threshold`` (3) servers of the group as never
  registered within ``window`` (2 h), and no server of the group created after them has joined
  since. A broken image or user data looks like this, and CA 1.36 never backs such a group
  off: it deletes each server after its ``max-node-provision-time`` and asks for another.

osas sees no Kubernetes Node; what CA sends says it all the same. A server "deleted before it
joined" is one CA named in DeleteNodes with one of its fake nodes for unregistered instances
(annotation ``k8s.io/cluster-autoscaler/fake-node-reason: unregistered``). A server "joined"
when CA asks NodeGroupForNode about a Node that is not one of its fakes (no such annotation)
and whose provider id is that server: CA asks it for every Node it lists, every loop.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from osas.domain.servers import Server, classify_fault
from osas.domain.snapshot import Snapshot


class Problem(StrEnum):
    ERROR = "error"
    BUILD_STUCK = "build-stuck"
    DELETE_STUCK = "delete-stuck"
    UNCONFIGURED_GROUP = "unconfigured-group"
    SHARED_REQUEST = "shared-request-id"


@dataclass(frozen=True, slots=True)
class ProblemSettings:
    stuck_build_after: float = 30 * 60.0
    stuck_delete_after: float = 10 * 60.0


@dataclass(frozen=True, slots=True)
class ProblemChange:
    """A server entered (``started``) or left a problem state."""

    problem: Problem
    server_id: str
    group_id: str
    started: bool
    detail: str = ""
    lasted: float = 0.0  # seconds in the state, when it ends


@dataclass(frozen=True, slots=True)
class ActiveProblem:
    """A server in a problem state now: since when (the review that first saw it) and why
    (the detail logged when it began)."""

    server_id: str
    problem: Problem
    group_id: str
    since: float
    detail: str


def _sharing(server: Server, snapshot: Snapshot, marked: Container[str]) -> int:
    """How many live servers (this one included) carry this server's request id; osas
    deletes the extra ones of its own requests, so those count only while not marked."""
    if not server.request_id or server.server_id in marked or server.is_deleting:
        return 0
    return sum(
        1
        for other in snapshot.of_request(server.request_id)
        if other.server_id not in marked and not other.is_deleting
    )


def _span(seconds: float) -> str:
    """A configured span as an operator writes it: seconds, whole hours, or minutes."""
    if seconds < 120:  # noqa: PLR2004
        return f"{seconds:g}s"
    hours, rest = divmod(seconds, 3600)
    return f"{hours:.0f}h" if not rest else f"{seconds / 60:.0f}m"


class ProblemWatch:
    """Which servers are in a problem state, and the changes since the last review."""

    def __init__(self, settings: ProblemSettings | None = None) -> None:
        self.settings = settings or ProblemSettings()
        # Servers that are, or may by time alone become, a problem: ERROR, BUILD, being
        # deleted by Nova, of an unconfigured group. Everything else changes only through a
        # listing, which ``observe`` is told of.
        self._candidates: set[str] = set()
        self._deleting_since: dict[str, float] = {}  # first review that saw it being deleted
        self._building_since: dict[str, float] = {}  # first review that saw it in BUILD
        self._active: dict[tuple[str, Problem], ActiveProblem] = {}

    def observe(self, servers: Iterable[Server]) -> None:
        """Servers a listing brought (new or changed): looked at in the next review."""
        self._candidates.update(server.server_id for server in servers)

    def active(self) -> dict[tuple[str, Problem], str]:
        """(server id, problem) -> group id, for every problem that holds now."""
        return {key: entry.group_id for key, entry in self._active.items()}

    def listed(self) -> list[ActiveProblem]:
        """Every problem that holds now, by problem, then the longest-standing first."""
        order = {problem: index for index, problem in enumerate(Problem)}
        return sorted(
            self._active.values(),
            key=lambda entry: (order[entry.problem], entry.since, entry.server_id),
        )

    def counts(self) -> dict[tuple[str, Problem], int]:
        """(group id, problem) -> how many servers are in it."""
        counts: dict[tuple[str, Problem], int] = {}
        for (_, problem), entry in self._active.items():
            key = (entry.group_id, problem)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def review(
        self,
        snapshot: Snapshot,
        marked_deleting: Iterable[str],
        configured: Container[str],
        now: float,
    ) -> list[ProblemChange]:
        """What holds now, compared with the last review: the changes, sorted."""
        marked = set(marked_deleting)
        ids = self._candidates | marked | {server_id for server_id, _ in self._active}
        # Servers sharing a request id with one looked at are looked at too: a second server
        # of a request makes the first one shared as well.
        for server_id in list(ids):
            server = snapshot.get(server_id)
            if server is not None and server.request_id:
                ids.update(s.server_id for s in snapshot.of_request(server.request_id))
        holding: dict[tuple[str, Problem], tuple[str, str]] = {}  # -> (group, detail)
        keep: set[str] = set()
        for server_id in ids:
            server = snapshot.get(server_id)
            if server is None:
                continue
            shared = _sharing(server, snapshot, marked)
            found = self._problems_of(server, server_id in marked, configured, now, shared)
            if found is None:
                continue
            keep.add(server_id)
            for problem, detail in found:
                holding[server_id, problem] = (server.group_id, detail)
        self._candidates = keep
        for times in (self._deleting_since, self._building_since):
            for server_id in [i for i in times if i not in keep]:
                del times[server_id]
        return self._changes(holding, snapshot, now)

    def _problems_of(
        self, server: Server, marked: bool, configured: Container[str], now: float, shared: int
    ) -> list[tuple[Problem, str]] | None:
        """The problems of one server now; None when it can no longer become one by time."""
        found: list[tuple[Problem, str]] = []
        watch = False
        if shared > 1:
            detail = f"{shared} live servers carry request id {server.request_id}"
            found.append((Problem.SHARED_REQUEST, detail))
            watch = True
        if server.group_id not in configured:
            found.append((Problem.UNCONFIGURED_GROUP, f"node group {server.group_id!r}"))
            watch = True
        if server.status == "ERROR":
            error = classify_fault(server.fault)
            found.append((Problem.ERROR, f"{error.code}: {error.message[:200]}"))
            watch = True
        if marked or server.is_deleting:
            since = self._deleting_since.setdefault(server.server_id, now)
            after = self.settings.stuck_delete_after
            if now - since >= after:
                detail = f"being deleted longer than reconcile.stuck_delete_after ({_span(after)})"
                found.append((Problem.DELETE_STUCK, detail))
            watch = True
        elif server.status == "BUILD":
            since = server.created or self._building_since.setdefault(server.server_id, now)
            after = self.settings.stuck_build_after
            if now - since >= after:
                detail = f"in BUILD longer than reconcile.stuck_build_after ({_span(after)})"
                found.append((Problem.BUILD_STUCK, detail))
            watch = True
        return found if watch else None

    def _changes(
        self, holding: dict[tuple[str, Problem], tuple[str, str]], snapshot: Snapshot, now: float
    ) -> list[ProblemChange]:
        changes: list[ProblemChange] = []
        for key, (group_id, detail) in holding.items():
            if key not in self._active:
                self._active[key] = ActiveProblem(key[0], key[1], group_id, now, detail)
                changes.append(ProblemChange(key[1], key[0], group_id, started=True, detail=detail))
        for key in [k for k in self._active if k not in holding]:
            entry = self._active.pop(key)
            server = snapshot.get(key[0])
            if server is None:
                detail = "no longer listed"
            elif key[1] is Problem.UNCONFIGURED_GROUP:
                detail = "node group configured now"
            else:
                detail = f"now {server.status}" + (" (deleting)" if server.is_deleting else "")
            changes.append(
                ProblemChange(
                    key[1],
                    key[0],
                    entry.group_id,
                    started=False,
                    detail=detail,
                    lasted=now - entry.since,
                )
            )
        changes.sort(key=lambda c: (c.problem, c.server_id, c.started))
        return changes


# CA's annotation on the fake nodes it makes of instances without a Node, and its value for
# those that never registered (the other, ``create-error``, is for instances with error info).
FAKE_NODE_REASON = "k8s.io/cluster-autoscaler/fake-node-reason"
FAKE_NODE_UNREGISTERED = "unregistered"


def never_registered(annotations: Mapping[str, str]) -> bool:
    """A node of a DeleteNodes request that CA made of an instance that never registered."""
    return annotations.get(FAKE_NODE_REASON) == FAKE_NODE_UNREGISTERED


def is_fake_node(annotations: Mapping[str, str]) -> bool:
    """A node CA made up (of an instance without a Node), not a Node of the cluster."""
    return FAKE_NODE_REASON in annotations


class GroupProblem(StrEnum):
    DELETED_BEFORE_JOINING = "deleted-before-joining"


GROUP_PROBLEM_ADVICE = {
    GroupProblem.DELETED_BEFORE_JOINING: "servers deleted before they joined: check the image "
    "and user data",
}


@dataclass(frozen=True, slots=True)
class JoinSettings:
    threshold: int = 3  # servers deleted before joining ...
    window: float = 2 * 3600.0  # ... within this many seconds


@dataclass(frozen=True, slots=True)
class GroupProblemChange:
    """A node group entered (``started``) or left a problem."""

    problem: GroupProblem
    group_id: str
    started: bool
    servers: int  # servers that make the problem (deleted before joining, in the window)
    detail: str = ""
    lasted: float = 0.0  # seconds in the problem, when it ends


@dataclass(slots=True)
class _Streak:
    # server id -> (when CA deleted it, when it was created: Nova's ``created``, or the
    # deletion's time when unknown, an upper bound)
    deleted: dict[str, tuple[float, float]] = field(default_factory=dict)
    since: float | None = None  # when the problem began; None while below the threshold


class JoinWatch:
    """Per node group, the servers CA deleted before they joined, and whether that makes the
    group's problem (see the module's docstring for the rule)."""

    def __init__(self, settings: JoinSettings | None = None) -> None:
        self.settings = settings or JoinSettings()
        self._streaks: dict[str, _Streak] = {}

    def watching(self, group_id: str) -> bool:
        """Whether a join in this group can change anything: asked on every NodeGroupForNode,
        so a dict lookup and nothing more."""
        return group_id in self._streaks

    def deleted_unjoined(
        self, group_id: str, servers: Iterable[Server | str], now: float
    ) -> tuple[int, list[GroupProblemChange]]:
        """CA deleted these servers of the group before they joined (a server this process
        has not listed yet is known by its id alone). Returns how many were new to the watch
        (CA repeats a DeleteNodes whose answer it missed) and the change, if any."""
        streak = self._streaks.setdefault(group_id, _Streak())
        added = 0
        for server in servers:
            server_id = server if isinstance(server, str) else server.server_id
            if server_id in streak.deleted:
                continue
            created = None if isinstance(server, str) else server.created
            streak.deleted[server_id] = (now, now if created is None else created)
            added += 1
        return added, self._judge(group_id, streak, now, "")

    def joined(self, group_id: str, server: Server, now: float) -> list[GroupProblemChange]:
        """A server of the group has a Node: the deletions of servers created before it are no
        longer evidence (what broke them works again)."""
        streak = self._streaks.get(group_id)
        created = server.created
        if streak is None or created is None:
            return []
        before = len(streak.deleted)
        streak.deleted = {k: v for k, v in streak.deleted.items() if v[1] > created}
        if len(streak.deleted) == before:
            return []
        return self._judge(group_id, streak, now, f"server {server.server_id} joined")

    def review(self, configured: Container[str], now: float) -> list[GroupProblemChange]:
        """Deletions older than the window forgotten, groups no longer configured dropped."""
        changes: list[GroupProblemChange] = []
        horizon = now - self.settings.window
        for group_id in list(self._streaks):
            streak = self._streaks[group_id]
            if group_id not in configured:
                streak.deleted.clear()
                changes += self._judge(group_id, streak, now, "node group no longer configured")
                continue
            kept = {k: v for k, v in streak.deleted.items() if v[0] > horizon}
            if len(kept) != len(streak.deleted):
                streak.deleted = kept
                why = (
                    f"fewer than {self.settings.threshold} deleted before joining in the last "
                    f"{_span(self.settings.window)}"
                )
                changes += self._judge(group_id, streak, now, why)
        return changes

    def active(self) -> dict[str, tuple[int, float]]:
        """Group id -> (servers deleted before joining in the window, when the problem began),
        for every group in the problem now."""
        return {
            group_id: (len(streak.deleted), streak.since)
            for group_id, streak in self._streaks.items()
            if streak.since is not None
        }

    def _judge(
        self, group_id: str, streak: _Streak, now: float, why_over: str
    ) -> list[GroupProblemChange]:
        count = len(streak.deleted)
        holds = count >= self.settings.threshold
        change: list[GroupProblemChange] = []
        problem = GroupProblem.DELETED_BEFORE_JOINING
        if holds and streak.since is None:
            streak.since = now
            detail = (
                f"{count} servers deleted by CA before they joined within "
                f"{_span(self.settings.window)}, none created since has joined"
            )
            change.append(
                GroupProblemChange(problem, group_id, started=True, servers=count, detail=detail)
            )
        elif not holds and streak.since is not None:
            lasted, streak.since = now - streak.since, None
            change.append(
                GroupProblemChange(
                    problem, group_id, started=False, servers=count, detail=why_over, lasted=lasted
                )
            )
        if not streak.deleted:
            del self._streaks[group_id]
        return change
