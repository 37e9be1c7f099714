"""An answer to CA is a promise that survives kill -9.

Real processes: ``osas serve`` on 127.0.0.1 against the simulated OpenStack (the one ``osas
sim`` serves, here in the test's process so that the test can read Nova's state), the
Cluster Autoscaler played by the test's gRPC client, and SIGKILL by pid: nothing of osas runs
after it, no shutdown, no flush. Issue 20, problems 4 and 5.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from support import (
    CLUSTER,
    NovaWatch,
    ServedOsas,
    ca_client,
    eventually,
    expect_status,
    increase_once_allowed,
    kept,
    killable_config,
    seed_earlier,
)

from osas.domain.servers import META_GROUP
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

MAX = 8
GROUP = {
    "id": "big",
    "min_size": 0,
    "max_size": MAX,
    "flavor": "m1.small",
    "image": "ubuntu-24.04",
    "networks": ["cluster-net"],
}


def seed_an_hour_ago(sim: SimulatedOpenStack, count: int) -> list[str]:
    """Running servers of an earlier osas, untouched for an hour."""
    sim.nova.clock_offset = -3600.0
    ids = []
    for index in range(count):
        server = seed_earlier(sim.nova, "big", f"{index:032x}", name=f"{CLUSTER}-big-{index}")
        ids.append(server.server_id)
    sim.nova.clock_offset = 0.0
    return ids


def live(sim: SimulatedOpenStack) -> list[str]:
    """Servers of the group that Nova is not deleting."""
    return [
        s.server_id
        for s in sim.nova.live_servers()
        if s.metadata.get(META_GROUP) == "big" and s.deleting_since is None
    ]


async def test_a_delete_answered_ok_is_carried_out_even_if_osas_is_killed_at_once(tmp_path):
    """Problem 4: DeleteNodes(5) answered OK, SIGKILL right after: the 5 were never deleted
    (their deletes waited in the killed process's queue) and the target stayed 8 where CA
    expects 3. Now the DELETEs reach Nova before the answer, Nova slow as it may be."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05, delete_seconds=0.5)) as sim:
        ids = seed_an_hour_ago(sim, MAX)
        path = killable_config(tmp_path, sim, GROUP, hold_after_start=False)
        with ServedOsas(path) as osas:
            osas.wait_for("health SERVING")
            sim.nova.faults.latency = 0.5  # every Nova call takes half a second
            async with ca_client(osas.address) as ca:
                assert await ca.target_size("big") == MAX
                doomed = ids[:5]
                await ca.delete("big", [(f"n{i}", f"openstack:///{i}") for i in doomed])
            osas.kill()
        sim.nova.faults.latency = 0.0
        # Nothing of osas runs now; Nova carries out what it was sent.
        assert set(live(sim)) == set(ids[5:])
        with ServedOsas(path) as again:
            again.wait_for("health SERVING")
            async with ca_client(again.address) as ca:
                assert await ca.target_size("big") == 3
                assert len(kept(await ca.nodes("big"))) == 3
            assert again.stop() == 0


@pytest.mark.long
async def test_creates_in_novas_api_during_a_kill_never_take_a_group_beyond_max(tmp_path):
    """Problem 5: five create POSTs held in Nova's API, SIGKILL, restart: the new process
    listed before Nova stored them, accepted CA's re-ask of 5, and the group ended above
    max_size. Now a new process spends no headroom for create_doubt_window (which bounds how
    long Nova may take to store a create it was sent): CA is told max = target meanwhile, and
    an IncreaseSize is refused with the reason; the late servers are adopted, never doubled."""
    window = 6.0
    stall = 4.5  # Nova stores the creates 4.5 s after they were sent: within the window
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        seed_an_hour_ago(sim, 3)
        path = killable_config(tmp_path, sim, GROUP, create_doubt_window=f"{window}s")
        watch = NovaWatch(sim)
        try:
            with ServedOsas(path) as first:
                first.wait_for("health SERVING")
                async with ca_client(first.address) as ca:
                    await increase_once_allowed(ca, "big", 5, timeout=window + 10)
                    sim.nova.faults.create_stall = stall
                    await eventually(
                        lambda: sim.calls["compute.servers.create"] == 5,
                        timeout=10,
                        what="five creates held in Nova's API",
                    )
                first.kill()
            killed_at = time.monotonic()
            assert len(live(sim)) == 3  # none stored yet
            with ServedOsas(path) as second:
                second.wait_for("health SERVING")
                assert time.monotonic() - killed_at < stall  # it listed before Nova stored them
                async with ca_client(second.address) as ca:
                    # Asked anyway (CA would not: it is told max = target), refused with why.
                    details = await expect_status(
                        grpc.StatusCode.FAILED_PRECONDITION, ca.increase("big", 5)
                    )
                told = await play_ca_until(second.address, want=MAX, sim=sim, timeout=30)
                assert second.stop() == 0
        finally:
            watch.stop()
    assert watch.most == MAX  # never beyond max_size, at any instant
    assert not watch.twice
    assert len(live(sim)) == MAX
    assert "held" in details
    # Meanwhile CA was told the group could not grow: max size = target, below max_size.
    assert any(max_size == target < MAX for max_size, target in told)


async def play_ca_until(
    address: str, *, want: int, sim: SimulatedOpenStack, timeout: float
) -> list[tuple[int, int]]:
    """CA's loop on one group: Refresh, read the max size and the target, ask for what is
    missing within the max it is told (as CA plans), until Nova holds ``want`` servers and
    the target agrees. Every (max size, target) it was told."""
    told: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    async with ca_client(address) as ca:
        while True:
            assert time.monotonic() < deadline, f"not converged: Nova has {len(live(sim))}"
            await ca.refresh()
            (group,) = await ca.node_groups()
            target = await ca.target_size("big")
            told.append((group.maxSize, target))
            assert group.maxSize <= MAX
            if target < min(want, group.maxSize):
                await ca.increase("big", min(want, group.maxSize) - target)
            if target == want and len(kept(await ca.nodes("big"))) == want == len(live(sim)):
                return told
            await asyncio.sleep(0.2)
