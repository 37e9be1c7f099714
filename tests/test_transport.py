"""mTLS on the provider port, the plaintext health port, and readiness."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
import trustme
from fake_cloud import FakeCloud
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs
from support import (
    Provider,
    ca_client,
    eventually,
    expect_status,
    make_certs,
    make_config,
    running,
)

from osas.domain.errors import NodeGroupNotFound, NotReady
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc
from osas.service.answers import NO_MESSAGE, Serialized, StandingAnswers, refuse
from osas.service.gate import REQUEST_ID_KEY, RpcGate
from osas.service.metrics import RpcMetrics
from osas.sim.model import FakeNova

SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"]
METHODS = [method.name for method in SERVICE.methods]
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


def _pending_per_registered_method() -> int:
    """The tasks grpc.aio keeps pending, one per registered method of each running server."""
    return sum("_request_registered_call" in repr(task) for task in asyncio.all_tasks())


async def test_no_server_of_osas_waits_on_a_task_per_registered_method(tmp_path):
    # Invariant: each of CA's calls costs grpc.aio's server loop one pending request, whatever
    # else the port serves. grpc.aio keeps a task per registered method and waits on all of
    # them again for every call it takes, so health and reflection are served as generic
    # handlers; they still answer on both ports (the tests above and below).
    control = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_pb2_grpc.HealthServicer(), control)
    control.add_insecure_port("127.0.0.1:0")
    await control.start()
    try:
        # The probe sees what it looks for: a bare server with health registered has some.
        assert _pending_per_registered_method() > 0
    finally:
        await control.stop(None)
    await eventually(lambda: _pending_per_registered_method() == 0, what="the control stopped")
    async with running(make_config(tmp_path)) as provider:
        async with grpc.aio.insecure_channel(provider.address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert (await check).status == SERVING
        assert _pending_per_registered_method() == 0


def _decode_target_size(raw, context):
    return pb.NodeGroupTargetSizeRequest.FromString(raw)


@contextlib.asynccontextmanager
async def gated_target_size(gate, behavior, standing=None):
    """A real grpc.aio server on loopback whose NodeGroupTargetSize is ``behavior`` behind
    ``gate`` (with ``standing`` answers, if given); yields a CloudProvider stub connected to
    it."""
    handler = grpc.unary_unary_rpc_method_handler(
        gate.wrap("NodeGroupTargetSize", _decode_target_size, behavior, standing),
        # As osas serve does: a message, or an answer serialised before (answers.Serialized).
        response_serializer=lambda answer: answer.SerializeToString(),
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, {"NodeGroupTargetSize": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb_grpc.CloudProviderStub(channel)
    finally:
        await server.stop(None)


async def test_calls_past_max_concurrent_rpcs_are_refused_and_the_rest_served():
    """transport.max_concurrent_rpcs: the calls in progress past it get RESOURCE_EXHAUSTED at
    once; the ones within it are served. Counted by osas's call gate on a real server."""
    release = asyncio.Event()

    async def slow(request, context):
        await release.wait()
        return pb.NodeGroupTargetSizeResponse(targetSize=1)

    gate = RpcGate(SERVICE, RpcMetrics(CollectorRegistry(), METHODS), max_concurrent=2)
    async with gated_target_size(gate, slow) as stub:
        calls = [
            asyncio.ensure_future(stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest()))
            for _ in range(5)
        ]
        await eventually(lambda: gate.in_flight == 5 or any(c.done() for c in calls))
        await eventually(lambda: sum(c.done() for c in calls) == 3, what="3 refused")
        release.set()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert [o.code() for o in refused] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
    assert sum(1 for o in outcomes if not isinstance(o, Exception)) == 2
    assert gate.in_flight == 0


async def test_a_bug_answers_internal_without_its_details_and_logs_its_traceback():
    """Whatever a method raises that is not an osas error is INTERNAL, worded by osas (the
    exception's text could hold what is not the caller's), its traceback in the log; an osas
    error is its own status. Both are answered by setting the status: the gate's one coroutine
    sees the call through and counts it."""

    async def broken(request, context):
        if request.id == "nope":
            raise NodeGroupNotFound("node group 'nope' is not configured")
        raise RuntimeError("password=hunter2")

    registry = CollectorRegistry()
    gate = RpcGate(SERVICE, RpcMetrics(registry, METHODS))
    with capture_logs() as logs:
        async with gated_target_size(gate, broken) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as bug:
                await stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="workers"))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="nope"))
    assert bug.value.code() is grpc.StatusCode.INTERNAL
    assert bug.value.details() == "NodeGroupTargetSize failed; see the osas log"
    assert refused.value.code() is grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == "node group 'nope' is not configured"
    failed = [e for e in logs if e["event"] == "rpc failed"]
    assert len(failed) == 1
    assert isinstance(failed[0]["exc_info"], RuntimeError)
    lines = [(e["code"], e["request_id"]) for e in logs if e["event"] == "rpc"]
    assert [code for code, _ in lines] == ["INTERNAL", "NOT_FOUND"]
    assert dict(bug.value.trailing_metadata())[REQUEST_ID_KEY] == lines[0][1]
    handled = "osas_grpc_server_handled_total"
    for code in ("INTERNAL", "NOT_FOUND"):
        labels = {"method": "NodeGroupTargetSize", "code": code}
        assert registry.get_sample_value(handled, labels) == 1
    assert gate.in_flight == 0


async def test_a_standing_answer_is_given_only_while_its_configuration_holds_and_osas_answers():
    """The gate gives a kept answer (UNIMPLEMENTED, or OK with its bytes) again from its
    request bytes alone, without asking the method. It asks again for other bytes, once the
    configuration the answer was decided from is replaced (a reload), and whenever osas may not
    answer (a standby, before the first sync): then the method's own refusal goes out. Every
    call is counted."""
    configuration, answering, asked = [object()], [True], []
    answered = Serialized(pb.NodeGroupTargetSizeResponse(targetSize=3).SerializeToString())

    def behavior(request, context):
        asked.append(request.id)
        if not answering[0]:
            raise NotReady("standing by: osas-a holds the leader lease")
        if request.id == "answered":
            return answered
        return refuse(context, grpc.StatusCode.UNIMPLEMENTED, "no overrides")

    registry = CollectorRegistry()
    gate = RpcGate(SERVICE, RpcMetrics(registry, METHODS))
    standing = StandingAnswers(lambda: configuration[0], lambda: answering[0])

    async def expect(code, group="workers"):
        request = pb.NodeGroupTargetSizeRequest(id=group)
        return await expect_status(code, stub.NodeGroupTargetSize(request))

    async with gated_target_size(gate, behavior, standing) as stub:
        for _ in range(3):
            assert await expect(grpc.StatusCode.UNIMPLEMENTED) == "no overrides"
        assert asked == ["workers"]
        await expect(grpc.StatusCode.UNIMPLEMENTED, "gpu")
        assert asked == ["workers", "gpu"]
        configuration[0] = object()  # reloaded
        await expect(grpc.StatusCode.UNIMPLEMENTED)
        assert asked == ["workers", "gpu", "workers"]
        answering[0] = False
        assert "standing by" in await expect(grpc.StatusCode.UNAVAILABLE)
        assert asked == ["workers", "gpu", "workers", "workers"]
        answering[0] = True
        await expect(grpc.StatusCode.UNIMPLEMENTED)
        assert len(asked) == 4  # kept under the same configuration
        for _ in range(2):
            request = pb.NodeGroupTargetSizeRequest(id="answered")
            assert (await stub.NodeGroupTargetSize(request)).targetSize == 3
        assert asked[4:] == ["answered"]
    handled = "osas_grpc_server_handled_total"
    labels = {"method": "NodeGroupTargetSize"}
    assert registry.get_sample_value(handled, {**labels, "code": "UNIMPLEMENTED"}) == 6
    assert registry.get_sample_value(handled, {**labels, "code": "UNAVAILABLE"}) == 1
    assert registry.get_sample_value(handled, {**labels, "code": "OK"}) == 2
    assert registry.get_sample_value("osas_grpc_server_started_total", labels) == 9


def test_standing_answers_are_bounded():
    """One kept answer per distinct request; past the bound the kept ones are dropped, never
    grown without end by a client sending ever new bytes."""
    standing = StandingAnswers(lambda: None, lambda: True, limit=3)
    unimplemented = (grpc.StatusCode.UNIMPLEMENTED, "no overrides", NO_MESSAGE)
    for index in range(3):
        standing.keep(b"%d" % index, None, *unimplemented)
    assert standing.get(b"2") == unimplemented
    standing.keep(b"3", None, *unimplemented)
    assert [standing.get(b"%d" % index) for index in range(3)] == [None] * 3
    assert standing.get(b"3") is not None
