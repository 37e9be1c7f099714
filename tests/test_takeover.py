"""One writer, elected by the cluster: two ``osas serve`` processes under one Lease.

Real processes: each osas a process of its own with its pod's name and address as the
downward API gives them; the Kubernetes API is the test suite's stand-in for a kube-apiserver
(``osas/sim/kubernetes.py``: its Lease and EndpointSlice APIs with their optimistic
concurrency), the Cluster Autoscaler the test's gRPC client dialling CA's Service as
kube-proxy would route it (to the endpoint the Lease holder publishes), Nova the simulated
OpenStack. SIGKILL by pid. Issue 20, problem 6, and the failover it asks for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import grpc
import pytest
from support import (
    CLUSTER,
    NovaWatch,
    ServedOsas,
    ca_client,
    config_data,
    eventually,
    expect_status,
    free_port,
    increase_once_allowed,
    kept,
    write_config,
)

from osas.domain.servers import META_GROUP
from osas.sim import SimulatedOpenStack
from osas.sim.kubernetes import KubeStandIn
from osas.sim.model import FakeNova

NAMESPACE = "kube-system"
SERVICE = "osas"
LEASE_DURATION = 2.0
RENEW_DEADLINE = 1.2
RETRY_PERIOD = 0.2
WINDOW = 3.0  # create_doubt_window: longer than api_timeout and Nova's stall below


def group(max_size: int) -> dict:
    return {
        "id": "big",
        "min_size": 0,
        "max_size": max_size,
        "flavor": "m1.small",
        "image": "ubuntu-24.04",
        "networks": ["cluster-net"],
    }


def replica(
    tmp_path: Path, kube: KubeStandIn, sim: SimulatedOpenStack, name: str, max_size: int
) -> tuple[Path, dict[str, str]]:
    """One replica's configuration file and environment, as the chart's pod has them."""
    data = config_data(
        listen=f"127.0.0.1:{free_port()}",
        openstack={"auth": sim.clouds_yaml_entry()["auth"], "api_timeout": "1s"},
        node_groups=[group(max_size)],
        queue={"capacity": 50, "workers": 8},
        reconcile={
            "interval": "0.2s",
            "full_resync_interval": "1h",
            "max_inventory_age": "1h",
            "retry_backoff": "0.05s",
            "create_doubt_window": f"{WINDOW}s",
        },
        leader_election={
            "enabled": True,
            "kubeconfig": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
            "lease_namespace": NAMESPACE,
            "lease_duration": f"{LEASE_DURATION}s",
            "renew_deadline": f"{RENEW_DEADLINE}s",
            "retry_period": f"{RETRY_PERIOD}s",
            "service_name": SERVICE,
        },
    )
    path = write_config(tmp_path, data, name=f"{name}.yaml")
    env = {**os.environ, "POD_NAME": name, "POD_NAMESPACE": NAMESPACE, "POD_IP": "127.0.0.1"}
    return path, env


def service(kube: KubeStandIn) -> str | None:
    """Where kube-proxy sends a new connection to CA's Service now."""
    found = kube.service_endpoint(NAMESPACE, SERVICE)
    return None if found is None else f"{found[0]}:{found[1]}"


def live(sim: SimulatedOpenStack) -> list:
    return [
        s
        for s in sim.nova.live_servers()
        if s.metadata.get(META_GROUP) == "big" and s.deleting_since is None
    ]


async def ca_through_the_service(kube: KubeStandIn, sim: SimulatedOpenStack, want: int) -> None:
    """CA's loop, its connection made through the Service (a new one after the old breaks,
    as gRPC reconnects): Refresh, ask for what is missing within the max it is told, until
    Nova holds ``want`` servers and the target agrees."""
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        address = service(kube)
        if address is None:
            await asyncio.sleep(0.1)
            continue
        try:
            async with ca_client(address) as ca:
                while time.monotonic() < deadline:
                    await ca.refresh()
                    (found,) = await ca.node_groups()
                    target = await ca.target_size("big")
                    if target < min(want, found.maxSize):
                        await ca.increase("big", min(want, found.maxSize) - target)
                    done = len(kept(await ca.nodes("big"))) == want == len(live(sim))
                    if target == want and done:
                        return
                    await asyncio.sleep(0.2)
        except grpc.aio.AioRpcError as error:
            # The old leader gone, or a standby reached before the endpoint moved.
            if error.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError(f"not converged: Nova has {len(live(sim))}")


@pytest.mark.long
async def test_a_second_osas_stands_by_and_writes_nothing(tmp_path):
    """Problem 6: a second osas against the same project and cluster went SERVING and, with
    CA's connection moved to it while the first had 4 creates in flight, accepted +4: 10
    servers against max 8. Now it stands by: CA's Service has the holder alone as endpoint,
    and the second refuses every call (UNAVAILABLE, saying who holds the lease)."""
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        first_config, first_env = replica(tmp_path, kube, sim, "osas-a", max_size=8)
        second_config, second_env = replica(tmp_path, kube, sim, "osas-b", max_size=8)
        watch = NovaWatch(sim)
        try:
            with ServedOsas(first_config, first_env) as first:
                first.wait_for("health SERVING", timeout=WINDOW + 20)
                await eventually(lambda: service(kube) == first.address, what="endpoint")
                with ServedOsas(second_config, second_env) as second:
                    second.wait_for("another osas holds the lease; standing by")
                    # CA asks the holder for 4 more; Nova keeps them in its API a while.
                    sim.nova.faults.create_stall = 1.5
                    async with ca_client(service(kube) or "") as ca:
                        await increase_once_allowed(ca, "big", 8, WINDOW + 10)
                    await eventually(
                        lambda: sim.calls["compute.servers.create"] == 8,
                        what="creates in Nova's API",
                    )
                    # CA's connection reaches the second (a copy elsewhere, a port-forward):
                    # refused, whatever it asks, while the holder's creates are in flight.
                    async with ca_client(second.address) as wrong:
                        details = await expect_status(
                            grpc.StatusCode.UNAVAILABLE, wrong.increase("big", 4)
                        )
                        assert "standby" in details
                        assert "osas-a" in details
                        await expect_status(grpc.StatusCode.UNAVAILABLE, wrong.refresh())
                    assert service(kube) == first.address
                    await eventually(lambda: len(live(sim)) == 8, what="the holder's 8")
                    assert second.stop() == 0
                assert second.seen("became the leader") == []
                assert first.stop() == 0
        finally:
            watch.stop()
    assert watch.most == 8
    assert not watch.twice


@pytest.mark.long
async def test_the_standby_finishes_a_scale_up_of_ten_after_the_holder_is_killed(tmp_path):
    """The holder SIGKILLed with a scale-up of 10 half sent: the standby takes the lease once
    it has stood for its duration, publishes itself behind CA's Service, holds its headroom
    while the dead holder's creates may still land, and CA's next asks complete the 10: no
    duplicate, and never more than 10 at any instant."""
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        first_config, first_env = replica(tmp_path, kube, sim, "osas-a", max_size=10)
        second_config, second_env = replica(tmp_path, kube, sim, "osas-b", max_size=10)
        watch = NovaWatch(sim)
        try:
            with contextlib.ExitStack() as stack:
                first = stack.enter_context(ServedOsas(first_config, first_env))
                first.wait_for("health SERVING", timeout=WINDOW + 20)
                second = stack.enter_context(ServedOsas(second_config, second_env))
                second.wait_for("another osas holds the lease; standing by")
                await eventually(lambda: service(kube) == first.address, what="endpoint")
                sim.nova.faults.create_stall = 1.0
                async with ca_client(first.address) as ca:
                    await increase_once_allowed(ca, "big", 10, WINDOW + 10)
                await eventually(
                    lambda: sim.calls["compute.servers.create"] >= 4, what="creates sent"
                )
                first.kill()
                killed = time.monotonic()
                second.wait_for("became the leader", timeout=LEASE_DURATION + 10)
                took_over = time.monotonic() - killed
                sim.nova.faults.create_stall = 0.0
                await ca_through_the_service(kube, sim, want=10)
                assert service(kube) == second.address
                assert second.stop() == 0
        finally:
            watch.stop()
    assert LEASE_DURATION - RETRY_PERIOD <= took_over <= LEASE_DURATION + 3
    assert watch.most == 10
    assert not watch.twice
    assert len(live(sim)) == 10


async def test_a_clean_shutdown_hands_the_lease_over_at_once_with_nothing_held(tmp_path):
    """SIGTERM on the holder: it sends what it must, empties its endpoint and releases the
    lease, telling that no create of its may still land; the standby leads within a retry
    period, not a lease duration, and accepts a scale-up at once."""
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        first_config, first_env = replica(tmp_path, kube, sim, "osas-a", max_size=5)
        second_config, second_env = replica(tmp_path, kube, sim, "osas-b", max_size=5)
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(ServedOsas(first_config, first_env))
            first.wait_for("health SERVING", timeout=WINDOW + 20)
            second = stack.enter_context(ServedOsas(second_config, second_env))
            second.wait_for("another osas holds the lease; standing by")
            begun = time.monotonic()
            assert first.stop() == 0
            second.wait_for("health SERVING", timeout=LEASE_DURATION + 10)
            handed_over = time.monotonic() - begun
            await eventually(lambda: service(kube) == second.address, what="endpoint moved")
            async with ca_client(second.address) as ca:
                await ca.increase("big", 2)  # no hold: nothing of the first can still land
            await eventually(lambda: len(live(sim)) == 2, what="two servers")
            assert second.seen("the previous leader released the lease with no create in flight")
            assert second.stop() == 0
    assert handed_over < LEASE_DURATION


@pytest.mark.long
async def test_a_holder_cut_off_from_the_api_stops_writing_before_the_lease_can_pass(tmp_path):
    """The holder partitioned from the Kubernetes API (not from Nova): it stops writing once
    its renew deadline passes, before the lease could pass to another, and exits (8) to come
    back as a standby; the standby takes over once the API answers."""
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        first_config, first_env = replica(tmp_path, kube, sim, "osas-a", max_size=5)
        second_config, second_env = replica(tmp_path, kube, sim, "osas-b", max_size=5)
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(ServedOsas(first_config, first_env))
            first.wait_for("health SERVING", timeout=WINDOW + 20)
            second = stack.enter_context(ServedOsas(second_config, second_env))
            second.wait_for("another osas holds the lease; standing by")
            renewed = [w.at for w in kube.writes if w.holder == "osas-a"][-1]
            kube.unreachable = "hang"
            assert first.process.wait(timeout=RENEW_DEADLINE + 10) == 8
            stopped = time.monotonic()
            assert first.seen("lost the lease; stopping")
            assert stopped - renewed < LEASE_DURATION + 1  # a process stopped, not just fenced
            kube.unreachable = None
            second.wait_for("became the leader", timeout=LEASE_DURATION + 10)
            acquired = next(w.at for w in kube.writes if w.holder == "osas-b")
            assert acquired - renewed >= LEASE_DURATION  # never before the old lease could end
            assert acquired > stopped
            async with ca_client(second.address) as ca:
                await increase_once_allowed(ca, "big", 1, WINDOW + 10)
            await eventually(lambda: len(live(sim)) == 1, what="a server")
            assert second.stop() == 0
    assert CLUSTER
