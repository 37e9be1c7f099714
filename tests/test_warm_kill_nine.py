"""A claim is a promise that survives kill -9.

Real ``osas serve`` processes against the simulated OpenStack (in the test's process, so that
the test reads Nova's state), killed with SIGKILL while they claim warm servers: before,
during and after the metadata write and the start. The next process finishes every claim Nova
shows (starts the server, takes the claim mark off) or replaces it by a cold create. Watched
from a thread all along: never more than max_size nodes in Nova, never two servers of one
create; at the end CA's view is exactly the group's nodes, all ACTIVE, no claim left open, and
no warm server was ever in CA's view.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support import (
    NovaWatch,
    ServedOsas,
    ca_client,
    check_warm_invariants,
    increase_once_allowed,
    kept,
    killable_config,
    node_servers,
    warm_servers,
)

from osas.domain.servers import META_CLAIMED
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

pytestmark = pytest.mark.long

MAX = 4
WANT = 3
GROUP = {
    "id": "big",
    "min_size": 0,
    "max_size": MAX,
    "flavor": "m1.small",
    "image": "ubuntu-24.04",
    "networks": ["cluster-net"],
    "user_data": "#cloud-config\n",
    "warm_pool": {"size": 3, "start_timeout": "6s"},
}


async def wait_pool_ready(sim: SimulatedOpenStack, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len([s for s in warm_servers(sim) if s.status == "SHUTOFF"]) < count:
        assert time.monotonic() < deadline, "the pool did not fill"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("kill_after", [0.0, 0.3, 0.8, 2.0])
async def test_a_kill_during_claims_loses_no_claimed_server_and_never_passes_max(
    tmp_path, kill_after
):
    nova = FakeNova(build_seconds=0.05, delete_seconds=0.1)
    nova.start_seconds = 0.5
    nova.warm_prepare_seconds = 0.1
    with SimulatedOpenStack(nova) as sim:
        path = killable_config(
            tmp_path,
            sim,
            GROUP,
            interval="0.2s",
            full_resync_interval="2s",
            create_doubt_window="3s",
        )
        watch = NovaWatch(sim, nodes_only=True)
        try:
            with ServedOsas(path) as first:
                first.wait_for("health SERVING")
                await wait_pool_ready(sim, 3)
                sim.nova.faults.latency = 0.15  # every Nova call: the kill lands mid-claim
                async with ca_client(first.address) as ca:
                    await increase_once_allowed(ca, "big", WANT, timeout=20)
                await asyncio.sleep(kill_after)
                first.kill()
            sim.nova.faults.latency = 0.0
            with ServedOsas(path) as second:
                second.wait_for("health SERVING")
                async with ca_client(second.address) as ca:
                    deadline = time.monotonic() + 40
                    while True:
                        assert time.monotonic() < deadline, "no convergence"
                        await check_warm_invariants(sim, ca, "big", MAX)
                        await ca.refresh()
                        target = await ca.target_size("big")
                        if target < WANT:
                            await increase_once_allowed(ca, "big", WANT - target, timeout=20)
                        nodes = node_servers(sim)
                        running = kept(list(await ca.nodes("big")))
                        if (
                            target == WANT == len(running) == len(nodes)
                            and all(s.status == "ACTIVE" for s in nodes)
                            and not any(META_CLAIMED in s.metadata for s in nodes)
                        ):
                            break
                        await asyncio.sleep(0.1)
                    assert {i.id for i in running} == {f"openstack:///{s.server_id}" for s in nodes}
                assert second.stop() == 0
        finally:
            watch.stop()
    assert watch.most <= MAX
    assert not watch.twice
