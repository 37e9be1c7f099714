"""The benchmark: how fast osas answers CA and syncs, and what the inventory costs in memory,
at cluster sizes that matter. Run with `nox -s bench` (or `python tests/benchmark/run.py`).
Everything runs on 127.0.0.1: osas over gRPC with mTLS, the simulated OpenStack over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from support import (
    CLUSTER,
    TAG,
    Provider,
    ca_client,
    config_data,
    make_certs,
    settings_for,
    write_config,
)

from osas.cloud.openstack import OpenStackCloud
from osas.config import load_config
from osas.domain.inventory import Inventory
from osas.domain.servers import META_CLUSTER, META_GROUP, OwnershipMarks, Server
from osas.sim import SimulatedOpenStack
from osas.sim.cloud import FakeCloud
from osas.sim.model import FakeNova

BIG = {
    "id": "big",
    "min_size": 0,
    "max_size": 10_000,
    "flavor": "m1.small",
    "image": "ubuntu-24.04",
    "networks": ["cluster-net"],
}


def seed(nova: FakeNova, count: int) -> list[str]:
    nova.clock = lambda: datetime.now(UTC) - timedelta(hours=1)
    ids = [
        nova.seed(
            name=f"{CLUSTER}-big-{i}",
            metadata={META_CLUSTER: CLUSTER, META_GROUP: "big"},
            tags=[TAG],
        ).server_id
        for i in range(count)
    ]
    nova.clock = lambda: datetime.now(UTC)
    return ids


def row(what: str, value: str) -> None:
    print(f"  {what:<58} {value}")


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[int(len(ordered) * 0.99) - 1] * 1000
    return f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"


def inventory_memory(servers: int) -> None:
    config = load_config(write_config(Path(tempfile.mkdtemp()), config_data(node_groups=[BIG])))
    cluster = config.cluster_spec()
    marks = OwnershipMarks(CLUSTER)
    nova = FakeNova()
    records = [s.record() for s in (nova.get_server(i) for i in seed(nova, servers)) if s]
    tracemalloc.start()
    inventory = Inventory(cluster)
    claimed: list[Server] = [c for r in records if (c := marks.claim(r)) is not None]
    started = time.perf_counter()
    inventory.ledger.settle_full(inventory.ledger.begin_sync(), claimed, 0.0)
    elapsed = time.perf_counter() - started
    size, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row(f"inventory of {servers:,} servers: memory", f"{size / 2**20:.1f} MiB")
    row(f"inventory of {servers:,} servers: apply a full sync", f"{elapsed * 1000:.0f} ms")


async def rpc_latency(servers: int, nodes: int) -> None:
    folder = Path(tempfile.mkdtemp())
    certs = make_certs(folder)
    tls = {
        "cert_file": str(certs.server_cert),
        "key_file": str(certs.server_key),
        "client_ca_file": str(certs.client_ca),
    }
    data = config_data(node_groups=[BIG], insecure=False, tls=tls)
    nova = FakeNova()
    ids = seed(nova, servers)
    provider = Provider(load_config(write_config(folder, data)), FakeCloud(nova))
    await provider.start()
    try:
        async with ca_client(f"localhost:{provider.app.server.port}", certs) as ca:
            samples = []
            loop_started = time.perf_counter()
            for server_id in ids[:nodes]:  # CA: NodeGroupForNode once per node, serially
                started = time.perf_counter()
                await ca.group_for_node("n", f"openstack:///{server_id}")
                samples.append(time.perf_counter() - started)
            loop = time.perf_counter() - loop_started
            row(f"NodeGroupForNode, {nodes:,} nodes serially (mTLS)", percentiles(samples))
            row("  the whole per-loop pass", f"{loop:.2f} s")
            samples = []
            for _ in range(200):
                started = time.perf_counter()
                await ca.target_size("big")
                samples.append(time.perf_counter() - started)
            row(f"NodeGroupTargetSize, group of {servers:,}", percentiles(samples))
            samples = []
            for _ in range(20):
                started = time.perf_counter()
                instances = await ca.nodes("big")
                samples.append(time.perf_counter() - started)
            row(f"NodeGroupNodes, {len(instances):,} instances", percentiles(samples))
    finally:
        await provider.stop()


async def listing(servers: int) -> None:
    with SimulatedOpenStack(FakeNova()) as sim:
        seed(sim.nova, servers)
        cloud = OpenStackCloud(settings_for(sim))
        try:
            await cloud.verify()
            started = time.perf_counter()
            found = await cloud.list_servers(TAG)
            elapsed = time.perf_counter() - started
        finally:
            await cloud.close()
    row(f"full listing of {len(found):,} servers, openstacksdk over HTTP", f"{elapsed:.2f} s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    args = parser.parse_args()
    print(f"osas benchmark: {args.servers:,} servers, {args.nodes:,} nodes per CA loop")
    inventory_memory(args.servers)
    await rpc_latency(args.servers, args.nodes)
    await listing(args.servers)


if __name__ == "__main__":
    asyncio.run(main())
