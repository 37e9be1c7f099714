"""The mechanisms that keep osas fast, pinned without timing anything: syncs that cost what
they bring, answers reused until their group changes, resyncs applied between turns of the event
loop, one Keystone token and one look-up per name for every thread. Speed itself is measured by
the benchmark (`osas bench`, docs/BENCHMARKS.md), not asserted here."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import tracemalloc
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import anyio
from fake_cloud import FakeCloud
from support import (
    BIG,
    CLUSTER,
    TAG,
    Provider,
    ca_client,
    config_data,
    make_config,
    seed_earlier,
    seed_ours,
    settings_for,
    write_config,
)

from osas.cloud.openstack import OpenStackCloud, _records_of_page
from osas.cloud.port import CreateServerRequest
from osas.config import load_config
from osas.domain.inventory import Inventory
from osas.domain.servers import (
    META_CLUSTER,
    OwnershipMarks,
    Server,
)
from osas.engine.queue import TaskQueue
from osas.engine.reconciler import Reconciler
from osas.process import tune_process
from osas.protocol import externalgrpc_pb2 as pb
from osas.service.servicer import CloudProviderServicer
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

AN_HOUR_AGO = datetime.now(UTC) - timedelta(hours=1)
T = TypeVar("T")


def seeded(count: int, group: str = "workers") -> FakeNova:
    """Servers made an hour ago: outside every changes-since window of the tests."""
    nova = FakeNova()
    nova.clock = lambda: AN_HOUR_AGO
    seed_ours(nova, count, group)
    nova.clock = lambda: datetime.now(UTC)
    return nova


def reconciler_for(tmp_path, cloud, **config) -> tuple[Reconciler, Inventory]:
    loaded = load_config(write_config(tmp_path, config_data(**config)))
    cluster = loaded.cluster_spec()
    inventory = Inventory(cluster)
    reconciler = Reconciler(cloud, inventory, TaskQueue(100), loaded.engine_settings())
    return reconciler, inventory


async def test_an_empty_incremental_sync_leaves_the_inventory_as_it_was(tmp_path):
    reconciler, inventory = reconciler_for(tmp_path, FakeCloud(seeded(50)))
    await reconciler.reconcile_once(full=True)
    snapshot = inventory.snapshot
    servers = {s.server_id: s for s in snapshot.servers()}
    generations = {g: inventory.generation(g) for g in ("workers", "gpu")}

    orders = await reconciler.reconcile_once(full=False)

    assert reconciler.status.incremental_syncs == 1
    assert orders.deletes == ()
    assert orders.events == ()
    assert {g: inventory.generation(g) for g in ("workers", "gpu")} == generations
    assert len(snapshot) == 50
    assert all(snapshot.get(server_id) is server for server_id, server in servers.items())


async def test_an_incremental_sync_touches_only_the_groups_it_changes(tmp_path):
    nova = seeded(10)
    gpu = seed_ours(nova, 1, group="gpu")[0]
    reconciler, inventory = reconciler_for(tmp_path, FakeCloud(nova))
    await reconciler.reconcile_once(full=True)
    before = {s.server_id: s for s in inventory.snapshot.servers()}
    generations = {g: inventory.generation(g) for g in ("workers", "gpu")}

    nova.delete_seconds = 60.0  # ACTIVE with task_state deleting for now: listed as changed
    nova.delete_server(gpu)  # the only change: in the gpu group
    await reconciler.reconcile_once(full=False)

    assert inventory.generation("workers") == generations["workers"]
    assert inventory.generation("gpu") > generations["gpu"]
    workers = [s for s in inventory.snapshot.servers() if s.group_id == "workers"]
    assert all(before[s.server_id] is s for s in workers)


async def test_node_group_nodes_is_serialised_once_per_change_of_its_group(tmp_path):
    config = make_config(tmp_path)
    nova = seeded(3)
    seed_ours(nova, 1, group="gpu")
    provider = Provider(config, FakeCloud(nova))
    await provider.start()
    try:
        # A servicer over the running app's controller, called as the gate calls it (a read
        # that never waits is a plain method).
        servicer = CloudProviderServicer(provider.app.controller)

        async def answer(group: str) -> bytes:
            served = servicer.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group), None)
            return served.SerializeToString()

        first = await answer("workers")
        assert await answer("workers") is first  # the same bytes object, not rebuilt
        gpu = await answer("gpu")

        async with ca_client(provider.address) as ca:
            await ca.increase("gpu", 1)  # a change of another group
            assert await answer("workers") is first
            changed = await answer("gpu")
            assert changed is not gpu
            assert len(pb.NodeGroupNodesResponse.FromString(changed).instances) == 2

            await ca.increase("workers", 2)  # a change of this group
            after = await answer("workers")
            assert after is not first
            assert len(pb.NodeGroupNodesResponse.FromString(after).instances) == 5
            assert await answer("workers") is after
            # What CA receives is what the cache holds.
            assert len(await ca.nodes("workers")) == 5
            assert await ca.target_size("workers") == 5
    finally:
        await provider.stop()


async def probed_complete_listing(reconciler: Reconciler, probe: Callable[[], T]) -> list[T]:
    """A complete listing, with ``probe`` called at every turn it gives other tasks."""
    seen: list[T] = []
    listed = anyio.Event()

    async def prober() -> None:
        while not listed.is_set():
            seen.append(probe())
            await asyncio.sleep(0)

    async def listing() -> None:
        await reconciler.reconcile_once(full=True)
        listed.set()

    async with anyio.create_task_group() as group:
        group.start_soon(listing)
        group.start_soon(prober)
    return seen


async def test_a_complete_resync_lets_readers_in_between_its_slices(tmp_path):
    """A reader scheduled while a complete listing of 20,000 servers is compared with the
    inventory runs before that comparison ends, and only ever sees the inventory before the
    listing or after it, never a half-applied one."""
    nova = seeded(20_000, group="big")
    reconciler, inventory = reconciler_for(tmp_path, FakeCloud(nova), node_groups=[BIG])
    await reconciler.reconcile_once(full=True)
    assert inventory.target_size("big") == 20_000
    for server in nova.live_servers()[:5000]:
        nova.delete_server(server.server_id)  # behind osas's back: only a complete listing shows
    seen = await probed_complete_listing(reconciler, lambda: inventory.target_size("big"))

    assert len(seen) > 3  # the reader had turns while the resync ran
    assert set(seen) == {20_000}  # and saw the inventory whole, as it was
    assert inventory.target_size("big") == 15_000


def servers_alive() -> int:
    """Server objects the interpreter holds, wherever they are (the collector tracks each)."""
    return sum(1 for held in gc.get_objects() if type(held) is Server)


async def test_a_complete_listing_of_unchanged_servers_keeps_nothing_new(tmp_path):
    """A complete listing that shows the same servers again keeps the inventory's own
    objects, during the listing as after it: at any turn it gives other tasks, the objects
    alive are the inventory's and those of what changed, never a second copy of every server
    (which the collector would walk, and which would hold memory until the listing ends)."""
    nova = seeded(3000, group="big")
    reconciler, inventory = reconciler_for(tmp_path, FakeCloud(nova), node_groups=[BIG])
    await reconciler.reconcile_once(full=True)
    before = {s.server_id: s for s in inventory.snapshot.servers()}
    changed = nova.live_servers()[:10]
    with nova.lock:
        for server in changed:
            server.status = "ERROR"  # behind every changes-since: a complete listing shows it
    gc.collect()
    held = servers_alive()  # the inventory's 3,000, and whatever earlier tests still hold
    counts = await probed_complete_listing(reconciler, servers_alive)

    assert len(counts) > 3  # the listing gave other tasks turns
    assert max(counts) - held <= len(changed) + 1
    snapshot = inventory.snapshot
    moved = {server.server_id for server in changed}
    assert all(snapshot.get(i) is s for i, s in before.items() if i not in moved)
    assert all(snapshot.get(i).status == "ERROR" for i in moved)


async def test_repeated_complete_listings_of_the_same_servers_keep_no_more_objects(tmp_path):
    """Objects the collector tracks stay the same in number across complete listings of the
    same servers: none outlives the listing that made it."""
    gc.collect()
    elsewhere = servers_alive()  # what earlier tests still hold
    nova = seeded(2000, group="big")
    reconciler, inventory = reconciler_for(tmp_path, FakeCloud(nova), node_groups=[BIG])
    tracked: list[int] = []
    for _ in range(6):
        await reconciler.reconcile_once(full=True)
        gc.collect()
        tracked.append(len(gc.get_objects()))
    assert servers_alive() - elsewhere == len(inventory.snapshot) == 2000
    # The first listings warm what is made once (caches, the ledger's books); from then on a
    # listing of 2,000 unchanged servers leaves a few objects at most, not thousands.
    assert max(tracked[2:]) - tracked[2] <= 50, tracked


def seed_as_osas_made(nova: FakeNova, count: int, group: str = "big") -> None:
    """Servers as osas makes them: named for their request, with every mark."""
    for _ in range(count):
        seed_earlier(nova, group, uuid.uuid4().hex)


async def test_the_inventory_keeps_a_bounded_number_of_bytes_a_server(tmp_path):
    """What a complete listing read over HTTP leaves behind for each server it brought is
    the inventory's own: the Server with its id and request id strings, the float of its
    creation, and its entries in the snapshot's indexes by id, group and request. Nothing
    more: the ledger keeps no copy of every listed request id, the index by name waits for
    the first node without a provider id, and a name osas gave is kept as its group's stem
    (its request id holds the rest)."""
    nova = FakeNova()
    seed_as_osas_made(nova, 500)
    with SimulatedOpenStack(nova) as sim:
        config = load_config(write_config(tmp_path, config_data(node_groups=[BIG])))
        inventory = Inventory(config.cluster_spec())
        cloud = OpenStackCloud(settings_for(sim))
        reconciler = Reconciler(cloud, inventory, TaskQueue(10), config.engine_settings())
        try:
            # The connection, its token and what is made once, before the count begins.
            await reconciler.reconcile_once(full=True)
            seed_as_osas_made(nova, 4000)
            gc.collect()
            tracemalloc.start()
            try:
                await reconciler.reconcile_once(full=True)
                gc.collect()
                kept, _ = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        finally:
            await cloud.close()
    assert len(inventory.snapshot) == 4500
    sample = next(iter(inventory.snapshot.servers()))
    assert sample.name_given
    # Some 300 bytes of the server's own (its object, two uuids, a float) and some 100 of
    # index entries: 400 here. The name kept whole, an index by name and the ledger's copy
    # of the request id each added 45 to 70 more (560 in all).
    assert kept / 4000 <= 430, kept / 4000


async def test_a_resync_reads_every_servers_state_and_marks_again(tmp_path):
    """A complete listing is complete: every server's details are read again, so a change
    Nova's changes-since cannot show (a metadata mark deleted by hand, a state changed
    without a listing seeing it) is in the inventory after it; a server left out is looked
    up once before it counts as gone, and nothing else is fetched one by one."""
    with SimulatedOpenStack(seeded(30, group="big")) as sim:
        nova = sim.nova
        config = load_config(write_config(tmp_path, config_data(node_groups=[BIG])))
        cluster = config.cluster_spec()
        inventory = Inventory(cluster)
        cloud = OpenStackCloud(settings_for(sim))
        reconciler = Reconciler(cloud, inventory, TaskQueue(10), config.engine_settings())
        try:
            await reconciler.reconcile_once(full=True)
            assert len(inventory.snapshot) == 30
            servers = [nova.find_server(i) for i in inventory.snapshot.ids()]
            unmarked, building, gone = (s.server_id for s in servers[:3] if s is not None)
            # Behind every changes-since: a mark deleted (Nova leaves updated_at alone), a
            # state changed with updated_at kept an hour ago.
            nova.delete_metadata_key(unmarked, META_CLUSTER)
            with nova.lock:
                server = nova.find_server(building)
                assert server is not None
                server.status, server.task_state = "BUILD", "spawning"
            new = seed_ours(nova, 2, group="big")
            nova.delete_server(gone)
            sim.calls.clear()

            await reconciler.reconcile_once(full=True)
            snapshot = inventory.snapshot
            assert unmarked not in snapshot
            assert inventory.ledger.lost_marks(f"openstack:///{unmarked}")
            held = snapshot.get(building)
            assert held is not None
            assert held.status == "BUILD"
            assert set(new) <= set(snapshot.ids())
            assert gone not in snapshot
            assert len(snapshot) == 30 - 2 + 2
            assert sim.calls["compute.servers.get"] == 1  # the one left out, confirmed gone
            assert sim.calls["compute.servers.list"] == 1  # one page of details, no brief one
        finally:
            await cloud.close()


def create_request(index: int) -> CreateServerRequest:
    request_id = uuid.uuid4().hex
    marks = OwnershipMarks(CLUSTER)
    return CreateServerRequest(
        name=f"n{index}",
        flavor="m1.small",
        image="ubuntu-24.04",
        networks=["cluster-net"],
        metadata=marks.metadata("workers", request_id),
        tags=marks.tags(request_id),
    )


async def creates_through_one_cloud(sim: SimulatedOpenStack, count: int) -> dict[str, int]:
    """Requests other than creates that ``count`` concurrent creates cost, after verify()."""
    cloud = OpenStackCloud(settings_for(sim, concurrency=8))
    try:
        await cloud.verify()
        sim.calls.clear()
        await asyncio.gather(*(cloud.create_server(create_request(i)) for i in range(count)))
        await asyncio.gather(*(cloud.list_servers(TAG) for _ in range(count)))
    finally:
        await cloud.close()
    calls = dict(sim.calls)
    assert calls.pop("compute.servers.create") == count
    assert calls.pop("compute.servers.list") == count
    return calls


async def test_threads_share_one_token_and_one_look_up_per_name():
    with SimulatedOpenStack(FakeNova()) as sim:
        alone = await creates_through_one_cloud(sim, 1)
        together = await creates_through_one_cloud(sim, 16)
    # Sixteen creates on eight threads cost the name look-ups of one, and no new token.
    assert together == alone
    assert "identity.tokens.create" not in together
    assert any(operation.startswith("image.") for operation in together)


def detail_page(count: int) -> bytes:
    """A page of Nova's detail listing as a complete listing reads it: ``count`` servers of
    this cluster with the fields Nova sends (most of which osas skips)."""
    servers = []
    for _ in range(count):
        request_id = str(uuid.uuid4())
        servers.append(
            {
                "id": str(uuid.uuid4()),
                "name": f"{CLUSTER}-big-{request_id[:10]}",
                "status": "ACTIVE",
                "metadata": {META_CLUSTER: CLUSTER, "osas-node-group": "big"},
                "tags": [TAG, f"osas-request={request_id}"],
                "OS-EXT-STS:task_state": None,
                "created": "2026-12-05T12:00:00Z",
                "updated": "2026-12-05T12:00:00Z",
                "flavor": {"vcpus": 2, "ram": 4096, "disk": 20, "original_name": "m1.small"},
                "addresses": {"net": [{"addr": "10.0.0.5", "version": 4}]},
                "links": [{"rel": "self", "href": f"http://127.0.0.1/servers/{request_id}"}],
            }
        )
    return json.dumps({"servers": servers, "servers_links": []}).encode()


def test_a_page_of_a_complete_listing_sets_off_no_collection_in_a_tuned_process():
    """A page's records live as long as the page and are freed by their last reference: in a
    process tuned as ``osas serve`` is, reading and claiming a page of 1,000 servers leaves the
    garbage collector idle, where CPython's default set it off several times a page (in the
    worker thread reading it, holding the interpreter)."""
    content = detail_page(1000)
    marks = OwnershipMarks(CLUSTER)
    passes: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    def read_and_claim() -> int:
        gc.collect()  # every generation empty: the count starts at zero
        passes.clear()
        gc.callbacks.append(counted)
        try:
            records, _ = _records_of_page(content)
            claimed = {r.server_id: marks.claim(r) for r in records}
        finally:
            gc.callbacks.remove(counted)
        assert len(claimed) == 1000
        assert all(claimed.values())
        return len(passes)

    thresholds, switch = gc.get_threshold(), sys.getswitchinterval()
    try:
        gc.set_threshold(700, *thresholds[1:])
        assert read_and_claim() > 0  # CPython's default: the probe sees its passes
        tune_process()
        assert read_and_claim() == 0
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(switch)
