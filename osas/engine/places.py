"""CA's calls over node groups that live in several places (clouds and regions).

Each place has a ``Controller`` of its own over its own inventory, reconciler and workers; the
router in front of them is what the servicer sees. A call on one group goes to its place's
controller and to nothing else: a place that fails (unreachable, refusing the credentials,
rate limited, its clock off) answers for its own groups only, from what it last listed, and
never slows the calls on the others. The calls on the whole cluster gather every place that has
done its first listing: a place that has not is left out of NodeGroups and NodeGroupForNode
(its nodes are then not autoscaled, which is safe) until it has. Refresh fails only when no
place has a fresh listing (FACTS.md: a Refresh error aborts CA's whole loop), or on a standby.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

from osas.domain.errors import NodeNotFound, NotReady
from osas.domain.inventory import NodeAnswer
from osas.domain.limits import NodeInfo
from osas.domain.sizing import require_group
from osas.domain.specs import ClusterSpec, NodeGroupSpec
from osas.engine.controller import ConfiguredAnswers, Controller, NodeGroupView


class PlacesController(ConfiguredAnswers):
    """The controllers of several places, as one: the calls the servicer makes on
    ``Controller``, each sent where it belongs. ``names`` says each place (same order as
    ``controllers``), for the reasons given to CA."""

    def __init__(
        self,
        controllers: Sequence[Controller],
        names: Sequence[str],
        *,
        standby: Callable[[], str | None],
    ) -> None:
        self._controllers = tuple(controllers)
        self._names = tuple(names)
        self._standby = standby
        self._merged: tuple[tuple[ClusterSpec, ...], ClusterSpec] | None = None

    @property
    def controllers(self) -> tuple[Controller, ...]:
        return self._controllers

    @property
    def cluster(self) -> ClusterSpec:
        """The configuration in force, every place's groups in one (in the file's order, as
        each place keeps its own): rebuilt when a reload changes any place's."""
        parts = tuple(controller.cluster for controller in self._controllers)
        merged = self._merged
        if merged is None or any(a is not b for a, b in zip(merged[0], parts, strict=True)):
            groups = tuple(spec for part in parts for spec in part.node_groups)
            merged = (parts, dataclasses.replace(parts[0], node_groups=groups))
            self._merged = merged
        return merged[1]

    def _owner(self, group_id: str) -> Controller:
        for controller in self._controllers:
            if controller.cluster.group(group_id) is not None:
                return controller
        require_group(self.cluster, group_id)  # raises: not configured (or not a valid id)
        raise AssertionError(group_id)  # pragma: no cover - require_group raised

    def _synced(self) -> list[Controller]:
        return [c for c in self._controllers if c.inventory.synced]

    def _not_answering(self) -> str | None:
        standby = self._standby()
        if standby is not None:
            return standby
        if not self._synced():
            return "inventory not synced with OpenStack yet in any place; try again shortly"
        return None

    def stop_accepting(self) -> None:
        for controller in self._controllers:
            controller.stop_accepting()

    # -- the calls on one node group: its place's alone ----------------------------------------

    def group(self, group_id: str) -> NodeGroupView:
        self.check_ready()
        return self._owner(group_id).group(group_id)

    def group_to_change(self, group_id: str) -> NodeGroupView:
        self.check_ready()
        return self._owner(group_id).group_to_change(group_id)

    def reported_max(self, spec: NodeGroupSpec) -> int:
        return self._owner(spec.group_id).reported_max(spec)

    # -- the calls on the whole cluster: every place with a first listing --------------------

    def node_groups(self) -> tuple[NodeGroupSpec, ...]:
        self.check_ready()
        return tuple(spec for c in self._synced() for spec in c.cluster.node_groups)

    def node_answer(self, node: NodeInfo) -> NodeAnswer:
        self.check_ready()
        for controller in self._synced():
            answer = controller.node_answer(node)
            if answer is not None:
                return answer  # Nova's uuids are unique across regions and clouds
        return None

    def node_price(self, node: NodeInfo, start: float, end: float) -> float:
        self.check_ready()
        for controller in self._synced():
            try:
                return controller.node_price(node, start, end)
            except NodeNotFound:
                continue
        raise NodeNotFound(f"node {node.provider_id or node.name!r} is not of any node group")

    def pod_price(self, requests: Mapping[str, Decimal], start: float, end: float) -> float:
        self.check_ready()
        return self._synced()[0].pod_price(requests, start, end)

    # -- lifecycle ---------------------------------------------------------------------------

    def refresh(self) -> None:
        """Nudge every place; refuse only on a standby, or when no place's listing is fresh
        (one stale place must not abort CA's loop for the groups of the others)."""
        for controller in self._controllers:
            controller.reconciler.nudge()
        reason = self._standby() or self.staleness()
        if reason is not None:
            raise NotReady(reason)

    def staleness(self) -> str | None:
        """Why no place's inventory can be acted on, or None when one can."""
        stale = [
            f"{name}: {reason}"
            for name, controller in zip(self._names, self._controllers, strict=True)
            if (reason := controller.staleness()) is not None
        ]
        return "; ".join(stale) if len(stale) == len(self._controllers) else None

    def cleanup(self) -> None:
        self.check_ready()
        for controller in self._synced():
            controller.cleanup()


# What the servicer answers CA through: one place's controller, or the router over several.
CaController = Controller | PlacesController
