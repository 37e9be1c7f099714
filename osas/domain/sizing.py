"""The decisions behind every mutating RPC, taken on the inventory without changing it.

Each ``plan_*`` either raises an ``OsasError`` that says precisely why the request is refused,
or returns what must change; the engine then reserves queue room and applies the plan in one go,
so a refused request changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from osas.domain.errors import (
    InvalidRequest,
    NodeGroupNotFound,
    NodeNotFound,
    PreconditionFailed,
)
from osas.domain.ids import (
    NamedNode,
    PlaceholderNode,
    ServerNode,
    parse_node,
    placeholder_id,
)
from osas.domain.inventory import Inventory
from osas.domain.ledger import Create, CreateState, DecreasePlan, DeletePlan
from osas.domain.limits import check_group_id
from osas.domain.servers import ErrorClass, ErrorInfo, Server
from osas.domain.specs import ClusterSpec, NodeGroupSpec


def require_group(cluster: ClusterSpec, group_id: str) -> NodeGroupSpec:
    check_group_id(group_id)
    spec = cluster.group(group_id)
    if spec is None:
        raise NodeGroupNotFound(f"node group {group_id!r} is not configured")
    return spec


@dataclass(frozen=True, slots=True)
class IncreasePlan:
    """IncreaseSize(delta): ``creates`` to queue, and ``refused`` failed at once with
    ``error`` (the project's quota has no room for them)."""

    creates: int
    refused: int = 0
    error: ErrorInfo | None = None


def plan_increase(
    cluster: ClusterSpec, inventory: Inventory, group_id: str, delta: int, now: float
) -> IncreasePlan:
    """What IncreaseSize(delta) does: the part the project's quota can hold is queued, the
    rest fails at once, as out of resources, without a POST (CA backs the group off and its
    expander turns to another group; the max size osas reports already says as much, so
    this happens only when CA asked before it saw it, or two groups shared the room)."""
    spec = require_group(cluster, group_id)
    if delta <= 0:
        raise InvalidRequest(f"size increase must be positive, got {delta}")
    held = inventory.ledger.headroom_held(now)
    if held is not None:
        until = f"for {held:.0f}s more" if held > 0 else "until its place is listed again"
        raise PreconditionFailed(
            f"scale-up of node group {group_id!r} held {until}: creates an earlier osas sent "
            "may still reach Nova (reconcile.create_doubt_window after a start or a takeover, "
            "then a listing of the group's place to show them); its max size is reported as "
            "its target until then"
        )
    target = inventory.target_size(group_id)
    if target + delta > spec.max_size:
        raise PreconditionFailed(
            f"size increase too large: target {target} + {delta} exceeds max size "
            f"{spec.max_size} of node group {group_id!r}"
        )
    fits = inventory.scale_up_room(spec)
    if fits is None or fits >= delta:
        return IncreasePlan(delta)
    limiting = inventory.headroom(group_id).limiting()
    error = ErrorInfo(
        "QuotaExceeded",
        f"the project's quota holds {fits} more server(s) of node group {group_id!r} "
        f"({limiting} is the limit): {delta - fits} of the {delta} asked were not sent",
        ErrorClass.OUT_OF_RESOURCES,
    )
    return IncreasePlan(fits, delta - fits, error)


def plan_decrease(
    cluster: ClusterSpec, inventory: Inventory, group_id: str, delta: int
) -> DecreasePlan:
    """DecreaseTargetSize(delta): give up creates that never became servers, newest first.
    Only failed creates and creates no worker has taken can go: one being sent or in doubt may
    already be a server."""
    require_group(cluster, group_id)
    if delta >= 0:
        raise InvalidRequest(f"size decrease must be negative, got {delta}")
    failures, queued = inventory.ledger.cancellable(group_id)
    candidates = failures + queued
    if -delta > len(candidates):
        raise PreconditionFailed(
            f"attempt to delete existing nodes: node group {group_id!r} has only "
            f"{len(candidates)} unfulfilled creates to cancel, asked for {-delta}; "
            "DecreaseTargetSize never deletes servers"
        )
    chosen = candidates[len(candidates) + delta :]
    return DecreasePlan(
        failures=tuple(r for r in chosen if r in failures),
        cancels=tuple(r for r in chosen if r not in failures),
    )


class _DeleteBuilder:
    def __init__(self, inventory: Inventory, cluster: ClusterSpec, group_id: str) -> None:
        self.inventory = inventory
        self.ledger = inventory.ledger
        self.cluster = cluster
        self.group_id = group_id
        self.servers: list[str] = []
        self.failures: list[str] = []
        self.cancels: list[str] = []
        self.give_ups: list[str] = []
        self.unknown: list[str] = []
        self.repeats = 0
        self.healthy_removals = 0
        self.seen: set[str] = set()

    def _once(self, instance_id: str, shown: str) -> None:
        """Refuse a request that names one node twice."""
        if instance_id in self.seen:
            raise InvalidRequest(f"node {shown!r} appears more than once in the request")
        self.seen.add(instance_id)

    def _check_group(self, group_id: str, shown: str) -> None:
        if group_id != self.group_id:
            raise InvalidRequest(
                f"node {shown!r} belongs to node group {group_id!r}, not {self.group_id!r}"
            )

    def add_server(self, server: Server, shown: str) -> None:
        self._once(self.cluster.provider_ids.format(server.server_id), shown)
        self._check_group(server.group_id, shown)
        if self.ledger.is_deleting(server):
            self.repeats += 1
            return
        self.servers.append(server.server_id)
        if server.status != "ERROR":
            self.healthy_removals += 1

    def add_server_id(self, server_id: str, shown: str) -> None:
        server = self.inventory.server(server_id)
        if server is not None:
            self.add_server(server, shown)
            return
        instance_id = self.cluster.provider_ids.format(server_id)
        create = self.ledger.create_of_server(server_id)
        if create is not None:
            # Nova returned the server, no listing has shown it yet: delete it now.
            self._once(instance_id, shown)
            self._check_group(create.group_id, shown)
            self._add_create(create)
            return
        if self.ledger.recently_removed(instance_id) or self.ledger.is_marked(server_id):
            self._once(instance_id, shown)
            self.repeats += 1
            return
        if self.ledger.lost_marks(instance_id):
            raise PreconditionFailed(
                f"node {shown!r}: its server no longer carries this cluster's ownership marks "
                "(a metadata key or tag removed or changed by hand): osas never deletes such a "
                "server, and no longer reports it"
            )
        raise NodeNotFound(f"node {shown!r} is not a server of this cluster")

    def add_placeholder(self, group_id: str, request_id: str, shown: str) -> None:
        instance_id = placeholder_id(group_id, request_id)
        self._once(instance_id, shown)
        self._check_group(group_id, shown)
        create = self.ledger.create(request_id)
        if create is not None and create.group_id == group_id:
            self._add_create(create)
        elif self.ledger.recently_removed(instance_id):
            self.repeats += 1
        else:
            # Not known here: a placeholder of an earlier osas process (CA's instance cache
            # outlives a restart) or one removed long ago. Nothing to do, and no error: CA
            # skips its whole clean-up loop when this call fails.
            self.unknown.append(request_id)

    def _add_create(self, create: Create) -> None:
        if create.state is CreateState.FAILED:
            self.failures.append(create.request_id)
            return
        self.healthy_removals += 1
        if create.state is CreateState.QUEUED:
            self.cancels.append(create.request_id)
        elif create.server_id is not None:
            self.servers.append(create.server_id)
        else:
            self.give_ups.append(create.request_id)

    def add_named(self, name: str) -> None:
        servers = self.inventory.servers_named(name)
        if not servers:
            raise NodeNotFound(f"node {name!r} has no provider id and no server of that name")
        if len(servers) > 1:
            raise InvalidRequest(f"node {name!r} has no provider id and its name is ambiguous")
        self.add_server(servers[0], name)


def plan_delete(
    cluster: ClusterSpec,
    inventory: Inventory,
    group_id: str,
    nodes: Sequence[tuple[str, str]],
) -> DeletePlan:
    """DeleteNodes for ``(name, provider_id)`` pairs: all of them are ours and of this group, or
    the request is refused whole.

    Failed creates and ERROR servers can never become nodes, so removing them is allowed below
    the group's min size; CA's clean-up of creation errors would otherwise loop forever.
    """
    spec = require_group(cluster, group_id)
    if not nodes:
        raise InvalidRequest("no nodes to delete")
    builder = _DeleteBuilder(inventory, cluster, group_id)
    for name, provider_id in nodes:
        ref = parse_node(name, provider_id, cluster.provider_ids)
        shown = provider_id or name
        match ref:
            case ServerNode(server_id):
                builder.add_server_id(server_id, shown)
            case PlaceholderNode(ref_group, request_id):
                builder.add_placeholder(ref_group, request_id, shown)
            case NamedNode(node_name):
                builder.add_named(node_name)
    target = inventory.target_size(group_id)
    if builder.healthy_removals and target - builder.healthy_removals < spec.min_size:
        raise PreconditionFailed(
            f"min size reached: deleting {builder.healthy_removals} nodes would take node group "
            f"{group_id!r} from {target} to below its min size {spec.min_size}"
        )
    return DeletePlan(
        group_id=group_id,
        servers=tuple(builder.servers),
        failures=tuple(builder.failures),
        cancels=tuple(builder.cancels),
        give_ups=tuple(builder.give_ups),
        unknown=tuple(builder.unknown),
        repeats=builder.repeats,
    )
