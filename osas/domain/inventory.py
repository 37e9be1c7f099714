"""The in-memory picture every Cluster Autoscaler read is served from.

``Inventory`` holds the ``Snapshot`` of what Nova showed and the ``Ledger`` of the creates and
deletes in hand, and turns both into what CA sees: target sizes, instances with their states and
errors, the node group of a node. A read never waits on OpenStack and never sees a half-applied
listing: listings and ledger changes are applied between reads, never across an await.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from osas.domain.ids import ProviderIdFormat, parse_placeholder_id, placeholder_id
from osas.domain.ledger import CreateState, Ledger, LedgerSettings
from osas.domain.limits import NodeInfo
from osas.domain.quota import GroupHeadroom, QuotaBook
from osas.domain.servers import ErrorInfo, Flavor, Server, classify_fault
from osas.domain.snapshot import Snapshot
from osas.domain.specs import ClusterSpec, NodeGroupSpec, WarmState
from osas.domain.warm import WarmPool

# Node descriptions whose answers are kept at most: more than a cluster has nodes.
_KEPT_ANSWERS = 100_000
# NodeGroupForNode's answer: the node's group and the max size CA is told, or None.
NodeAnswer = tuple[NodeGroupSpec, int] | None
_UNKNOWN = object()  # no answer kept for a node


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


class Inventory:
    """Servers of this cluster per node group, and the creates and deletes osas has in hand."""

    def __init__(self, cluster: ClusterSpec, settings: LedgerSettings | None = None) -> None:
        self._ids: ProviderIdFormat = cluster.provider_ids  # restart-only: never reloaded
        self.snapshot = Snapshot()
        self.ledger = Ledger(cluster, self.snapshot, settings)
        # Servers waiting in warm pools: listed with the others, never in CA's view.
        self.warm = WarmPool()
        self.quota = QuotaBook()
        # The region its servers live in, as the cloud resolved it at its check ("" before,
        # or for a cloud that names none): the scale-from-zero templates carry it.
        self.region = ""
        self._headrooms: dict[str, GroupHeadroom] = {}
        self._headroom_key = (-1, -1)
        self._headroom_cluster: ClusterSpec | None = None
        # node fingerprint -> answer, all made under ``_answers_key`` (``node_answer``)
        self._answers: dict[int, NodeAnswer] = {}
        self._distinct: dict[tuple[str, int], tuple[NodeGroupSpec, int]] = {}
        self._answers_key: tuple[int, int, int, int, ClusterSpec | None] = (-1, -1, -1, -1, None)

    # -- sync state -------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.snapshot.listed_at is not None

    def age(self, now: float) -> float | None:
        """Seconds since the last successful listing, None before the first."""
        listed_at = self.snapshot.listed_at
        return None if listed_at is None else now - listed_at

    @property
    def cluster(self) -> ClusterSpec:
        """The configuration in force (the ledger's: a reload changes it in one place)."""
        return self.ledger.cluster

    def generation(self, group_id: str) -> int:
        """Changes whenever anything CA sees of the group may have changed: both counters only
        ever grow, so their sum moves when either does."""
        return self.snapshot.generation(group_id) + self.ledger.generation(group_id)

    # -- what CA sees -----------------------------------------------------------------------------

    def server(self, server_id: str) -> Server | None:
        return self.snapshot.get(server_id)

    def servers_named(self, name: str) -> list[Server]:
        return self.snapshot.named(name)

    def flavor(self, group_id: str) -> Flavor | None:
        return self.snapshot.flavor(group_id)

    def target_size(self, group_id: str) -> int:
        return self.ledger.target_size(group_id)

    def headroom(self, group_id: str) -> GroupHeadroom:
        """How many more servers of the group the project's quota can hold now: worked out
        once per quota version (a read, a spend), configuration and flavors, since
        NodeGroupForNode asks for it at every call."""
        cluster = self.cluster
        key = (self.quota.version, self.snapshot.flavors_version)
        if key != self._headroom_key or cluster is not self._headroom_cluster:
            self._headroom_key, self._headroom_cluster = key, cluster
            self._headrooms = {}
        found = self._headrooms.get(group_id)
        if found is not None:
            return found
        spec = cluster.group(group_id)
        if spec is None:
            return GroupHeadroom(None, {})
        flavors = {g.group_id: self.snapshot.flavor(g.group_id) for g in cluster.node_groups}
        found = self.quota.headroom(spec, cluster.node_groups, flavors)
        self._headrooms[group_id] = found
        return found

    def not_counted_by_nova(self) -> dict[str, int]:
        """Per group, servers Nova's usage may not count yet: creates in hand, and servers
        still being scheduled (real Nova counts an instance only once it is in a cell, after
        scheduling; a server group lists it at once). Counting some twice errs on the safe
        side until the next read of the quota."""
        counts = self.ledger.creates_in_hand()
        for server in self.snapshot.servers():
            if server.status == "BUILD" and server.task_state == "scheduling":
                counts[server.group_id] = counts.get(server.group_id, 0) + 1
        return counts

    def reported_max(self, spec: NodeGroupSpec, now: float) -> int:
        """The max size CA is told: the configured one; while scale-ups are held, the target
        (``Ledger.reported_max``); and never more than the project's quota can hold
        (``QuotaBook``), so that CA plans no scale-up that would fail."""
        reported = self.ledger.reported_max(spec.group_id, spec.max_size, spec.min_size, now)
        room = self.scale_up_room(spec)
        if room is None:
            return reported
        return min(reported, max(spec.min_size, self.target_size(spec.group_id) + room))

    def scale_up_room(self, spec: NodeGroupSpec) -> int | None:
        """How many more servers of the group a scale-up can have now (None: no limit): the
        quota's headroom, plus the warm servers ready to claim that no create queued will
        take (a claim needs no new quota: the server holds it already; an offloaded one needs
        its cores and RAM back, which the quota bounds)."""
        room = self.headroom(spec.group_id)
        if room.count is None or spec.warm_pool is None:
            return room.count
        return room.count + self.claimable(spec)

    def claimable(self, spec: NodeGroupSpec) -> int:
        """Ready warm servers of the group left for scale-ups to come: those no queued create
        will take first."""
        ready = self.warm.claimable(spec.group_id)
        if not ready:
            return 0
        ready -= self.ledger.queued(spec.group_id)
        if spec.warm_pool is not None and spec.warm_pool.state is WarmState.SHELVED_OFFLOADED:
            # Unshelving takes cores and RAM again, but no new instance.
            compute = self.headroom(spec.group_id).by_resource
            bounds = [compute[r] for r in ("cores", "ram_mib") if compute.get(r) is not None]
            ready = min([ready, *[b for b in bounds if b is not None]])
        return max(0, ready)

    def instances(self, group_id: str) -> list[Instance]:
        """What NodeGroupNodes reports: one Instance per server and per create in hand."""
        result: list[Instance] = []
        ledger = self.ledger
        for server in self.snapshot.of_group(group_id):
            instance_id = self._ids.format(server.server_id)
            if ledger.is_deleting(server):
                result.append(Instance(instance_id, InstanceState.DELETING))
            elif server.status == "ERROR":
                error = classify_fault(server.fault)
                result.append(Instance(instance_id, InstanceState.CREATING, error))
            elif server.status == "BUILD" or server.is_starting:
                result.append(Instance(instance_id, InstanceState.CREATING))
            else:
                result.append(Instance(instance_id, InstanceState.RUNNING))
        for create in ledger.creates_of(group_id):
            if create.state is CreateState.FAILED:
                instance_id = placeholder_id(group_id, create.request_id)
                result.append(Instance(instance_id, InstanceState.CREATING, create.error))
            elif create.server_id is not None:
                result.append(Instance(self._ids.format(create.server_id), InstanceState.CREATING))
            else:
                instance_id = placeholder_id(group_id, create.request_id)
                result.append(Instance(instance_id, InstanceState.CREATING))
        return result

    def node_answer(
        self, node: NodeInfo, now: float, check: Callable[[NodeInfo], None]
    ) -> NodeAnswer:
        """NodeGroupForNode's answer: the node's group (``group_for_node``, the node passed
        through ``check`` first) and the max size CA is told (``reported_max``), or None when
        the node is not one of ours. CA asks it of every node on every loop, and it changes
        only with the servers, the creates and deletes, the holds, the quota, the flavors or
        the configuration (not with time alone: a hold ends at a listing, which changes the
        ledger): kept per node description (its fingerprint) until one of those changes. A
        warm-pool group's answer is never kept: its max size moves with the pool. The
        fingerprint stands for the whole description (SipHash of its canonical bytes, keyed
        per process): two nodes share one by chance about once in 10^19 pairs, as
        ``CheckedNodes`` trusts it for a node's check."""
        key = (
            self.snapshot.changes,
            self.ledger.changes,
            self.quota.version,
            self.snapshot.flavors_version,
            self.ledger.cluster,
        )
        if key != self._answers_key:
            self._answers_key = key
            self._answers.clear()
            self._distinct.clear()
        fingerprint = node.fingerprint
        kept = _UNKNOWN if fingerprint is None else self._answers.get(fingerprint, _UNKNOWN)
        if kept is not _UNKNOWN:
            return kept  # type: ignore[return-value]  # an answer: _UNKNOWN ruled out
        check(node)
        group_id = self.group_for_node(node.name, node.provider_id)
        spec = None if group_id is None else self.cluster.group(group_id)
        answer: NodeAnswer = None
        if spec is not None:
            max_size = self.reported_max(spec, now)
            # One object per answer, shared by the nodes that get it: a node kept costs its
            # fingerprint and an entry, some 80 bytes (4 MiB for 50,000 nodes).
            answer = self._distinct.setdefault((spec.group_id, max_size), (spec, max_size))
        if fingerprint is not None and (spec is None or spec.warm_pool is None):
            if len(self._answers) >= _KEPT_ANSWERS:
                self._answers.clear()
            self._answers[fingerprint] = answer
        return answer

    def group_for_node(self, name: str, provider_id: str) -> str | None:
        """The node group of a Kubernetes node, None when it is not one of ours."""
        if provider_id:
            # A listed server first, found by the id as written: a listed id is Nova's own
            # uuid, so it needs no parsing (CA asks this once per node per loop).
            listed = self.snapshot.get(self._ids.suffix(provider_id))
            if listed is not None:
                return listed.group_id
            placeholder = parse_placeholder_id(provider_id)
            if placeholder is not None:
                group_id, request_id = placeholder
                create = self.ledger.create(request_id)
                return group_id if create is not None and create.group_id == group_id else None
            server_id = self._ids.parse(provider_id)
            if server_id is None:
                return None
            pending = self.ledger.create_of_server(server_id)
            return pending.group_id if pending is not None else None
        named = self.snapshot.named(name) if name else []
        groups = {server.group_id for server in named}
        # A name shared by servers of two groups cannot be told apart: claim neither.
        return groups.pop() if len(groups) == 1 else None
