"""The engine's face to the service: every Cluster Autoscaler call, answered from the inventory
or turned into queued work, with the decisions taken in the domain.

Mutations log nothing themselves: what they decided is bound to the call's log context
(structlog contextvars) and goes out in the one access line the service writes per call."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import anyio
import structlog
from structlog.contextvars import bind_contextvars

from osas.domain.errors import NodeNotFound, NotReady, NotSupported
from osas.domain.inventory import Instance, Inventory
from osas.domain.limits import NodeInfo, check_node, check_nodes
from osas.domain.options import AutoscalingOptions, group_options
from osas.domain.pricing import node_price, pod_price
from osas.domain.sizing import plan_decrease, plan_delete, plan_increase, require_group
from osas.domain.specs import ClusterSpec, NodeGroupSpec
from osas.domain.template import LABEL_INSTANCE_TYPE, NodeTemplate, build_template
from osas.engine.events import follow
from osas.engine.metrics import EngineMetrics
from osas.engine.queue import CreateTask, TaskQueue
from osas.engine.reconciler import Reconciler
from osas.engine.settings import EngineSettings

logger = structlog.get_logger(__name__)


class Controller:
    def __init__(
        self,
        inventory: Inventory,
        queue: TaskQueue,
        reconciler: Reconciler,
        settings: EngineSettings,
        *,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.inventory = inventory
        self.queue = queue
        self.reconciler = reconciler
        self.settings = settings
        self._metrics = metrics
        self._accepting = True

    @property
    def cluster(self) -> ClusterSpec:
        """The configuration in force; CA sees a reload at its next Refresh (it caches
        NodeGroups until then)."""
        return self.inventory.cluster

    def check_ready(self) -> None:
        if not self.inventory.synced:
            raise NotReady("inventory not synced with OpenStack yet; try again shortly")

    def stop_accepting(self) -> None:
        """Shutting down: mutations are refused from now on (CA retries them elsewhere)."""
        self._accepting = False

    def _check_accepting(self) -> None:
        self.check_ready()
        if not self._accepting:
            raise NotReady("osas is shutting down; no new work is accepted")

    # -- reads ------------------------------------------------------------------------------------

    def node_groups(self) -> tuple[NodeGroupSpec, ...]:
        self.check_ready()
        return self.cluster.node_groups

    def node_group_for_node(self, node: NodeInfo) -> NodeGroupSpec | None:
        self.check_ready()
        check_node(node)
        group_id = self.inventory.group_for_node(node.name, node.provider_id)
        return None if group_id is None else self.cluster.group(group_id)

    def generation(self, group_id: str) -> int:
        """Changes whenever anything CA sees of the group may have changed: answers derived
        from the group stay true while it does not."""
        self.check_ready()
        require_group(self.cluster, group_id)
        return self.inventory.generation(group_id)

    def target_size(self, group_id: str) -> int:
        self.check_ready()
        require_group(self.cluster, group_id)
        return self.inventory.target_size(group_id)

    def nodes(self, group_id: str) -> list[Instance]:
        self.check_ready()
        require_group(self.cluster, group_id)
        return self.inventory.instances(group_id)

    def template(self, group_id: str) -> NodeTemplate:
        self.check_ready()
        spec = require_group(self.cluster, group_id)
        flavor = self.inventory.flavor(group_id)
        if flavor is None:
            raise NotSupported(f"flavor {spec.flavor!r} of node group {group_id!r} is unknown")
        return build_template(self.cluster, spec, flavor)

    def options(self, group_id: str, defaults: AutoscalingOptions) -> AutoscalingOptions:
        self.check_ready()
        spec = require_group(self.cluster, group_id)
        return group_options(defaults, spec.options)

    def gpu_label(self) -> str:
        self.check_ready()
        return self.cluster.gpu_label

    def gpu_types(self) -> tuple[str, ...]:
        self.check_ready()
        return self.cluster.gpu_types

    def node_price(self, node: NodeInfo, start: float, end: float) -> float:
        self.check_ready()
        spec = self.node_group_for_node(node)
        if spec is None:
            # Template nodes of the price expander carry no provider id: match the flavor.
            instance_type = node.labels.get(LABEL_INSTANCE_TYPE)
            spec = next(
                (
                    g
                    for g in self.cluster.node_groups
                    if (f := self.inventory.flavor(g.group_id)) is not None
                    and instance_type in {f.name, f.flavor_id}
                ),
                None,
            )
        if spec is None:
            raise NodeNotFound(f"node {node.provider_id or node.name!r} is not of any node group")
        flavor = self.inventory.flavor(spec.group_id)
        return node_price(spec, flavor, self.cluster.pricing, start, end)

    def pod_price(self, requests: Mapping[str, Decimal], start: float, end: float) -> float:
        self.check_ready()
        gpu_resource = next(
            (g.gpu.resource for g in self.cluster.node_groups if g.gpu is not None),
            "nvidia.com/gpu",
        )
        return pod_price(self.cluster.pricing, requests, gpu_resource, start, end)

    # -- mutations --------------------------------------------------------------------------------

    def increase_size(self, group_id: str, delta: int) -> None:
        self._check_accepting()
        count = plan_increase(self.cluster, self.inventory, group_id, delta)
        self.queue.ensure_room(count)
        request_ids = self.inventory.ledger.accept_creates(group_id, count, anyio.current_time())
        self.queue.put_all([CreateTask(request_id, group_id) for request_id in request_ids])
        if self._metrics is not None:
            self._metrics.creates_requested.labels(group_id).inc(count)
        bind_contextvars(delta=delta, target=self.inventory.target_size(group_id))

    def delete_nodes(self, group_id: str, nodes: list[NodeInfo]) -> None:
        self._check_accepting()
        check_nodes(nodes)
        pairs = [(node.name, node.provider_id) for node in nodes]
        plan = plan_delete(self.cluster, self.inventory, group_id, pairs)
        self.queue.ensure_room(len(plan.servers))
        steps = self.inventory.ledger.accept_delete(plan, anyio.current_time())
        follow(steps, self.queue, self._metrics)
        bind_contextvars(
            servers=len(plan.servers),
            failed_creates=len(plan.failures),
            cancelled_creates=len(plan.cancels) + len(plan.give_ups),
            repeats=plan.repeats + len(plan.unknown),
            target=self.inventory.target_size(group_id),
        )

    def decrease_target_size(self, group_id: str, delta: int) -> None:
        self._check_accepting()
        plan = plan_decrease(self.cluster, self.inventory, group_id, delta)
        self.inventory.ledger.accept_decrease(plan, anyio.current_time())
        bind_contextvars(delta=delta, target=self.inventory.target_size(group_id))

    # -- lifecycle --------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Nudge a sync; refuse (CA then skips its loop) only if the inventory is too stale."""
        self.reconciler.nudge()
        stale = self.staleness()
        if stale is not None:
            raise NotReady(stale)

    def staleness(self) -> str | None:
        """Why the inventory is too stale to act on (Refresh fails, /readyz answers 503), or
        None when it is not."""
        age = self.inventory.age(anyio.current_time())
        if age is None:
            return "inventory not synced with OpenStack yet"
        if age > self.settings.max_inventory_age:
            return (
                f"inventory is {age:.0f}s old (limit {self.settings.max_inventory_age:.0f}s): "
                f"OpenStack unreachable? last error: {self.reconciler.status.last_error}"
            )
        return None

    def cleanup(self) -> None:
        """CA is shutting down. Accepted work is still carried out; say how much there is."""
        bind_contextvars(
            queued_tasks=len(self.queue), deleting=len(self.inventory.ledger.deleting_ids())
        )
