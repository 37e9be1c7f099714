"""Random schedules over two places, with the invariants checked after every convergence.

A hypothesis state machine plays the Cluster Autoscaler against a real osas (gRPC on
127.0.0.1) serving a group in each of two regions of the simulated cloud (one Keystone, a Nova
per region, reached with an application credential from a clouds.yaml), while it breaks one
place at a time: a region unreachable (every call 503), a region's Nova clock off by up to ten
minutes, the application credential rotated (a new one in clouds.yaml, the old one deleted,
every token of it revoked). While one place is down, CA's calls on the other place's group
must succeed and Refresh must too. Whenever the faults stop and CA's loop has converged:

- each group's servers live in its own region and nowhere else;
- never above a group's max_size, no duplicate of a create, CA's target equals what it wants;
- CA's view of each group is its region's servers, and nothing lacking this cluster's marks
  (look-alikes seeded in both regions) is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections import Counter
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from prometheus_client import CollectorRegistry
from support import (
    CLUSTER,
    TAG,
    Provider,
    ca_client,
    config_data,
    kept,
    rotate_application_credential,
    sim_group,
    write_clouds_yaml,
    write_config,
)

from osas.app import openstack_clouds
from osas.config import load_config
from osas.demo.client import CaClient
from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST
from osas.sim import APP_CREDENTIAL_ID, CLOUD_NAME, SimulatedOpenStack
from osas.sim.model import FakeNova
from osas.sim.region import SimRegion

pytestmark = pytest.mark.long

MAX_SIZE = {"north": 4, "south": 3}
REGION = {"north": "RegionOne", "south": "RegionTwo"}
CLOCKS = [-600.0, 0.0, 600.0]
CONVERGE_SECONDS = 40


def group(group_id: str) -> dict:
    south = REGION[group_id] if group_id == "south" else None
    return sim_group(group_id, MAX_SIZE[group_id], region_name=south)


def nova(build: float = 0.05) -> FakeNova:
    return FakeNova(build_seconds=build, delete_seconds=0.1)


class TwoPlaces(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.Runner()
        self._tmp = tempfile.TemporaryDirectory(prefix="osas-places-", ignore_cleanup_errors=True)
        self.tmp = Path(self._tmp.name)
        self.sim = SimulatedOpenStack(nova())
        self.sim.start()
        self.regions: dict[str, SimRegion] = {
            "north": self.sim.regions[REGION["north"]],
            "south": self.sim.add_region(REGION["south"], nova()),
        }
        self.clouds = self.tmp / "clouds.yaml"
        self.credential = APP_CREDENTIAL_ID
        write_clouds_yaml(self.sim, self.clouds)
        self._clouds_env = os.environ.get("OS_CLIENT_CONFIG_FILE")
        os.environ["OS_CLIENT_CONFIG_FILE"] = str(self.clouds)
        data = config_data(
            node_groups=[group("north"), group("south")],
            queue={"capacity": 50, "workers": 3},
            reconcile={
                "interval": "0.1s",
                "full_resync_interval": "0.5s",
                # Short: a place down through a few of CA's loops is stale (its Refresh would
                # fail alone), and the other place's must keep Refresh succeeding.
                "max_inventory_age": "2s",
                "retry_backoff": "0.01s",
                "delete_retry_after": "0.5s",
                "quota_interval": "0.5s",
                "hold_after_start": False,
            },
            openstack={"cloud": CLOUD_NAME, "region_name": REGION["north"], "api_timeout": "2s"},
            shutdown_grace="2s",
        )
        self.config = load_config(write_config(self.tmp, data))
        self.foreign = {name: self._seed_foreign(region) for name, region in self.regions.items()}
        self.want = dict.fromkeys(MAX_SIZE, 0)
        self.provider: Provider | None = None
        self.ca: CaClient | None = None
        self._ca_context: contextlib.AbstractAsyncContextManager[CaClient] | None = None
        self.loop.run(self._start())

    def _seed_foreign(self, region: SimRegion) -> dict[str, dict[str, str]]:
        tag = TAG
        look_alikes = [
            region.nova.seed(name=f"{CLUSTER}-x", metadata={META_CLUSTER: "other"}, tags=[tag]),
            region.nova.seed(name=f"{CLUSTER}-y", metadata={META_CLUSTER: CLUSTER}),
        ]
        return {s.server_id: dict(s.metadata) for s in look_alikes}

    async def _start(self) -> None:
        clouds = openstack_clouds(self.config, CollectorRegistry())
        self.provider = Provider(self.config, clouds)  # type: ignore[arg-type]
        await self.provider.start(wait_serving=True)
        self._ca_context = ca_client(self.provider.address)
        self.ca = await self._ca_context.__aenter__()

    def teardown(self) -> None:
        try:
            if self.provider is not None:
                for region in self.regions.values():
                    region.nova.faults.error_rate = 0.0
                self.loop.run(self._stop())
        finally:
            self.sim.stop()
            self.loop.close()
            if self._clouds_env is None:
                os.environ.pop("OS_CLIENT_CONFIG_FILE", None)
            else:
                os.environ["OS_CLIENT_CONFIG_FILE"] = self._clouds_env
            self._tmp.cleanup()

    async def _stop(self) -> None:
        if self._ca_context is not None:
            await self._ca_context.__aexit__(None, None, None)
        assert self.provider is not None
        await self.provider.stop()

    # -- what CA and the world do -----------------------------------------------------------------

    @rule(name=st.sampled_from(sorted(MAX_SIZE)), size=st.integers(0, 4))
    def ca_wants(self, name: str, size: int) -> None:
        self.want[name] = min(size, MAX_SIZE[name])
        self.loop.run(self._converge())

    @rule(down=st.sampled_from(sorted(MAX_SIZE)), size=st.integers(0, 4))
    def a_place_unreachable(self, down: str, size: int) -> None:
        """One region answers 503 to everything for a while: the other's group scales all
        the same, and CA's Refresh keeps succeeding."""
        other = next(name for name in MAX_SIZE if name != down)
        self.regions[down].nova.faults.error_rate = 1.0
        self.want[other] = min(size, MAX_SIZE[other])
        self.loop.run(self._while_down(other))
        self.regions[down].nova.faults.error_rate = 0.0
        self.loop.run(self._converge())

    @rule(name=st.sampled_from(sorted(MAX_SIZE)), offset=st.sampled_from(CLOCKS))
    def a_places_clock_off(self, name: str, offset: float) -> None:
        self.regions[name].nova.clock_offset = offset
        self.loop.run(self._converge())

    @rule()
    def credentials_rotated(self) -> None:
        """A new application credential in clouds.yaml, the old one deleted: every place
        reads the file again and carries on."""
        new_id = f"rotated-{os.urandom(4).hex()}"
        rotate_application_credential(self.sim, self.clouds, self.credential, new_id)
        self.credential = new_id
        self.loop.run(self._converge())

    # -- CA's loop --------------------------------------------------------------------------------

    async def _while_down(self, healthy: str) -> None:
        ca = self.ca
        assert ca is not None
        for _ in range(25):  # 2.5 s: past max_inventory_age, the place down is stale
            await ca.refresh()  # never fails for one place down
            target = await ca.target_size(healthy)
            if target < self.want[healthy]:
                await ca.increase(healthy, self.want[healthy] - target)
            await asyncio.sleep(0.1)

    async def _converge(self) -> None:
        ca, provider = self.ca, self.provider
        assert ca is not None
        assert provider is not None
        deadline = asyncio.get_running_loop().time() + CONVERGE_SECONDS
        while True:
            assert asyncio.get_running_loop().time() < deadline, f"no convergence: {self.want}"
            with contextlib.suppress(grpc.aio.AioRpcError):
                await ca.refresh()
                settled = [await self._step(name) for name in MAX_SIZE]
                if all(settled):
                    break
            await asyncio.sleep(0.1)
        for engine in provider.app.places:
            await engine.reconciler.reconcile_once(full=True)
        self._check_invariants({name: {i.id for i in await ca.nodes(name)} for name in MAX_SIZE})

    async def _step(self, name: str) -> bool:
        ca = self.ca
        assert ca is not None
        instances = list(await ca.nodes(name))
        failed = [i for i in instances if i.status.HasField("errorInfo")]
        if failed:
            await ca.delete(name, [(i.id, i.id) for i in failed])
        target = await ca.target_size(name)
        running = kept(instances)
        if target < self.want[name]:
            await ca.increase(name, self.want[name] - target)
        elif target > self.want[name] and len(running) > self.want[name]:
            extra = running[: target - self.want[name]]
            await ca.delete(name, [(i.id, i.id) for i in extra])
        live = self._live(name)
        return target == self.want[name] == len(running) == sum(live.values())

    def _live(self, name: str) -> Counter[str]:
        """The group's servers in its own region, not being deleted, per create request."""
        return Counter(
            s.metadata.get(META_REQUEST, s.server_id)
            for s in self.regions[name].nova.live_servers()
            if s.deleting_since is None
            and s.metadata.get(META_CLUSTER) == CLUSTER
            and s.metadata.get(META_GROUP) == name
        )

    def _check_invariants(self, nodes: dict[str, set[str]]) -> None:
        for name, region in self.regions.items():
            live = self._live(name)
            # No duplicate, never above max_size, the target is what CA wants.
            assert max(live.values(), default=0) <= 1, live
            assert sum(live.values()) == self.want[name] <= MAX_SIZE[name]
            # CA's view of the group is its own region's servers.
            ours = {
                f"openstack:///{s.server_id}"
                for s in region.nova.live_servers()
                if s.deleting_since is None
                and s.metadata.get(META_GROUP) == name
                and s.metadata.get(META_CLUSTER) == CLUSTER
                and TAG in s.tags
            }
            assert nodes[name] == ours
            # Each group lives in its own region alone.
            for other, other_region in self.regions.items():
                if other != name:
                    assert not any(
                        s.metadata.get(META_GROUP) == name for s in other_region.nova.live_servers()
                    )
            # Nothing lacking this cluster's marks touched.
            for server_id, metadata in self.foreign[name].items():
                server = region.nova.find_server(server_id)
                assert server is not None
                assert server.deleting_since is None
                assert server.metadata == metadata


SCHEDULES = 6


@pytest.mark.parametrize("part", [0, 1])
def test_two_places_schedules(part: int) -> None:
    machine = seed(part)(type(f"TwoPlacesPart{part}", (TwoPlaces,), {}))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=SCHEDULES,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
