"""The cloud's rate limit is pace, never failure (issue 21, problem 1).

osas against the simulated OpenStack over HTTP (unmodified openstacksdk), with a rate limit in
front of Nova's API as public clouds run one (``Faults.create_rate``): above it a request is
answered 429 (or 503) with ``Retry-After`` and never reaches Nova. A burst CA asks for completes
at the cloud's pace, every create made exactly once, and CA never sees one fail; with osas's
``openstack.rate_limit`` set to the cloud's, no request is refused at all. ``Pacer`` itself is
checked on a clock of the test's.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter

import anyio
import pytest
from support import Provider, big_config, ca_client, cloud_for, ours

from osas.cloud.pacing import RECOVERY, Pacer
from osas.domain.servers import META_REQUEST
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

CREATE = "compute.servers.create"


async def burst(sim: SimulatedOpenStack, provider: Provider, count: int) -> list[str]:
    """IncreaseSize(count), then CA's view watched until every server is running: the error
    codes of every failed instance CA was shown meanwhile."""
    failures: list[str] = []
    async with ca_client(provider.address) as ca:
        await ca.increase("big", count)

        running = pb.InstanceStatus.instanceRunning
        deadline = time.monotonic() + 60
        while True:
            instances = await ca.nodes("big")
            failures.extend(
                i.status.errorInfo.errorCode for i in instances if i.status.HasField("errorInfo")
            )
            if sum(i.status.instanceState == running for i in instances) == count:
                return failures
            assert time.monotonic() < deadline, f"{count} servers not running within 60 s"
            await anyio.sleep(0.05)


@pytest.mark.parametrize("status", [429, 503])
async def test_a_burst_against_a_rate_limited_nova_completes_with_no_failure(tmp_path, status):
    """Problem 1: IncreaseSize(200) against a Nova allowing 2 creates/s failed 142 creates
    (each 429 counted as a send, three sends, given up). Here 30 against 10 creates/s."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        sim.nova.faults.create_rate = 10.0
        sim.nova.faults.rate_limit_status = status
        provider = Provider(big_config(tmp_path), cloud_for(sim))
        await provider.start()
        try:
            failures = await burst(sim, provider, 30)
        finally:
            await provider.stop()
        assert failures == []
        assert sim.throttled[CREATE] > 0, "the burst never met the rate limit"
        made = Counter(s.metadata[META_REQUEST] for s in sim.nova.all_servers())
        assert len(made) == 30
        assert set(made.values()) == {1}  # a refused create was never made


@pytest.mark.long
async def test_with_osas_paced_at_the_clouds_rate_nothing_is_refused(tmp_path):
    """Problem 1: with `openstack.rate_limit` matching the cloud's, 6 of 201 creates still
    failed: the limiter let a second's worth through at once. osas spaces its requests."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        sim.nova.faults.request_rate = 8.0
        # Few listings, so that the creates have most of the pace.
        reconcile = {"interval": "1s", "full_resync_interval": "1h", "hold_after_start": False}
        config = big_config(tmp_path, reconcile=reconcile)
        provider = Provider(config, cloud_for(sim, rate_limit=6.0))
        await provider.start()
        try:
            failures = await burst(sim, provider, 12)
        finally:
            await provider.stop()
        assert failures == []
        assert sim.throttled == Counter()
        assert len(ours(sim)) == 12


async def test_the_pace_is_never_above_the_rate():
    pacer = Pacer(20.0)
    instants = []
    for _ in range(8):
        await pacer.wait_turn()
        instants.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(instants)]
    assert min(gaps) >= 1 / 20 - 0.002


def test_a_refusal_holds_every_request_and_slows_the_pace_once_per_second():
    now = [100.0]
    pacer = Pacer(10.0, clock=lambda: now[0])
    pacer.refused(2.0)
    assert pacer.rate == pytest.approx(8.0)
    assert pacer.held_for() == 2.0
    now[0] += 0.5
    pacer.refused(1.0)  # a refusal of the same burst: one signal
    assert pacer.rate == pytest.approx(8.0)
    assert pacer.held_for() == 1.5  # the longer wait stands
    now[0] += 2.0
    pacer.refused(None)  # no Retry-After: one interval at the lowered pace
    assert pacer.rate == pytest.approx(6.4)
    assert pacer.held_for() == pytest.approx(1 / 6.4)
    pacer.refused(3600.0)  # a misconfigured limiter: capped
    assert pacer.held_for() == 60.0


def test_the_pace_rises_again_once_the_refusals_stop():
    now = [0.0]
    pacer = Pacer(10.0, clock=lambda: now[0])
    pacer.refused(None)
    pacer.answered()
    assert pacer.rate == pytest.approx(8.0)  # not before RECOVERY quiet seconds
    rates = []
    for _ in range(30):
        now[0] += 1.0
        pacer.answered()
        rates.append(pacer.rate)
    assert rates[int(RECOVERY) - 2] == pytest.approx(8.0)
    assert rates == sorted(rates)
    assert rates[-1] == 10.0  # up to the configured rate, never above


async def test_a_request_asked_while_held_waits_for_retry_after():
    pacer = Pacer(100.0)
    pacer.refused(0.3)
    begun = time.monotonic()
    with anyio.fail_after(5):
        await pacer.wait_turn()
    assert time.monotonic() - begun >= 0.29
