"""A burst against a rate-limited cloud: IncreaseSize(1,000) against a cloud that allows 5
server creates a second, osas at its default ``openstack.rate_limit`` (50 a second).

Public clouds put a rate limit in front of Nova and answer 429 with ``Retry-After`` above it; a
create so refused never reached Nova. osas takes such an answer as pace (``osas.cloud.pacing``):
it waits, slows down and sends the create again, and never reports it failed to CA. Measured
here is what that costs a burst, against the ideal of every create at the cloud's rate.

Separate processes, as in a cluster: the simulated OpenStack (``osas sim``, builds that take a
second, its rate limit set through its control API) and ``osas serve`` against it with mTLS;
CA's side is a gRPC client in this process. Each round, with a fresh cloud and osas: CA's side
calls NodeGroupIncreaseSize once, then NodeGroupNodes every second, as CA's loop would, until
every instance is running or the time limit passes, noting every instance shown with
``errorInfo``. The cloud then says how many creates it refused (``/_sim/calls``) and how many
servers it stored (``/_sim/servers``), and osas's ``/metrics`` the pace it allows itself.

``python -m osas.bench.burst [--count N] [--rate R] [--rounds N] [--out PATH]`` measures this
alone and rewrites only its section of the report (``osas bench`` measures it with everything
else).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from osas.bench.client import Call, Client, nodes
from osas.bench.processes import (
    CLUSTER,
    Osas,
    Setup,
    Tls,
    machine,
    sim_get,
    start_osas,
    stop_process,
)
from osas.bench.report import replace_burst_section
from osas.bench.results import BurstResult
from osas.cloud.openstack_settings import OpenStackSettings
from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST
from osas.engine.settings import QueueSettings, ReconcileSettings
from osas.protocol import externalgrpc_pb2 as pb

CREATES = 1_000
RATE = 5.0  # server creates a second the cloud allows
ROUNDS = 1  # the burst is long
TIME_LIMIT = 900.0  # CA's default max-node-provision-time: a node later than this is given up
BUILD_SECONDS = 1.0  # quick builds: the cloud's rate, not its builds, is measured
POLL = 1.0  # how often CA's side asks for the group's instances
GROUP = "g0"
CREATE = "compute.servers.create"  # the simulator's name for a create, in its counts
PACE = "osas_openstack_pace_per_second"


@dataclass(frozen=True)
class Watched:
    """What CA's side was shown of one burst."""

    began: float  # wall clock at IncreaseSize, to compare with Nova's timestamps
    seconds: float  # from IncreaseSize to the answer showing every instance running (or the limit)
    running: int  # instances running in the last answer
    failed: int  # instances ever shown with errorInfo


@dataclass(frozen=True)
class Counted:
    """What the cloud counted of one burst."""

    posts: int  # create POSTs sent to it, refused ones included
    throttled: int  # creates it answered 429
    servers: int  # servers of the group it stored
    request_ids: int  # distinct osas request ids among them: one per create osas accepted
    last_created: float  # wall clock (to the second) of the last server stored


# -- processes ----------------------------------------------------------------------------------


@contextmanager
def rate_limited_cloud(folder: Path, rate: float, name: str) -> Iterator[dict[str, Any]]:
    """``osas sim`` in a process of its own, allowing ``rate`` creates a second (set through its
    control API once it serves); its URLs as the benchmark's other clouds give them. It prints
    where Keystone is once it serves, and stops on SIGTERM."""
    command = [sys.executable, "-m", "osas", "sim", "--port", "0"]
    command += ["--build-seconds", str(BUILD_SECONDS)]
    with (folder / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own command, arguments we build
            command, stdout=subprocess.PIPE, stderr=log, text=True
        )
    try:
        line = process.stdout.readline() if process.stdout else ""
        auth_url = line.rpartition(" keystone at ")[2].strip()
        if not auth_url.startswith("http://"):
            msg = f"osas sim did not say where it serves (it printed {line!r})"
            raise RuntimeError(msg)
        base_url = auth_url.removesuffix("/identity/v3")
        answer = requests.post(f"{base_url}/_sim/faults", json={"create_rate": rate}, timeout=10)
        answer.raise_for_status()
        yield {"auth_url": auth_url, "base_url": base_url}
    finally:
        stop_process(process)
        if process.stdout:
            process.stdout.close()


def counted(sim: dict[str, Any]) -> Counted:
    """The cloud's counts: creates sent and refused, and the group's servers it stored (deleted
    ones included: a create stored twice and cleaned up later still counts)."""
    calls = sim_get(sim, "/_sim/calls")
    stored = [
        server
        for server in sim_get(sim, "/_sim/servers?deleted=true")["servers"]
        if server["metadata"].get(META_CLUSTER) == CLUSTER
        and server["metadata"].get(META_GROUP) == GROUP
    ]
    created = [datetime.fromisoformat(server["created"]).timestamp() for server in stored]
    return Counted(
        posts=int(calls["calls"].get(CREATE, 0)),
        throttled=int(calls["throttled"].get(CREATE, 0)),
        servers=len(stored),
        request_ids=len({server["metadata"].get(META_REQUEST) for server in stored}),
        last_created=max(created, default=math.nan),
    )


def pace_per_second(osas: Osas) -> float:
    """The requests a second osas allows itself now, from its /metrics (NaN: not exported)."""
    answer = requests.get(f"http://127.0.0.1:{osas.metrics}/metrics", timeout=10)
    answer.raise_for_status()
    for family in text_string_to_metric_families(answer.text):
        if family.name == PACE and family.samples:
            return float(family.samples[0].value)
    return math.nan


# -- the burst ----------------------------------------------------------------------------------


async def watch_burst(client: Client, count: int, time_limit: float) -> Watched:
    """IncreaseSize(``count``), then the group's instances every second until ``count`` of them
    are running or ``time_limit`` has passed; every instance shown with errorInfo meanwhile
    counts as a create reported failed."""
    request = pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=count).SerializeToString()
    increase = Call("NodeGroupIncreaseSize", request, pb.NodeGroupIncreaseSizeResponse)
    running_state = pb.InstanceStatus.instanceRunning
    failed: set[str] = set()
    began, started = time.time(), time.perf_counter()
    await client.call(increase)
    while True:
        answer = await client.call(nodes(GROUP))
        if not isinstance(answer, pb.NodeGroupNodesResponse):
            msg = "osas did not answer NodeGroupNodes"
            raise RuntimeError(msg)  # noqa: TRY004 - a broken run, not a wrong argument
        instances = answer.instances
        failed.update(i.id for i in instances if i.status.HasField("errorInfo"))
        running = sum(i.status.instanceState == running_state for i in instances)
        seconds = time.perf_counter() - started
        if running >= count or seconds >= time_limit:
            return Watched(began, seconds, running, len(failed))
        await asyncio.sleep(POLL)


async def one_round(result: BurstResult, tls: Tls, folder: Path, index: int) -> None:
    """One burst against a fresh cloud and a fresh osas, its figures added to ``result``."""
    # Room for the burst in osas's queue (its default holds 1,000 tasks); the group's max_size
    # is the benchmark's 10,000.
    queue = {"capacity": max(QueueSettings().capacity, 2 * result.count)}
    with rate_limited_cloud(folder, result.rate, f"burst-sim-{index}") as sim:
        setup = Setup(folder, tls, sim, [GROUP])
        osas = await start_osas(setup, f"burst-osas-{index}", metrics=True, queue=queue)
        client = Client(osas.port, tls)
        try:
            watched = await watch_burst(client, result.count, result.time_limit)
            pace = pace_per_second(osas)
        finally:
            await client.close()
            osas.stop()
        cloud = counted(sim)
    late = (
        ""
        if watched.running >= result.count
        else f"{watched.running:,} of {result.count:,} running when the limit passed"
    )
    result.add("burst_running", watched.seconds, late)
    result.add("burst_stored", cloud.last_created - watched.began, "Nova's created, to the second")
    result.add("burst_ideal", watched.seconds / result.ideal, f"ideal {result.ideal:.0f} s")
    result.add("burst_throttled", cloud.throttled, f"of {cloud.posts:,} create POSTs")
    result.add(
        "burst_servers",
        cloud.servers,
        f"{result.count:,} asked, {cloud.posts - cloud.throttled:,} POSTs let through, "
        f"{cloud.request_ids:,} request ids",
    )
    result.add("burst_shown_running", watched.running)
    result.add("burst_failed", watched.failed)
    if not math.isnan(pace):
        result.add("burst_pace", pace, f"openstack.rate_limit {result.rate_limit:g}/s")


async def measure_burst(
    rounds: int,
    tls: Tls,
    folder: Path,
    *,
    count: int = CREATES,
    rate: float = RATE,
    time_limit: float = TIME_LIMIT,
) -> BurstResult:
    """``rounds`` bursts of ``count`` creates against a cloud allowing ``rate`` a second."""
    print(  # noqa: T201
        f"== a burst of {count:,} creates against a cloud allowing {rate:g} a second", flush=True
    )
    result = BurstResult(
        count,
        rate,
        time_limit,
        BUILD_SECONDS,
        OpenStackSettings().rate_limit,
        QueueSettings().workers,
        ReconcileSettings().interval,
    )
    for index in range(rounds):
        await one_round(result, tls, folder, index)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=CREATES, help="creates asked for at once")
    parser.add_argument("--rate", type=float, default=RATE, help="creates a second the cloud takes")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="osas-bench-") as temporary:
        folder = Path(temporary)
        result = asyncio.run(
            measure_burst(args.rounds, Tls.make(folder), folder, count=args.count, rate=args.rate)
        )
    replace_burst_section(args.out, result, machine())
    print(f"written: {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
