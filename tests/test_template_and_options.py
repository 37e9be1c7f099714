"""NodeGroupTemplateNodeInfo, NodeGroupGetOptions, GPU and pricing answers, over gRPC."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest
import structlog
from fake_cloud import FakeCloud
from prometheus_client import generate_latest
from support import (
    Provider,
    ca_client,
    config_data,
    expect_status,
    make_config,
    running,
    write_config,
)

from osas.cloud.openstack import OpenStackCloud
from osas.cloud.openstack_settings import OpenStackSettings
from osas.config import load_config
from osas.domain.inventory import Instance, InstanceState
from osas.domain.limits import MAX_GROUP_SIZE
from osas.domain.servers import ErrorClass, ErrorInfo
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import k8s_pb2 as k8s
from osas.service.translate import instance
from osas.sim import CLOUD_NAME, SimulatedOpenStack
from osas.sim.model import FakeNova

GIB = 1024**3


@pytest.fixture
async def ca(tmp_path):
    config = make_config(
        tmp_path,
        gpu_types=["nvidia-a100", "nvidia-t4"],
        pricing={"cpu_per_hour": 0.02, "memory_gib_per_hour": 0.01, "gpu_per_hour": 1.5},
    )
    async with running(config) as provider, ca_client(provider.address) as client:
        yield client


def decode(data: bytes) -> k8s.Node:
    node = k8s.Node()
    node.ParseFromString(data)
    return node


async def test_template_is_a_kubernetes_node_in_both_fields(ca):
    response = await ca.template("gpu")
    assert response.nodeBytes
    assert response.nodeInfo == response.nodeBytes  # CA <= 1.34.1 reads 1, newer CA reads 2
    node = decode(response.nodeBytes)
    # g1.xlarge in the fake cloud: 8 vCPU, 32 GiB RAM, 100 GiB disk; one GPU configured.
    expected = {
        "cpu": "8",
        "memory": "32768Mi",
        "ephemeral-storage": "100Gi",
        "pods": "110",
        "nvidia.com/gpu": "1",
    }
    assert {k: v.string for k, v in node.status.capacity.items()} == expected
    assert {k: v.string for k, v in node.status.allocatable.items()} == expected
    labels = dict(node.metadata.labels)
    assert labels["kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/arch"] == "amd64"
    assert labels["node.kubernetes.io/instance-type"] == "g1.xlarge"
    assert labels["topology.kubernetes.io/zone"] == "az-1"
    assert labels["nvidia.com/gpu.product"] == "nvidia-a100"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
        ("nvidia.com/gpu", "present", "NoSchedule")
    ]
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]
    assert node.status.nodeInfo.operatingSystem == "linux"
    assert node.status.nodeInfo.architecture == "amd64"
    assert node.metadata.name


async def test_template_of_plain_group_has_its_labels_and_no_gpu(ca):
    node = decode((await ca.template("workers")).nodeBytes)
    assert node.status.capacity["cpu"].string == "2"
    assert node.status.capacity["memory"].string == "4096Mi"
    assert "nvidia.com/gpu" not in node.status.capacity
    assert node.metadata.labels["pool"] == "workers"
    assert "topology.kubernetes.io/zone" not in node.metadata.labels
    assert "topology.kubernetes.io/region" not in node.metadata.labels  # the fake names none
    assert not node.spec.taints


async def test_the_template_is_in_the_region_the_cloud_resolves(tmp_path, monkeypatch):
    """cloud-provider-openstack labels every node with its OpenStack region: the template
    carries the region osas's cloud resolves, here from the clouds.yaml entry alone (osas's
    configuration names none), so that a pod bound to a region scales a group up from zero."""
    with SimulatedOpenStack(FakeNova(), region="North") as sim:
        clouds = tmp_path / "clouds.yaml"
        sim.write_clouds_yaml(clouds)
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
        cloud = OpenStackCloud(OpenStackSettings(cloud=CLOUD_NAME, backoff=0.01))
        async with (
            running(make_config(tmp_path), cloud) as provider,
            ca_client(provider.address) as ca,
        ):
            labels = decode((await ca.template("workers")).nodeBytes).metadata.labels
        assert labels["topology.kubernetes.io/region"] == "North"


def ca_defaults(*, legacy: bool) -> pb.NodeGroupAutoscalingOptions:
    """What CA sends: 1.35+ fills durations 8-10, CA <= 1.34.1 fills the legacy 3-5."""
    minutes = {"unneeded": 10, "unready": 20, "provision": 15}
    options = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5,
        scaleDownGpuUtilizationThreshold=0.5,
        zeroOrMaxNodeScaling=False,
        ignoreDaemonSetsUtilization=False,
    )
    fields = {
        "unneeded": ("scaleDownUnneededDuration", "scaleDownUnneededTime"),
        "unready": ("scaleDownUnreadyDuration", "scaleDownUnreadyTime"),
        "provision": ("MaxNodeProvisionDuration", "MaxNodeProvisionTime"),
    }
    for key, (new, old) in fields.items():
        if legacy:
            getattr(options, old).duration = minutes[key] * 60 * 10**9
        else:
            getattr(options, new).FromTimedelta(timedelta(minutes=minutes[key]))
    return options


@pytest.mark.parametrize("legacy", [False, True], ids=["ca-1.35", "ca-1.34"])
async def test_options_echo_defaults_and_apply_overrides(ca, legacy):
    options = await ca.options("gpu", ca_defaults(legacy=legacy))
    # Overridden in config: unneeded time 20m, zero-or-max scaling on.
    assert options.scaleDownUnneededDuration.ToTimedelta() == timedelta(minutes=20)
    assert options.scaleDownUnneededTime.duration == 20 * 60 * 10**9
    assert options.zeroOrMaxNodeScaling is True
    # Echoed from CA's defaults, in both encodings.
    assert options.scaleDownUtilizationThreshold == 0.5
    assert options.scaleDownGpuUtilizationThreshold == 0.5
    assert options.ignoreDaemonSetsUtilization is False
    assert options.scaleDownUnreadyDuration.ToTimedelta() == timedelta(minutes=20)
    assert options.scaleDownUnreadyTime.duration == 20 * 60 * 10**9
    assert options.MaxNodeProvisionDuration.ToTimedelta() == timedelta(minutes=15)
    assert options.MaxNodeProvisionTime.duration == 15 * 60 * 10**9
    for name in ("scaleDownUnneededTime", "scaleDownUnreadyTime", "MaxNodeProvisionTime"):
        assert options.HasField(name)  # CA <= 1.34 dereferences these without a check


@pytest.mark.parametrize("legacy", [False, True], ids=["ca-1.35", "ca-1.34"])
async def test_options_of_a_group_without_overrides_are_unimplemented_and_only_counted(
    tmp_path, legacy
):
    """UNIMPLEMENTED ("keep your defaults") with the domain's reason, every time, in both
    of CA's encodings; answered without an exception (CA asks four times per node per loop),
    counted in the metrics, never an access line. A group with overrides still answers."""
    config = make_config(tmp_path)
    with structlog.testing.capture_logs() as logs:
        async with running(config) as provider, ca_client(provider.address) as ca:
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await ca.options("workers", ca_defaults(legacy=legacy))
                assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
                assert refused.value.details() == (
                    "node group has no option overrides; CA keeps its defaults"
                )
            options = await ca.options("gpu", ca_defaults(legacy=legacy))
            assert options.zeroOrMaxNodeScaling is True
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await ca.options("nope", ca_defaults(legacy=legacy))
            assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
            scraped = generate_latest(provider.app.registry).decode()
    counted = 'osas_grpc_server_handled_total{code="UNIMPLEMENTED",method="NodeGroupGetOptions"}'
    assert f"{counted} 3.0" in scraped.splitlines()
    access = [e for e in logs if e["event"] == "rpc" and e.get("method") == "NodeGroupGetOptions"]
    assert [e["code"] for e in access] == ["NOT_FOUND"]


async def test_gpu_label_and_types(ca):
    label = await ca.stub.GPULabel(pb.GPULabelRequest())
    assert label.label == "nvidia.com/gpu.product"
    types = await ca.stub.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest())
    assert set(types.gpuTypes) == {"nvidia-a100", "nvidia-t4"}


async def test_node_price_of_a_template_node_from_the_table(ca):
    template = decode((await ca.template("gpu")).nodeBytes)
    request = pb.PricingNodePriceRequest(
        node=pb.ExternalGrpcNode(name=template.metadata.name, labels=template.metadata.labels),
        startTimestamp={"seconds": 0},
        endTimestamp={"seconds": 7200},
    )
    response = await ca.stub.PricingNodePrice(request)
    per_hour = 8 * 0.02 + 32 * 0.01 + 1 * 1.5
    assert response.price == pytest.approx(2 * per_hour)


@pytest.mark.parametrize("legacy", [False, True], ids=["ca-1.35", "ca-1.34"])
async def test_pod_price_from_requests(ca, legacy):
    pod = k8s.Pod()
    app = pod.spec.containers.add(name="app")
    app.resources.requests["cpu"].string = "500m"
    app.resources.requests["memory"].string = "1Gi"
    side = pod.spec.containers.add(name="side")
    side.resources.requests["cpu"].string = "500m"
    init = pod.spec.initContainers.add(name="init")
    init.resources.requests["memory"].string = "3Gi"  # more than the containers: it counts
    data = pod.SerializeToString()
    if legacy:
        request = pb.PricingPodPriceRequest(
            pod=data, startTime={"seconds": 0}, endTime={"seconds": 3600}
        )
    else:
        request = pb.PricingPodPriceRequest(
            pod_bytes=data, startTimestamp={"seconds": 0}, endTimestamp={"seconds": 3600}
        )
    response = await ca.stub.PricingPodPrice(request)
    assert response.price == pytest.approx(1 * 0.02 + 3 * 0.01)


def test_the_largest_node_group_answer_fits_in_what_ca_accepts():
    worst = ErrorInfo("ServerError500", "x" * 10_000, ErrorClass.OTHER)
    response = pb.NodeGroupNodesResponse(
        instances=[
            instance(Instance(f"osas://{'g' * 40}/{index:032x}", InstanceState.CREATING, worst))
            for index in range(int(MAX_GROUP_SIZE * 1.2))
        ]
    )
    assert response.ByteSize() < 4 * 1024 * 1024


async def test_an_options_refusal_given_again_from_its_bytes_ends_with_the_configuration(
    tmp_path,
):
    """GetOptions' answer is kept by its request bytes and given again from them alone (CA
    asks four times per node per loop, with the same bytes). A reload that gives the group
    overrides answers them at the next call with the same bytes, and again after; one that
    takes them away answers UNIMPLEMENTED again. Every call is counted."""
    data = config_data()
    path = write_config(tmp_path, data)
    provider = Provider(load_config(path), FakeCloud(FakeNova()), config_path=path)
    await provider.start()
    defaults = ca_defaults(legacy=False)
    try:
        async with ca_client(provider.address) as ca:
            for _ in range(3):
                details = await expect_status(
                    grpc.StatusCode.UNIMPLEMENTED, ca.options("workers", defaults)
                )
                assert details == "node group has no option overrides; CA keeps its defaults"
            data["node_groups"][0]["options"] = {"scale_down_unneeded_time": "7m"}
            write_config(tmp_path, data)
            assert await provider.app.reload_once() == "applied"
            for _ in range(2):
                options = await ca.options("workers", defaults)
                assert options.scaleDownUnneededDuration.ToTimedelta() == timedelta(minutes=7)
                assert options.scaleDownUnreadyDuration.ToTimedelta() == timedelta(minutes=20)
            del data["node_groups"][0]["options"]
            write_config(tmp_path, data)
            assert await provider.app.reload_once() == "applied"
            await expect_status(grpc.StatusCode.UNIMPLEMENTED, ca.options("workers", defaults))
        scraped = generate_latest(provider.app.registry).decode().splitlines()
    finally:
        await provider.stop()
    method = 'method="NodeGroupGetOptions"'
    assert f'osas_grpc_server_handled_total{{code="UNIMPLEMENTED",{method}}} 4.0' in scraped
    assert f'osas_grpc_server_handled_total{{code="OK",{method}}} 2.0' in scraped
    assert f"osas_grpc_server_started_total{{{method}}} 6.0" in scraped
