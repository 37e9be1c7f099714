"""A client that calls osas the way cluster-autoscaler's externalgrpc provider does: the same
RPCs, the same 5 s deadline per call. The demo plays CA with it; the tests drive osas with it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from osas.domain.problems import FAKE_NODE_REASON
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc

# CA's default grpc_timeout.
CA_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class ClientTls:
    """What CA's cloud-config names: cacert, cert, key (here as PEM bytes)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


class CaClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = pb_grpc.CloudProviderStub(channel)

    async def refresh(self) -> None:
        await self.stub.Refresh(pb.RefreshRequest(), timeout=CA_TIMEOUT)

    async def node_groups(self) -> list[pb.NodeGroup]:
        response = await self.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=CA_TIMEOUT)
        return list(response.nodeGroups)

    async def group_for_node(self, name: str, provider_id: str) -> pb.NodeGroup:
        request = pb.NodeGroupForNodeRequest(
            node=pb.ExternalGrpcNode(name=name, providerID=provider_id)
        )
        response = await self.stub.NodeGroupForNode(request, timeout=CA_TIMEOUT)
        return response.nodeGroup

    async def target_size(self, group: str) -> int:
        request = pb.NodeGroupTargetSizeRequest(id=group)
        response = await self.stub.NodeGroupTargetSize(request, timeout=CA_TIMEOUT)
        return response.targetSize

    async def increase(self, group: str, delta: int) -> None:
        request = pb.NodeGroupIncreaseSizeRequest(id=group, delta=delta)
        await self.stub.NodeGroupIncreaseSize(request, timeout=CA_TIMEOUT)

    async def decrease(self, group: str, delta: int) -> None:
        request = pb.NodeGroupDecreaseTargetSizeRequest(id=group, delta=delta)
        await self.stub.NodeGroupDecreaseTargetSize(request, timeout=CA_TIMEOUT)

    async def delete(self, group: str, nodes: Sequence[tuple[str, str]]) -> None:
        """DeleteNodes for ``(name, provider_id)`` pairs."""
        request = pb.NodeGroupDeleteNodesRequest(
            id=group,
            nodes=[pb.ExternalGrpcNode(name=name, providerID=pid) for name, pid in nodes],
        )
        await self.stub.NodeGroupDeleteNodes(request, timeout=CA_TIMEOUT)

    async def delete_fake(self, group: str, instance_ids: Sequence[str], reason: str) -> None:
        """DeleteNodes with CA's fake nodes for instances that have no Node: name = provider
        id = instance id, and CA's annotation saying why (``unregistered`` past
        max-node-provision-time, ``create-error`` for instances with error info)."""
        annotations = {FAKE_NODE_REASON: reason}
        request = pb.NodeGroupDeleteNodesRequest(
            id=group,
            nodes=[
                pb.ExternalGrpcNode(name=i, providerID=i, annotations=annotations)
                for i in instance_ids
            ],
        )
        await self.stub.NodeGroupDeleteNodes(request, timeout=CA_TIMEOUT)

    async def nodes(self, group: str) -> list[pb.Instance]:
        request = pb.NodeGroupNodesRequest(id=group)
        response = await self.stub.NodeGroupNodes(request, timeout=CA_TIMEOUT)
        return list(response.instances)

    async def template(self, group: str) -> pb.NodeGroupTemplateNodeInfoResponse:
        request = pb.NodeGroupTemplateNodeInfoRequest(id=group)
        return await self.stub.NodeGroupTemplateNodeInfo(request, timeout=CA_TIMEOUT)

    async def options(
        self, group: str, defaults: pb.NodeGroupAutoscalingOptions
    ) -> pb.NodeGroupAutoscalingOptions:
        request = pb.NodeGroupAutoscalingOptionsRequest(id=group, defaults=defaults)
        response = await self.stub.NodeGroupGetOptions(request, timeout=CA_TIMEOUT)
        return response.nodeGroupAutoscalingOptions


@contextlib.asynccontextmanager
async def connect(address: str, tls: ClientTls | None = None) -> AsyncIterator[CaClient]:
    """A channel as CA opens it: mTLS, with the server name checked against ``address``."""
    if tls is None:
        channel = grpc.aio.insecure_channel(address)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=tls.ca_pem, private_key=tls.key_pem, certificate_chain=tls.cert_pem
        )
        channel = grpc.aio.secure_channel(address, credentials)
    async with channel:
        yield CaClient(channel)
