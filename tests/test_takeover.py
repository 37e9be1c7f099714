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
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_cloud import FakeCloud
from support import (
    CLUSTER,
    LEASE_DURATION,
    NAMESPACE,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    NovaWatch,
    ServedOsas,
    ca_client,
    config_data,
    eventually,
    expect_status,
    free_port,
    increase_once_allowed,
    kept,
    make_config,
    pod_env,
    replica_election,
    running,
    service_address,
    until_through,
    write_config,
)

from osas.demo.client import CaClient
from osas.domain.promises import RECORD_CAPACITY
from osas.domain.servers import META_CLUSTER, META_GROUP, TAG_CLUSTER_PREFIX
from osas.election.port import lease_name_for
from osas.sim import SimulatedOpenStack
from osas.sim.kubernetes import KubeStandIn
from osas.sim.model import FakeNova

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
    tmp_path: Path,
    kube: KubeStandIn,
    sim: SimulatedOpenStack,
    name: str,
    max_size: int,
    *,
    window: float = WINDOW,
    token: str | None = None,
    api_timeout: float = 1.0,
    **more: Any,
) -> tuple[Path, dict[str, str]]:
    """One replica's configuration file and environment, as the chart's pod has them; with
    a ``token`` of its own, its Kubernetes API can be cut off alone (``kube.cut_off``)."""
    kubeconfig = tmp_path / "kubeconfig"
    if token is not None:
        kube.grant(token)
        kubeconfig = kube.write_kubeconfig(tmp_path / f"{name}.kubeconfig", token=token)
    else:
        kubeconfig = kube.write_kubeconfig(kubeconfig)
    data = config_data(
        listen=f"127.0.0.1:{free_port()}",
        openstack={"auth": sim.clouds_yaml_entry()["auth"], "api_timeout": f"{api_timeout}s"},
        node_groups=[group(max_size)],
        queue={"capacity": 50, "workers": 8},
        reconcile={
            "interval": "0.2s",
            "full_resync_interval": "1h",
            "max_inventory_age": "1h",
            "retry_backoff": "0.05s",
            "create_doubt_window": f"{window}s",
            "delete_retry_after": "1s",
        },
        leader_election=replica_election(kubeconfig),
        **more,
    )
    path = write_config(tmp_path, data, name=f"{name}.yaml")
    return path, pod_env(name)


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

    async def step(ca: CaClient) -> bool:
        await ca.refresh()
        (found,) = await ca.node_groups()
        target = await ca.target_size("big")
        if target < min(want, found.maxSize):
            await ca.increase("big", min(want, found.maxSize) - target)
        done = len(kept(await ca.nodes("big"))) == want == len(live(sim))
        return target == want and done

    if not await until_through(lambda: service_address(kube), step, timeout=40):
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
                await eventually(lambda: service_address(kube) == first.address, what="endpoint")
                with ServedOsas(second_config, second_env) as second:
                    second.wait_for("another osas holds the lease; standing by")
                    # CA asks the holder for 4 more; Nova keeps them in its API a while.
                    sim.nova.faults.create_stall = 1.5
                    async with ca_client(service_address(kube) or "") as ca:
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
                    assert service_address(kube) == first.address
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
                await eventually(lambda: service_address(kube) == first.address, what="endpoint")
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
                assert service_address(kube) == second.address
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
            await eventually(lambda: service_address(kube) == second.address, what="endpoint moved")
            async with ca_client(second.address) as ca:
                await ca.increase("big", 2)  # no hold: nothing of the first can still land
            await eventually(lambda: len(live(sim)) == 2, what="two servers")
            assert second.seen("took over the previous leader's promise record")
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


# -- issue 31: promises kept by the cluster, not the process ---------------------------------

REMADE = (
    "the lease was deleted under its holder (by hand, or another tool); made again at once, "
    "with the promise record"
)
HELD = (
    "scale-ups held until creates an earlier osas may have sent can no longer reach Nova (no "
    "promise record to say which); each group's max size is reported as its target meanwhile"
)


def with_status(
    tmp_path: Path, kube: KubeStandIn, sim: SimulatedOpenStack, name: str, **more: Any
) -> tuple[Path, dict[str, str], int]:
    """A replica whose /status is served on a port of its own; that port."""
    port = free_port()
    path, env = replica(
        tmp_path,
        kube,
        sim,
        name,
        more.pop("max_size", 5),
        metrics_listen=f"127.0.0.1:{port}",
        **more,
    )
    return path, env, port


def leading(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as answer:
        return bool(json.load(answer)["leader_election"]["leading"])


class TwoLeaders:
    """Both replicas' /status sampled from a thread, back to back: every instant both said
    they lead (each may write)."""

    def __init__(self, first: int, second: int) -> None:
        self.both: list[float] = []
        self.samples = 0
        self._ports = (first, second)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                if all(leading(port) for port in self._ports):
                    self.both.append(time.monotonic())
                self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.mark.long
async def test_a_lease_deleted_by_hand_never_gives_two_leaders(tmp_path):
    """Problem 1: the standby found the Lease missing, made it and led at once while the
    holder still wrote (both led for 1.35 s). Now a candidate that saw a holder makes a
    vanished Lease only once the lease duration has passed since that holder last renewed:
    deleted while the holder is cut off from the API, one leader at every instant (the
    holder stops at its renew deadline, the standby leads after); deleted while it is not,
    the holder makes it again at its next renew, its record with it, and stays the leader."""
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        first_config, first_env, first_port = with_status(
            tmp_path, kube, sim, "osas-a", token="token-a"
        )
        second_config, second_env, second_port = with_status(tmp_path, kube, sim, "osas-b")
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(ServedOsas(first_config, first_env))
            first.wait_for("health SERVING")
            second = stack.enter_context(ServedOsas(second_config, second_env))
            second.wait_for("another osas holds the lease; standing by")
            watch = TwoLeaders(first_port, second_port)
            try:
                for _ in range(2):  # the holder reachable: it makes the Lease again
                    kube.delete_lease(NAMESPACE, lease_name_for(CLUSTER))
                    await asyncio.sleep(LEASE_DURATION * 1.5)
                remade = bool(first.seen(REMADE))
                assert leading(first_port)
                kube.cut_off.add("token-a")  # the holder cut off, then its Lease deleted
                kube.delete_lease(NAMESPACE, lease_name_for(CLUSTER))
                second.wait_for("health SERVING", timeout=LEASE_DURATION + 10)
                assert first.process.wait(timeout=10) == 8
            finally:
                watch.stop()
                kube.cut_off.clear()
            assert watch.samples > 50
            assert watch.both == []
            assert remade
            assert second.stop() == 0


def holder_of(*replicas: ServedOsas) -> ServedOsas:
    (found,) = [r for r in replicas if r.seen("became the leader") and r.process.poll() is None]
    return found


@pytest.mark.long
async def test_the_doubt_survives_a_clean_hand_over_after_a_kill(tmp_path):
    """Problem 2: kill -9 during a scale-up; the new holder held for its predecessor's
    creates, then a rollout SIGTERMed it and it released saying no create was in flight, so
    its successor held nothing and the late creates took the group to 4 against max 3. Now
    the doubt is in the record, which every holder writes from its ledger: handed on by
    construction, and the group never passes max_size."""
    window, stall = 10.0, 5.0  # Nova stores the creates 5 s after they were sent
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        configs = [
            replica(tmp_path, kube, sim, f"osas-{name}", max_size=3, window=window)
            for name in "abc"
        ]
        watch = NovaWatch(sim)
        try:
            with contextlib.ExitStack() as stack:
                first = stack.enter_context(ServedOsas(*configs[0]))
                first.wait_for("health SERVING")
                others = [stack.enter_context(ServedOsas(*config)) for config in configs[1:]]
                for other in others:
                    other.wait_for("another osas holds the lease; standing by")
                sim.nova.faults.create_stall = stall
                async with ca_client(first.address) as ca:
                    await increase_once_allowed(ca, "big", 3, window + 10)
                await eventually(
                    lambda: sim.calls["compute.servers.create"] >= 3, what="creates sent"
                )
                first.kill()
                await eventually(
                    lambda: any(o.seen("became the leader") for o in others),
                    timeout=LEASE_DURATION + 10,
                    what="a new holder",
                )
                second = holder_of(*others)
                second.wait_for("health SERVING")
                assert second.stop() == 0  # a rollout, while it holds for the dead one's creates
                (third,) = [o for o in others if o is not second]
                third.wait_for("health SERVING", timeout=LEASE_DURATION + 10)
                # CA asks for what it is told is missing: nothing, until the creates land.
                await ca_through_the_service(kube, sim, want=3)
                assert third.stop() == 0
        finally:
            watch.stop()
    assert watch.most == 3
    assert not watch.twice
    took_over = "took over the previous leader's promise record"
    assert second.seen(took_over)[0]["creates"] == 3
    assert third.seen(took_over)[0]["creates"] == 3


@pytest.mark.long
async def test_a_kill_of_an_idle_holder_holds_nothing_and_a_first_install_neither(tmp_path):
    """Problem 3: after every start and every takeover CA was told max = target for
    create_doubt_window (3 minutes by default): pending pods waited it out even after a kill
    of an idle holder, or at a first install. Now a new holder holds only what the record
    says may be in flight: with nothing in it, a scale-up is accepted as soon as it leads."""
    window = 60.0  # long enough that any hold would fail the test
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        first_config, first_env = replica(tmp_path, kube, sim, "osas-a", 5, window=window)
        second_config, second_env = replica(tmp_path, kube, sim, "osas-b", 5, window=window)
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(ServedOsas(first_config, first_env))
            first.wait_for("health SERVING")
            async with ca_client(first.address) as ca:  # a first install holds nothing
                (found,) = await ca.node_groups()
                assert found.maxSize == 5
                await ca.increase("big", 1)
            await eventually(lambda: len(live(sim)) == 1, what="a server")
            second = stack.enter_context(ServedOsas(second_config, second_env))
            second.wait_for("another osas holds the lease; standing by")
            await asyncio.sleep(1.0)  # the create listed: nothing in flight
            first.kill()
            killed = time.monotonic()
            accepted = None
            while time.monotonic() - killed < LEASE_DURATION + RETRY_PERIOD + 10:
                address = service_address(kube)
                if address == second.address:
                    try:
                        async with ca_client(address) as ca:
                            await ca.refresh()
                            await ca.increase("big", 1)
                    except grpc.aio.AioRpcError:
                        pass
                    else:
                        accepted = time.monotonic() - killed
                        break
                await asyncio.sleep(0.05)
            assert accepted is not None, "no scale-up accepted"
            assert accepted <= LEASE_DURATION + RETRY_PERIOD + 5
            assert second.seen("took over the previous leader's promise record")
            assert not second.seen(HELD)
            await eventually(lambda: len(live(sim)) == 2, what="the second server")
            assert second.stop() == 0


@pytest.mark.long
async def test_delete_nodes_answers_whatever_nova_does_and_a_kill_loses_no_delete(tmp_path):
    """Problem 4: DeleteNodes read every server and sent every DELETE before it answered, so
    with Nova at 1 s a call DeleteNodes(40) failed, and a slow Nova stopped every
    scale-down. Now it answers once the record holds the deletes: OK with Nova out of reach,
    the target down at once, the deletes sent when Nova answers again; and a holder killed
    right after the OK leaves them to the next holder, which sends them."""
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        first_config, first_env = replica(tmp_path, kube, sim, "osas-a", max_size=50)
        second_config, second_env = replica(tmp_path, kube, sim, "osas-b", max_size=50)
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(ServedOsas(first_config, first_env))
            first.wait_for("health SERVING")
            async with ca_client(first.address) as ca:
                await increase_once_allowed(ca, "big", 45, WINDOW + 10)
            await eventually(lambda: len(live(sim)) == 45, timeout=30, what="45 servers")
            second = stack.enter_context(ServedOsas(second_config, second_env))
            second.wait_for("another osas holds the lease; standing by")
            async with ca_client(first.address) as ca:
                await eventually_async(ca, lambda nodes: len(kept(nodes)) == 45)
                nodes = sorted(kept(await ca.nodes("big")), key=lambda n: n.id)
                # Nova at a second a call: 40 deletes answered at once.
                sim.nova.faults.latency = 1.0
                begun = time.monotonic()
                await ca.delete("big", [(f"n{i}", node.id) for i, node in enumerate(nodes[:40])])
                took = time.monotonic() - begun
                assert await ca.target_size("big") == 5
                # Nova out of reach: still OK, nothing deleted yet.
                sim.nova.faults.latency = 0.0
                sim.nova.faults.error_rate = 1.0
                await ca.delete("big", [("n40", nodes[40].id)])
                assert await ca.target_size("big") == 4
            first.kill()
            sim.nova.faults.error_rate = 0.0
            # The next holder sends what the dead one promised.
            second.wait_for("health SERVING", timeout=LEASE_DURATION + 10)
            await eventually(lambda: len(live(sim)) == 4, timeout=30, what="41 deleted")
            assert second.seen("took over the previous leader's promise record")
            assert second.stop() == 0
    assert took < 1.0  # not one of Nova's seconds: the answer never waits on it


async def eventually_async(ca, check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check(await ca.nodes("big")):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


@pytest.mark.long
async def test_a_rollout_with_a_create_in_flight_breaks_cas_loop_for_under_two_seconds(tmp_path):
    """Problem 5: on SIGTERM the holder stopped gRPC at once while the EndpointSlice named
    it until its creates finished: CA's calls failed for seconds. Now it takes itself out of
    CA's Service and releases the Lease first, the standby publishes itself within a retry
    period, and CA's calls, made through the Service all along, fail for under 2 s in all."""
    stall = 4.0
    with KubeStandIn() as kube, SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        # Each create is in the holder's hands (its POST unanswered) for 4 s.
        first_config, first_env = replica(
            tmp_path, kube, sim, "osas-a", 5, window=15.0, api_timeout=8.0
        )
        second_config, second_env = replica(
            tmp_path, kube, sim, "osas-b", 5, window=15.0, api_timeout=8.0
        )
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(ServedOsas(first_config, first_env))
            first.wait_for("health SERVING")
            second = stack.enter_context(ServedOsas(second_config, second_env))
            second.wait_for("another osas holds the lease; standing by")
            sim.nova.faults.create_stall = stall
            async with ca_client(first.address) as ca:
                await increase_once_allowed(ca, "big", 2, 20)
            await eventually(lambda: sim.calls["compute.servers.create"] >= 2, what="sent")
            stopping = threading.Thread(target=first.stop)
            stopping.start()
            failing, last, begun = 0.0, time.monotonic(), time.monotonic()
            clients: dict[str, Any] = {}
            async with contextlib.AsyncExitStack() as connections:
                while time.monotonic() - begun < stall + 2:
                    ok = False
                    address = service_address(kube)
                    if address is not None:
                        if address not in clients:
                            clients[address] = await connections.enter_async_context(
                                ca_client(address)
                            )
                        with contextlib.suppress(grpc.aio.AioRpcError):
                            await clients[address].refresh()
                            ok = True
                    now = time.monotonic()
                    if not ok:
                        failing += now - last
                    last = now
                    await asyncio.sleep(0.02)
            stopping.join(timeout=30)
            assert first.process.returncode == 0
            assert service_address(kube) == second.address
            assert second.stop() == 0
    assert failing <= 2.0


async def test_a_full_promise_record_refuses_whole_and_promises_nothing(tmp_path):
    """The record is bounded (2,000 entries, well inside Kubernetes' 256 KiB of annotations):
    a call that would pass the bound is refused, RESOURCE_EXHAUSTED, with nothing promised;
    with room again, the same call is accepted. And a record that cannot be written (the API
    out of reach) fails the call, UNAVAILABLE, with its creates taken back."""
    with KubeStandIn() as kube:
        nova = FakeNova()
        for index in range(3):
            nova.seed(
                name=f"{CLUSTER}-workers-{index}",
                metadata={META_CLUSTER: CLUSTER, META_GROUP: "workers"},
                tags=[f"{TAG_CLUSTER_PREFIX}{CLUSTER}"],
            )
        config = make_config(
            tmp_path,
            leader_election={
                "enabled": True,
                "kubeconfig": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
                "lease_namespace": NAMESPACE,
                "lease_duration": "5s",
                "renew_deadline": "3s",
                "retry_period": "0.2s",
            },
        )
        async with running(config, FakeCloud(nova)) as provider:
            ledger = provider.app.inventory.ledger
            filler = ledger.accept_creates("gpu", RECORD_CAPACITY - 1, 0.0)
            async with ca_client(provider.address) as ca:
                target = await ca.target_size("workers")
                assert "promise record is full" in await expect_status(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, ca.increase("workers", 2)
                )
                (first, *_) = kept(await ca.nodes("workers"))
                await ca.delete("workers", [("n0", first.id)])  # one more fits: the last
                assert "promise record is full" in await expect_status(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, ca.increase("workers", 1)
                )
                assert await ca.target_size("workers") == target - 1
                ledger.withdraw_creates(filler)
                kube.unreachable = "hang"
                assert "promise record could not be written" in await expect_status(
                    grpc.StatusCode.UNAVAILABLE, ca.increase("workers", 1)
                )
                assert await ca.target_size("workers") == target - 1  # taken back
                kube.unreachable = None
                await eventually(provider.app.leadership.may_write, what="renewed")
                await ca.increase("workers", 1)
                assert await ca.target_size("workers") == target
