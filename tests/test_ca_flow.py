"""A real grpc.aio server on 127.0.0.1 driven the way cluster-autoscaler drives it."""

from __future__ import annotations

import grpc
import pytest
from fake_cloud import FakeCloud
from support import (
    CLUSTER,
    ca_client,
    eventually,
    expect_status,
    make_certs,
    make_config,
    provider_id,
    running,
    states,
)

from osas.domain.servers import META_CLUSTER, META_GROUP, TAG_CLUSTER_PREFIX
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim.model import FakeNova

RUNNING = pb.InstanceStatus.instanceRunning
CREATING = pb.InstanceStatus.instanceCreating
DELETING = pb.InstanceStatus.instanceDeleting
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def seed_ours(nova: FakeNova, group: str, count: int) -> list[str]:
    servers = [
        nova.seed(
            name=f"{CLUSTER}-{group}-{index}",
            metadata={META_CLUSTER: CLUSTER, META_GROUP: group},
            tags=[f"{TAG_CLUSTER_PREFIX}{CLUSTER}"],
        )
        for index in range(count)
    ]
    return [server.server_id for server in servers]


@pytest.fixture(params=["plaintext", "mtls"])
def transport(request, tmp_path):
    if request.param == "plaintext":
        return make_config(tmp_path), None
    certs = make_certs(tmp_path)
    tls = {
        "cert_file": str(certs.server_cert),
        "key_file": str(certs.server_key),
        "client_ca_file": str(certs.client_ca),
    }
    return make_config(tmp_path, insecure=False, tls=tls), certs


async def test_ca_loop_scale_up_and_down(transport):
    config, certs = transport
    nova = FakeNova()
    existing = seed_ours(nova, "workers", 2)
    async with running(config, FakeCloud(nova)) as provider:
        target = "localhost" if certs else "127.0.0.1"
        address = f"{target}:{provider.app.server.port}"
        async with ca_client(address, certs) as ca:
            # One CA loop: Refresh, NodeGroups, NodeGroupForNode per node, then sizes.
            await ca.refresh()
            groups = {g.id: (g.minSize, g.maxSize) for g in await ca.node_groups()}
            assert groups == {"workers": (1, 10), "gpu": (0, 3)}
            for index, server_id in enumerate(existing):
                group = await ca.group_for_node(f"node-{index}", provider_id(server_id))
                assert (group.id, group.minSize, group.maxSize) == ("workers", 1, 10)
            assert await ca.target_size("workers") == 2
            assert set(states(await ca.nodes("workers")).values()) == {RUNNING}

            # Scale up: the target rises before the call returns, servers follow.
            await ca.increase("workers", 3)
            assert await ca.target_size("workers") == 5
            await eventually(lambda: len(nova.live_servers()) == 5, what="3 servers created")
            created = [s for s in nova.live_servers() if s.server_id not in existing]
            for server in created:
                assert server.metadata[META_CLUSTER] == CLUSTER
                assert server.metadata[META_GROUP] == "workers"
                assert f"{TAG_CLUSTER_PREFIX}{CLUSTER}" in server.tags
                assert server.user_data == f"#cloud-config\nhostname: {server.name}\n"
            await provider.sync()
            assert await ca.target_size("workers") == 5
            listed = states(await ca.nodes("workers"))
            assert {provider_id(s.server_id) for s in created} <= listed.keys()
            assert all(listed[provider_id(s.server_id)] == CREATING for s in created)
            nova.activate()
            await provider.sync()
            assert set(states(await ca.nodes("workers")).values()) == {RUNNING}

            # Scale down two servers: the target drops at once, the servers go.
            doomed = [created[0].server_id, existing[0]]
            await ca.delete("workers", [("n", provider_id(s)) for s in doomed])
            assert await ca.target_size("workers") == 3
            listed = states(await ca.nodes("workers"))
            assert all(listed[provider_id(s)] == DELETING for s in doomed)
            await eventually(lambda: len(nova.live_servers()) == 3, what="2 servers deleted")
            assert not {s.server_id for s in nova.live_servers()} & set(doomed)
            await provider.sync()
            assert await ca.target_size("workers") == 3
            assert len(await ca.nodes("workers")) == 3

            # CA repeats the same DeleteNodes (its call timed out, say): nothing more happens.
            await ca.delete("workers", [("n", provider_id(s)) for s in doomed])
            assert await ca.target_size("workers") == 3
            assert len(nova.live_servers()) == 3


@pytest.mark.long
async def test_decrease_target_cancels_only_unfulfilled_creates(tmp_path):
    config = make_config(tmp_path, queue={"capacity": 50, "workers": 1})
    nova = FakeNova()
    nova.faults.latency = 0.5  # keep the single worker busy so creates wait in the queue
    async with running(config, FakeCloud(nova)) as provider, ca_client(provider.address) as ca:
        await ca.increase("workers", 3)
        assert await ca.target_size("workers") == 3
        await eventually(
            lambda: nova.calls["servers.create"] == 0 and provider.app.queue.room < 50,
            what="the first create in flight",
        )
        # One create is with Nova, two are queued: only those two can be cancelled.
        await expect_status(FAILED_PRECONDITION, ca.decrease("workers", -3))
        assert await ca.target_size("workers") == 3
        await ca.decrease("workers", -2)
        assert await ca.target_size("workers") == 1
        await eventually(lambda: len(nova.live_servers()) == 1, what="one server created")
        await provider.sync()
        assert await ca.target_size("workers") == 1
        # With every create fulfilled, decreasing would need a deletion: refused, nothing gone.
        details = await expect_status(FAILED_PRECONDITION, ca.decrease("workers", -1))
        assert "never deletes servers" in details
        assert len(nova.live_servers()) == 1
        assert await ca.target_size("workers") == 1


async def test_quota_failure_reported_then_cleaned_up_by_fake_node(tmp_path):
    config = make_config(tmp_path)
    nova = FakeNova()
    seed_ours(nova, "workers", 1)
    nova.faults.quota_exceeded = 2
    async with running(config, FakeCloud(nova)) as provider, ca_client(provider.address) as ca:
        await ca.increase("workers", 2)
        assert await ca.target_size("workers") == 3

        def failed() -> bool:
            return len(provider.app.inventory.ledger.failures_of("workers")) == 2

        await eventually(failed, what="two failed creates")
        instances = await ca.nodes("workers")
        errored = [i for i in instances if i.status.HasField("errorInfo")]
        assert len(errored) == 2
        for instance in errored:
            assert instance.status.instanceState == CREATING
            assert instance.status.errorInfo.errorCode == "QuotaExceeded"
            assert instance.status.errorInfo.instanceErrorClass == 1
            assert "Quota exceeded" in instance.status.errorInfo.errorMessage
        # The ids are stable from one listing to the next.
        again = await ca.nodes("workers")
        assert {i.id for i in again if i.status.HasField("errorInfo")} == {i.id for i in errored}
        assert await ca.target_size("workers") == 3

        # CA deletes errored instances with fake nodes: name = provider id = instance id.
        fake_nodes = [(i.id, i.id) for i in errored]
        await ca.delete("workers", fake_nodes)
        assert await ca.target_size("workers") == 1
        assert all(not i.status.HasField("errorInfo") for i in await ca.nodes("workers"))
        assert len(nova.live_servers()) == 1
        # ... and it may send them again next loop: harmless.
        await ca.delete("workers", fake_nodes)
        assert await ca.target_size("workers") == 1


async def test_no_valid_host_server_is_an_out_of_resources_error(tmp_path):
    config = make_config(tmp_path)
    nova = FakeNova()
    nova.faults.no_valid_host = 1
    async with running(config, FakeCloud(nova)) as provider, ca_client(provider.address) as ca:
        await ca.increase("gpu", 1)
        await eventually(lambda: len(nova.live_servers()) == 1, what="server in ERROR")
        await provider.sync()
        [instance] = await ca.nodes("gpu")
        assert instance.status.instanceState == CREATING
        assert instance.status.errorInfo.errorCode == "NoValidHost"
        assert instance.status.errorInfo.instanceErrorClass == 1
        await ca.delete("gpu", [(instance.id, instance.id)])
        assert await ca.target_size("gpu") == 0
        await eventually(lambda: not nova.live_servers(), what="ERROR server deleted")


async def test_node_without_provider_id_is_found_by_server_name(tmp_path):
    config = make_config(tmp_path)
    nova = FakeNova()
    [server_id] = seed_ours(nova, "workers", 1)
    async with running(config, FakeCloud(nova)) as provider, ca_client(provider.address) as ca:
        name = f"{CLUSTER}-workers-0"
        assert (await ca.group_for_node(name, "")).id == "workers"
        assert (await ca.group_for_node("somebody-else", "")).id == ""
        assert (await ca.group_for_node(name, provider_id(server_id))).id == "workers"
