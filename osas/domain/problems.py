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
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass
from datetime import datetime
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


def _created_at(server: Server) -> float | None:
    try:
        return datetime.fromisoformat(server.created).timestamp()
    except ValueError:
        return None


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
    return f"{seconds:g}s" if seconds < 120 else f"{seconds / 60:.0f}m"  # noqa: PLR2004


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
            since = _created_at(server) or self._building_since.setdefault(server.server_id, now)
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
