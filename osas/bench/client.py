"""CA's side of every benchmark: one mTLS channel to a server, and the requests Cluster
Autoscaler sends, serialised once."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from osas.bench.processes import Tls
from osas.protocol import externalgrpc_pb2 as pb

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
CA_TIMEOUT = 5.0


@dataclass(frozen=True)
class Call:
    method: str
    request: bytes
    response: type[Message]


@dataclass(frozen=True)
class Timed:
    method: str
    start: float  # wall clock, to match osas's log
    seconds: float


class Client:
    """CA's side: one mTLS channel, requests serialised beforehand, answers parsed."""

    def __init__(self, port: int, tls: Tls) -> None:
        credentials = grpc.ssl_channel_credentials(tls.ca, tls.client_key, tls.client_cert)
        self.channel = grpc.aio.secure_channel(
            f"127.0.0.1:{port}",
            credentials,
            options=[("grpc.max_receive_message_length", 16 * 2**20)],
        )

    async def call(self, call: Call) -> Message | None:
        stub = self.channel.unary_unary(
            f"/{SERVICE}/{call.method}",
            request_serializer=None,
            response_deserializer=call.response.FromString,
        )
        try:
            return await stub(call.request, timeout=CA_TIMEOUT)  # type: ignore[no-any-return]
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise

    async def raw(self, method: str, request: bytes) -> bytes | None:
        stub = self.channel.unary_unary(
            f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None
        )
        try:
            return bytes(await stub(request, timeout=CA_TIMEOUT))
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise

    async def timed(self, calls: list[Call]) -> list[Timed]:
        # What this process already holds (the samples and answers of earlier phases) is
        # frozen while it times calls: a full collection here would walk all of it in the
        # middle of a call and charge the pause to the server being measured.
        gc.freeze()
        try:
            samples = []
            for call in calls:
                wall, started = time.time(), time.perf_counter()
                await self.call(call)
                samples.append(Timed(call.method, wall, time.perf_counter() - started))
            return samples
        finally:
            gc.unfreeze()

    async def provider_ids(self, group: str) -> list[str]:
        answer = await self.call(nodes(group))
        if not isinstance(answer, pb.NodeGroupNodesResponse) or not answer.instances:
            msg = f"no instances in {group}"
            raise RuntimeError(msg)
        return [instance.id for instance in answer.instances]

    async def close(self) -> None:
        await self.channel.close(None)


def for_node(provider_id: str) -> Call:
    node = pb.ExternalGrpcNode(name=f"node-{provider_id[-12:]}", providerID=provider_id)
    request = pb.NodeGroupForNodeRequest(node=node).SerializeToString()
    return Call("NodeGroupForNode", request, pb.NodeGroupForNodeResponse)


def target_size(group: str) -> Call:
    request = pb.NodeGroupTargetSizeRequest(id=group).SerializeToString()
    return Call("NodeGroupTargetSize", request, pb.NodeGroupTargetSizeResponse)


def nodes(group: str) -> Call:
    request = pb.NodeGroupNodesRequest(id=group).SerializeToString()
    return Call("NodeGroupNodes", request, pb.NodeGroupNodesResponse)


def options(group: str) -> Call:
    # CA's defaults, as 1.35 sends them (durations in fields 8-10).
    defaults = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5, scaleDownGpuUtilizationThreshold=0.5
    )
    defaults.scaleDownUnneededDuration.FromSeconds(600)
    defaults.scaleDownUnreadyDuration.FromSeconds(1200)
    defaults.MaxNodeProvisionDuration.FromSeconds(900)
    request = pb.NodeGroupAutoscalingOptionsRequest(id=group, defaults=defaults)
    response = pb.NodeGroupAutoscalingOptionsResponse
    return Call("NodeGroupGetOptions", request.SerializeToString(), response)


def template(group: str) -> Call:
    request = pb.NodeGroupTemplateNodeInfoRequest(id=group).SerializeToString()
    return Call("NodeGroupTemplateNodeInfo", request, pb.NodeGroupTemplateNodeInfoResponse)
