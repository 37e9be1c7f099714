"""The in-memory picture of the cluster's servers that every Cluster Autoscaler read is served from.

Two kinds of state live here. What Nova reported (``Server``) is replaced as a whole by each
sync, never edited in place. What osas itself has promised but Nova does not show yet (creates
in the queue or in flight, creates that failed, servers being deleted) is a small ledger that the
engine updates as work is accepted and done. Every count the Cluster Autoscaler sees is derived
from both, so a read never waits on OpenStack and never sees a half-applied sync.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from osas.domain.ids import ProviderIdFormat, parse_placeholder_id, placeholder_id
from osas.domain.servers import ErrorInfo, Flavor, Server, classify_fault
from osas.domain.specs import ClusterSpec

logger = logging.getLogger(__name__)

# How long a removed instance id is remembered, so that CA repeating a DeleteNodes is harmless.
REMOVED_MEMORY_SECONDS = 15 * 60.0


class InstanceState(IntEnum):
    """InstanceStatus.InstanceState as the Cluster Autoscaler defines it."""

    RUNNING = 1
    CREATING = 2
    DELETING = 3


@dataclass(frozen=True, slots=True)
class Instance:
    instance_id: str
    state: InstanceState
    error: ErrorInfo | None = None


class CreateStage(Enum):
    QUEUED = "queued"  # accepted, waiting for a worker: the only stage that can be cancelled
    SUBMITTING = "submitting"  # a worker is talking to Nova
    CREATED = "created"  # Nova returned a server that no sync has shown yet


@dataclass(slots=True)
class PendingCreate:
    request_id: str
    group_id: str
    stage: CreateStage = CreateStage.QUEUED
    server_id: str | None = None
    created_generation: int = 0
    # CA asked to delete it while Nova was creating it: delete the server as soon as it exists.
    doomed: bool = False


@dataclass(frozen=True, slots=True)
class FailedCreate:
    request_id: str
    group_id: str
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class SyncReport:
    servers: int
    settled_creates: int
    vanished_creates: int
    deleted: int


@dataclass(frozen=True, slots=True)
class _DeleteMark:
    generation: int  # the sync generation current when the server was marked
    marked_at: float


@dataclass(slots=True)
class _Ledger:
    creates: dict[str, PendingCreate] = field(default_factory=dict)
    failures: dict[str, FailedCreate] = field(default_factory=dict)
    deleting: dict[str, _DeleteMark] = field(default_factory=dict)
    removed: dict[str, float] = field(default_factory=dict)


class Inventory:
    """Servers of this cluster per node group, plus the creates and deletes osas has in hand."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self._cluster = cluster
        self._ids: ProviderIdFormat = cluster.provider_ids
        self._servers: Mapping[str, Server] = {}
        self._by_name: Mapping[str, tuple[str, ...]] = {}
        self._by_request: Mapping[str, str] = {}
        self._by_group: Mapping[str, tuple[Server, ...]] = {}
        self._flavors: dict[str, Flavor] = {}
        self._ledger = _Ledger()
        self._generation = 0
        self._synced_at: float | None = None

    # -- sync -------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced_at is not None

    def age(self, now: float) -> float | None:
        """Seconds since the last successful sync, None before the first."""
        return None if self._synced_at is None else now - self._synced_at

    def begin_sync(self) -> int:
        """A generation number for a sync about to list the cloud."""
        self._generation += 1
        return self._generation

    def apply_full_sync(self, generation: int, servers: Iterable[Server], now: float) -> SyncReport:
        """Replace the picture with a complete listing that began at ``generation``."""
        fresh = {server.server_id: server for server in servers}
        return self._replace(fresh, generation, now, full=True)

    def apply_changes(
        self, generation: int, changed: Iterable[Server], gone: Iterable[str], now: float
    ) -> SyncReport:
        """Merge an incremental listing: servers changed since the last sync, ids known gone."""
        fresh = dict(self._servers)
        for server in changed:
            fresh[server.server_id] = server
        for server_id in gone:
            fresh.pop(server_id, None)
        return self._replace(fresh, generation, now, full=False)

    def forget_server(self, server_id: str, now: float) -> None:
        """Nova answered 404 for this server: it is gone, whatever the last listing said."""
        if server_id in self._servers:
            fresh = dict(self._servers)
            del fresh[server_id]
            self._install(fresh)
        self._ledger.deleting.pop(server_id, None)
        self._remember_removed(self._ids.format(server_id), now)

    def _replace(
        self, fresh: dict[str, Server], generation: int, now: float, *, full: bool
    ) -> SyncReport:
        for server_id, server in list(fresh.items()):
            if server.status == "DELETED":
                del fresh[server_id]
        gone = self._servers.keys() - fresh.keys()
        self._install(fresh)
        self._synced_at = now
        for server_id in gone:
            self._remember_removed(self._ids.format(server_id), now)
        deleted = self._settle_deletions(gone, generation, full=full)
        settled, vanished = self._settle_creates(generation, full=full)
        self._forget_old_removals(now)
        return SyncReport(len(fresh), settled, vanished, deleted)

    def _settle_deletions(self, gone: set[str], generation: int, *, full: bool) -> int:
        deleted = 0
        for server_id, mark in list(self._ledger.deleting.items()):
            # A mark goes once a listing no longer shows the server; a complete listing that
            # began after the mark proves it gone even if no listing ever showed it.
            if server_id in gone or (
                full and generation > mark.generation and server_id not in self._servers
            ):
                del self._ledger.deleting[server_id]
                deleted += 1
        return deleted

    def _settle_creates(self, generation: int, *, full: bool) -> tuple[int, int]:
        ledger = self._ledger
        for request_id in list(ledger.failures):
            if request_id in self._by_request:
                # The create that looked failed (its answer was lost) did make a server.
                del ledger.failures[request_id]
        settled = vanished = 0
        for request_id, create in list(ledger.creates.items()):
            if create.stage is not CreateStage.CREATED:
                continue
            if create.server_id in self._servers or request_id in self._by_request:
                del ledger.creates[request_id]
                settled += 1
            elif full and generation > create.created_generation:
                # Listed after the create returned, yet absent: deleted behind our back.
                logger.warning(
                    "server %s of create %s vanished before any sync saw it",
                    create.server_id,
                    request_id,
                )
                del ledger.creates[request_id]
                vanished += 1
        return settled, vanished

    def _install(self, fresh: dict[str, Server]) -> None:
        by_name: dict[str, list[str]] = {}
        by_request: dict[str, str] = {}
        by_group: dict[str, list[Server]] = {}
        for server in fresh.values():
            by_name.setdefault(server.name, []).append(server.server_id)
            by_group.setdefault(server.group_id, []).append(server)
            if server.request_id:
                by_request[server.request_id] = server.server_id
        self._servers = fresh
        self._by_name = {name: tuple(ids) for name, ids in by_name.items()}
        self._by_request = by_request
        self._by_group = {group_id: tuple(servers) for group_id, servers in by_group.items()}

    def _remember_removed(self, instance_id: str, now: float) -> None:
        self._ledger.removed[instance_id] = now

    def _forget_old_removals(self, now: float) -> None:
        removed = self._ledger.removed
        for instance_id, when in list(removed.items()):
            if now - when > REMOVED_MEMORY_SECONDS:
                del removed[instance_id]

    # -- flavors ----------------------------------------------------------------------------------

    def set_flavor(self, group_id: str, flavor: Flavor | None) -> None:
        if flavor is None:
            self._flavors.pop(group_id, None)
        else:
            self._flavors[group_id] = flavor

    def flavor(self, group_id: str) -> Flavor | None:
        return self._flavors.get(group_id)

    # -- queries ----------------------------------------------------------------------------------

    def server(self, server_id: str) -> Server | None:
        return self._servers.get(server_id)

    def servers(self) -> list[Server]:
        return list(self._servers.values())

    def servers_named(self, name: str) -> list[Server]:
        return [self._servers[server_id] for server_id in self._by_name.get(name, ())]

    def is_deleting(self, server: Server) -> bool:
        return server.server_id in self._ledger.deleting or server.is_deleting

    def stale_deletions(self, now: float, older_than: float) -> list[Server]:
        """Listed servers marked for deletion longer ago than ``older_than`` seconds."""
        return [
            self._servers[server_id]
            for server_id, mark in self._ledger.deleting.items()
            if server_id in self._servers and now - mark.marked_at >= older_than
        ]

    def deleting_ids(self) -> list[str]:
        return sorted(self._ledger.deleting)

    def pending(self, request_id: str) -> PendingCreate | None:
        return self._ledger.creates.get(request_id)

    def pending_by_server(self, server_id: str) -> PendingCreate | None:
        for create in self._ledger.creates.values():
            if create.server_id == server_id:
                return create
        return None

    def failure(self, request_id: str) -> FailedCreate | None:
        return self._ledger.failures.get(request_id)

    def recently_removed(self, instance_id: str) -> bool:
        return instance_id in self._ledger.removed

    def _unobserved_creates(self, group_id: str) -> list[PendingCreate]:
        return [
            create
            for create in self._ledger.creates.values()
            if create.group_id == group_id
            and create.request_id not in self._by_request
            and create.server_id not in self._servers
        ]

    def _given_up(self, create: PendingCreate) -> bool:
        """CA asked to delete it: before Nova answered, or after, by its server's id."""
        return create.doomed or create.server_id in self._ledger.deleting

    def cancellable_creates(self, group_id: str) -> list[PendingCreate]:
        """Creates no worker has picked up yet, oldest first."""
        return [
            create
            for create in self._unobserved_creates(group_id)
            if create.stage is CreateStage.QUEUED and not self._given_up(create)
        ]

    def failures_of(self, group_id: str) -> list[FailedCreate]:
        return [f for f in self._ledger.failures.values() if f.group_id == group_id]

    def target_size(self, group_id: str) -> int:
        """Instances not being deleted, plus creates accepted but not yet shown by Nova."""
        servers = sum(
            1 for server in self._by_group.get(group_id, ()) if not self.is_deleting(server)
        )
        creates = sum(1 for c in self._unobserved_creates(group_id) if not self._given_up(c))
        return servers + creates + len(self.failures_of(group_id))

    def instances(self, group_id: str) -> list[Instance]:
        """What NodeGroupNodes reports: one Instance per server, pending or failed create."""
        result: list[Instance] = []
        for server in self._by_group.get(group_id, ()):
            instance_id = self._ids.format(server.server_id)
            if self.is_deleting(server):
                result.append(Instance(instance_id, InstanceState.DELETING))
            elif server.status == "ERROR":
                error = classify_fault(server.fault)
                result.append(Instance(instance_id, InstanceState.CREATING, error))
            elif server.status == "BUILD":
                result.append(Instance(instance_id, InstanceState.CREATING))
            else:
                result.append(Instance(instance_id, InstanceState.RUNNING))
        for create in self._unobserved_creates(group_id):
            if create.server_id is not None:
                instance_id = self._ids.format(create.server_id)
            else:
                instance_id = placeholder_id(group_id, create.request_id)
            given_up = self._given_up(create)
            state = InstanceState.DELETING if given_up else InstanceState.CREATING
            result.append(Instance(instance_id, state))
        result.extend(
            Instance(placeholder_id(group_id, f.request_id), InstanceState.CREATING, f.error)
            for f in self.failures_of(group_id)
        )
        return result

    def group_for_node(self, name: str, provider_id: str) -> str | None:
        """The node group of a Kubernetes node, None when it is not one of ours."""
        if provider_id:
            placeholder = parse_placeholder_id(provider_id)
            if placeholder is not None:
                group_id, request_id = placeholder
                known = self.pending(request_id) or self.failure(request_id)
                return group_id if known is not None and known.group_id == group_id else None
            server_id = self._ids.parse(provider_id)
            if server_id is None:
                return None
            server = self._servers.get(server_id)
            if server is not None:
                return server.group_id
            create = self.pending_by_server(server_id)
            return create.group_id if create is not None else None
        named = self.servers_named(name) if name else []
        groups = {server.group_id for server in named}
        # A name shared by servers of two groups cannot be told apart: claim neither.
        return groups.pop() if len(groups) == 1 else None

    # -- ledger updates, made by the engine as work is accepted and done --------------------------

    def add_creates(self, group_id: str, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._ledger.creates[request_id] = PendingCreate(request_id, group_id)

    def cancel_create(self, request_id: str, now: float) -> None:
        create = self._ledger.creates.pop(request_id, None)
        if create is not None:
            self._remember_removed(placeholder_id(create.group_id, request_id), now)

    def doom_create(self, request_id: str) -> None:
        self._ledger.creates[request_id].doomed = True

    def start_create(self, request_id: str) -> PendingCreate | None:
        """A worker takes a create; None when it was cancelled meanwhile."""
        create = self._ledger.creates.get(request_id)
        if create is None:
            return None
        create.stage = CreateStage.SUBMITTING
        return create

    def create_succeeded(self, request_id: str, server: Server) -> None:
        create = self._ledger.creates.get(request_id)
        if create is None:
            return
        create.stage = CreateStage.CREATED
        create.server_id = server.server_id
        create.created_generation = self._generation
        if server.server_id in self._servers or request_id in self._by_request:
            del self._ledger.creates[request_id]

    def create_failed(self, request_id: str, error: ErrorInfo, now: float) -> None:
        create = self._ledger.creates.pop(request_id, None)
        if create is None:
            return
        listed = self._by_request.get(request_id)
        if listed is not None:
            # An earlier try did make the server (its answer was lost): that server is the
            # outcome, not this error. If CA gave the create up meanwhile, the server goes.
            if create.doomed:
                self.mark_deleting([listed], now)
            return
        if create.doomed:
            # CA already gave this create up; there is nothing to report.
            self._remember_removed(placeholder_id(create.group_id, request_id), now)
            return
        self._ledger.failures[request_id] = FailedCreate(request_id, create.group_id, error)

    def remove_failure(self, request_id: str, now: float) -> None:
        failure = self._ledger.failures.pop(request_id, None)
        if failure is not None:
            self._remember_removed(placeholder_id(failure.group_id, request_id), now)

    def mark_deleting(self, server_ids: Iterable[str], now: float) -> None:
        for server_id in server_ids:
            self._ledger.deleting.setdefault(server_id, _DeleteMark(self._generation, now))
