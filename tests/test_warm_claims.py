"""Warm pools at work, issue 36: filled in the background, claimed by IncreaseSize before any
cold create, started, replaced by a cold create when a start fails or takes too long, kept
fresh, and finished by whoever holds the lease next.

osas on a real gRPC server on 127.0.0.1 against the simulated OpenStack over HTTP with
unmodified openstacksdk. The simulator plays each warm server's guest: once ACTIVE it prepares
for ``warm_prepare_seconds`` and powers itself off (``osas.sim.model``). After each step the
invariants: never a warm server in CA's view, never more than max_size nodes in Nova, no
claimed server lost, no create fulfilled twice.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from fake_cloud import FakeCloud
from support import (
    BIG,
    CLUSTER,
    TAG,
    Provider,
    big_config,
    ca_client,
    check_warm_invariants,
    cloud_for,
    deleted,
    node_servers,
    warm_servers,
)

from osas.cloud.errors import CloudUnavailable
from osas.domain.servers import (
    META_CLAIMED,
    META_CLUSTER,
    META_GROUP,
    META_NODE_LABELS,
    META_NODE_TAINTS,
    META_REQUEST,
    META_WARM,
    META_WARM_STATE,
)
from osas.engine.userdata import SecretFiles, warm_fingerprint
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

pytestmark = pytest.mark.long

USER_DATA = "#cloud-config\nruncmd:\n  - [sh, -c, 'echo preparing ${server_name}']\n"
GROUP: dict[str, Any] = {
    **BIG,
    "max_size": 5,
    "user_data": USER_DATA,
    "labels": {"osas/node-group": "big", "tier": "warm"},
    "taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}],
    "warm_pool": {"size": 2, "start_timeout": "4s"},
}


def warm_config(tmp_path, **pool: Any):  # type: ignore[no-untyped-def]
    group = {**GROUP, "warm_pool": {**GROUP["warm_pool"], **pool}}
    return big_config(tmp_path, node_groups=[group])


async def until(sim, ca, condition, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition`` (checking the invariants at every turn) until it holds."""
    async with asyncio.timeout(timeout):
        while True:
            await check_warm_invariants(sim, ca, "big", GROUP["max_size"])
            if await condition():
                return
            await asyncio.sleep(0.05)


def pool_status(provider: Provider) -> dict[str, Any]:
    (group,) = provider.app.status()["groups"]
    return group["warm_pool"]


@pytest.fixture
async def served(tmp_path):
    nova = FakeNova(build_seconds=0.05)
    nova.start_seconds = 0.3
    with SimulatedOpenStack(nova) as sim:
        provider = Provider(warm_config(tmp_path), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                yield sim, provider, ca
        finally:
            await provider.stop()


async def ready(provider: Provider, count: int) -> bool:
    return pool_status(provider).get("ready") == count


async def test_the_pool_fills_in_the_background_out_of_cas_view(served):
    sim, provider, ca = served
    await until(sim, ca, lambda: ready(provider, 2))
    assert await ca.target_size("big") == 0
    assert list(await ca.nodes("big")) == []
    spec = provider.app.inventory.cluster.group("big")
    assert spec is not None
    fingerprint = warm_fingerprint(spec, SecretFiles())
    servers = warm_servers(sim)
    assert len(servers) == 2
    for server in servers:
        assert server.status == "SHUTOFF"  # the guest prepared and powered itself off
        assert server.metadata[META_WARM] == fingerprint
        assert server.metadata[META_WARM_STATE] == "shutoff"
        assert server.metadata[META_CLUSTER] == CLUSTER
        assert TAG in server.tags
        assert server.user_data is not None
    status = pool_status(provider)
    assert status["wanted"] == 2
    assert status["why_not"] is None
    registry = provider.app.registry
    assert registry.get_sample_value("osas_warm_pool_ready", {"group": "big"}) == 2
    assert registry.get_sample_value("osas_warm_refills_total", {"group": "big"}) == 2


async def test_increase_size_claims_warm_servers_first_then_creates_cold(served):
    sim, provider, ca = served
    await until(sim, ca, lambda: ready(provider, 2))
    warm_ids = {s.server_id for s in warm_servers(sim)}
    creates_before = sim.calls["compute.servers.create"]
    await ca.increase("big", 3)
    assert await ca.target_size("big") == 3  # at once, as for cold creates

    async def claimed_and_creating() -> bool:
        instances = {i.id: i.status.instanceState for i in await ca.nodes("big")}
        claimed = {f"openstack:///{server_id}" for server_id in warm_ids}
        return claimed <= instances.keys()

    await until(sim, ca, claimed_and_creating)

    async def all_running() -> bool:
        instances = await ca.nodes("big")
        return len(instances) == 3 and all(
            i.status.instanceState == pb.InstanceStatus.instanceRunning for i in instances
        )

    await until(sim, ca, all_running)

    async def claims_finished() -> bool:
        return not any(META_CLAIMED in s.metadata for s in node_servers(sim))

    await until(sim, ca, claims_finished)
    nodes = {s.server_id: s for s in node_servers(sim)}
    assert warm_ids <= nodes.keys()  # both warm servers became nodes
    for server_id in warm_ids:
        metadata = nodes[server_id].metadata
        assert META_WARM not in metadata
        assert META_CLAIMED not in metadata  # the claim finished
        assert metadata[META_NODE_LABELS] == "osas/node-group=big,tier=warm"
        assert metadata[META_NODE_TAINTS] == "dedicated=batch:NoSchedule"
    # One cold create for the third; then the pool refills (max 5 - target 3 = 2).
    cold = [s for s in nodes.values() if s.server_id not in warm_ids]
    assert len(cold) == 1
    assert cold[0].metadata[META_NODE_LABELS] == "osas/node-group=big,tier=warm"
    await until(sim, ca, lambda: ready(provider, 2))
    assert sim.calls["compute.servers.create"] - creates_before == 3
    registry = provider.app.registry
    claims = {"group": "big", "outcome": "claimed"}
    assert registry.get_sample_value("osas_warm_claims_total", claims) == 2
    assert not sim.nova.deletes_asked


async def test_a_start_that_fails_is_replaced_by_a_cold_create(served):
    sim, provider, ca = served
    await until(sim, ca, lambda: ready(provider, 2))
    sim.nova.faults.start_fails = 1
    await ca.increase("big", 1)
    assert await ca.target_size("big") == 1

    async def one_running_node() -> bool:
        instances = await ca.nodes("big")
        return [i.status.instanceState for i in instances] == [pb.InstanceStatus.instanceRunning]

    await until(sim, ca, one_running_node, timeout=20)
    assert await ca.target_size("big") == 1
    (node,) = node_servers(sim)
    assert len(deleted(sim)) == 1  # the claimed server that did not start
    assert node.server_id not in deleted(sim)
    registry = provider.app.registry
    replaced = {"group": "big", "outcome": "replaced"}
    assert registry.get_sample_value("osas_warm_claims_total", replaced) == 1
    reason = {"group": "big", "reason": "claim-failed"}
    assert registry.get_sample_value("osas_delete_orders_total", reason) == 1


async def test_a_claimed_server_not_active_in_time_is_replaced(served):
    sim, provider, ca = served
    await until(sim, ca, lambda: ready(provider, 2))
    sim.nova.faults.start_stalls = 1
    await ca.increase("big", 1)

    async def replaced() -> bool:
        registry = provider.app.registry
        labels = {"group": "big", "outcome": "replaced"}
        return registry.get_sample_value("osas_warm_claims_total", labels) == 1

    await until(sim, ca, replaced, timeout=20)

    async def one_running_node() -> bool:
        instances = await ca.nodes("big")
        return [i.status.instanceState for i in instances] == [pb.InstanceStatus.instanceRunning]

    await until(sim, ca, one_running_node, timeout=20)
    assert await ca.target_size("big") == 1


async def test_a_claim_left_by_a_killed_holder_is_finished_by_the_next(tmp_path):
    """A holder killed right after writing a claim (before its start) leaves a node of the
    group, SHUTOFF, with the claim mark: the next one starts it, and finishes the claim."""
    nova = FakeNova(build_seconds=0.05)
    nova.start_seconds = 0.3
    with SimulatedOpenStack(nova) as sim:
        left = sim.nova.seed(
            name=f"{CLUSTER}-big-claimed",
            metadata={
                META_CLUSTER: CLUSTER,
                META_GROUP: "big",
                META_REQUEST: "ab" * 16,
                META_CLAIMED: str(int(time.time())),
            },
            tags=[TAG],
            status="SHUTOFF",
        )
        provider = Provider(warm_config(tmp_path, size=0), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                assert await ca.target_size("big") == 1
                (instance,) = await ca.nodes("big")
                assert instance.status.instanceState == pb.InstanceStatus.instanceCreating

                async def finished() -> bool:
                    server = sim.nova.get_server(left.server_id)
                    return (
                        server is not None
                        and server.status == "ACTIVE"
                        and META_CLAIMED not in server.metadata
                    )

                await until(sim, ca, finished)

                async def running() -> bool:
                    (instance,) = await ca.nodes("big")
                    return instance.status.instanceState == pb.InstanceStatus.instanceRunning

                await until(sim, ca, running)
                assert not sim.nova.deletes_asked
        finally:
            await provider.stop()


async def test_stale_warm_servers_are_recycled_and_the_pool_refilled(tmp_path):
    nova = FakeNova(build_seconds=0.05)
    with SimulatedOpenStack(nova) as sim:
        stale = [
            sim.nova.seed(
                name=f"{CLUSTER}-big-stale-{index}",
                metadata={
                    META_CLUSTER: CLUSTER,
                    META_GROUP: "big",
                    META_REQUEST: f"{index:032x}",
                    META_WARM: "v1-prepared-from-an-older-image",
                },
                tags=[TAG],
                status="SHUTOFF",
            )
            for index in range(2)
        ]
        provider = Provider(warm_config(tmp_path), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                await until(sim, ca, lambda: ready(provider, 2))
                assert {s.server_id for s in stale} <= set(deleted(sim))
                fresh = {s.server_id for s in warm_servers(sim)}
                assert not fresh & {s.server_id for s in stale}
                registry = provider.app.registry
                labels = {"group": "big", "reason": "stale"}
                assert registry.get_sample_value("osas_warm_recycled_total", labels) == 2
        finally:
            await provider.stop()


async def test_a_pool_the_quota_cannot_hold_says_why(tmp_path):
    nova = FakeNova(build_seconds=0.05)
    nova.quota.instances = 0
    with SimulatedOpenStack(nova) as sim:
        config = warm_config(tmp_path)
        config = config.model_copy(
            update={"reconcile": config.reconcile.model_copy(update={"quota_interval": 0.2})}
        )
        provider = Provider(config, cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:

                async def says_why() -> bool:
                    why = pool_status(provider).get("why_not")
                    return why is not None and "quota" in why

                await until(sim, ca, says_why)
                registry = provider.app.registry
                assert registry.get_sample_value("osas_warm_pool_unfilled", {"group": "big"}) == 1
                assert not warm_servers(sim)
        finally:
            await provider.stop()


async def test_warm_servers_of_a_group_without_a_pool_are_recycled(tmp_path):
    """A pool switched off leaves no server holding quota: each is deleted after a fresh read
    shows it still warm; a node of the group is never touched."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        left = sim.nova.seed(
            name=f"{CLUSTER}-big-left",
            metadata={
                META_CLUSTER: CLUSTER,
                META_GROUP: "big",
                META_REQUEST: "cd" * 16,
                META_WARM: "v1-whatever",
            },
            tags=[TAG],
            status="SHUTOFF",
        )
        node = sim.nova.seed(
            name=f"{CLUSTER}-big-node",
            metadata={META_CLUSTER: CLUSTER, META_GROUP: "big", META_REQUEST: "ef" * 16},
            tags=[TAG],
        )
        provider = Provider(big_config(tmp_path), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:

                async def recycled() -> bool:
                    return left.server_id in deleted(sim)

                await until(sim, ca, recycled)
                assert deleted(sim) == [left.server_id]
                assert await ca.target_size("big") == 1
                assert sim.nova.get_server(node.server_id) is not None
        finally:
            await provider.stop()


@pytest.mark.parametrize(
    ("state", "held"),
    [("paused", "PAUSED"), ("suspended", "SUSPENDED"), ("shelved_offloaded", "SHELVED_OFFLOADED")],
)
async def test_each_state_a_pool_keeps_is_reached_and_claimed_from(tmp_path, state, held):
    """Paused, suspended and offloaded pools: the guest says on its console that it is
    prepared and waits; osas reads it and pauses, suspends or shelves the server. A claim
    resumes it (an offloaded one is unshelved first: Nova refuses metadata writes on it), and
    the guest joins once its metadata says it is claimed."""
    # A shelve offloads at once (Nova's default shelved_offload_time 0), as a non-admin's.
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        provider = Provider(warm_config(tmp_path, size=1, state=state), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                await until(sim, ca, lambda: ready(provider, 1))
                (waiting,) = warm_servers(sim)
                assert waiting.status == held
                await ca.increase("big", 1)

                async def joined() -> bool:
                    nodes = node_servers(sim)
                    return (
                        [s.server_id for s in nodes] == [waiting.server_id]
                        and nodes[0].status == "ACTIVE"
                        and META_CLAIMED not in nodes[0].metadata
                        and "osas-node-joined" in sim.nova.console_output(waiting.server_id)
                    )

                await until(sim, ca, joined)

                async def running() -> bool:
                    (instance,) = await ca.nodes("big")
                    return instance.status.instanceState == pb.InstanceStatus.instanceRunning

                await until(sim, ca, running)
                assert not deleted(sim)
        finally:
            await provider.stop()


@pytest.mark.parametrize("state", ["paused", "shelved_offloaded"])
async def test_a_preparation_that_hangs_in_a_pool_osas_settles_is_recycled(tmp_path, state):
    """A guest whose preparation hangs stays ACTIVE, as a prepared one waiting to be paused
    or shelved does: past prepare_timeout its console, still without the marker, says which,
    and it is recycled (reason prepare-timeout) and the pool refilled; before, it was counted
    as preparing for ever and the pool never filled."""
    nova = FakeNova(build_seconds=0.05)
    nova.faults.warm_prepare_hangs = 1
    with SimulatedOpenStack(nova) as sim:
        config = warm_config(tmp_path, size=1, state=state, prepare_timeout="2s")
        provider = Provider(config, cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:

                async def hanging() -> bool:
                    return len(warm_servers(sim)) == 1

                await until(sim, ca, hanging)
                (hung,) = warm_servers(sim)
                await until(sim, ca, lambda: ready(provider, 1))
                (waiting,) = warm_servers(sim)
                assert waiting.server_id != hung.server_id
                assert deleted(sim) == [hung.server_id]
                labels = {"group": "big", "reason": "prepare-timeout"}
                assert provider.app.registry.get_sample_value("osas_warm_recycled_total", labels)
                assert nova.faults.warm_prepare_hangs == 0  # the fault hit the first guest
        finally:
            await provider.stop()


class LostClaimAnswer(FakeCloud):
    """Nova takes the claim's metadata write, and its answer is lost (once)."""

    lose = True

    async def replace_metadata_if(self, server_id, metadata, still):  # type: ignore[no-untyped-def]
        written = await super().replace_metadata_if(server_id, metadata, still)
        if self.lose and META_CLAIMED in metadata:
            self.lose = False
            raise CloudUnavailable("the answer to a claim was lost (injected)")
        return written


async def test_a_claim_whose_answer_is_lost_is_settled_by_the_listing_never_doubled(tmp_path):
    """The write landed, its answer did not: the create is in doubt, the server stays out of
    every other claim; the next listing shows it claimed for the create (settled), the keeper
    starts it, and no cold create is sent for it."""
    nova = FakeNova(build_seconds=0.05)
    nova.start_seconds = 0.2
    cloud = LostClaimAnswer(nova)
    provider = Provider(warm_config(tmp_path, size=1), cloud)
    await provider.start()
    try:
        async with ca_client(provider.address) as ca:
            sim = SimpleNamespace(nova=nova)  # the kit reads Nova through .nova
            await until(sim, ca, lambda: ready(provider, 1))
            (waiting,) = warm_servers(sim)
            await ca.increase("big", 1)

            async def started() -> bool:
                nodes = node_servers(sim)
                return (
                    [s.server_id for s in nodes] == [waiting.server_id]
                    and nodes[0].status == "ACTIVE"
                    and META_CLAIMED not in nodes[0].metadata
                )

            await until(sim, ca, started)
            assert not cloud.lose  # the answer was lost
            events = provider.app.registry.get_sample_value(
                "osas_ledger_events_total", {"group": "big", "event": "create-in-doubt"}
            )
            assert events == 1
            # Only the pool's refill was made since: no cold create for the claimed one.
            await until(sim, ca, lambda: ready(provider, 1))
            assert len(nova.live_servers()) == 2  # the claimed node and the refill
            assert not deleted(sim)
            assert await ca.target_size("big") == 1
    finally:
        await provider.stop()


async def test_servers_older_than_max_age_are_replaced(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        provider = Provider(warm_config(tmp_path, size=1, max_age="2s"), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                await until(sim, ca, lambda: ready(provider, 1))
                (first,) = warm_servers(sim)

                async def replaced() -> bool:
                    fresh = [s for s in warm_servers(sim) if s.status == "SHUTOFF"]
                    return first.server_id in deleted(sim) and len(fresh) == 1

                await until(sim, ca, replaced)
                labels = {"group": "big", "reason": "aged"}
                assert provider.app.registry.get_sample_value("osas_warm_recycled_total", labels)
        finally:
            await provider.stop()


async def test_a_claim_finished_is_never_judged_again_on_a_listing_older_than_it(tmp_path):
    """Found on real Nova: a finished claim that the last listing still showed open was
    watched again from that listing, and past start_timeout the running node was replaced.
    Every watch begun from the inventory reads Nova first."""
    nova = FakeNova(build_seconds=0.05)
    nova.start_seconds = 1.0
    config = warm_config(tmp_path, size=1, start_timeout="2s")
    # No loop of osas's own acts meanwhile: listings and passes only when the test asks.
    config = config.model_copy(
        update={"reconcile": config.reconcile.model_copy(update={"interval": 3600.0})}
    )
    provider = Provider(config, FakeCloud(nova))
    await provider.start()
    keeper = provider.app.places[0].keeper
    sim = SimpleNamespace(nova=nova)
    try:
        async with ca_client(provider.address) as ca:
            async with asyncio.timeout(15):
                while [s.status for s in warm_servers(sim)] != ["SHUTOFF"]:
                    await provider.sync(full=False)
                    await keeper.keep_once()
                    await asyncio.sleep(0.05)
                await provider.sync(full=False)
                await keeper.keep_once()
            (waiting,) = warm_servers(sim)
            await ca.increase("big", 1)
            async with asyncio.timeout(5):
                while META_WARM in nova.get_server(waiting.server_id).metadata:
                    await asyncio.sleep(0.05)
            await provider.sync(full=False)  # the one listing: claimed, still starting
            shown = provider.app.inventory.snapshot.get(waiting.server_id)
            assert shown is not None
            assert shown.is_starting
            async with asyncio.timeout(10):  # the claim seen through, no listing since
                while META_CLAIMED in nova.get_server(waiting.server_id).metadata:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(2.5)  # past start_timeout of the claim
            await keeper.keep_once()  # the listing still shows it starting
            await asyncio.sleep(0.5)
            assert not deleted(sim)
            (node,) = node_servers(sim)
            assert (node.server_id, node.status) == (waiting.server_id, "ACTIVE")
            labels = {"group": "big", "outcome": "replaced"}
            assert not provider.app.registry.get_sample_value("osas_warm_claims_total", labels)
    finally:
        await provider.stop()


class FailsOnceAtFinish(FakeCloud):
    """The read after the one that shows a claimed server ACTIVE (the finish's own) fails
    once: Nova did not answer."""

    armed = failed = False

    async def get_server(self, server_id):  # type: ignore[no-untyped-def]
        if self.armed and not self.failed:
            self.failed = True
            raise CloudUnavailable("Nova did not answer (injected)")
        record = await super().get_server(server_id)
        claimed = record is not None and META_CLAIMED in record.metadata
        self.armed = self.armed or (claimed and record.status == "ACTIVE")
        return record


async def test_a_read_that_fails_while_a_claim_finishes_is_tried_again(tmp_path):
    """Found reading the code: one failed GET at a claim's finish ended the keeper, and with
    it osas. Now the claim is finished at a later read, and osas serves on."""
    nova = FakeNova(build_seconds=0.05)
    nova.start_seconds = 0.3
    cloud = FailsOnceAtFinish(nova)
    provider = Provider(warm_config(tmp_path, size=1), cloud)
    await provider.start()
    sim = SimpleNamespace(nova=nova)
    try:
        async with ca_client(provider.address) as ca:
            await until(sim, ca, lambda: ready(provider, 1))
            (waiting,) = warm_servers(sim)
            await ca.increase("big", 1)

            async def finished() -> bool:
                server = nova.get_server(waiting.server_id)
                return server.status == "ACTIVE" and META_CLAIMED not in server.metadata

            await until(sim, ca, finished)
            assert cloud.failed
            assert provider._task is not None
            assert not provider._task.done()
            assert await ca.target_size("big") == 1
    finally:
        await provider.stop()
