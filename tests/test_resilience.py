"""osas against a misbehaving OpenStack: faults, restarts, and Nova traffic at scale."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from support import (
    BIG,
    CLUSTER,
    Provider,
    big_config,
    ca_client,
    ca_loop_until,
    cloud_for,
    config_data,
    eventually,
    kept,
    ours,
    seed_ours,
    settings_for,
    write_config,
)

from osas.cloud.openstack import OpenStackCloud
from osas.config import load_config
from osas.domain.inventory import Inventory
from osas.domain.servers import META_REQUEST, TAG_CLUSTER_PREFIX
from osas.engine.queue import TaskQueue
from osas.engine.reconciler import Reconciler
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

TAG = f"{TAG_CLUSTER_PREFIX}{CLUSTER}"


@pytest.mark.long
async def test_fifty_node_scale_up_and_down_under_faults(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.2)) as sim:
        sim.nova.faults.error_rate = 0.3
        sim.nova.faults.latency = 0.01
        config = big_config(tmp_path)
        provider = Provider(config, cloud_for(sim, concurrency=8))
        sim.nova.faults.error_rate = 0.0  # let the first sync through, then misbehave
        await provider.start()
        sim.nova.faults.error_rate = 0.3
        try:
            async with ca_client(provider.address) as ca:
                await ca_loop_until(ca, 50, sim, time.monotonic() + 120)
                failures = sum(1 for e in sim.history if e.status >= 500)
                assert failures >= 10  # the faults did happen
                names = [s.name for s in ours(sim)]
                assert len(set(names)) == 50  # no duplicate
                requests = [s.metadata[META_REQUEST] for s in ours(sim)]
                assert len(set(requests)) == 50

                # CA scales all down; a DeleteNodes some of whose DELETEs Nova's 5xx kept out
                # is refused (those servers stay), and CA asks again for what is left.
                for _ in range(20):
                    left = [i.id for i in kept(await ca.nodes("big"))]
                    if not left:
                        break
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await ca.delete("big", [("n", pid) for pid in left])
                assert await ca.target_size("big") == 0
                deadline = time.monotonic() + 120
                while ours(sim) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                assert ours(sim) == []  # no leftovers

                sim.nova.faults.error_rate = 0.0
                # Once the faults stop, work in hand done and a complete listing made, nothing
                # is left pending. Twice: the background loop may have resent a delete (its
                # first answer was a 503) just before the first listing, and a delete answered
                # after a listing began is settled only by a listing begun after the answer.
                queue = provider.app.queue
                for _ in range(2):
                    await eventually(lambda: queue.in_hand_count() == 0, timeout=60, what="idle")
                    await provider.sync(full=True)
                assert await ca.target_size("big") == 0
                assert await ca.nodes("big") == []
                assert provider.app.inventory.ledger.deleting_ids() == []
        finally:
            await provider.stop()


async def kill(provider: Provider) -> None:
    """Stop osas without its graceful shutdown, as SIGKILL would."""
    assert provider._task is not None
    provider._task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await provider._task


@pytest.mark.parametrize("point", ["accepted", "in-flight", "created-unsynced"])
async def test_restart_during_scale_up_loses_nothing_and_duplicates_nothing(tmp_path, point):
    with SimulatedOpenStack(FakeNova(build_seconds=0.2)) as sim:
        config = big_config(tmp_path, queue={"capacity": 50, "workers": 2})
        first = Provider(config, cloud_for(sim))
        await first.start()
        async with ca_client(first.address) as ca:
            if point == "in-flight":
                sim.nova.faults.latency = 0.3
            await ca.increase("big", 5)
            if point == "in-flight":
                deadline = time.monotonic() + 10
                while not ours(sim) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            elif point == "created-unsynced":
                deadline = time.monotonic() + 10
                while len(ours(sim)) < 5 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
        await kill(first)
        await asyncio.sleep(0.7)  # requests osas had sent complete in Nova meanwhile
        sim.nova.faults.latency = 0.0
        before = {s.server_id for s in ours(sim)}

        second = Provider(config, cloud_for(sim))
        await second.start()
        try:
            async with ca_client(second.address) as ca:
                assert await ca.target_size("big") == len(before)  # nothing lost
                await ca_loop_until(ca, 5, sim, time.monotonic() + 60)
            assert before <= {s.server_id for s in ours(sim)}
            assert len({s.name for s in ours(sim)}) == 5
        finally:
            await second.stop()


async def idle_minutes(sim: SimulatedOpenStack, tmp_path, minutes: int) -> Counter[str]:
    """Requests of a reconciler left idle for ``minutes`` of simulated time, at the default
    intervals (10 s incremental, 30 min complete), after its first sync."""
    data = config_data(node_groups=[BIG], reconcile={})  # the defaults operators get
    config = load_config(write_config(tmp_path, data))
    cluster = config.cluster_spec()
    settings = config.engine_settings()
    assert (settings.reconcile.interval, settings.reconcile.full_resync_interval) == (10.0, 1800.0)
    now = [0.0]
    inventory = Inventory(cluster)
    cloud = OpenStackCloud(settings_for(sim))
    reconciler = Reconciler(cloud, inventory, TaskQueue(10), settings, clock=lambda: now[0])
    try:
        await reconciler.reconcile_once()  # the first, complete sync at start
        sim.calls.clear()
        while now[0] < minutes * 60:
            now[0] += settings.reconcile.interval
            await reconciler.reconcile_once()
    finally:
        await cloud.close()
    assert reconciler.status.full_syncs == 2  # at start and at 30 minutes
    assert reconciler.status.incremental_syncs == 179
    return Counter(sim.calls)


@pytest.mark.long
async def test_idle_nova_traffic_does_not_grow_with_the_cluster(tmp_path):
    calls = {}
    for size in (1_000, 20_000):
        with SimulatedOpenStack(FakeNova()) as sim:
            # Servers made an hour ago: an idle cluster, with nothing changed lately.
            sim.nova.clock = lambda: datetime.now(UTC) - timedelta(hours=1)
            seed_ours(sim.nova, size, group="big")
            sim.nova.clock = lambda: datetime.now(UTC)
            calls[size] = await idle_minutes(sim, tmp_path, 30)
    small, large = calls[1_000], calls[20_000]
    # 179 incremental listings of one page each, and 1 complete listing of every server's
    # details: 2 or 21 pages (a full page of 1000 always links a next one, as Nova does,
    # which here is empty).
    assert small["compute.servers.list"] == 179 + 2
    assert large["compute.servers.list"] == 179 + 21
    # Nothing else depends on the size of the cluster.
    small.pop("compute.servers.list")
    large.pop("compute.servers.list")
    assert small == large


async def test_a_standby_keeps_warm_with_incremental_syncs_alone(tmp_path):
    """A standby (leader election on, the Lease held by another) makes no complete listing
    after its first: that is the writer's, and at 50,000 servers the costliest thing osas asks
    Nova. Taking the Lease, it makes one at its next sync."""
    with SimulatedOpenStack(FakeNova()) as sim:
        seed_ours(sim.nova, 50, group="big")
        data = config_data(node_groups=[BIG], reconcile={})
        config = load_config(write_config(tmp_path, data))
        settings = config.engine_settings()
        now, leading = [0.0], [False]
        inventory = Inventory(config.cluster_spec())
        cloud = OpenStackCloud(settings_for(sim))
        reconciler = Reconciler(
            cloud,
            inventory,
            TaskQueue(10),
            settings,
            clock=lambda: now[0],
            leading=lambda: leading[0],
        )
        try:
            await reconciler.reconcile_once()  # the first, complete: warm from the start
            while now[0] < 2 * settings.reconcile.full_resync_interval:
                now[0] += settings.reconcile.interval
                await reconciler.reconcile_once()
            assert reconciler.status.full_syncs == 1
            leading[0] = True
            reconciler.want_complete()
            await reconciler.reconcile_once()
            assert reconciler.status.full_syncs == 2
        finally:
            await cloud.close()
