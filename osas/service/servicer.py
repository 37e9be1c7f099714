"""The CloudProvider servicer: each RPC turns its request into a controller call and the
result into a response. Decisions live in the domain; errors are mapped in ``errors``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf.any_pb2 import Any as AnyMessage

from osas.engine.controller import Controller
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc
from osas.service import translate
from osas.service.errors import translate_errors

if TYPE_CHECKING:
    # The generated stubs' own alias for a sync-or-aio context; it exists only in the .pyi.
    from osas.protocol.externalgrpc_pb2_grpc import _ServicerContext as Context


class CloudProviderServicer(pb_grpc.CloudProviderServicer):
    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    @translate_errors
    async def NodeGroups(
        self, request: pb.NodeGroupsRequest, context: Context
    ) -> pb.NodeGroupsResponse:
        groups = self._controller.node_groups()
        return pb.NodeGroupsResponse(nodeGroups=[translate.node_group(g) for g in groups])

    @translate_errors
    async def NodeGroupForNode(
        self, request: pb.NodeGroupForNodeRequest, context: Context
    ) -> pb.NodeGroupForNodeResponse:
        spec = self._controller.node_group_for_node(translate.node_info(request.node))
        if spec is None:
            return pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id=""))
        return pb.NodeGroupForNodeResponse(nodeGroup=translate.node_group(spec))

    @translate_errors
    async def PricingNodePrice(
        self, request: pb.PricingNodePriceRequest, context: Context
    ) -> pb.PricingNodePriceResponse:
        self._controller.check_ready()  # before the request is parsed, as for every RPC
        start, end = translate.price_period(request)
        price = self._controller.node_price(translate.node_info(request.node), start, end)
        return pb.PricingNodePriceResponse(price=price)

    @translate_errors
    async def PricingPodPrice(
        self, request: pb.PricingPodPriceRequest, context: Context
    ) -> pb.PricingPodPriceResponse:
        self._controller.check_ready()
        start, end = translate.price_period(request)
        price = self._controller.pod_price(translate.pod_requests(request), start, end)
        return pb.PricingPodPriceResponse(price=price)

    @translate_errors
    async def GPULabel(self, request: pb.GPULabelRequest, context: Context) -> pb.GPULabelResponse:
        return pb.GPULabelResponse(label=self._controller.gpu_label())

    @translate_errors
    async def GetAvailableGPUTypes(
        self, request: pb.GetAvailableGPUTypesRequest, context: Context
    ) -> pb.GetAvailableGPUTypesResponse:
        # CA reads only the keys.
        types = {name: AnyMessage() for name in self._controller.gpu_types()}
        return pb.GetAvailableGPUTypesResponse(gpuTypes=types)

    @translate_errors
    async def Cleanup(self, request: pb.CleanupRequest, context: Context) -> pb.CleanupResponse:
        self._controller.cleanup()
        return pb.CleanupResponse()

    @translate_errors
    async def Refresh(self, request: pb.RefreshRequest, context: Context) -> pb.RefreshResponse:
        self._controller.refresh()
        return pb.RefreshResponse()

    @translate_errors
    async def NodeGroupTargetSize(
        self, request: pb.NodeGroupTargetSizeRequest, context: Context
    ) -> pb.NodeGroupTargetSizeResponse:
        return pb.NodeGroupTargetSizeResponse(targetSize=self._controller.target_size(request.id))

    @translate_errors
    async def NodeGroupIncreaseSize(
        self, request: pb.NodeGroupIncreaseSizeRequest, context: Context
    ) -> pb.NodeGroupIncreaseSizeResponse:
        self._controller.increase_size(request.id, request.delta)
        return pb.NodeGroupIncreaseSizeResponse()

    @translate_errors
    async def NodeGroupDeleteNodes(
        self, request: pb.NodeGroupDeleteNodesRequest, context: Context
    ) -> pb.NodeGroupDeleteNodesResponse:
        nodes = [translate.node_info(node) for node in request.nodes]
        self._controller.delete_nodes(request.id, nodes)
        return pb.NodeGroupDeleteNodesResponse()

    @translate_errors
    async def NodeGroupDecreaseTargetSize(
        self, request: pb.NodeGroupDecreaseTargetSizeRequest, context: Context
    ) -> pb.NodeGroupDecreaseTargetSizeResponse:
        self._controller.decrease_target_size(request.id, request.delta)
        return pb.NodeGroupDecreaseTargetSizeResponse()

    @translate_errors
    async def NodeGroupNodes(
        self, request: pb.NodeGroupNodesRequest, context: Context
    ) -> pb.NodeGroupNodesResponse:
        instances = self._controller.nodes(request.id)
        return pb.NodeGroupNodesResponse(instances=[translate.instance(i) for i in instances])

    @translate_errors
    async def NodeGroupTemplateNodeInfo(
        self, request: pb.NodeGroupTemplateNodeInfoRequest, context: Context
    ) -> pb.NodeGroupTemplateNodeInfoResponse:
        return translate.template_response(self._controller.template(request.id))

    @translate_errors
    async def NodeGroupGetOptions(
        self, request: pb.NodeGroupAutoscalingOptionsRequest, context: Context
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        defaults = translate.options_from(request.defaults)
        options = self._controller.options(request.id, defaults)
        return pb.NodeGroupAutoscalingOptionsResponse(
            nodeGroupAutoscalingOptions=translate.options_message(options)
        )
