"""What osas is doing, for a person: the ``/status`` document of the metrics port (``osas
status`` prints it as a table, ``osas.cli.status_table``).

The document is plain JSON built from the inventory, the queue, the reconciler and the problem
watch; it is what the metrics say, gathered per node group.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio.lowlevel

from osas.domain.inventory import Inventory
from osas.domain.ledger import CreateState, Ledger
from osas.domain.problems import GROUP_PROBLEM_ADVICE, GroupProblem, Problem
from osas.domain.servers import Server, classify_fault
from osas.domain.specs import NodeGroupSpec
from osas.engine.queue import TaskQueue
from osas.engine.reconciler import Reconciler
from osas.engine.warm import WarmKeeper

SERVER_STATES = ("running", "creating", "deleting", "error")
CREATE_STATES = tuple(state.value.replace("-", "_") for state in CreateState)
PROBLEMS = tuple(problem.value for problem in Problem)
# Servers counted between two turns of the event loop (about a millisecond).
_COUNT_SLICE = 5000
# Servers in a problem state listed one by one (the rest are counted).
PROBLEM_SERVERS_SHOWN = 50


def server_state(server: Server, ledger: Ledger) -> str:
    """The state CA sees a server in (as ``Inventory.instances`` reports it), with ERROR
    apart: CA sees those as creating with error info."""
    if ledger.is_deleting(server):
        return "deleting"
    if server.status == "ERROR":
        return "error"
    if server.status == "BUILD":
        return "creating"
    return "running"


@dataclass(slots=True)
class _GroupCount:
    generation: int
    states: dict[str, int]
    # (code, error class) -> (how many, one message)
    errors: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)


class Census:
    """Servers of each group by state, and its ERROR servers by error code, counted when asked
    (a scrape, a status request) and kept while the group's generation says nothing changed.
    ``refresh`` counts ahead of a scrape in slices, so that a large group never holds the
    event loop (and CA's calls) for the whole walk."""

    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory
        self._counts: dict[str, _GroupCount] = {}

    def _fresh(self, group_id: str) -> _GroupCount | None:
        cached = self._counts.get(group_id)
        if cached is not None and cached.generation == self._inventory.generation(group_id):
            return cached
        return None

    def _add(self, counted: _GroupCount, servers: Iterable[Server]) -> None:
        ledger = self._inventory.ledger
        for server in servers:
            state = server_state(server, ledger)
            counted.states[state] += 1
            if state == "error":
                error = classify_fault(server.fault)
                key = (error.code, int(error.error_class))
                seen, _ = counted.errors.get(key, (0, error.message))
                counted.errors[key] = (seen + 1, error.message)

    def _count(self, group_id: str) -> _GroupCount:
        cached = self._fresh(group_id)
        if cached is not None:
            return cached
        inventory = self._inventory
        counted = _GroupCount(inventory.generation(group_id), dict.fromkeys(SERVER_STATES, 0))
        self._add(counted, inventory.snapshot.of_group(group_id))
        self._counts[group_id] = counted
        return counted

    async def refresh(self) -> None:
        """Count every group that changed, giving the event loop a turn between slices."""
        inventory = self._inventory
        for group_id in [spec.group_id for spec in inventory.cluster.node_groups]:
            if self._fresh(group_id) is not None:
                continue
            generation = inventory.generation(group_id)
            servers = list(inventory.snapshot.of_group(group_id))  # safe across the turns
            counted = _GroupCount(generation, dict.fromkeys(SERVER_STATES, 0))
            for start in range(0, len(servers), _COUNT_SLICE):
                self._add(counted, servers[start : start + _COUNT_SLICE])
                await anyio.lowlevel.checkpoint()
            self._counts[group_id] = counted

    def servers(self, group_id: str) -> dict[str, int]:
        return self._count(group_id).states

    def creates(self, group_id: str) -> dict[str, int]:
        """Creates in hand by state; not cached (a create taken by a worker changes no
        generation), and cheap: creates in hand are few."""
        counts = dict.fromkeys(CREATE_STATES, 0)
        for create in self._inventory.ledger.creates_of(group_id):
            counts[create.state.value.replace("-", "_")] += 1
        return counts

    def failures(self, group_id: str) -> list[dict[str, Any]]:
        """What CA sees as failed creates: creates that failed, and ERROR servers, by code."""
        found: dict[tuple[str, int], tuple[int, str]] = dict(self._count(group_id).errors)
        for create in self._inventory.ledger.failures_of(group_id):
            if create.error is None:
                continue
            key = (create.error.code, int(create.error.error_class))
            seen, _ = found.get(key, (0, create.error.message))
            found[key] = (seen + 1, create.error.message)
        return [
            {"code": code, "class": error_class, "count": count, "message": message[:200]}
            for (code, error_class), (count, message) in sorted(found.items())
        ]


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """The last reload of the configuration file that was applied or rejected: when (wall
    clock), and why a rejected one was."""

    applied: bool
    at: float
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PlaceSources:
    """What ``/status`` and the metrics read of one place (a cloud and region): the parts
    that keep its node groups' servers."""

    cloud: str
    region: str
    inventory: Inventory
    queue: TaskQueue
    reconciler: Reconciler
    census: Census
    keeper: WarmKeeper | None = None

    @classmethod
    def of(
        cls,
        cloud: str,
        region: str,
        inventory: Inventory,
        queue: TaskQueue,
        reconciler: Reconciler,
        *,
        keeper: WarmKeeper | None = None,
    ) -> PlaceSources:
        return cls(cloud, region, inventory, queue, reconciler, Census(inventory), keeper)


@dataclass(frozen=True, slots=True)
class StatusSources:
    """Everything ``/status`` reads, wired by the app: ``places`` in the order the app runs
    them, the top-level ``openstack`` block's first (the document's top-level sync, queue
    and hold figures are that place's; ``places`` has each)."""

    version: str
    config_file: str | None
    places: tuple[PlaceSources, ...]
    workers: int
    clock: Callable[[], float]
    readiness: Callable[[], str | None]  # None when ready, else why not
    rejected_certificate_reloads: Callable[[], int]
    leadership: Callable[[], dict[str, object]]  # the leader election's own status
    last_reload: Callable[[], ReloadOutcome | None] = lambda: None
    # Keys the file changes that only a restart applies.
    restart_needed: Callable[[], tuple[str, ...]] = tuple
    wall_clock: Callable[[], float] = time.time


def _headroom(inventory: Inventory, group_id: str) -> dict[str, Any] | None:
    """More servers of the group the project's quota can hold (None: not read, or no
    limit), in all and per resource."""
    if inventory.quota.quota is None:
        return None
    headroom = inventory.headroom(group_id)
    return {"servers": headroom.count, "limited_by": headroom.limiting(), **headroom.by_resource}


async def refresh_census(sources: StatusSources) -> None:
    """Every place's census counted ahead of a scrape or a status request."""
    for place in sources.places:
        await place.census.refresh()


def _problem_servers(sources: StatusSources) -> list[dict[str, Any]]:
    """The servers in a problem state, the first ``PROBLEM_SERVERS_SHOWN`` of them: which,
    how old (by Nova's ``created``), for how long, and why."""
    now = sources.wall_clock()
    listed = []
    entries = [
        (place.inventory.snapshot, entry)
        for place in sources.places
        for entry in place.reconciler.problems.listed()
    ]
    for snapshot, entry in entries[:PROBLEM_SERVERS_SHOWN]:
        server = snapshot.get(entry.server_id)
        created = server.created if server is not None else None
        listed.append(
            {
                "problem": entry.problem.value,
                "group": entry.group_id,
                "id": entry.server_id,
                "name": server.name if server is not None else None,
                "age_seconds": None if created is None else round(now - created),
                "for_seconds": round(now - entry.since),
                "reason": entry.detail,
            }
        )
    return listed


def _reload(sources: StatusSources) -> dict[str, Any] | None:
    """The last reload applied or rejected; a rejected one left the configuration before it
    in force."""
    outcome = sources.last_reload()
    if outcome is None:
        return None
    return {
        "result": "applied" if outcome.applied else "rejected",
        "at": datetime.fromtimestamp(outcome.at, UTC).isoformat(timespec="seconds"),
        "seconds_ago": round(sources.wall_clock() - outcome.at, 1),
        "reason": outcome.reason,
    }


def _group_problems(reconciler: Reconciler, now: float) -> list[dict[str, Any]]:
    """Node groups in a problem now, each with what to look at."""
    problem = GroupProblem.DELETED_BEFORE_JOINING
    window = reconciler.unjoined.settings.window
    return [
        {
            "group": group_id,
            "problem": problem.value,
            "servers": servers,
            "window_seconds": window,
            "for_seconds": round(max(0.0, now - since), 1),
            "advice": GROUP_PROBLEM_ADVICE[problem],
        }
        for group_id, (servers, since) in sorted(reconciler.unjoined.active().items())
    ]


def _syncs(place: PlaceSources, now: float) -> dict[str, Any]:
    sync = place.reconciler.status
    offset = sync.nova_clock_offset
    failing = None if sync.failing_since is None else now - sync.failing_since
    return {
        "full": sync.full_syncs,
        "incremental": sync.incremental_syncs,
        "failures": sync.failures,
        "last_error": sync.last_error,
        "consecutive_failures": sync.consecutive_failures,
        "failing_for_seconds": None if failing is None else round(failing, 1),
        # The request to OpenStack in progress, and how long it has gone unanswered.
        "waiting_for": sync.waiting_for,
        "waiting_seconds": (
            None if sync.waiting_since is None else round(now - sync.waiting_since, 1)
        ),
        "retrying": place.reconciler.retrying(),  # why that request is being sent again
        "nova_clock_offset_seconds": None if offset is None else round(offset, 1),
        "clock_jumps": sync.clock_jumps,
    }


def _queue(place: PlaceSources, workers: int) -> dict[str, Any]:
    queue = place.queue
    return {
        "creates": len(queue) - queue.queued_deletes(),
        "deletes": queue.queued_deletes(),
        "capacity": queue.capacity,
        "workers_busy": queue.in_hand_count() - len(queue),
        "workers": workers,
    }


def _place(place: PlaceSources, sources: StatusSources, now: float) -> dict[str, Any]:
    """One place: where it is, its groups, how fresh its listing is and how it syncs."""
    age = place.inventory.age(now)
    held = place.inventory.ledger.headroom_held(now)
    return {
        "cloud": place.cloud,
        "region": place.region,
        "groups": [spec.group_id for spec in place.inventory.cluster.node_groups],
        "synced": place.inventory.synced,
        "inventory_age_seconds": None if age is None else round(age, 1),
        "syncs": _syncs(place, now),
        "scale_ups_held_seconds": None if held is None else round(held, 1),
        "queue": _queue(place, sources.workers),
    }


def _groups(place: PlaceSources, now: float) -> list[dict[str, Any]]:
    inventory, census = place.inventory, place.census
    groups = []
    for spec in inventory.cluster.node_groups:
        group_id = spec.group_id
        groups.append(
            {
                "id": group_id,
                "cloud": place.cloud,
                "region": place.region,
                "min_size": spec.min_size,
                "max_size": spec.max_size,
                "reported_max_size": inventory.reported_max(spec, now),
                "quota_headroom": _headroom(inventory, group_id),
                "target_size": inventory.target_size(group_id) if inventory.synced else None,
                "servers": census.servers(group_id),
                "creates": census.creates(group_id),
                "failures": census.failures(group_id),
                "warm_pool": _warm_pool(place, spec),
            }
        )
    return groups


def _warm_pool(place: PlaceSources, spec: NodeGroupSpec) -> dict[str, Any]:
    """Servers prepared for the group and waiting to be claimed, by Nova's status (never in
    CA's view nor in the counts beside), and what the keeper's last pass made of the pool."""
    pool, group_id = place.inventory.warm, spec.group_id
    found: dict[str, Any] = {
        "servers": len(pool.of_group(group_id)),
        "by_status": pool.census(group_id),
    }
    if spec.warm_pool is None:
        return found
    found["state"] = spec.warm_pool.state.value
    kept = None if place.keeper is None else place.keeper.states.get(group_id)
    if kept is not None:
        found.update(
            wanted=kept.wanted,
            ready=kept.ready,
            preparing=kept.preparing,
            refilling=kept.refilling,
            why_not=kept.why_not,
        )
    return found


def build_status(sources: StatusSources) -> dict[str, Any]:
    """The ``/status`` document."""
    now = sources.clock()
    first = sources.places[0]
    problems = dict.fromkeys(PROBLEMS, 0)
    for place in sources.places:
        for (_, problem), count in place.reconciler.problems.counts().items():
            problems[problem.value] += count
    not_ready = sources.readiness()
    problem_count = sum(problems.values())
    places = [_place(place, sources, now) for place in sources.places]
    top = places[0]
    return {
        "cluster_name": first.inventory.cluster.cluster_name,
        "config_file": sources.config_file,
        "version": sources.version,
        "ready": not_ready is None,
        "not_ready_reason": not_ready,
        # The top-level openstack block's place (each place's: ``places``).
        "inventory_age_seconds": top["inventory_age_seconds"],
        "syncs": top["syncs"],
        "leader_election": sources.leadership(),
        "scale_ups_held_seconds": top["scale_ups_held_seconds"],
        "queue": top["queue"],
        "places": places,
        "groups": [group for place in sources.places for group in _groups(place, now)],
        "problems": problems,
        "problem_servers": (shown := _problem_servers(sources)),
        "problem_servers_not_shown": problem_count - len(shown),
        "group_problems": [
            problem
            for place in sources.places
            for problem in _group_problems(place.reconciler, sources.wall_clock())
        ],
        "config_reload": _reload(sources),
        "restart_needed_for": list(sources.restart_needed()),
        "rejected_certificate_reloads": sources.rejected_certificate_reloads(),
    }
