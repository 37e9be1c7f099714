"""Promises kept across kill -9 and failover when node groups live in two places (issue 35).

Real processes, as in tests/test_kill_nine.py and tests/test_takeover.py, now with a node group
in each of two regions of the simulated cloud (one Keystone, a Nova per region): ``osas
serve`` processes on 127.0.0.1 reaching the simulator with openstacksdk over HTTP, the Cluster
Autoscaler played by the test's gRPC client, the Kubernetes API by its stand-in
(``osas/sim/kubernetes.py``) where two replicas share one Lease, and SIGKILL by pid.

After every convergence, in each region and across them:

- each group's servers live in its own region and nowhere else, exactly as many as CA was
  promised, never more than the group's max_size at any instant (watched from a thread), and
  never two live servers of one create request;
- every server of the cluster carries the same cluster name (metadata and tag) in both
  regions;
- look-alikes lacking one of this cluster's marks, seeded in each region, are never deleted
  nor changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from support import (
    CLUSTER,
    LEASE_DURATION,
    TAG,
    ServedOsas,
    ca_client,
    config_data,
    eventually,
    expect_status,
    free_port,
    kept,
    pod_env,
    replica_election,
    seed_earlier,
    service_address,
    sim_group,
    until_through,
    write_config,
)

from osas.demo.client import CaClient
from osas.domain.servers import (
    META_CLUSTER,
    META_GROUP,
    META_REQUEST,
    TAG_CLUSTER_PREFIX,
    TAG_REQUEST_PREFIX,
)
from osas.sim import SimulatedOpenStack
from osas.sim.kubernetes import KubeStandIn
from osas.sim.model import FakeNova
from osas.sim.region import SimRegion

pytestmark = pytest.mark.long

# Where each group lives: "north" in the cloud's first region (the top-level openstack block),
# "south" in the second (its own openstack block names the region).
REGION = {"north": "RegionOne", "south": "RegionTwo"}


# -- the cloud, the configuration, the replicas ------------------------------------------------


@contextlib.contextmanager
def two_regions() -> Any:
    """The simulated cloud with RegionOne and RegionTwo behind its one Keystone; servers build
    in 50 ms. Yields the simulator and the two regions by group name."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        regions = {
            "north": sim.regions[REGION["north"]],
            "south": sim.add_region(REGION["south"], FakeNova(build_seconds=0.05)),
        }
        yield sim, regions


def group(group_id: str, max_size: int) -> dict[str, Any]:
    south = REGION[group_id] if group_id == "south" else None
    return sim_group(group_id, max_size, region_name=south)


def places_config(
    tmp_path: Path,
    sim: SimulatedOpenStack,
    name: str,
    maxima: dict[str, int],
    *,
    window: float,
    hold_after_start: bool = True,
    api_timeout: float = 1.0,
    **more: Any,
) -> Path:
    """One osas's configuration: a group per region (``maxima``), fast reconciliation, the
    create doubt window given."""
    data = config_data(
        openstack={
            "auth": sim.clouds_yaml_entry()["auth"],
            "region_name": REGION["north"],
            "api_timeout": f"{api_timeout}s",
        },
        node_groups=[group(group_id, size) for group_id, size in maxima.items()],
        queue={"capacity": 50, "workers": 8},
        reconcile={
            "interval": "0.2s",
            "full_resync_interval": "1h",
            "max_inventory_age": "1h",
            "retry_backoff": "0.05s",
            "delete_retry_after": "1s",
            "create_doubt_window": f"{window}s",
            "hold_after_start": hold_after_start,
        },
        **more,
    )
    return write_config(tmp_path, data, name=f"{name}.yaml")


def replica(
    tmp_path: Path,
    kube: KubeStandIn,
    sim: SimulatedOpenStack,
    name: str,
    maxima: dict[str, int],
    *,
    window: float,
) -> tuple[Path, dict[str, str]]:
    """One replica under the Lease: its configuration and its pod's environment."""
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    path = places_config(
        tmp_path,
        sim,
        name,
        maxima,
        window=window,
        listen=f"127.0.0.1:{free_port()}",
        leader_election=replica_election(kubeconfig),
    )
    return path, pod_env(name)


# -- what Nova holds ----------------------------------------------------------------------------


def ours(region: SimRegion, group_id: str) -> list[Any]:
    """The group's live servers in ``region`` that carry this cluster's marks, not being
    deleted."""
    return [
        s
        for s in region.nova.live_servers()
        if s.deleting_since is None
        and s.metadata.get(META_CLUSTER) == CLUSTER
        and s.metadata.get(META_GROUP) == group_id
    ]


def seed_ours(region: SimRegion, group_id: str, count: int) -> list[str]:
    """Running servers of an earlier osas in the group's region."""
    ids = []
    for index in range(count):
        request_id, name = f"{group_id}-earlier-{index}", f"{CLUSTER}-{group_id}-earlier{index}"
        ids.append(seed_earlier(region.nova, group_id, request_id, name=name).server_id)
    return ids


def seed_look_alikes(regions: dict[str, SimRegion]) -> dict[str, tuple[dict[str, str], set[str]]]:
    """In each region, servers that look like the group's but lack one of this cluster's
    marks: no cluster in their metadata (the cluster's tag on), another cluster's, and this
    cluster's without a group. Their metadata and tags, by id."""
    seeded = {}
    for group_id, region in regions.items():
        look_alikes = [
            region.nova.seed(
                name=f"{CLUSTER}-{group_id}-a",
                metadata={META_GROUP: group_id},
                tags=[TAG],
            ),
            region.nova.seed(
                name=f"{CLUSTER}-{group_id}-b",
                metadata={META_CLUSTER: "other", META_GROUP: group_id},
                tags=[f"{TAG_CLUSTER_PREFIX}other"],
            ),
            region.nova.seed(
                name=f"{CLUSTER}-{group_id}-c", metadata={META_CLUSTER: CLUSTER}, tags=[TAG]
            ),
        ]
        for server in look_alikes:
            seeded[server.server_id] = (dict(server.metadata), set(server.tags))
    return seeded


class PlacesWatch:
    """Every region's servers watched from a thread of its own (the test's event loop may be
    blocked on a process): per group, the most it ever held at once, and every create request
    that had two live servers at once; and any server of a group seen in another region."""

    def __init__(self, regions: dict[str, SimRegion]) -> None:
        self.regions = regions
        self.most: Counter[str] = Counter()
        self.twice: set[str] = set()
        self.elsewhere: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            for name, region in self.regions.items():
                for group_id in self.regions:
                    servers = ours(region, group_id)
                    if group_id != name:
                        self.elsewhere |= {s.server_id for s in servers}
                        continue
                    self.most[group_id] = max(self.most[group_id], len(servers))
                    counts = Counter(s.metadata.get(META_REQUEST) for s in servers)
                    self.twice |= {r for r, n in counts.items() if r and n > 1}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def check_invariants(
    regions: dict[str, SimRegion],
    watch: PlacesWatch,
    want: dict[str, int],
    maxima: dict[str, int],
    look_alikes: dict[str, tuple[dict[str, str], set[str]]],
) -> None:
    """The invariants of the module's docstring, after a convergence."""
    for group_id, region in regions.items():
        assert watch.most[group_id] <= maxima[group_id], (
            f"{group_id} held {watch.most[group_id]} servers at once in {region.name}, "
            f"max_size {maxima[group_id]}"
        )
        servers = ours(region, group_id)
        assert len(servers) == want[group_id], (group_id, len(servers))
        requests = Counter(s.metadata.get(META_REQUEST) for s in servers)
        assert max(requests.values(), default=0) <= 1, requests
        for server in servers:  # the cluster's tag, and the create's own, on each
            assert {TAG, f"{TAG_REQUEST_PREFIX}{server.metadata[META_REQUEST]}"} <= server.tags
        # The same cluster name written in every place: metadata and tag alike.
        for server in region.nova.live_servers():
            if server.metadata.get(META_GROUP) in regions and TAG in server.tags:
                if server.server_id in look_alikes:
                    continue
                assert server.metadata.get(META_CLUSTER) == CLUSTER, server
                assert server.name.startswith(f"{CLUSTER}-{server.metadata[META_GROUP]}-")
        # Nothing lacking a mark was deleted, or changed.
        deleted = {asked.server_id for asked in region.nova.deletes_asked}
        for server_id, (metadata, tags) in look_alikes.items():
            server = region.nova.find_server(server_id)
            if server is None:
                continue  # seeded in the other region
            assert server_id not in deleted
            assert server.deleting_since is None
            assert (server.metadata, server.tags) == (metadata, tags)
    assert not watch.twice, watch.twice
    assert not watch.elsewhere, (
        f"servers in a region their group does not live in: {watch.elsewhere}"
    )


# -- the Cluster Autoscaler -----------------------------------------------------------------------


async def ca_loop(
    where: Callable[[], str | None],
    regions: dict[str, SimRegion],
    want: dict[str, int],
    *,
    timeout: float,
    told: list[tuple[str, int, int]] | None = None,
) -> None:
    """CA's loop over every group, its connection made where ``where`` says (a new one after
    the old breaks, as gRPC reconnects): Refresh, read each group's max size and target,
    delete the instances that carry error info, ask for what is missing within the max size
    it is told, until each region holds ``want`` of its group and the targets agree. Every
    (group, max size, target) it was told goes to ``told``."""

    async def step(ca: CaClient) -> bool:
        return await _ca_step(ca, regions, want, told)

    if await until_through(where, step, timeout=timeout):
        return
    held = {g: len(ours(region, g)) for g, region in regions.items()}
    raise AssertionError(f"not converged on {want}: Nova holds {held}")


async def converge(
    where: Callable[[], str | None],
    regions: dict[str, SimRegion],
    want: dict[str, int],
    watch: PlacesWatch,
    maxima: dict[str, int],
    *,
    timeout: float,
    told: list[tuple[str, int, int]] | None = None,
) -> None:
    """``ca_loop``; when it does not converge, a group seen above its max_size says so first."""
    try:
        await ca_loop(where, regions, want, timeout=timeout, told=told)
    except AssertionError:
        for group_id, most in watch.most.items():
            assert most <= maxima[group_id], (
                f"{group_id} held {most} servers at once in {regions[group_id].name}, "
                f"max_size {maxima[group_id]}"
            )
        raise


async def _ca_step(
    ca: CaClient,
    regions: dict[str, SimRegion],
    want: dict[str, int],
    told: list[tuple[str, int, int]] | None,
) -> bool:
    await ca.refresh()
    maxima = {found.id: found.maxSize for found in await ca.node_groups()}
    done = True
    for group_id, wanted in want.items():
        if group_id not in maxima:
            done = False  # its place not listed yet: out of CA's view
            continue
        instances = list(await ca.nodes(group_id))
        failed = [i for i in instances if i.status.HasField("errorInfo")]
        if failed:
            await ca.delete(group_id, [(i.id, i.id) for i in failed])
        target = await ca.target_size(group_id)
        if told is not None:
            told.append((group_id, maxima[group_id], target))
        goal = min(wanted, maxima[group_id])
        if target < goal:
            await ca.increase(group_id, goal - target)
        live = len(ours(regions[group_id], group_id))
        done = done and target == wanted == len(kept(instances)) == live
    return done


async def killed_with_creates_in_flight(
    config: Path,
    regions: dict[str, SimRegion],
    stall: float,
    asks: dict[str, int],
    in_flight: Callable[[], bool],
) -> None:
    """A first life, a fresh install, that answers OK to CA's IncreaseSize (``asks``) while
    each region's Nova holds every create in its API for ``stall`` seconds, SIGKILLed as soon
    as ``in_flight()``; each region's Nova stores later creates at once again."""
    with ServedOsas(config) as first:
        first.wait_for("health SERVING")
        first_listings(first)  # both places in CA's view (one may be retrying its first)
        for region in regions.values():
            region.nova.faults.create_stall = stall
        async with ca_client(first.address) as ca:
            for group_id, delta in asks.items():
                await ca.increase(group_id, delta)
        await eventually(in_flight, what="creates in flight")
        first.kill()
    for region in regions.values():
        region.nova.faults.create_stall = 0.0
        region.nova.faults.create_rate = 0.0


def first_listings(osas: ServedOsas) -> list[int]:
    """How many of the cluster's servers each place's first listing showed, once both are
    done."""
    deadline = time.monotonic() + 20
    while len(done := osas.seen("first sync done")) < len(REGION):
        assert time.monotonic() < deadline, osas.events[-30:]
        time.sleep(0.05)
    return [event["servers"] for event in done]


# -- 1. kill -9 with creates in flight in both places ------------------------------------------


async def holder_and_standby(
    stack: contextlib.ExitStack,
    tmp_path: Path,
    kube: KubeStandIn,
    sim: SimulatedOpenStack,
    maxima: dict[str, int],
    *,
    window: float,
) -> tuple[ServedOsas, ServedOsas]:
    """Two replicas under one Lease: the first holds it and owns CA's endpoint, the second
    stands by; each has listed both places."""
    configs = [
        replica(tmp_path, kube, sim, name, maxima, window=window) for name in ("osas-a", "osas-b")
    ]
    first = stack.enter_context(ServedOsas(*configs[0]))
    first.wait_for("health SERVING", timeout=window + 20)
    second = stack.enter_context(ServedOsas(*configs[1]))
    second.wait_for("another osas holds the lease; standing by")
    await eventually(lambda: service_address(kube) == first.address, what="endpoint")
    for served in (first, second):  # both places listed by each
        first_listings(served)
    return first, second


async def test_a_kill_with_creates_in_flight_in_two_regions_keeps_every_invariant(tmp_path):
    """One osas (no election, so no promise record: a new life holds every place's scale-ups
    for create_doubt_window after its start) serves "north" in RegionOne and "south" in
    RegionTwo. CA's IncreaseSize is answered OK in both; each region's Nova holds the creates
    in its API (stored 5 s after they were sent), and RegionTwo's rate limit keeps one of
    them unsent; osas is SIGKILLed as soon as they are in flight. A new osas (the same
    settings, holding after its start) lists both regions before the creates land, and CA's
    loop converges: each group holds exactly what CA wanted (its max size), the late creates
    adopted, never doubled, the unsent one asked for again; never above max_size in either
    region at any instant, each group in its own region alone, the same cluster name on every
    server in both, and no look-alike without the cluster's marks touched."""
    maxima = {"north": 4, "south": 3}
    window, stall = 7.0, 5.0
    with two_regions() as (sim, regions):
        seed_ours(regions["north"], "north", 1)
        seed_ours(regions["south"], "south", 1)
        look_alikes = seed_look_alikes(regions)
        # The first life is a fresh install (nothing of an earlier osas can be in flight).
        first_config = places_config(
            tmp_path, sim, "first", maxima, window=window, hold_after_start=False
        )
        config = places_config(tmp_path, sim, "osas", maxima, window=window, api_timeout=2.0)
        watch = PlacesWatch(regions)
        try:
            regions["south"].nova.faults.create_rate = 0.2  # one now, the next in 5 s
            await killed_with_creates_in_flight(
                first_config,
                regions,
                stall,
                {"north": 3, "south": 2},
                lambda: (
                    regions["north"].calls["compute.servers.create"] == 3
                    and regions["south"].throttled["compute.servers.create"] >= 1
                ),
            )
            with ServedOsas(config) as second:
                second.wait_for("health SERVING")
                # It listed both regions before the creates were stored (the earlier server).
                assert first_listings(second) == [1, 1], second.events[-30:]
                told: list[tuple[str, int, int]] = []
                await converge(
                    lambda: second.address,
                    regions,
                    maxima,
                    watch,
                    maxima,
                    timeout=window + 15,
                    told=told,
                )
                assert second.stop() == 0
        finally:
            watch.stop()
        check_invariants(regions, watch, maxima, maxima, look_alikes)
        assert all(max_size <= maxima[g] for g, max_size, _ in told)
        # Held after the start: CA was told it could not grow either group for a while.
        assert {g for g, max_size, target in told if max_size == target < maxima[g]} == {
            "north",
            "south",
        }
        assert regions["south"].calls["compute.servers.create"] >= 3  # the unsent one, again


# -- 2. failover under one Lease with promises outstanding in both places ----------------------


async def test_the_standby_keeps_the_killed_holders_promises_in_both_regions(tmp_path):
    """Two replicas under one Lease, a group in each region. The holder answers OK to
    IncreaseSize in both (the creates held in each region's Nova API, stored 3 s after they
    were sent) and to DeleteNodes of one earlier server in each (both regions answering 503
    meanwhile, so no DELETE reached Nova), then is SIGKILLed. The standby takes the Lease
    and keeps both places' promises from the one record: its first answers count the dead
    holder's creates and leave out its deletes in each group (the targets CA expects), it
    sends the deletes to each region, adopts the late creates where they land, and CA's loop
    (through the Service) converges with nothing asked again. The invariants hold in and
    across both regions; the record it took over held 4 creates and 2 deletes."""
    maxima = {"north": 4, "south": 4}
    window, stall = 6.0, 3.0
    want = {"north": 3, "south": 3}  # 2 earlier - 1 deleted + 2 created, in each
    with KubeStandIn() as kube, two_regions() as (sim, regions):
        earlier = {g: seed_ours(regions[g], g, 2) for g in regions}
        look_alikes = seed_look_alikes(regions)
        watch = PlacesWatch(regions)
        try:
            with contextlib.ExitStack() as stack:
                first, second = await holder_and_standby(
                    stack, tmp_path, kube, sim, maxima, window=window
                )
                for region in regions.values():
                    region.nova.faults.create_stall = stall
                async with ca_client(first.address) as ca:
                    for group_id in regions:
                        await ca.increase(group_id, 2)
                    await eventually(
                        lambda: all(
                            r.calls["compute.servers.create"] == 2 for r in regions.values()
                        ),
                        what="two creates in each region's API",
                    )
                    for region in regions.values():
                        region.nova.faults.error_rate = 1.0
                    for group_id, ids in earlier.items():
                        await ca.delete(group_id, [("n0", f"openstack:///{ids[0]}")])
                first.kill()
                for region in regions.values():
                    region.nova.faults.error_rate = 0.0
                    region.nova.faults.create_stall = 0.0
                assert all(len(ours(regions[g], g)) == 2 for g in regions)  # nothing done yet
                second.wait_for("became the leader", timeout=LEASE_DURATION + 10)
                second.wait_for("health SERVING")
                await eventually(
                    lambda: service_address(kube) == second.address, what="endpoint moved"
                )
                async with ca_client(second.address) as ca:
                    # The promises counted at once, in each group: the targets CA expects.
                    assert {g: await ca.target_size(g) for g in regions} == want
                told: list[tuple[str, int, int]] = []
                await converge(
                    lambda: service_address(kube),
                    regions,
                    want,
                    watch,
                    maxima,
                    timeout=20,
                    told=told,
                )
                assert second.stop() == 0
        finally:
            watch.stop()
        check_invariants(regions, watch, want, maxima, look_alikes)
        took_over = second.seen("took over the previous leader's promise record")
        assert (took_over[0]["creates"], took_over[0]["deletes"]) == (4, 2)
        for group_id, ids in earlier.items():
            region = regions[group_id]
            assert region.nova.find_server(ids[0]).deleting_since is not None  # deleted
            assert [a.server_id for a in region.nova.deletes_asked] == [ids[0]]
            assert region.calls["compute.servers.create"] == 2  # nothing asked again
        assert all(target == want[g] for g, _, target in told)


# -- 3. each place's own doubt after a takeover or a start --------------------------------------


async def _ca_steps(
    address: str,
    regions: dict[str, SimRegion],
    want: dict[str, int],
    until: Callable[[], bool],
    timeout: float,
) -> list[tuple[str, int, int]]:
    """CA's loop, converging or not, until ``until()`` (at most ``timeout`` seconds); every
    (group, max size, target) it was told."""
    told: list[tuple[str, int, int]] = []
    deadline = time.monotonic() + timeout
    async with ca_client(address) as ca:
        while not until():
            assert time.monotonic() < deadline, f"CA's loop timed out; told {told[-4:]}"
            await _ca_step(ca, regions, want, told)
            await asyncio.sleep(0.2)
    return told


async def test_after_a_takeover_each_region_settles_its_own_doubt(tmp_path):
    """The Lease holder accepts IncreaseSize(2) in each region (max_size 2 both), whose Novas
    answer every call 503 (the creates are in the record, and never reach Nova), and is
    SIGKILLed. RegionOne answers again; RegionTwo stays unreachable. The standby takes over
    with the record: each place counts its own group's inherited creates, in doubt until a
    listing of that place shows them or one made after create_doubt_window (from the
    takeover) does not. Asserted: right after the takeover both targets are 2 (= max_size,
    CA can ask nothing, an IncreaseSize is refused); RegionOne's doubt ends when its window
    passes and a listing of it does not show them, and its group then scales to 2 on CA's
    ask while RegionTwo is still unreachable; RegionTwo's group does not scale past its own
    window (target still 2, IncreaseSize refused) for as long as no listing of it can settle
    the doubt; once it answers, its doubt settles and it scales to 2. Never above max_size,
    no duplicate, each group in its region, look-alikes untouched."""
    maxima = {"north": 2, "south": 2}
    window = 4.0
    with KubeStandIn() as kube, two_regions() as (sim, regions):
        look_alikes = seed_look_alikes(regions)
        watch = PlacesWatch(regions)
        try:
            with contextlib.ExitStack() as stack:
                first, second = await holder_and_standby(
                    stack, tmp_path, kube, sim, maxima, window=window
                )
                for region in regions.values():
                    region.nova.faults.error_rate = 1.0
                async with ca_client(first.address) as ca:
                    for group_id in regions:
                        await ca.increase(group_id, 2)  # answered: in the record
                await asyncio.sleep(0.5)  # the holder's workers trying them
                first.kill()
                regions["north"].nova.faults.error_rate = 0.0  # RegionTwo stays unreachable
                second.wait_for("became the leader", timeout=LEASE_DURATION + 10)
                took_over = time.monotonic()
                second.wait_for("health SERVING")
                async with ca_client(second.address) as ca:
                    assert {g: await ca.target_size(g) for g in regions} == maxima
                    for group_id in regions:
                        refused = await expect_status(
                            grpc.StatusCode.FAILED_PRECONDITION, ca.increase(group_id, 1)
                        )
                        assert "exceeds max size" in refused
                # RegionOne's doubt ends with its window: CA's loop then fills its group.
                told = await _ca_steps(
                    second.address,
                    regions,
                    maxima,
                    lambda: (
                        len(ours(regions["north"], "north")) == 2
                        and time.monotonic() > took_over + window + 1.5
                    ),
                    timeout=window + 10,
                )
                lapsed = second.seen("inherited-create-lapsed")
                assert {e["group"] for e in lapsed} == {"north"}
                # RegionTwo's doubt outlived its window: nothing settles it while it is down.
                assert all(target == 2 for g, _, target in told if g == "south")
                async with ca_client(second.address) as ca:
                    refused = await expect_status(
                        grpc.StatusCode.FAILED_PRECONDITION, ca.increase("south", 1)
                    )
                    assert "exceeds max size" in refused
                assert ours(regions["south"], "south") == []
                # RegionTwo answers again: a listing settles its doubt, and it scales.
                regions["south"].nova.faults.error_rate = 0.0
                await converge(
                    lambda: second.address, regions, maxima, watch, maxima, timeout=window + 10
                )
                assert {e["group"] for e in second.seen("inherited-create-lapsed")} == {
                    "north",
                    "south",
                }
                assert second.stop() == 0
        finally:
            watch.stop()
        check_invariants(regions, watch, maxima, maxima, look_alikes)
        # The north group scaled on its own window, not on RegionTwo's return.
        north_scaled = [t for g, _, t in told if g == "north"]
        assert north_scaled[0] == 2
        assert 0 in north_scaled


async def slowed_after_a_listing(region: SimRegion, latency: float) -> None:
    """Once osas has listed ``region`` again (a request begun since, and one more), each call
    to its Nova takes ``latency`` seconds more."""
    listings = region.calls["compute.servers.list"]
    await eventually(
        lambda: region.calls["compute.servers.list"] >= listings + 2,
        what=f"{region.name} listed",
    )
    region.nova.faults.latency = latency


async def test_after_a_start_each_region_holds_until_its_own_listing_settles_the_doubt(tmp_path):
    """No election, so no promise record: after a start, creates an earlier osas sent may
    still reach Nova, and each place holds its scale-ups (CA told max size = target,
    IncreaseSize refused as held) through create_doubt_window. An osas is SIGKILLed with two
    creates held in each region's Nova API (stored 4.5 s after they were sent); a new one
    lists both regions before they land, at its start and during its window; then RegionTwo
    turns slow (each call 2 s, past api_timeout: its listings fail, while what reaches it is
    still carried out). Asserted:
    RegionOne's hold ends with its window, its listing shows the late creates, and CA's ask
    for one more is carried out there although RegionTwo is down; RegionTwo's group does not
    scale past its window while no listing of it made after the window has shown what landed
    (CA is told max size = target, an IncreaseSize is refused as held): else a stale target
    of 0 would let CA ask for 2 more, which the slow Nova still stores, 4 against max_size
    2. Once RegionTwo answers, its listing shows the late 2 and the group is at its max size
    with nothing asked again. Never above max_size, no duplicate, each group in its region,
    look-alikes untouched."""
    maxima = {"north": 3, "south": 2}
    want = {"north": 3, "south": 2}
    window, stall, slow = 6.0, 4.5, 2.0
    with two_regions() as (sim, regions):
        look_alikes = seed_look_alikes(regions)
        first_config = places_config(
            tmp_path, sim, "first", maxima, window=window, hold_after_start=False
        )
        config = places_config(tmp_path, sim, "osas", maxima, window=window)
        watch = PlacesWatch(regions)
        try:
            await killed_with_creates_in_flight(
                first_config,
                regions,
                stall,
                {"north": 2, "south": 2},
                lambda: all(r.calls["compute.servers.create"] == 2 for r in regions.values()),
            )
            with ServedOsas(config) as second:
                second.wait_for("health SERVING")
                started = time.monotonic()
                # RegionTwo listed during its window (before the creates land), then slow.
                await slowed_after_a_listing(regions["south"], slow)
                # Both regions listed before the creates landed, and RegionTwo slow before.
                assert first_listings(second) == [0, 0], second.events[-30:]
                assert ours(regions["south"], "south") == []
                address = second.address
                async with ca_client(address) as ca:
                    refused = await expect_status(
                        grpc.StatusCode.FAILED_PRECONDITION, ca.increase("north", 1)
                    )
                    assert "held" in refused
                await eventually(
                    lambda: len(ours(regions["north"], "north")) == 2,
                    timeout=window,
                    what="the late creates landing in RegionOne",
                )
                await asyncio.sleep(max(0.0, started + window + 0.5 - time.monotonic()))
                # Both windows over; RegionTwo still slow: CA's loop for a while.
                ends = time.monotonic() + 1.5
                told = await _ca_steps(
                    address, regions, want, lambda: time.monotonic() > ends, timeout=5
                )
                assert len(ours(regions["north"], "north")) == 3  # RegionOne scaled
                async with ca_client(address) as ca:
                    await ca.refresh()
                    south_target = await ca.target_size("south")
                    asked = ca.increase("south", 1)
                    refused = await expect_status(grpc.StatusCode.FAILED_PRECONDITION, asked)
                # RegionTwo answers again: whatever osas still has in hand for it is sent.
                regions["south"].nova.faults.latency = 0.0
                try:
                    await ca_loop(lambda: address, regions, want, timeout=window + 5)
                except AssertionError as exc:
                    converged: AssertionError | None = exc
                else:
                    converged = None
                assert watch.most["south"] <= maxima["south"], (
                    f"RegionTwo's group reached {watch.most['south']} servers (max_size "
                    f"{maxima['south']}): its hold ended with its window while no listing of "
                    "it could show the late creates, and CA's ask on a stale target was sent"
                )
                assert converged is None, converged
                assert "held" in refused, refused
                assert all(max_size == target for g, max_size, target in told if g == "south")
                assert south_target == 0  # its last listing's, before the creates landed
                assert regions["south"].calls["compute.servers.create"] == 2  # the first's
                assert second.stop() == 0
        finally:
            regions["south"].nova.faults.latency = 0.0
            watch.stop()
        check_invariants(regions, watch, want, maxima, look_alikes)
