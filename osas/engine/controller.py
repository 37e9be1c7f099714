"""The engine's face to the service: every Cluster Autoscaler call, answered from the inventory
or turned into queued work, with the decisions taken in the domain.

Mutations log nothing themselves: what they decided is bound to the call's log context
(structlog contextvars) and goes out in the one access line the service writes per call."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Container, Mapping
from decimal import Decimal

import anyio
import structlog
from structlog.contextvars import bind_contextvars

from osas.cloud.errors import CloudUnavailable
from osas.domain.errors import (
    NodeNotFound,
    NotReady,
    NotSupported,
    Overloaded,
    PreconditionFailed,
)
from osas.domain.ids import ServerNode, parse_node
from osas.domain.inventory import Instance, Inventory, NodeAnswer
from osas.domain.ledger import DeleteOutcome, DeletePlan, Orders
from osas.domain.limits import CheckedNodes, NodeInfo, check_nodes
from osas.domain.options import AutoscalingOptions, group_options, options_refusal
from osas.domain.pricing import node_price, pod_price
from osas.domain.problems import is_fake_node, never_registered
from osas.domain.promises import RECORD_CAPACITY
from osas.domain.sizing import plan_decrease, plan_delete, plan_increase, require_group
from osas.domain.specs import ClusterSpec, NodeGroupSpec
from osas.domain.template import LABEL_INSTANCE_TYPE, NodeTemplate, build_template
from osas.election.port import PromisesNotKept
from osas.engine.deletes import ServerDeleter
from osas.engine.events import carry_out, log_group_problems
from osas.engine.metrics import EngineMetrics
from osas.engine.queue import CreateTask, TaskQueue
from osas.engine.reconciler import Reconciler
from osas.engine.settings import EngineSettings

logger = structlog.get_logger(__name__)

# What a mutation keeps of CA's deadline to answer in; and the longest it waits for the
# promise record (a few of the API server's round trips: a slower API fails the call).
_ANSWER_MARGIN = 0.25
_RECORD_BUDGET = 2.0
_NO_DEADLINE_BUDGET = 30.0  # DeleteNodes reaching Nova itself, when CA gives no deadline


def _never_standby() -> str | None:
    return None


async def _nothing_to_keep(budget: float) -> None:
    del budget


class ConfiguredAnswers:
    """Whether CA's calls are answered now, and the answers the configuration alone gives:
    the same for one place's controller and for the router over several."""

    @property
    def cluster(self) -> ClusterSpec:
        raise NotImplementedError

    def _not_answering(self) -> str | None:
        """Why CA's calls are not answered now, or None."""
        raise NotImplementedError

    def answering(self) -> bool:
        """Whether CA's calls are answered now (``check_ready`` passes)."""
        return self._not_answering() is None

    def check_ready(self) -> None:
        reason = self._not_answering()
        if reason is not None:
            raise NotReady(reason)

    def gpu_label(self) -> str:
        self.check_ready()
        return self.cluster.gpu_label

    def gpu_types(self) -> tuple[str, ...]:
        self.check_ready()
        return self.cluster.gpu_types


class Controller(ConfiguredAnswers):
    def __init__(
        self,
        inventory: Inventory,
        queue: TaskQueue,
        reconciler: Reconciler,
        settings: EngineSettings,
        *,
        deleter: ServerDeleter,
        keep_promises: Callable[[float], Awaitable[None]] | None = None,
        standby: Callable[[], str | None] = _never_standby,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.inventory = inventory
        self.queue = queue
        self.reconciler = reconciler
        self.settings = settings
        self.deleter = deleter
        # Returns once the promises made so far are kept outside this process (the record
        # on the leader Lease); raises PromisesNotKept. None: nothing is kept outside it
        # (election off), and DeleteNodes reaches Nova before it answers instead.
        self._keep_promises = keep_promises or _nothing_to_keep
        self.keeps_promises = keep_promises is not None
        # Why this process may not answer CA now (it does not hold the leader lease), or None.
        self._standby = standby
        self._metrics = metrics
        self._accepting = True
        self._checked_nodes = CheckedNodes()

    @property
    def cluster(self) -> ClusterSpec:
        """The configuration in force; CA sees a reload at its next Refresh (it caches
        NodeGroups until then)."""
        return self.inventory.cluster

    def _not_answering(self) -> str | None:
        """Why CA's calls are not answered now, or None."""
        if not self.inventory.synced:
            return "inventory not synced with OpenStack yet; try again shortly"
        return self._standby()

    def stop_accepting(self) -> None:
        """Shutting down: mutations are refused from now on (CA retries them elsewhere)."""
        self._accepting = False

    def count_creates(self, group_id: str, count: int) -> None:
        if self._metrics is not None:
            self._metrics.creates_requested.labels(group_id).inc(count)

    def carry_out(self, orders: Orders, *, sent_by_caller: Container[str] = ()) -> None:
        carry_out(orders, self.queue, self._metrics, sent_by_caller=sent_by_caller)

    def check_record_room(self, count: int) -> None:
        """Refuse, with nothing changed, a call whose promises the record has no room for."""
        if not self.keeps_promises or not count:
            return  # nothing kept outside this process: nothing to bound
        held = len(self.inventory.ledger.promises())
        if held + count > RECORD_CAPACITY:
            raise Overloaded(
                f"the promise record is full ({held} of {RECORD_CAPACITY} creates and deletes "
                f"not yet confirmed by a listing); no room for {count} more"
            )

    def delete_budget(self, time_left: float | None) -> float:
        """Seconds DeleteNodes may spend reaching Nova: CA's deadline less time to answer."""
        if time_left is None or not math.isfinite(time_left):
            return _NO_DEADLINE_BUDGET
        return max(0.0, time_left - _ANSWER_MARGIN)

    async def keep_promises(self, time_left: float | None) -> None:
        """Return once what was promised so far is kept in the cluster; NotReady (the call
        fails, UNAVAILABLE) when the record cannot be written within the budget."""
        budget = _RECORD_BUDGET
        if time_left is not None and math.isfinite(time_left):
            budget = min(budget, max(0.0, time_left - _ANSWER_MARGIN))
        try:
            await self._keep_promises(budget)
        except PromisesNotKept as exc:
            raise NotReady(str(exc)) from exc

    def _check_accepting(self) -> None:
        self.check_ready()
        if not self._accepting:
            raise NotReady("osas is shutting down; no new work is accepted")

    # -- the calls on one node group --------------------------------------------------------------

    def group(self, group_id: str) -> NodeGroupView:
        """The node group a call names, resolved once with the inventory checked ready: every
        per-group call of CA starts here (CA's own example wrapper does the same)."""
        self.check_ready()
        return NodeGroupView(self, require_group(self.cluster, group_id))

    def group_to_change(self, group_id: str) -> NodeGroupView:
        """The same, for a call that changes the group: refused while shutting down."""
        self._check_accepting()
        return NodeGroupView(self, require_group(self.cluster, group_id))

    # -- calls on the whole cluster ---------------------------------------------------------------

    def node_groups(self) -> tuple[NodeGroupSpec, ...]:
        self.check_ready()
        return self.cluster.node_groups

    def reported_max(self, spec: NodeGroupSpec) -> int:
        """The max size CA is told for a group (``Inventory.reported_max``: configured,
        held after a start, bounded by the project's quota); NodeGroups and NodeGroupForNode
        say the same."""
        # The clock anyio.current_time() reads (the event loop's is time.monotonic's), read
        # without anyio's lookup of the running backend (0.5 µs against 0.04): CA asks this
        # once per node per loop.
        return self.inventory.reported_max(spec, time.monotonic())

    def node_answer(self, node: NodeInfo) -> NodeAnswer:
        """NodeGroupForNode: the node's group and the max size CA is told (the same as
        NodeGroups says, ``reported_max``), or None when the node is not one of ours."""
        self.check_ready()
        answer = self._answer_of(node)
        if answer is not None and self.reconciler.unjoined.watching(answer[0].group_id):
            self._seen_joined(answer[0].group_id, node)
        return answer

    def _seen_joined(self, group_id: str, node: NodeInfo) -> None:
        """CA asks NodeGroupForNode of every Node it lists: one that is not a fake of its
        own, with a server's provider id, says that server joined the cluster."""
        if is_fake_node(node.annotations):
            return
        server_id = self.cluster.provider_ids.parse(node.provider_id)
        server = None if server_id is None else self.inventory.snapshot.get(server_id)
        if server is not None:
            changes = self.reconciler.unjoined.joined(group_id, server, time.time())
            log_group_problems(changes, self._metrics)

    def count_unjoined(self, group_id: str, server_ids: list[str]) -> None:
        """Servers CA is deleting as never registered: told to the join watch, counted."""
        snapshot = self.inventory.snapshot
        servers = [snapshot.get(server_id) or server_id for server_id in server_ids]
        added, changes = self.reconciler.unjoined.deleted_unjoined(group_id, servers, time.time())
        if self._metrics is not None and added:
            self._metrics.deleted_before_joining.labels(group_id).inc(added)
        log_group_problems(changes, self._metrics)

    def _answer_of(self, node: NodeInfo) -> NodeAnswer:
        # The event loop's clock, as in reported_max.
        return self.inventory.node_answer(node, time.monotonic(), self._checked_nodes.check)

    def node_price(self, node: NodeInfo, start: float, end: float) -> float:
        self.check_ready()
        answer = self._answer_of(node)
        spec = None if answer is None else answer[0]
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

    # -- lifecycle --------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Nudge a sync; refuse (CA then skips its loop) if the inventory is too stale, or if
        this process is a standby (CA reached it before the Service's endpoint moved: its
        whole loop is skipped, rather than run on NodeGroups answered with nothing)."""
        self.reconciler.nudge()
        stale = self.staleness() or self._standby()
        if stale is not None:
            raise NotReady(stale)

    def staleness(self) -> str | None:
        """Why the inventory is too stale to act on (Refresh fails, /readyz answers 503), or
        None when it is not."""
        age = self.inventory.age(anyio.current_time())
        if age is None:
            return "inventory not synced with OpenStack yet"
        limit = self.settings.reconcile.max_inventory_age
        if age > limit:
            return (
                f"inventory is {age:.0f}s old (limit {limit:.0f}s): "
                f"OpenStack unreachable? last error: {self.reconciler.status.last_error}"
            )
        return None

    def cleanup(self) -> None:
        """CA is shutting down. Accepted work is still carried out; say how much there is."""
        self.check_ready()
        bind_contextvars(
            queued_tasks=len(self.queue), deleting=len(self.inventory.ledger.deleting_ids())
        )


class NodeGroupView:
    """One node group as one CA call sees it: resolved, and the inventory found ready, by
    ``Controller.group`` (or ``group_to_change``); each method then answers or acts with no
    check repeated. Made per call, so a reload never leaves a call half on the old spec."""

    __slots__ = ("_controller", "spec")

    def __init__(self, controller: Controller, spec: NodeGroupSpec) -> None:
        self._controller = controller
        self.spec = spec

    @property
    def group_id(self) -> str:
        return self.spec.group_id

    # -- reads ------------------------------------------------------------------------------------

    def generation(self) -> int:
        """Changes whenever anything CA sees of the group may have changed: answers derived
        from the group stay true while it does not."""
        return self._controller.inventory.generation(self.spec.group_id)

    def target_size(self) -> int:
        return self._controller.inventory.target_size(self.spec.group_id)

    def nodes(self) -> list[Instance]:
        return self._controller.inventory.instances(self.spec.group_id)

    def template(self) -> NodeTemplate:
        spec = self.spec
        inventory = self._controller.inventory
        flavor = inventory.flavor(spec.group_id)
        if flavor is None:
            raise NotSupported(f"flavor {spec.flavor!r} of node group {spec.group_id!r} is unknown")
        return build_template(self._controller.cluster, spec, flavor, region=inventory.region)

    def options(self, defaults: AutoscalingOptions) -> AutoscalingOptions:
        return group_options(defaults, self.spec.options)

    def options_refusal(self) -> NotSupported | None:
        """Why the group answers no options (CA keeps its defaults), or None."""
        return options_refusal(self.spec.options)

    # -- mutations: planned in the domain, which refuses a request whole or changes it all ---------

    async def increase_size(self, delta: int, time_left: float | None = None) -> None:
        """IncreaseSize: the target rises at once; the creates are queued (and may be sent)
        only once the promise record holding them is written, before the answer. A record
        that cannot be written fails the call with the creates taken back."""
        controller, group_id = self._controller, self.spec.group_id
        stale = controller.staleness()
        if stale is not None:
            # The group's place out of reach past max_inventory_age: a create sent there now
            # would sit in doubt, creating to CA with no error, until the place is back and
            # the doubt window over. Refused, CA backs the group off and scales another.
            raise NotReady(f"node group {group_id!r} cannot scale up now: {stale}")
        inventory = controller.inventory
        now = anyio.current_time()
        plan = plan_increase(controller.cluster, inventory, group_id, delta, now)
        controller.queue.ensure_room(plan.creates)
        controller.check_record_room(plan.creates)
        # Creates that will claim a warm server take no new quota (an offloaded one takes its
        # cores and RAM back: counted as spent, on the safe side).
        warm = inventory.claimable(self.spec)
        if self.spec.warm_pool is not None and self.spec.warm_pool.state.holds_compute:
            cold = max(0, plan.creates - warm)
        else:
            cold = plan.creates
        request_ids = inventory.ledger.accept_creates(group_id, plan.creates, now)
        try:
            await controller.keep_promises(time_left)
        except NotReady:
            inventory.ledger.withdraw_creates(request_ids)
            raise
        # Cancelled meanwhile (a DecreaseTargetSize) are left out: the ledger knows them no
        # more, and a worker would drop them anyway.
        wanted = [rid for rid in request_ids if inventory.ledger.create(rid) is not None]
        controller.queue.put_new([CreateTask(request_id, group_id) for request_id in wanted])
        inventory.quota.spend(group_id, cold)
        controller.count_creates(group_id, plan.creates)
        if plan.error is not None:
            refused = inventory.ledger.refuse_creates(group_id, plan.refused, plan.error, now)
            controller.carry_out(refused)
        bind_contextvars(delta=delta, target=inventory.target_size(group_id))

    async def delete_nodes(self, nodes: list[NodeInfo], time_left: float | None = None) -> None:
        """DeleteNodes: an OK is a promise that every server named goes, kept even if this
        process is killed right after answering: the servers are marked deleting (they leave
        the target at once) and written to the promise record before the answer; the
        workers then send the deletes, each after a fresh read of the server (one that lost
        this cluster's marks is never deleted, and leaves CA's view), and after a kill the
        next holder sends them. Nothing here waits on Nova."""
        if not self._controller.keeps_promises:
            await self._delete_before_answering(nodes, time_left)
            return
        controller, group_id = self._controller, self.spec.group_id
        inventory = controller.inventory
        ledger = inventory.ledger
        check_nodes(nodes)
        pairs = [(node.name, node.provider_id) for node in nodes]
        unregistered = _never_registered_servers(nodes, controller.cluster)
        plan = plan_delete(controller.cluster, inventory, group_id, pairs)
        controller.queue.ensure_room(len(plan.servers))
        controller.check_record_room(len(plan.servers))
        orders = ledger.accept_delete(plan, anyio.current_time())
        if plan.servers:
            try:
                await controller.keep_promises(time_left)
            except NotReady as exc:
                for server_id in plan.servers:
                    now = anyio.current_time()
                    controller.carry_out(ledger.delete_not_sent(server_id, str(exc), now))
                raise
        controller.carry_out(orders)
        self._tell_delete(plan, unregistered)
        bind_contextvars(target=inventory.target_size(group_id))

    def _tell_delete(self, plan: DeletePlan, unregistered: set[str]) -> None:
        """What a DeleteNodes decided, counted and bound to the call's access line."""
        unjoined = [server_id for server_id in plan.servers if server_id in unregistered]
        if unjoined:
            self._controller.count_unjoined(plan.group_id, unjoined)
            bind_contextvars(never_registered=len(unjoined))
        bind_contextvars(
            servers=len(plan.servers),
            failed_creates=len(plan.failures),
            cancelled_creates=len(plan.cancels) + len(plan.give_ups),
            repeats=plan.repeats + len(plan.unknown),
        )

    async def _delete_before_answering(
        self, nodes: list[NodeInfo], time_left: float | None
    ) -> None:
        """DeleteNodes with no record kept outside this process (election off): an OK is
        a promise that every server named goes, kept even if this process is killed right
        after answering, so each DELETE reaches Nova before the answer. The servers are
        read first: one that lost this cluster's marks refuses the request whole (and leaves
        CA's view); then every DELETE is sent at once. A delete that did not reach Nova in
        time is taken back (the server is counted again) and the call fails, saying which;
        the others went, as CA expects of a failed scale-down."""
        controller, group_id = self._controller, self.spec.group_id
        inventory = controller.inventory
        check_nodes(nodes)
        pairs = [(node.name, node.provider_id) for node in nodes]
        unregistered = _never_registered_servers(nodes, controller.cluster)
        plan = plan_delete(controller.cluster, inventory, group_id, pairs)
        budget = controller.delete_budget(time_left)
        begun = anyio.current_time()
        gone: tuple[str, ...] = ()
        if plan.servers:
            read = await controller.deleter.read_marks(plan.servers, group_id, budget / 2)
            if read.unowned:
                controller.carry_out(inventory.ledger.marks_lost(read.unowned, begun))
                raise PreconditionFailed(
                    f"{_listed(read.unowned)}: no longer carrying "
                    f"this cluster's ownership marks for node group {group_id!r} (a metadata "
                    "key or tag removed or changed by hand): osas never deletes such a server, "
                    "and no longer reports it; nothing was deleted"
                )
            if read.failed:
                raise CloudUnavailable(
                    f"could not read {_listed(read.failed)} before deleting "
                    f"({next(iter(read.failed.values()))}); nothing was deleted"
                )
            gone = read.gone
            # The reads awaited: the decision is taken again on what the inventory holds now.
            plan = plan_delete(controller.cluster, inventory, group_id, pairs)
        ledger = inventory.ledger
        orders = ledger.accept_delete(plan, anyio.current_time())
        controller.carry_out(orders, sent_by_caller=set(plan.servers))
        self._tell_delete(plan, unregistered)
        if plan.servers:
            left = budget - (anyio.current_time() - begun)
            await self._send_deletes(plan, gone, left)
        bind_contextvars(target=inventory.target_size(group_id))

    async def _send_deletes(self, plan: DeletePlan, gone: tuple[str, ...], budget: float) -> None:
        controller = self._controller
        ledger = controller.inventory.ledger
        to_send = [server_id for server_id in plan.servers if server_id not in gone]
        unsent: dict[str, str] = {}
        settled: set[str] = set()
        try:
            for server_id in gone:
                controller.carry_out(
                    ledger.finish_delete(server_id, DeleteOutcome.GONE, anyio.current_time())
                )
                settled.add(server_id)
            results = await controller.deleter.send_all(to_send, budget)
            for server_id, result in results.items():
                if isinstance(result, DeleteOutcome) and result is not DeleteOutcome.FAILED:
                    now = anyio.current_time()
                    controller.carry_out(ledger.finish_delete(server_id, result, now))
                    controller.queue.release_held()  # a create waiting for it may go now
                    settled.add(server_id)
                elif isinstance(result, DeleteOutcome):
                    unsent[server_id] = "this osas is no longer the leader"
                else:
                    unsent[server_id] = result
        finally:
            # Also when CA gave up waiting and the call was cancelled: nothing is promised of
            # a delete not known to have reached Nova. (No await here: nothing can interrupt.)
            for server_id in plan.servers:
                if server_id not in settled:
                    reason = unsent.get(server_id, "the call ended first")
                    now = anyio.current_time()
                    controller.carry_out(ledger.delete_not_sent(server_id, reason, now))
        if unsent:
            raise CloudUnavailable(
                f"{len(unsent)} of {len(plan.servers)} deletes did not reach Nova "
                f"({next(iter(unsent.values()))}): {_listed(unsent)} stay"
                f"{'s' if len(unsent) == 1 else ''} in node group {plan.group_id!r}"
            )

    def decrease_target_size(self, delta: int) -> None:
        controller, group_id = self._controller, self.spec.group_id
        inventory = controller.inventory
        plan = plan_decrease(controller.cluster, inventory, group_id, delta)
        inventory.ledger.accept_decrease(plan, anyio.current_time())
        bind_contextvars(delta=delta, target=inventory.target_size(group_id))


def _never_registered_servers(nodes: list[NodeInfo], cluster: ClusterSpec) -> set[str]:
    """The servers CA names with its fake nodes for instances that never registered."""
    found: set[str] = set()
    for node in nodes:
        if never_registered(node.annotations):
            ref = parse_node(node.name, node.provider_id, cluster.provider_ids)
            if isinstance(ref, ServerNode):
                found.add(ref.server_id)
    return found


def _listed(server_ids: Mapping[str, object] | tuple[str, ...]) -> str:
    """Servers named in an answer: the first few, and how many more."""
    ids = list(server_ids)
    shown = ", ".join(f"server {server_id}" for server_id in ids[:3])
    return shown if len(ids) <= 3 else f"{shown} and {len(ids) - 3} more"  # noqa: PLR2004
