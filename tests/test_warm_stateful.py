"""Random schedules over a node group with a warm pool, the invariants checked at every step
of every convergence.

A hypothesis state machine plays the Cluster Autoscaler against a real osas (gRPC on
127.0.0.1, openstacksdk over HTTP to the simulated OpenStack, whose guests prepare and power
themselves off) while the world does what it does to warm pools: claims as CA scales up, the
pool refilled behind them, a start that fails, a start that never ends, osas killed (its task
cancelled, no shutdown) at a random instant after a scale-up and a new one started in its
place. At every step: no warm server in CA's view, never more than max_size nodes in Nova, no
create fulfilled twice. Once converged: CA's target is what it wants and its view is exactly
the group's nodes in Nova, every node ACTIVE with its claim finished (no claimed server lost
or left stopped), the pool full again, and nothing lacking this cluster's marks touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from support import (
    BIG,
    CLUSTER,
    TAG,
    Provider,
    big_config,
    ca_client,
    check_warm_invariants,
    cloud_for,
    kept,
    node_servers,
    warm_servers,
)

from osas.demo.client import CaClient
from osas.domain.servers import META_CLAIMED, META_CLUSTER
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

pytestmark = pytest.mark.long

MAX_SIZE = 4
POOL = 2
CONVERGE_SECONDS = 40
GROUP: dict[str, Any] = {
    **BIG,
    "max_size": MAX_SIZE,
    "user_data": "#cloud-config\n",
    "warm_pool": {"size": POOL, "start_timeout": "2s"},
}


class WarmPoolSchedules(RuleBasedStateMachine):
    STATE = "shutoff"  # the state the pool keeps its servers in (each part its own)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.Runner()
        self._tmp = tempfile.TemporaryDirectory(prefix="osas-warm-", ignore_cleanup_errors=True)
        nova = FakeNova(build_seconds=0.05, delete_seconds=0.1)
        nova.start_seconds = 0.2
        nova.warm_prepare_seconds = 0.1
        self.sim = SimulatedOpenStack(nova)
        self.sim.start()
        group = {**GROUP, "warm_pool": {**GROUP["warm_pool"], "state": self.STATE}}
        self.config = big_config(Path(self._tmp.name), node_groups=[group], shutdown_grace="2s")
        self.foreign = {
            s.server_id: dict(s.metadata)
            for s in (
                nova.seed(name=f"{CLUSTER}-x", metadata={META_CLUSTER: "other"}, tags=[TAG]),
                nova.seed(name=f"{CLUSTER}-y", metadata={META_CLUSTER: CLUSTER}),
            )
        }
        self.want = 0
        self.provider: Provider | None = None
        self.ca: CaClient | None = None
        self._ca_context: contextlib.AbstractAsyncContextManager[CaClient] | None = None
        self.loop.run(self._start())

    async def _start(self) -> None:
        self.provider = Provider(self.config, cloud_for(self.sim))
        await self.provider.start(wait_serving=True)
        self._ca_context = ca_client(self.provider.address)
        self.ca = await self._ca_context.__aenter__()

    async def _close_ca(self) -> None:
        if self._ca_context is not None:
            await self._ca_context.__aexit__(None, None, None)
            self._ca_context = None

    def teardown(self) -> None:
        try:
            self.sim.nova.faults.start_fails = self.sim.nova.faults.start_stalls = 0
            self.loop.run(self._stop())
        finally:
            self.sim.stop()
            self.loop.close()
            self._tmp.cleanup()

    async def _stop(self) -> None:
        await self._close_ca()
        if self.provider is not None:
            await self.provider.stop()

    # -- what CA and the world do -------------------------------------------------------------

    @rule(size=st.integers(0, MAX_SIZE))
    def ca_wants(self, size: int) -> None:
        self.want = size
        self.loop.run(self._converge())

    @rule(size=st.integers(1, MAX_SIZE))
    def a_start_fails(self, size: int) -> None:
        """The next start fails (Nova returns the server to SHUTOFF): a cold create takes the
        claimed server's place."""
        self.sim.nova.faults.start_fails = 1
        self.want = size
        self.loop.run(self._converge())
        self.sim.nova.faults.start_fails = 0

    @rule(size=st.integers(1, MAX_SIZE))
    def a_start_never_ends(self, size: int) -> None:
        """The next start stays powering-on: past start_timeout, a cold create instead."""
        self.sim.nova.faults.start_stalls = 1
        self.want = size
        self.loop.run(self._converge())
        self.sim.nova.faults.start_stalls = 0

    @rule(size=st.integers(1, MAX_SIZE), delay=st.sampled_from([0.0, 0.02, 0.1, 0.3, 1.0]))
    def killed_while_scaling_up(self, size: int, delay: float) -> None:
        """osas killed at an instant after CA's scale-up (mid-claim, mid-start, or after),
        and a new one started: it finishes or replaces every claim Nova shows."""
        self.want = size
        self.loop.run(self._kill_after_scale_up(delay))
        self.loop.run(self._converge())

    async def _kill_after_scale_up(self, delay: float) -> None:
        ca, provider = self.ca, self.provider
        assert ca is not None
        assert provider is not None
        with contextlib.suppress(grpc.aio.AioRpcError):
            target = await ca.target_size("big")
            if target < self.want:
                await ca.increase("big", self.want - target)
        await asyncio.sleep(delay)
        await self._close_ca()
        task = provider._task  # no shutdown: what a SIGKILL leaves
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await self._start()

    # -- CA's loop ----------------------------------------------------------------------------

    async def _converge(self) -> None:
        ca = self.ca
        assert ca is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONVERGE_SECONDS
        while True:
            assert loop.time() < deadline, f"no convergence to {self.want}"
            await check_warm_invariants(self.sim, ca, "big", MAX_SIZE)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await ca.refresh()
                if await self._step(ca):
                    break
            await asyncio.sleep(0.1)
        await self._check_converged(ca)

    async def _step(self, ca: CaClient) -> bool:
        instances = list(await ca.nodes("big"))
        failed = [i for i in instances if i.status.HasField("errorInfo")]
        if failed:
            await ca.delete("big", [(i.id, i.id) for i in failed])
        target = await ca.target_size("big")
        running = kept(instances)
        if target < self.want:
            await ca.increase("big", self.want - target)
        elif target > self.want and len(running) > self.want:
            extra = running[: target - self.want]
            await ca.delete("big", [(i.id, i.id) for i in extra])
        nodes = node_servers(self.sim)
        assert self.provider is not None
        pool = self.provider.app.status()["groups"][0]["warm_pool"]
        wanted = min(POOL, MAX_SIZE - self.want)
        return (
            target == self.want == len(running) == len(nodes)
            and all(s.status == "ACTIVE" and META_CLAIMED not in s.metadata for s in nodes)
            and pool.get("ready") == wanted
        )

    async def _check_converged(self, ca: CaClient) -> None:
        assert self.provider is not None
        await self.provider.sync(full=True)
        seen = {i.id for i in kept(list(await ca.nodes("big")))}
        nodes = node_servers(self.sim)
        assert seen == {f"openstack:///{s.server_id}" for s in nodes}
        assert len(nodes) == self.want <= MAX_SIZE
        for server in nodes:  # no claimed server lost or left stopped
            assert server.status == "ACTIVE"
            assert META_CLAIMED not in server.metadata
        warm = [s for s in warm_servers(self.sim) if s.task_state != "deleting"]
        assert all(s.metadata.get(META_CLUSTER) == CLUSTER and TAG in s.tags for s in warm)
        assert len(warm) >= min(POOL, MAX_SIZE - self.want)
        for server_id, metadata in self.foreign.items():
            server = self.sim.nova.find_server(server_id)
            assert server is not None
            assert server.deleting_since is None
            assert server.metadata == metadata


SCHEDULES = 5


@pytest.mark.parametrize(("part", "state"), [(0, "shutoff"), (1, "suspended")])
def test_warm_pool_schedules(part: int, state: str) -> None:
    machine = seed(part)(
        type(f"WarmPoolSchedulesPart{part}", (WarmPoolSchedules,), {"STATE": state})
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=SCHEDULES,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
