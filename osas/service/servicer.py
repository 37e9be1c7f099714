"""The CloudProvider servicer: each RPC turns its request into a controller call and the
result into a response. Decisions live in the domain; errors are mapped in ``errors``.

The answers CA asks for most are kept serialised and sent as they are until what they say
changes: NodeGroupNodes and NodeGroupTargetSize per group and inventory generation (which the
domain bumps on every change CA could see of a group), NodeGroupForNode per group (it carries
only configuration). A cached answer is an ``answers.Serialized``. GetOptions' answer is kept
by the gate, by its request bytes (``standing_answers``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.any_pb2 import Any as AnyMessage

from osas.domain.specs import NodeGroupSpec
from osas.engine.controller import NodeGroupView
from osas.engine.places import CaController
from osas.protocol import externalgrpc_pb2 as pb
from osas.service import translate
from osas.service.answers import Serialized, StandingAnswers
from osas.service.errors import answer_refused

if TYPE_CHECKING:
    # The generated stubs' own alias for a sync-or-aio context; it exists only in the .pyi.
    from osas.protocol.externalgrpc_pb2_grpc import _ServicerContext as Context


class _PerGeneration:
    """One answer per group, serialised once and kept while the group's inventory generation
    stays the same."""

    __slots__ = ("_answers",)

    def __init__(self) -> None:
        self._answers: dict[str, tuple[int, Serialized]] = {}

    def answer(self, group: NodeGroupView, render: Callable[[], bytes]) -> Serialized:
        generation = group.generation()
        cached = self._answers.get(group.group_id)
        if cached is None or cached[0] != generation:
            cached = (generation, Serialized(render()))
            self._answers[group.group_id] = cached
        return cached[1]


_NOT_OURS = Serialized(
    pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id="")).SerializeToString()
)


class CloudProviderServicer:
    """Every RPC of ``pb_grpc.CloudProviderServicer``; the hot reads answer from caches."""

    def __init__(self, controller: CaController) -> None:
        self._controller = controller
        # group id -> (the spec and max size it was made from, the answer)
        self._for_node: dict[str, tuple[NodeGroupSpec, int, Serialized]] = {}
        self._nodes = _PerGeneration()
        self._targets = _PerGeneration()

    def standing_answers(self) -> dict[str, StandingAnswers]:
        """The methods whose answers stand for the same request bytes (``answers``):
        GetOptions, which the request's defaults and the configuration alone decide."""
        controller = self._controller
        return {
            "NodeGroupGetOptions": StandingAnswers(lambda: controller.cluster, controller.answering)
        }

    def NodeGroups(self, request: pb.NodeGroupsRequest, context: Context) -> pb.NodeGroupsResponse:
        controller = self._controller
        groups = controller.node_groups()
        return pb.NodeGroupsResponse(
            nodeGroups=[translate.node_group(g, controller.reported_max(g)) for g in groups]
        )

    def NodeGroupForNode(self, request: pb.NodeGroupForNodeRequest, context: Context) -> Serialized:
        answer = self._controller.node_answer(translate.node_info(request.node))
        if answer is None:
            return _NOT_OURS
        spec, max_size = answer
        cached = self._for_node.get(spec.group_id)
        if cached is None or cached[0] is not spec or cached[1] != max_size:
            group = translate.node_group(spec, max_size)
            response = pb.NodeGroupForNodeResponse(nodeGroup=group)
            cached = (spec, max_size, Serialized(response.SerializeToString()))
            self._for_node[spec.group_id] = cached
        return cached[2]

    def PricingNodePrice(
        self, request: pb.PricingNodePriceRequest, context: Context
    ) -> pb.PricingNodePriceResponse:
        self._controller.check_ready()  # before the request is parsed, as for every RPC
        start, end = translate.price_period(request)
        price = self._controller.node_price(translate.node_info(request.node), start, end)
        return pb.PricingNodePriceResponse(price=price)

    def PricingPodPrice(
        self, request: pb.PricingPodPriceRequest, context: Context
    ) -> pb.PricingPodPriceResponse:
        self._controller.check_ready()
        start, end = translate.price_period(request)
        price = self._controller.pod_price(translate.pod_requests(request), start, end)
        return pb.PricingPodPriceResponse(price=price)

    def GPULabel(self, request: pb.GPULabelRequest, context: Context) -> pb.GPULabelResponse:
        return pb.GPULabelResponse(label=self._controller.gpu_label())

    def GetAvailableGPUTypes(
        self, request: pb.GetAvailableGPUTypesRequest, context: Context
    ) -> pb.GetAvailableGPUTypesResponse:
        # CA reads only the keys.
        types = {name: AnyMessage() for name in self._controller.gpu_types()}
        return pb.GetAvailableGPUTypesResponse(gpuTypes=types)

    def Cleanup(self, request: pb.CleanupRequest, context: Context) -> pb.CleanupResponse:
        self._controller.cleanup()
        return pb.CleanupResponse()

    def Refresh(self, request: pb.RefreshRequest, context: Context) -> pb.RefreshResponse:
        self._controller.refresh()
        return pb.RefreshResponse()

    def NodeGroupTargetSize(
        self, request: pb.NodeGroupTargetSizeRequest, context: Context
    ) -> Serialized:
        group = self._controller.group(request.id)
        return self._targets.answer(
            group,
            lambda: pb.NodeGroupTargetSizeResponse(
                targetSize=group.target_size()
            ).SerializeToString(),
        )

    async def NodeGroupIncreaseSize(
        self, request: pb.NodeGroupIncreaseSizeRequest, context: Context
    ) -> pb.NodeGroupIncreaseSizeResponse:
        group = self._controller.group_to_change(request.id)
        await group.increase_size(request.delta, context.time_remaining())
        return pb.NodeGroupIncreaseSizeResponse()

    async def NodeGroupDeleteNodes(
        self, request: pb.NodeGroupDeleteNodesRequest, context: Context
    ) -> pb.NodeGroupDeleteNodesResponse:
        group = self._controller.group_to_change(request.id)
        nodes = [translate.node_info(node) for node in request.nodes]
        await group.delete_nodes(nodes, context.time_remaining())
        return pb.NodeGroupDeleteNodesResponse()

    def NodeGroupDecreaseTargetSize(
        self, request: pb.NodeGroupDecreaseTargetSizeRequest, context: Context
    ) -> pb.NodeGroupDecreaseTargetSizeResponse:
        self._controller.group_to_change(request.id).decrease_target_size(request.delta)
        return pb.NodeGroupDecreaseTargetSizeResponse()

    def NodeGroupNodes(self, request: pb.NodeGroupNodesRequest, context: Context) -> Serialized:
        group = self._controller.group(request.id)
        return self._nodes.answer(
            group,
            lambda: pb.NodeGroupNodesResponse(
                instances=[translate.instance(i) for i in group.nodes()]
            ).SerializeToString(),
        )

    def NodeGroupTemplateNodeInfo(
        self, request: pb.NodeGroupTemplateNodeInfoRequest, context: Context
    ) -> pb.NodeGroupTemplateNodeInfoResponse:
        return translate.template_response(self._controller.group(request.id).template())

    def NodeGroupGetOptions(
        self, request: pb.NodeGroupAutoscalingOptionsRequest, context: Context
    ) -> Serialized:
        # Asked once per request bytes and configuration: the gate keeps the answer and gives
        # it again (``standing_answers``), CA asking four times per node per loop.
        group = self._controller.group(request.id)
        refusal = group.options_refusal()
        if refusal is not None:
            # UNIMPLEMENTED (keep your defaults) for a group without overrides, set without an
            # exception.
            return answer_refused(context, refusal)
        options = group.options(translate.options_from(request.defaults))
        response = pb.NodeGroupAutoscalingOptionsResponse(
            nodeGroupAutoscalingOptions=translate.options_message(options)
        )
        return Serialized(response.SerializeToString())
