"""Every bad input of every RPC gets a precise status, and changes nothing."""

from __future__ import annotations

import uuid

import grpc
import pytest
from fake_cloud import FakeCloud
from structlog.testing import capture_logs
from support import (
    CLUSTER,
    CaClient,
    Provider,
    ca_client,
    eventually,
    expect_status,
    make_config,
    provider_id,
    running,
)

from osas.domain.servers import META_CLUSTER, META_GROUP, TAG_CLUSTER_PREFIX
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim.model import FakeNova

NOT_FOUND = grpc.StatusCode.NOT_FOUND
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
TAG = f"{TAG_CLUSTER_PREFIX}{CLUSTER}"


class World:
    """A provider with servers of both groups, another cluster's and unmarked ones."""

    def __init__(self, provider: Provider, ca: CaClient) -> None:
        self.provider = provider
        self.ca = ca
        nova = provider.nova
        self.workers = [
            nova.seed(
                name=f"{CLUSTER}-workers-{i}",
                metadata={META_CLUSTER: CLUSTER, META_GROUP: "workers"},
                tags=[TAG],
            ).server_id
            for i in range(2)
        ]
        self.gpu = nova.seed(
            name=f"{CLUSTER}-gpu-0", metadata={META_CLUSTER: CLUSTER, META_GROUP: "gpu"}, tags=[TAG]
        ).server_id
        self.foreign = nova.seed(
            name=f"{CLUSTER}-workers-9",  # looks like ours, carries another cluster's marks
            metadata={META_CLUSTER: "other", META_GROUP: "workers"},
            tags=[f"{TAG_CLUSTER_PREFIX}other"],
        ).server_id
        self.unmarked = nova.seed(name=f"{CLUSTER}-workers-8", tags=[TAG]).server_id

    async def snapshot(self) -> tuple[object, ...]:
        ca = self.ca
        nova = self.provider.nova
        return (
            await ca.target_size("workers"),
            await ca.target_size("gpu"),
            sorted((i.id, i.status.instanceState) for i in await ca.nodes("workers")),
            sorted((i.id, i.status.instanceState) for i in await ca.nodes("gpu")),
            sorted(s.server_id for s in nova.live_servers()),
            len(self.provider.app.queue),
            nova.calls["servers.create"],
            nova.calls["servers.delete"],
        )


@pytest.fixture
async def world(tmp_path):
    config = make_config(tmp_path, queue={"capacity": 4, "workers": 1})
    async with (
        running(config, FakeCloud(FakeNova())) as provider,
        ca_client(provider.address) as ca,
    ):
        built = World(provider, ca)
        await provider.sync()
        yield built


async def refused(world: World, code: grpc.StatusCode, call) -> str:
    before = await world.snapshot()
    details = await expect_status(code, call)
    assert await world.snapshot() == before
    assert details
    return details


def node(pid: str, name: str = "node") -> tuple[str, str]:
    return (name, pid)


async def test_unknown_group_everywhere(world):
    ca = world.ca
    for group in ("nope", "", "WORKERS", "workers "):
        await refused(world, NOT_FOUND, ca.target_size(group))
        await refused(world, NOT_FOUND, ca.increase(group, 1))
        await refused(world, NOT_FOUND, ca.decrease(group, -1))
        await refused(world, NOT_FOUND, ca.delete(group, [node(provider_id(world.workers[0]))]))
        await refused(world, NOT_FOUND, ca.nodes(group))
        await refused(world, NOT_FOUND, ca.template(group))
        await refused(world, NOT_FOUND, ca.options(group, pb.NodeGroupAutoscalingOptions()))


@pytest.mark.parametrize(("delta", "code"), [(0, INVALID), (-1, INVALID), (9, PRECONDITION)])
async def test_increase_size_refusals(world, delta, code):
    # workers: 2 servers, max 10: +9 would make 11.
    details = await refused(world, code, world.ca.increase("workers", delta))
    assert str(delta) in details


async def test_increase_size_full_queue_reserves_nothing(world):
    world.provider.nova.faults.latency = 2.0  # the single worker is slow: the queue fills up
    queue = world.provider.app.queue
    await world.ca.increase("workers", 4)
    await eventually(lambda: len(queue) == 3, what="one create taken by the worker")
    assert await world.ca.target_size("workers") == 6
    details = await refused(world, EXHAUSTED, world.ca.increase("workers", 2))
    assert "no room for 2" in details


@pytest.mark.parametrize("delta", [0, 1, 5])
async def test_decrease_target_size_needs_negative_delta(world, delta):
    await refused(world, INVALID, world.ca.decrease("workers", delta))


async def test_decrease_target_size_never_deletes(world):
    details = await refused(world, PRECONDITION, world.ca.decrease("workers", -1))
    assert "never deletes servers" in details


async def test_delete_nodes_refusals(world):
    ca = world.ca
    w0, w1 = (provider_id(s) for s in world.workers)
    cases = [
        (INVALID, []),  # no nodes at all
        (INVALID, [node(w0), node(w0)]),  # the same node twice
        (INVALID, [node(w0), node("", name=f"{CLUSTER}-workers-0")]),  # once by id, once by name
        (INVALID, [("", "")]),  # neither name nor provider id
        (INVALID, [node("aws:///us-east-1a/i-0123456789")]),
        (INVALID, [node("openstack:///not-a-uuid")]),
        (INVALID, [node(f"openstack://RegionOne/{world.workers[0]}")]),  # not this cluster's form
        (INVALID, [node(w0.upper())]),
        (INVALID, [node("x" * 300)]),  # absurdly long
        (INVALID, [node(f"osas://workers/{'z' * 32}")]),  # malformed placeholder
        (INVALID, [node(provider_id(world.gpu))]),  # a node of the other group
        (INVALID, [node(w0), node(provider_id(world.gpu))]),  # one bad node spoils the batch
        (NOT_FOUND, [node(provider_id(world.foreign))]),  # another cluster's server
        (NOT_FOUND, [node(provider_id(world.unmarked))]),  # a server without our marks
        (NOT_FOUND, [node(provider_id(str(uuid.uuid4())))]),  # nobody's server
        (INVALID, [node(f"osas://gpu/{uuid.uuid4().hex}")]),  # a placeholder of another group
        (INVALID, [node(f"osas://nope/{uuid.uuid4().hex}")]),  # of a group not configured
        (NOT_FOUND, [node("", name="stranger")]),  # name-only, not a server of ours
        (PRECONDITION, [node(w0), node(w1)]),  # 2 - 2 < min size 1
    ]
    for code, nodes in cases:
        await refused(world, code, ca.delete("workers", nodes))
    assert len(world.provider.nova.live_servers()) == 5


async def test_delete_of_an_unknown_placeholder_is_harmless(world):
    """CA's instance cache outlives an osas restart: a DeleteNodes of a placeholder of a
    configured group that this process does not know succeeds, changes nothing, and is logged
    (CA skips its whole clean-up loop when this call fails)."""
    ca = world.ca
    stale = f"osas://workers/{uuid.uuid4().hex}"
    before = await world.snapshot()
    with capture_logs() as logs:
        await ca.delete("workers", [node(stale, name=stale)])
        await ca.delete("workers", [node(stale, name=stale)])  # and again, as CA repeats it
    assert await world.snapshot() == before
    unknown = [e for e in logs if e["event"] == "unknown-placeholder"]
    assert [e["request_id"] for e in unknown] == [stale.rpartition("/")[2]]  # told once
    accepted = [e for e in logs if e["event"] == "rpc" and e["method"] == "NodeGroupDeleteNodes"]
    assert [(e["servers"], e["repeats"]) for e in accepted] == [(0, 1), (0, 1)]
    assert len(world.provider.nova.live_servers()) == 5


async def test_node_group_for_node_never_errors_for_strangers(world):
    ca = world.ca
    strangers = [
        ("n", provider_id(world.foreign)),
        ("n", provider_id(world.unmarked)),
        ("n", provider_id(str(uuid.uuid4()))),
        ("n", "openstack:///garbage"),
        ("n", "aws:///i-123"),
        ("n", f"openstack://RegionOne/{world.workers[0]}"),
        (f"{CLUSTER}-workers-9", ""),  # the foreign look-alike, by name
        ("", ""),
    ]
    for name, pid in strangers:
        group = await ca.group_for_node(name, pid)
        assert group.id == ""


async def test_oversized_nodes_are_refused_everywhere(world):
    ca = world.ca
    w0 = provider_id(world.workers[0])
    too_long = ("x" * 254, "")
    await refused(world, INVALID, ca.group_for_node(*too_long))
    await refused(world, INVALID, ca.delete("workers", [too_long]))
    many = [node(provider_id(str(uuid.uuid4()))) for _ in range(1001)]
    details = await refused(world, INVALID, ca.delete("workers", many))
    assert "at most 1000" in details
    stub = ca.stub
    hostile = [
        pb.ExternalGrpcNode(providerID=w0, labels={f"k{i}": "v" for i in range(513)}),
        pb.ExternalGrpcNode(providerID=w0, labels={"k": "v" * 64}),
        pb.ExternalGrpcNode(providerID=w0, annotations={"a": "v" * (256 * 1024 + 1)}),
        pb.ExternalGrpcNode(providerID=w0, annotations={"k" * 318: "v"}),
    ]
    for bad in hostile:
        request = pb.NodeGroupForNodeRequest(node=bad)
        await refused(world, INVALID, stub.NodeGroupForNode(request))
        delete = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[bad])
        await refused(world, INVALID, stub.NodeGroupDeleteNodes(delete))
    details = await refused(world, INVALID, ca.target_size("w" * 64))
    assert "longer than 63" in details


async def test_a_node_that_passed_is_refused_when_its_description_goes_past_a_bound(world):
    """NodeGroupForNode's check of a node is remembered by its description (CA asks for each
    node on every loop): the same node with a label past Kubernetes' bound is refused each
    time it comes, between answers for its valid description in either map order."""
    stub = world.ca.stub
    w0 = provider_id(world.workers[0])
    labels = {"kubernetes.io/hostname": "n0", "kubernetes.io/os": "linux"}
    valid = [
        pb.ExternalGrpcNode(name="n0", providerID=w0, labels=dict(order))
        for order in (labels.items(), reversed(labels.items()))
    ]
    hostile = pb.ExternalGrpcNode(name="n0", providerID=w0, labels={**labels, "k": "v" * 64})
    for node in (*valid, hostile, *valid, hostile):
        request = pb.NodeGroupForNodeRequest(node=node)
        if node is hostile:
            details = await refused(world, INVALID, stub.NodeGroupForNode(request))
            assert "label values" in details
        else:
            assert (await stub.NodeGroupForNode(request)).nodeGroup.id == "workers"


async def test_undecodable_requests_are_invalid_arguments(world):
    channel = world.ca.channel
    for method in ("NodeGroups", "NodeGroupDeleteNodes", "NodeGroupIncreaseSize"):
        call = channel.unary_unary(
            f"/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/{method}"
        )
        details = await refused(world, INVALID, call(b"\xff\xff\xff\xff"))
        assert "not a valid" in details


async def test_template_unknown_flavor_is_unimplemented(tmp_path):
    data_override = {
        "node_groups": [
            {
                "id": "odd",
                "min_size": 0,
                "max_size": 2,
                "flavor": "no-such-flavor",
                "image": "img",
                "networks": ["net"],
            }
        ]
    }
    config = make_config(tmp_path, **data_override)
    async with running(config) as provider, ca_client(provider.address) as ca:
        details = await expect_status(UNIMPLEMENTED, ca.template("odd"))
        assert "no-such-flavor" in details


async def test_options_without_overrides_is_unimplemented(world):
    await refused(
        world, UNIMPLEMENTED, world.ca.options("workers", pb.NodeGroupAutoscalingOptions())
    )


async def test_pricing_without_prices_is_unimplemented(world):
    stub = world.ca.stub
    period = {"startTimestamp": {"seconds": 0}, "endTimestamp": {"seconds": 3600}}
    node_request = pb.PricingNodePriceRequest(
        node=pb.ExternalGrpcNode(providerID=provider_id(world.workers[0])), **period
    )
    await refused(world, UNIMPLEMENTED, stub.PricingNodePrice(node_request))
    pod_request = pb.PricingPodPriceRequest(pod_bytes=b"", **period)
    await refused(world, INVALID, stub.PricingPodPrice(pod_request))


async def test_pricing_bad_requests(tmp_path):
    config = make_config(tmp_path, pricing={"cpu_per_hour": 0.01, "memory_gib_per_hour": 0.005})
    async with running(config) as provider, ca_client(provider.address) as ca:
        stub = ca.stub
        await expect_status(INVALID, stub.PricingNodePrice(pb.PricingNodePriceRequest()))
        backwards = pb.PricingPodPriceRequest(
            pod_bytes=b"\x0a\x00", startTimestamp={"seconds": 10}, endTimestamp={"seconds": 5}
        )
        await expect_status(INVALID, stub.PricingPodPrice(backwards))
        garbage = pb.PricingPodPriceRequest(
            pod_bytes=b"\xff\xff\xff", startTimestamp={"seconds": 0}, endTimestamp={"seconds": 5}
        )
        await expect_status(INVALID, stub.PricingPodPrice(garbage))
        # proto2 lets a non-UTF-8 string decode; found by the property tests.
        not_utf8 = pb.PricingPodPriceRequest(
            pod_bytes=b"\x12\r\x82\x02\n\n\x03\x00\x00\x00\n\x03\x00\x00\x80",
            startTimestamp={"seconds": 0},
            endTimestamp={"seconds": 5},
        )
        await expect_status(INVALID, stub.PricingPodPrice(not_utf8))
        unknown = pb.PricingNodePriceRequest(
            node=pb.ExternalGrpcNode(providerID=provider_id(str(uuid.uuid4()))),
            startTimestamp={"seconds": 0},
            endTimestamp={"seconds": 5},
        )
        await expect_status(NOT_FOUND, stub.PricingNodePrice(unknown))
