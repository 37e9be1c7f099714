"""mTLS on the provider port, the plaintext health port, and readiness."""

from __future__ import annotations

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support import Provider, ca_client, expect_status, make_certs, make_config, running

from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc
from osas.sim.cloud import FakeCloud
from osas.sim.model import FakeNova

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path)


@pytest.fixture
def mtls_config(tmp_path, certs):
    tls = {
        "cert_file": str(certs.server_cert),
        "key_file": str(certs.server_key),
        "client_ca_file": str(certs.client_ca),
    }
    return make_config(tmp_path, insecure=False, tls=tls)


async def node_groups_with(address: str, credentials: grpc.ChannelCredentials) -> None:
    async with grpc.aio.secure_channel(address, credentials) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)


async def test_mtls_accepts_a_client_of_the_configured_ca(mtls_config, certs):
    async with running(mtls_config) as provider:
        address = f"localhost:{provider.app.server.port}"
        async with ca_client(address, certs) as ca:
            assert {g.id for g in await ca.node_groups()} == {"workers", "gpu"}


async def test_mtls_refuses_a_client_without_certificate(mtls_config, certs):
    async with running(mtls_config) as provider:
        address = f"localhost:{provider.app.server.port}"
        credentials = grpc.ssl_channel_credentials(root_certificates=certs.ca_pem)
        await expect_status(grpc.StatusCode.UNAVAILABLE, node_groups_with(address, credentials))


async def test_mtls_refuses_a_client_certificate_from_another_ca(mtls_config, certs):
    stranger = trustme.CA().issue_cert("cluster-autoscaler")
    async with running(mtls_config) as provider:
        address = f"localhost:{provider.app.server.port}"
        credentials = grpc.ssl_channel_credentials(
            root_certificates=certs.ca_pem,
            private_key=stranger.private_key_pem.bytes(),
            certificate_chain=b"".join(b.bytes() for b in stranger.cert_chain_pems),
        )
        await expect_status(grpc.StatusCode.UNAVAILABLE, node_groups_with(address, credentials))


async def test_mtls_refuses_plaintext_clients(mtls_config):
    async with running(mtls_config) as provider:
        address = f"127.0.0.1:{provider.app.server.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            call = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
            await expect_status(grpc.StatusCode.UNAVAILABLE, call)


async def test_health_port_is_plaintext_and_serves_only_health(mtls_config):
    async with running(mtls_config) as provider:
        address = f"127.0.0.1:{provider.app.server.health_port}"
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"):
                response = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert response.status == SERVING
            stub = pb_grpc.CloudProviderStub(channel)
            call = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
            await expect_status(grpc.StatusCode.UNIMPLEMENTED, call)


async def test_every_rpc_unavailable_until_the_first_sync(tmp_path):
    nova = FakeNova()
    nova.faults.error_rate = 1.0  # OpenStack is down at start
    config = make_config(tmp_path)
    provider = Provider(config, FakeCloud(nova))
    await provider.start(wait_serving=False)
    try:
        async with grpc.aio.insecure_channel(provider.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            check = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == NOT_SERVING
            stub = pb_grpc.CloudProviderStub(channel)
            calls = [
                stub.Refresh(pb.RefreshRequest()),
                stub.NodeGroups(pb.NodeGroupsRequest()),
                stub.NodeGroupForNode(pb.NodeGroupForNodeRequest()),
                stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="workers")),
                stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1)),
                stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="workers")),
                stub.NodeGroupDecreaseTargetSize(
                    pb.NodeGroupDecreaseTargetSizeRequest(id="workers", delta=-1)
                ),
                stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="workers")),
                stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="workers")),
                stub.NodeGroupGetOptions(pb.NodeGroupAutoscalingOptionsRequest(id="gpu")),
                stub.GPULabel(pb.GPULabelRequest()),
                stub.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest()),
                stub.PricingNodePrice(pb.PricingNodePriceRequest()),
                stub.PricingPodPrice(pb.PricingPodPriceRequest()),
            ]
            for call in calls:
                details = await expect_status(grpc.StatusCode.UNAVAILABLE, call)
                assert "not synced" in details
            assert nova.calls["servers.create"] == 0

            nova.faults.error_rate = 0.0  # OpenStack is back
            await provider.wait_serving()
            check = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == SERVING
            response = await stub.NodeGroups(pb.NodeGroupsRequest())
            assert len(response.nodeGroups) == 2
    finally:
        await provider.stop()


async def test_health_goes_not_serving_on_shutdown(tmp_path):
    async with running(make_config(tmp_path)) as provider:
        address = f"127.0.0.1:{provider.app.server.health_port}"
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING
            provider.app.stop()
            assert (await watch.read()).status == NOT_SERVING


async def test_reflection_lists_the_provider_service(tmp_path):
    async with (
        running(make_config(tmp_path)) as provider,
        grpc.aio.insecure_channel(provider.address) as channel,
    ):
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        response = await call.read()
        await call.done_writing()
    names = {s.name for s in response.list_services_response.service}
    assert "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider" in names
    assert "grpc.health.v1.Health" in names
