"""Node groups in several places: CA's loop for the groups of a healthy place while another
place is unreachable or holds 50,000 servers, against osas serving the healthy place alone;
and osas's memory per place.

Separate processes, in the same run, as in a cluster: the simulated OpenStack
(``osas.bench.cloud``) with three regions behind one Keystone (``RegionOne``, the healthy
place, with ``healthy`` servers over two node groups; ``RegionBig`` with ``big`` servers over
groups of 10,000; ``RegionDown``, 100 servers), a second simulated cloud with a Keystone of its
own (100 servers), and one ``osas serve`` with mTLS at its defaults for each run below, the
healthy place's groups in the top-level ``openstack`` block and the other place's in a group
block of their own (``region_name``, or ``auth`` for the other cloud):

- ``one``: the healthy place alone (the baseline);
- ``down``: and ``RegionDown``, whose Nova answers every call 503 from the moment osas serves
  (the simulator's ``error_rate`` fault; its Keystone, shared, still answers);
- ``refused``: and the other cloud, whose process is stopped once osas serves: every call
  there, its Keystone's included, is refused (connection refused);
- ``big``: and ``RegionBig`` with ``big`` servers, at the default sync intervals (an
  incremental sync every 10 s; its complete listings come every 30 minutes);
- ``one_listing``, ``one_listing_busy`` and ``big_listing``: a sync every second, each a
  complete listing, in every place: the healthy place alone; the same while another process
  pulls ``RegionBig``'s complete listing from the simulator back to back (the simulator's share
  of the machine's cores when it serves 50,000 servers' details, with no osas listing them);
  and the healthy place with ``RegionBig``, both listing back to back: ``RegionBig``'s
  listings are under way the whole time.

Each run's osas is started once, its other place made to fail where it fails (until osas has
logged a failed sync there), warmed with one loop and paused (SIGSTOP). Then, cycle after
cycle (``rounds``), each run takes its turn, in an order that turns cycle by cycle, so that
the machine's drift falls on all of them alike: resumed (SIGCONT, with the process pulling the
listing for ``busy``), given a second to catch up with its timers, CA's loop for the healthy
place's groups replayed serially for ``seconds`` (whole loops, one at least), one call in
flight, with CA's 5 s deadline, and paused again. The loop: Refresh, NodeGroups,
NodeGroupTargetSize per group, per node a NodeGroupForNode (as kubelet registers the node) and
four NodeGroupGetOptions, then NodeGroupTemplateNodeInfo and NodeGroupNodes per group; every
node of the healthy place is in each loop. p50, p99 and the worst call (all but
NodeGroupNodes, whose answer is its group's servers), the calls that failed, the
NodeGroupForNode answers naming another group than the node's, and osas's CPU a loop
(``/proc/<pid>/stat``, its other place's work included); each run's ratio to its baseline's
of the same cycle, and the median over cycles.

Memory: ``osas serve`` for 1, 2 ... ``most_places`` places (regions of one simulated cloud)
holding the same number of servers each (``per_place``: 0, then 10,000), its RSS from /proc a
second after it serves; the MiB each place adds ((RSS of the most places - RSS of one) / (the
most places - 1), per round; ``memory_rounds`` rounds).

``python -m osas.bench.places [--big N] [--healthy N] [--rounds R] [--seconds S]
[--per-place N ...] [--memory-rounds R] [--out PATH]`` measures this alone and rewrites only
its section of the report (``osas bench`` measures it with everything else).
``--list-region BASE_URL REGION`` is the process that pulls a region's complete listing back
to back, which the measure starts itself.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGCONT, SIGSTOP
from typing import Any

import grpc
import requests
import yaml

from osas.bench.caloop import Ask, Loop, Node, cluster_nodes, cpu_seconds, cpu_ticks
from osas.bench.client import CA_TIMEOUT, SERVICE, Client, nodes, template
from osas.bench.cloud import region_groups
from osas.bench.processes import (
    CLUSTER,
    GROUP_SIZE,
    Osas,
    Setup,
    Tls,
    kit,
    machine,
    osas_config,
    rss_mib,
    serve_osas,
)
from osas.bench.report import HEADER, figure_row, replace_marked_section, verdict
from osas.bench.results import Figure, Kind
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim.server import DEFAULT_DOMAIN, DEFAULT_PASSWORD, DEFAULT_PROJECT, DEFAULT_USER

BEGIN = "<!-- places: osas bench, or python -m osas.bench.places -->"
END = "<!-- end of places -->"
HEALTHY = "RegionOne"  # the simulator's first region, served at its root
BIG = "RegionBig"
DOWN = "RegionDown"
OTHER_CLOUD = "CloudDown"  # the region of the second cloud
OTHER_SERVERS = 100  # in RegionDown, and in the second cloud
HEALTHY_GROUPS = 2
TARGET = 1.2  # p99 of the healthy place's calls over the baseline run's, same cycle
_BACK_TO_BACK = {"interval": "1s", "full_resync_interval": "1s"}
_SETTLE = 1.0  # seconds after SERVING before memory is read, after a resume before a turn
_WAIT = 60.0  # the longest osas may take to log a failed sync in the failing place
_NEXT = re.compile(rb'"servers_links"\s*:\s*\[\{"rel"\s*:\s*"next"\s*,\s*"href"\s*:\s*"([^"]+)"')


@dataclass(frozen=True)
class Plan:
    big: int = 50_000  # servers in RegionBig
    healthy: int = 1_000  # servers in the healthy place: the nodes of each replayed loop
    rounds: int = 10  # cycles: a turn of each run
    seconds: float = 3.0  # CA's loop replayed per turn (whole loops, one at least)
    per_place: tuple[int, ...] = (0, 10_000)  # memory: servers in each place
    most_places: int = 3  # memory: 1 ... this many places
    memory_rounds: int = 3


QUICK = Plan(big=10_000, rounds=6, per_place=(0, 5_000), memory_rounds=2)


@dataclass(frozen=True)
class Variant:
    """One osas serving the healthy place: the place besides it, and its syncs."""

    key: str
    says: str  # what the report calls it ({big}: RegionBig's servers)
    other: str | None = None  # "down", "refused", "big": the second place, if any
    listing: bool = False  # a sync every second, each a complete listing
    busy: bool = False  # RegionBig's listing pulled by another process meanwhile


VARIANTS = (
    Variant("one", "one place: the healthy region alone"),
    Variant("down", "two places: the other region's Nova answers 503 to every call", "down"),
    Variant(
        "refused",
        "two places: the other a cloud refusing every connection, its Keystone's too",
        "refused",
    ),
    Variant("big", "two places: the other region holds {big} servers (default intervals)", "big"),
    Variant("one_listing", "one place, a complete listing every second", listing=True),
    Variant(
        "one_listing_busy",
        "the same, another process pulling {big} servers' listing meanwhile",
        listing=True,
        busy=True,
    ),
    Variant(
        "big_listing",
        "two places, the other of {big} servers, both listing completely every second",
        "big",
        listing=True,
    ),
)
# (run, baseline, judged): each run's figures over its baseline's of the same cycle.
COMPARISONS = (
    ("down", "one", True),
    ("refused", "one", True),
    ("big", "one", True),
    ("one_listing_busy", "one_listing", False),
    ("big_listing", "one_listing", False),
    ("big_listing", "one_listing_busy", False),
)


# -- figures ------------------------------------------------------------------------------------


def kind_of(key: str) -> Kind:
    """What a figure of this measure is: ``<run>_<measure>`` or ``<run>_over_<baseline>_<q>``,
    ``memory_<servers>_<places>`` or ``memory_<servers>_each``."""
    if "_over_" in key:
        run, _, rest = key.partition("_over_")
        quantile = rest.rpartition("_")[2]
        judged = quantile == "p99" and (run, rest.rpartition("_")[0], True) in COMPARISONS
        if judged:
            return Kind(key, "x", f"<= {TARGET}x", threshold=TARGET)
        return Kind(key, "x")
    if key.startswith("memory_"):
        return Kind(key, "MiB")
    measure = key.rpartition("_")[2]
    if measure in {"failed", "misplaced"}:
        return Kind(key, "count", "0", threshold=0.0)
    return Kind(key, {"rss": "MiB", "cpu": "s"}.get(measure, "ms"))


@dataclass
class PlacesResult:
    """The measure's figures over cycles (memory: over rounds), by key (``kind_of``)."""

    plan: Plan
    figures: dict[str, Figure] = field(default_factory=dict)
    seconds: float = 0.0  # the measure's own wall time

    def add(self, key: str, value: float) -> None:
        self.figures.setdefault(key, Figure(kind_of(key))).samples.append(value)

    def get(self, key: str) -> Figure:
        return self.figures.get(key) or Figure(kind_of(key))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else math.nan


# -- the cloud ----------------------------------------------------------------------------------


def auth_at(auth_url: str) -> dict[str, str]:
    return {
        "auth_url": auth_url,
        "username": DEFAULT_USER,
        "password": DEFAULT_PASSWORD,
        "project_name": DEFAULT_PROJECT,
        "user_domain_name": DEFAULT_DOMAIN,
        "project_domain_name": DEFAULT_DOMAIN,
    }


def groups_of(servers: int) -> int:
    return max(1, -(-servers // GROUP_SIZE))


def place_groups(region: str, servers: int) -> list[str]:
    return [f"{region_groups(region)}{i}" for i in range(groups_of(servers))]


def set_faults(sim: dict[str, Any], region: str, **faults: float) -> None:
    answer = requests.post(
        f"{sim['base_url']}/regions/{region}/_sim/faults", json=faults, timeout=10
    )
    answer.raise_for_status()


@dataclass
class Placed:
    """An osas configuration: the top-level place, and the groups living elsewhere."""

    top_region: str
    groups: list[str]  # every group, the top-level place's first
    elsewhere: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> its block


def write_config(
    setup: Setup, placed: Placed, reconcile: dict[str, Any] | None = None
) -> tuple[Path, int, int]:
    """``osas_config``'s configuration (osas's defaults), its groups put in their places."""
    path, port, health, _ = osas_config(
        dataclasses.replace(setup, groups=placed.groups), reconcile=reconcile
    )
    data = yaml.safe_load(path.read_text())
    data["openstack"]["region_name"] = placed.top_region
    for group in data["node_groups"]:
        block = placed.elsewhere.get(group["id"])
        if block is not None:
            group["openstack"] = block
    path.write_text(yaml.safe_dump(data))
    return path, port, health


async def serve(setup: Setup, config: Path, port: int, health: int, name: str) -> Osas:
    """``osas serve`` with this configuration, once SERVING."""
    return await serve_osas(setup, config, port, health, name)


async def failed_sync(osas: Osas, region: str) -> None:
    """Until osas has logged a failed sync in the place of ``region``."""
    deadline = time.monotonic() + _WAIT
    while not any(region in str(e.get("place")) for e in osas.events("sync failed")):
        if time.monotonic() > deadline or osas.process.poll() is not None:
            msg = f"osas logged no failed sync in {region} within {_WAIT:.0f} s"
            raise RuntimeError(msg)
        await asyncio.sleep(0.1)


# -- the listing pulled by another process ------------------------------------------------------


def _token_session(auth_url: str) -> requests.Session:
    user = {"name": DEFAULT_USER, "domain": {"name": DEFAULT_DOMAIN}, "password": DEFAULT_PASSWORD}
    body: dict[str, Any] = {
        "auth": {
            "identity": {"methods": ["password"], "password": {"user": user}},
            "scope": {"project": {"name": DEFAULT_PROJECT, "domain": {"name": DEFAULT_DOMAIN}}},
        }
    }
    answer = requests.post(f"{auth_url}/auth/tokens", json=body, timeout=30)
    answer.raise_for_status()
    session = requests.Session()
    session.headers["X-Auth-Token"] = answer.headers["X-Subject-Token"]
    session.headers["OpenStack-API-Version"] = "compute 2.100"
    return session


def list_back_to_back(base_url: str, region: str, stop: threading.Event) -> int:
    """The region's complete listing, as osas's complete sync asks for it (every server's
    details by the cluster's tag, page by page), over and over, parsing nothing, until
    ``stop``; the listings made."""
    session = _token_session(f"{base_url}/identity/v3")
    first = f"{base_url}/regions/{region}/compute/v2.1/servers/detail?tags=osas-cluster%3D{CLUSTER}"
    listings = 0
    while not stop.is_set():
        url: str | None = first
        while url is not None and not stop.is_set():
            found = _NEXT.search(session.get(url, timeout=60).content)
            url = found.group(1).decode() if found else None
        listings += 1
    return listings


def _lister_main(base_url: str, region: str) -> int:
    stop = threading.Event()
    thread = threading.Thread(target=list_back_to_back, args=(base_url, region, stop))
    thread.start()
    sys.stdout.write(json.dumps({"pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the measure closes it (or dies)
    stop.set()
    thread.join()
    return 0


# -- CA's side ----------------------------------------------------------------------------------


def healthy_loop(groups: list[str], healthy_nodes: list[Node]) -> list[Ask]:
    """CA's loop over the healthy place's nodes (``caloop.Loop``: Refresh, NodeGroups,
    TargetSize per group, per node a NodeGroupForNode and four GetOptions), then
    TemplateNodeInfo and NodeGroupNodes per group."""
    asks = list(Loop(groups, healthy_nodes).calls)
    asks += [Ask("NodeGroupTemplateNodeInfo", template(g).request, "") for g in groups]
    asks += [Ask("NodeGroupNodes", nodes(g).request, "") for g in groups]
    return asks


@dataclass
class Replayed:
    """What one replay measured."""

    light: list[float] = field(default_factory=list)  # ms, every call but NodeGroupNodes
    failed: Counter[str] = field(default_factory=Counter)  # "Method: CODE"
    named: Counter[tuple[str, bytes]] = field(default_factory=Counter)  # NodeGroupForNode
    loops: int = 0

    def misplaced(self) -> int:
        """NodeGroupForNode answers not naming the node's own group."""
        return sum(
            count
            for (group, data), count in self.named.items()
            if pb.NodeGroupForNodeResponse.FromString(data).nodeGroup.id != group
        )


async def replay(client: Client, asks: list[Ask], seconds: float, into: Replayed) -> None:
    """Whole loops, serially, for at least ``seconds`` (one loop at least)."""
    stubs = {
        method: client.channel.unary_unary(
            f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None
        )
        for method in {ask.method for ask in asks}
    }
    # What this process holds is frozen from its collector meanwhile (as client.Client does).
    gc.freeze()
    try:
        deadline = time.perf_counter() + seconds
        while True:
            for ask in asks:
                started = time.perf_counter()
                try:
                    data = await stubs[ask.method](ask.request, timeout=CA_TIMEOUT)
                except grpc.aio.AioRpcError as error:
                    if error.code() is not grpc.StatusCode.UNIMPLEMENTED:  # GetOptions' answer
                        into.failed[f"{ask.method}: {error.code().name}"] += 1
                    data = b""
                took = time.perf_counter() - started
                if ask.method != "NodeGroupNodes":
                    into.light.append(took * 1000)
                if ask.method == "NodeGroupForNode":
                    into.named[ask.group, bytes(data)] += 1
            into.loops += 1
            if time.perf_counter() >= deadline:
                return
    finally:
        gc.unfreeze()


# -- the latency runs ---------------------------------------------------------------------------


@dataclass
class Cloud:
    """What every run is started against."""

    setup: Setup  # the simulator with the three regions
    healthy_groups: list[str]
    big_groups: list[str]
    down_groups: list[str]
    asks: list[Ask]


@contextmanager
def _other_cloud() -> Iterator[tuple[dict[str, Any], ExitStack]]:
    """The second cloud, and what stops it before the end (it is stopped at the end anyway)."""
    with ExitStack() as stack:
        other = stack.enter_context(
            kit("osas.bench.cloud", "--region", OTHER_CLOUD, str(OTHER_SERVERS), "1")
        )
        yield other, stack


@dataclass
class Run:
    """One variant's osas, started once; paused (SIGSTOP) but while its turn lasts, with the
    process pulling RegionBig's listing for it, if any."""

    variant: Variant
    osas: Osas
    client: Client
    lister: int | None = None  # pid

    def _signal(self, signal: int) -> None:
        for pid in (self.osas.process.pid, self.lister):
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal)

    def pause(self) -> None:
        self._signal(SIGSTOP)

    def resume(self) -> None:
        self._signal(SIGCONT)


async def start_run(stack: AsyncExitStack, cloud: Cloud, variant: Variant) -> Run:
    """The variant's osas serving, its other place failing where it fails (osas has logged a
    failed sync there), warmed with one loop, and paused; stopped when ``stack`` closes."""
    setup = cloud.setup
    placed = Placed(HEALTHY, list(cloud.healthy_groups))
    stop_other: ExitStack | None = None
    if variant.other == "big":
        placed.groups += cloud.big_groups
        placed.elsewhere |= {g: {"region_name": BIG} for g in cloud.big_groups}
    elif variant.other == "down":
        placed.groups += cloud.down_groups
        placed.elsewhere |= {g: {"region_name": DOWN} for g in cloud.down_groups}
    elif variant.other == "refused":
        other, stop_other = stack.enter_context(_other_cloud())
        groups = [f"{region_groups(OTHER_CLOUD)}0"]
        placed.groups += groups
        block = {"auth": auth_at(other["auth_url"]), "region_name": OTHER_CLOUD}
        placed.elsewhere |= dict.fromkeys(groups, block)
    lister = None
    if variant.busy:
        listing = ("osas.bench.places", "--list-region", setup.sim["base_url"], BIG)
        lister = int(stack.enter_context(kit(*listing))["pid"])
    config, port, health = write_config(setup, placed, _BACK_TO_BACK if variant.listing else None)
    osas = await serve(setup, config, port, health, f"places-{variant.key}")
    stack.callback(osas.stop)
    client = Client(osas.port, setup.tls)
    stack.push_async_callback(client.close)
    run = Run(variant, osas, client, lister)
    stack.callback(run.resume)  # before the stops: a stopped process cannot act on SIGTERM
    if variant.other == "down":
        set_faults(setup.sim, DOWN, error_rate=1.0)
        stack.callback(set_faults, setup.sim, DOWN, error_rate=0.0)
    elif stop_other is not None:
        stop_other.close()
    await replay(client, cloud.asks, 0.0, Replayed())  # warm; its Refresh nudges every place
    if variant.other == "down":
        await failed_sync(osas, DOWN)
    elif variant.other == "refused":
        await failed_sync(osas, OTHER_CLOUD)
    run.pause()
    print(f"   {variant.key}: serving in {osas.started:.1f} s", flush=True)  # noqa: T201
    return run


async def one_turn(plan: Plan, run: Run, asks: list[Ask], result: PlacesResult) -> None:
    """The run resumed, given ``_SETTLE`` to catch up with its timers, its loops replayed for
    ``plan.seconds``, and paused again."""
    run.resume()
    try:
        await asyncio.sleep(_SETTLE)
        replayed = Replayed()
        before = cpu_ticks(run.osas.process.pid)
        await replay(run.client, asks, plan.seconds, replayed)
        cpu = cpu_seconds(cpu_ticks(run.osas.process.pid) - before) / replayed.loops
        rss = rss_mib(run.osas.process.pid)[0]
    finally:
        run.pause()
    key, light = run.variant.key, replayed.light
    result.add(f"{key}_p50", percentile(light, 0.5))
    result.add(f"{key}_p99", percentile(light, 0.99))
    result.add(f"{key}_worst", max(light))
    result.add(f"{key}_failed", sum(replayed.failed.values()))
    result.add(f"{key}_misplaced", replayed.misplaced())
    result.add(f"{key}_cpu", cpu)
    result.add(f"{key}_rss", rss)


def ratios(result: PlacesResult) -> None:
    """Each comparison's ratio, turn by turn (a run over its baseline of the same cycle)."""
    for run, baseline, _ in COMPARISONS:
        for quantile in ("p50", "p99", "worst"):
            mine = result.get(f"{run}_{quantile}").samples
            base = result.get(f"{baseline}_{quantile}").samples
            for value, under in zip(mine, base, strict=False):
                if under > 0:
                    result.add(f"{run}_over_{baseline}_{quantile}", value / under)


async def measure_latency(plan: Plan, tls: Tls, folder: Path, result: PlacesResult) -> None:
    """Every run started once and paused; then, cycle after cycle, each run's turn, in an
    order that turns cycle by cycle."""
    cloud_args = ["--servers", str(plan.healthy), "--groups", str(HEALTHY_GROUPS)]
    cloud_args += ["--region", BIG, str(plan.big), str(groups_of(plan.big))]
    cloud_args += ["--region", DOWN, str(OTHER_SERVERS), "1"]
    with kit("osas.bench.cloud", *cloud_args) as sim:
        healthy_groups = [f"g{i}" for i in range(HEALTHY_GROUPS)]
        setup = Setup(folder, tls, sim, healthy_groups)
        cloud = Cloud(
            setup,
            healthy_groups,
            place_groups(BIG, plan.big),
            place_groups(DOWN, OTHER_SERVERS),
            healthy_loop(healthy_groups, cluster_nodes(sim)),
        )
        async with AsyncExitStack() as stack:
            runs = [await start_run(stack, cloud, variant) for variant in VARIANTS]
            for index in range(plan.rounds):
                turn = index % len(runs)
                for run in runs[turn:] + runs[:turn]:
                    await one_turn(plan, run, cloud.asks, result)
                p99 = [
                    (r.variant.key, result.get(f"{r.variant.key}_p99").samples[-1]) for r in runs
                ]
                said = ", ".join(f"{key} {ms:.2f}" for key, ms in p99)
                print(f"   cycle {index + 1}, p99 (ms): {said}", flush=True)  # noqa: T201
    ratios(result)


# -- memory -------------------------------------------------------------------------------------


def memory_region(servers: int, place: int) -> str:
    return f"Mem{servers}P{place}"


async def measure_memory(plan: Plan, tls: Tls, folder: Path, result: PlacesResult) -> None:
    """osas's RSS serving 1 ... ``most_places`` places of ``per_place`` servers each."""
    cloud_args = ["--servers", "0"]
    for servers in plan.per_place:
        for place in range(1, plan.most_places + 1):
            region = memory_region(servers, place)
            cloud_args += ["--region", region, str(servers), str(groups_of(servers))]
    with kit("osas.bench.cloud", *cloud_args) as sim:
        setup = Setup(folder, tls, sim, [])
        for index in range(plan.memory_rounds):
            for servers in plan.per_place:
                rss: dict[int, float] = {}
                for count in range(1, plan.most_places + 1):
                    regions = [memory_region(servers, p) for p in range(1, count + 1)]
                    groups = {r: place_groups(r, servers) for r in regions}
                    placed = Placed(regions[0], [g for r in regions for g in groups[r]])
                    for region in regions[1:]:
                        placed.elsewhere |= {g: {"region_name": region} for g in groups[region]}
                    config, port, health = write_config(setup, placed)
                    name = f"places-memory-{servers}-{count}-{index}"
                    osas = await serve(setup, config, port, health, name)
                    try:
                        await asyncio.sleep(_SETTLE)
                        rss[count] = rss_mib(osas.process.pid)[0]
                    finally:
                        osas.stop()
                    result.add(f"memory_{servers}_{count}", rss[count])
                most = plan.most_places
                if most > 1:
                    result.add(f"memory_{servers}_each", (rss[most] - rss[1]) / (most - 1))
                print(  # noqa: T201
                    f"   memory, {servers:,} servers a place: "
                    + ", ".join(f"{count} place(s) {mib:.1f} MiB" for count, mib in rss.items()),
                    flush=True,
                )


async def measure_places(plan: Plan, tls: Tls, folder: Path) -> PlacesResult:
    print(  # noqa: T201
        f"== several places: a healthy one of {plan.healthy:,} servers beside one unreachable "
        f"or of {plan.big:,}; memory per place",
        flush=True,
    )
    began = time.perf_counter()
    result = PlacesResult(plan)
    await measure_latency(plan, tls, folder, result)
    await measure_memory(plan, tls, folder, result)
    result.seconds = time.perf_counter() - began
    return result


# -- the report ---------------------------------------------------------------------------------


def _ms(figure: Figure) -> str:
    return "—" if not figure.samples else f"{figure.median:.2f} ms"


def _x(figure: Figure) -> str:
    if not figure.samples:
        return "—"
    low, high = min(figure.samples), max(figure.samples)
    return f"{figure.median:.2f}x ({low:.2f}-{high:.2f})"


def section(result: PlacesResult, info: dict[str, str]) -> list[str]:
    plan = result.plan
    big = f"{plan.big:,}"
    lines = [
        BEGIN,
        "## Node groups in several places",
        "",
        (
            "Separate processes: the simulated OpenStack with three regions behind one "
            f"Keystone (the healthy {HEALTHY}: {plan.healthy:,} servers over "
            f"{HEALTHY_GROUPS} node groups; {BIG}: {big} servers over groups of 10,000; "
            f"{DOWN}: {OTHER_SERVERS} servers), a second simulated cloud with a Keystone of its "
            f"own ({OTHER_SERVERS} servers) and one `osas serve` with mTLS at its defaults for "
            "each row below, the healthy region's groups in the top-level `openstack` block "
            "and the other place's in a group block (`region_name`, or `auth` for the other "
            f"cloud). Once it serves, {DOWN}'s Nova answers every call 503 (the simulator's "
            "`error_rate`; the Keystone it shares still answers) or the second cloud's process "
            "is stopped (every connection refused, its Keystone's too), until osas logs a "
            "failed sync there. Each osas is started once, warmed with one loop and paused "
            "(SIGSTOP); then, cycle after cycle, each takes its turn in an order that turns "
            "cycle by cycle, so that the machine's drift falls on all alike: resumed, given "
            f"{_SETTLE:g} s to catch up with its timers, CA's loop for the healthy region's "
            f"groups replayed serially for {plan.seconds:g} s (whole loops), one call in "
            "flight, with CA's 5 s deadline, then paused again. The loop: Refresh, "
            "NodeGroups, NodeGroupTargetSize per group, per node a NodeGroupForNode (as "
            "kubelet registers it) and four NodeGroupGetOptions, then TemplateNodeInfo and "
            f"NodeGroupNodes per group, all {plan.healthy:,} nodes in each loop. p50, p99 and "
            "worst are over every call but NodeGroupNodes (a Python client: a call's p50 is "
            "mostly the client's own time); *failed* counts every status but OK (and "
            "GetOptions' UNIMPLEMENTED, its answer), Refresh's included, over all cycles; "
            "*misplaced*: NodeGroupForNode answers naming another group than the node's; "
            "*osas CPU*: osas's own CPU a loop (`/proc/<pid>/stat`), its other place's work "
            "in the turn included. The `listing` runs sync every second, each sync a "
            f"complete listing, in every place: {BIG}'s listing of {big} servers is under "
            "way the whole turn; `one_listing_busy` is the healthy region alone while another "
            f"process pulls {BIG}'s complete listing from the simulator back to back, parsing "
            "nothing: the simulator's share of the same two cores, which a real Nova would "
            f"not take. Medians over {plan.rounds} cycles; {info['date']}, {info['cpu']}, "
            f"{info['cores']} cores; the measure took {result.seconds / 60:.1f} min."
        ),
        "",
        "| osas serving | p50 | p99 | worst | failed | misplaced | osas CPU | RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        key = variant.key
        failed, misplaced = result.get(f"{key}_failed"), result.get(f"{key}_misplaced")
        cpu, rss = result.get(f"{key}_cpu"), result.get(f"{key}_rss")
        lines.append(
            f"| `{key}`: {variant.says.format(big=big)} | {_ms(result.get(f'{key}_p50'))} | "
            f"{_ms(result.get(f'{key}_p99'))} | {_ms(result.get(f'{key}_worst'))} | "
            f"{sum(failed.samples):.0f} | {sum(misplaced.samples):.0f} | "
            f"{cpu.median:.2f} s | {rss.median:.0f} MiB |"
        )
    lines += [
        "",
        (
            "The healthy region's calls over the same calls of the run named, cycle by cycle "
            "(the two turns seconds apart): median (min-max) over cycles. The target, p99 at "
            f"most {TARGET}x the baseline's, is issue 35's: the calls of a healthy place go on "
            "as if a failing place did not exist, and so as if a large healthy one at the "
            "default intervals did not either (nothing of its steady state is on their path). "
            f"{TARGET}x leaves room for the noise of two shared cores, and still catches a "
            "place's work put on every call's path. While the other place's "
            f"{big} servers are listed completely (every 30 minutes at the defaults, a few "
            "seconds each time) that listing shares the event loop and the interpreter with "
            "the healthy place's calls, as a one-place osas's own complete listing does (the "
            "resync rows above): those rows are shown, not judged."
        ),
        "",
        "| run | over | p50 | p99 | target | worst | |",
        "|---|---|---|---|---|---|---|",
    ]
    for run, baseline, judged in COMPARISONS:
        p99 = result.get(f"{run}_over_{baseline}_p99")
        lines.append(
            f"| `{run}` | `{baseline}` | {_x(result.get(f'{run}_over_{baseline}_p50'))} | "
            f"{_x(p99)} | {f'<= {TARGET}x' if judged else ''} | "
            f"{_x(result.get(f'{run}_over_{baseline}_worst'))} | {verdict(p99)} |"
        )
    counts = range(1, plan.most_places + 1)
    lines += [
        "",
        (
            f"Memory: `osas serve` for 1 to {plan.most_places} places (regions of one "
            "simulated cloud) holding the same number of servers each, its RSS from /proc "
            f"{_SETTLE:g} s after it serves; each place adds (RSS with {plan.most_places} - "
            f"RSS with 1) / {plan.most_places - 1}. Medians over {plan.memory_rounds} rounds."
        ),
        "",
        HEADER,
    ]
    for servers in plan.per_place:
        for count in counts:
            figure = result.get(f"memory_{servers}_{count}")
            figure.kind = dataclasses.replace(
                figure.kind, name=f"RSS, {count} place(s) of {servers:,} servers"
            )
            lines.append(figure_row(figure))
        each = result.get(f"memory_{servers}_each")
        each.kind = dataclasses.replace(each.kind, name=f"each place of {servers:,} servers adds")
        lines.append(figure_row(each))
    return [*lines, END]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=Plan.big)
    parser.add_argument("--healthy", type=int, default=Plan.healthy)
    parser.add_argument("--rounds", type=int, default=Plan.rounds)
    parser.add_argument("--seconds", type=float, default=Plan.seconds)
    parser.add_argument(
        "--per-place", type=int, nargs="+", default=list(Plan.per_place), metavar="SERVERS"
    )
    parser.add_argument("--memory-rounds", type=int, default=Plan.memory_rounds)
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"))
    parser.add_argument("--list-region", nargs=2, metavar=("BASE_URL", "REGION"))
    args = parser.parse_args(argv)
    if args.list_region:
        return _lister_main(*args.list_region)
    plan = Plan(
        args.big,
        args.healthy,
        args.rounds,
        args.seconds,
        tuple(args.per_place),
        memory_rounds=args.memory_rounds,
    )
    with tempfile.TemporaryDirectory(prefix="osas-bench-") as temporary:
        folder = Path(temporary)
        result = asyncio.run(measure_places(plan, Tls.make(folder), folder))
    lines = section(result, machine())
    replace_marked_section(args.out, BEGIN, END, lines)
    print("\n".join(lines))  # noqa: T201
    print(f"written: {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
