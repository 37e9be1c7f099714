"""osas against the bare gRPC limit at 1k / 10k / 50k servers; writes docs/BENCHMARKS.md.

osas and the bare limit run side by side, in the same run, in separate processes, with the
same mTLS, the same Python client and the same answer bytes.

For each cluster size (servers spread over node groups of at most 10,000): the simulated
OpenStack starts seeded; then, round after round, ``osas serve`` starts against it (the time to
SERVING is measured), and the calls CA makes are timed serially against osas and against the
bare server answering osas's own bytes, alternating which goes first. A CA loop (Refresh,
NodeGroups, NodeGroupForNode and GetOptions per node, TargetSize three times per group,
NodeGroupNodes and TemplateNodeInfo per group) is replayed for a while at the default sync
interval (idle tails), then once more against an osas that resyncs every 20 s (tails during
complete listings, Nova traffic, memory). Last, 100 creates at the default settings, the time
a warm standby takes to become the writer under a Kubernetes Lease (``osas.bench.takeover``), a
burst of 1,000 creates against a cloud that allows 5 a second (``osas.bench.burst``), CA's loop
by the server's CPU at 1k / 5k / 10k nodes (1k / 5k quick; ``osas.bench.caloop``, kept as the
run labelled ``latest`` beside earlier labelled runs), CA's loop for a healthy place's groups
while another place is unreachable or holds 50,000 servers (10,000 quick), and memory per place
(``osas.bench.places``), IncreaseSize to the start of a node for a group with a warm pool beside
one without (``osas.bench.warm``), and the start-up of ``osas serve`` (``osas.bench.startup``).

The measures are built on the benchmark's kit (``processes``: what they start; ``client``: CA's
side) and hand their figures (``results``) to the report (``report``); none of those imports
this module or a measure.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import requests

from osas.bench.burst import measure_burst
from osas.bench.caloop import Plan as CaLoopPlan
from osas.bench.caloop import measure_caloop
from osas.bench.client import Call, Client, Timed, for_node, nodes, options, target_size, template
from osas.bench.memlimit import MemoryLimit, drop_page_cache
from osas.bench.places import BEGIN as PLACES_BEGIN
from osas.bench.places import END as PLACES_END
from osas.bench.places import QUICK as PLACES_QUICK
from osas.bench.places import Plan as PlacesPlan
from osas.bench.places import measure_places
from osas.bench.places import section as places_section
from osas.bench.processes import (
    CLUSTER,
    GROUP_SIZE,
    Osas,
    Setup,
    Tls,
    anonymous_mib,
    kit,
    machine,
    rss_mib,
    sim_get,
    start_osas,
)
from osas.bench.promises import BEGIN as PROMISES_BEGIN
from osas.bench.promises import END as PROMISES_END
from osas.bench.promises import measure_promises
from osas.bench.report import (
    replace_caloop_section,
    replace_marked_section,
    replace_size_sections,
    replace_startup_section,
    replace_takeover_section,
    write_report,
)
from osas.bench.results import KINDS, Figure, SizeResult, load_runs, save_run
from osas.bench.startup import measure_startup
from osas.bench.takeover import measure_takeover
from osas.bench.warm import BEGIN as WARM_BEGIN
from osas.bench.warm import END as WARM_END
from osas.bench.warm import QUICK as WARM_QUICK
from osas.bench.warm import Plan as WarmPlan
from osas.bench.warm import measure_warm
from osas.bench.warm import section as warm_section
from osas.engine.settings import ReconcileSettings
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim.server import DEFAULT_DOMAIN, DEFAULT_PASSWORD, DEFAULT_PROJECT, DEFAULT_USER

CREATES = 100
# The CA loop's run that `osas bench` keeps next to the report, replaced by the next one; runs
# kept under other labels (python -m osas.bench.caloop --label) stay beside it.
CA_LOOP_LABEL = "latest"
_NEXT = re.compile(rb'"servers_links"\s*:\s*\[\{"rel"\s*:\s*"next"\s*,\s*"href"\s*:\s*"([^"]+)"')


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    rounds: int
    for_node_calls: int  # serial NodeGroupForNode calls per round (distinct nodes)
    target_calls: int
    nodes_calls: int
    idle_seconds: float  # CA loop replay per round at the default 10 s sync interval
    resync_seconds: float  # CA loop replay with a complete listing every 20 s
    loop_nodes: int  # nodes per replayed CA loop
    create_rounds: int
    churn_seconds: float  # osas at its defaults while 1% of the project's other servers change
    load_calls: int  # TargetSize calls timed with and without load on the metrics port
    takeover_rounds: int  # a kill and a clean stop each (osas.bench.takeover)
    burst_rounds: int  # a burst against a rate-limited cloud each (osas.bench.burst)
    ca_loop: CaLoopPlan  # CA's loop by the server's CPU (osas.bench.caloop)
    places: PlacesPlan  # node groups in several places (osas.bench.places)
    warm: WarmPlan  # warm pools against cold creates (osas.bench.warm)


# CA's loop: at 1k / 5k / 10k nodes in full (caloop's defaults), 1k / 5k quick.
FULL = Plan(
    (1_000, 10_000, 50_000),
    5,
    2_000,
    300,
    20,
    12.0,
    125.0,
    500,
    3,
    45.0,
    500,
    3,
    1,
    CaLoopPlan(),
    PlacesPlan(),
    WarmPlan(),
)
QUICK = Plan(
    (1_000, 5_000),
    2,
    500,
    100,
    10,
    11.0,
    25.0,
    200,
    2,
    25.0,
    200,
    2,
    1,
    CaLoopPlan((1_000, 5_000)),
    PLACES_QUICK,
    WARM_QUICK,
)
# What else the project holds besides the cluster's servers: as many servers of another
# cluster, 1% of which change every minute in the churn phase.
OTHERS_PER_SERVER = 1
CHURN_SHARE = 0.01
# The load on the metrics port: idle connections, clients that send half a request line and
# stop, and clients polling /status and /metrics as fast as they are answered.
IDLE_CONNECTIONS, SLOW_CONNECTIONS, POLLERS = 200, 64, 50


# -- the simulator, CA's loop -------------------------------------------------------------------


def simulator_listing_seconds(sim: dict[str, Any]) -> float:
    """How long the simulator takes to serve the complete listing osas makes at start and at
    every complete resync (every server's details, by the cluster's tag, page by page), to a
    client that reads the bytes and parses nothing: the simulator's share of the start."""
    user = {"name": DEFAULT_USER, "domain": {"name": DEFAULT_DOMAIN}, "password": DEFAULT_PASSWORD}
    auth: dict[str, Any] = {
        "identity": {"methods": ["password"], "password": {"user": user}},
        "scope": {"project": {"name": DEFAULT_PROJECT, "domain": {"name": DEFAULT_DOMAIN}}},
    }
    answer = requests.post(f"{sim['auth_url']}/auth/tokens", json={"auth": auth}, timeout=30)
    session = requests.Session()
    session.headers["X-Auth-Token"] = answer.headers["X-Subject-Token"]
    session.headers["OpenStack-API-Version"] = "compute 2.100"
    url: str | None = f"{sim['base_url']}/compute/v2.1/servers/detail?tags=osas-cluster%3D{CLUSTER}"
    started = time.perf_counter()
    while url is not None:
        found = _NEXT.search(session.get(url, timeout=60).content)
        url = found.group(1).decode() if found else None
    return time.perf_counter() - started


def ca_loop(groups: list[str], provider_ids: list[str], count: int, loop: int) -> list[Call]:
    """One of CA's loops, its calls in CA's order (FACTS.md section 1), over ``count`` nodes."""
    chosen = [provider_ids[(loop * count + i) % len(provider_ids)] for i in range(count)]
    calls = [
        Call("Refresh", pb.RefreshRequest().SerializeToString(), pb.RefreshResponse),
        Call("NodeGroups", pb.NodeGroupsRequest().SerializeToString(), pb.NodeGroupsResponse),
    ]
    calls += [template(group) for group in groups]
    calls += [nodes(group) for group in groups]
    calls += [for_node(provider_id) for provider_id in chosen]
    calls += [target_size(group) for group in groups for _ in range(3)]
    calls += [options(groups[i % len(groups)]) for i in range(count)]
    return calls


async def replay(
    client: Client, setup: Setup, provider_ids: list[str], count: int, seconds: float
) -> list[Timed]:
    samples: list[Timed] = []
    deadline = time.perf_counter() + seconds
    loop = 0
    while time.perf_counter() < deadline:
        samples += await client.timed(ca_loop(setup.groups, provider_ids, count, loop))
        loop += 1
    return samples


# -- figures ------------------------------------------------------------------------------------


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


# -- the measure --------------------------------------------------------------------------------


async def capture_answers(client: Client, group: str, provider_id: str) -> dict[str, str | None]:
    """osas's own answer bytes for each call the benchmark makes, for the bare server."""
    calls = [
        Call("Refresh", pb.RefreshRequest().SerializeToString(), pb.RefreshResponse),
        Call("NodeGroups", pb.NodeGroupsRequest().SerializeToString(), pb.NodeGroupsResponse),
        for_node(provider_id),
        target_size(group),
        nodes(group),
        template(group),
        options(group),
    ]
    answers: dict[str, str | None] = {}
    for call in calls:
        data = await client.raw(call.method, call.request)
        answers[call.method] = None if data is None else base64.b64encode(data).decode()
    return answers


async def measure_size(plan: Plan, servers: int, tls: Tls, folder: Path) -> SizeResult:
    groups = [f"g{i}" for i in range(max(1, -(-servers // GROUP_SIZE)))]
    result = SizeResult(servers, len(groups))
    print(f"== {servers:,} servers in {len(groups)} group(s)", flush=True)  # noqa: T201
    others = str(servers * OTHERS_PER_SERVER)
    with kit(
        "osas.bench.cloud",
        "--servers",
        str(servers),
        "--groups",
        str(len(groups)),
        "--others",
        others,
    ) as sim:
        setup = Setup(folder, tls, sim, groups)
        simulator = simulator_listing_seconds(sim)
        osas = await start_osas(setup, f"osas-{servers}-answers")
        client = Client(osas.port, tls)
        try:
            provider_ids = await client.provider_ids(groups[0])
            answers = await capture_answers(client, groups[0], provider_ids[0])
        finally:
            await client.close()
            osas.stop()
        answers_file = folder / f"answers-{servers}.json"
        answers_file.write_text(json.dumps(answers))
        bare_files = ["--answers", str(answers_file), "--cert", str(folder / "tls.crt")]
        bare_files += ["--key", str(folder / "tls.key"), "--client-ca", str(folder / "ca.crt")]
        with kit("osas.bench.bare", *bare_files) as bare_process:
            bare = Client(bare_process["port"], tls)
            try:
                for round_index in range(plan.rounds):
                    await one_round(plan, result, setup, bare, round_index, simulator)
                await resync_phase(plan, result, setup, bare)
                await memory_phase(plan, result, setup)
                await memory_limit_phase(plan, result, setup)
                await churn_phase(plan, result, setup)
                await metrics_load_phase(plan, result, setup)
            finally:
                await bare.close()
    return result


async def one_round(
    plan: Plan, result: SizeResult, setup: Setup, bare: Client, index: int, simulator: float
) -> None:
    osas = await start_osas(setup, f"osas-{result.servers}-{index}")
    result.add("start_total", osas.started)
    result.add("start", osas.started - simulator)
    result.add("start_simulator", simulator)
    client = Client(osas.port, tls=setup.tls)
    try:
        provider_ids = await client.provider_ids(setup.groups[0])
        await bare.timed(ca_loop(setup.groups, provider_ids, 50, 0))  # both paths warm
        await client.timed(ca_loop(setup.groups, provider_ids, 50, 0))
        await paired_calls(plan, result, index, client, bare, setup.groups[0], provider_ids)
        samples = await replay(client, setup, provider_ids, plan.loop_nodes, plan.idle_seconds)
        bare_samples = await replay(
            bare, setup, provider_ids, plan.loop_nodes, plan.idle_seconds / 2
        )
        tails(result, samples, bare_samples)
        result.add("rss_started", rss_mib(osas.process.pid)[0])
    finally:
        await client.close()
        osas.stop()


# NodeGroupForNode's calls per turn of each server (``paired_calls``).
_FOR_NODE_BLOCK = 200


async def paired_calls(
    plan: Plan,
    result: SizeResult,
    index: int,
    osas: Client,
    bare: Client,
    group: str,
    provider_ids: list[str],
) -> None:
    """The hot reads, serially, against osas and bare back to back (taking turns first; for
    NodeGroupForNode, block by block)."""
    start = index * plan.for_node_calls
    chosen = [provider_ids[(start + i) % len(provider_ids)] for i in range(plan.for_node_calls)]
    size = min(result.servers, GROUP_SIZE)
    measures = (
        ("for_node", [for_node(provider_id) for provider_id in chosen], f"{len(chosen)} nodes"),
        ("target", [target_size(group)] * plan.target_calls, f"group of {size:,}"),
        ("nodes", [nodes(group)] * plan.nodes_calls, f"group of {size:,}"),
    )
    for key, calls, note in measures:
        seconds: dict[str, list[float]] = {"osas": [], "bare": []}
        first: dict[str, list[float]] = {}
        # NodeGroupForNode's ratio is one of sums, which the machine's drift over a round
        # moves by more than the target's margin: its calls go in blocks, the servers taking
        # turns block by block. The other rows are medians of single calls.
        block = _FOR_NODE_BLOCK if key == "for_node" else len(calls)
        for turn, start in enumerate(range(0, len(calls), block)):
            clients = [("osas", osas), ("bare", bare)]
            if (index + turn) % 2:
                clients.reverse()
            part = calls[start : start + block]
            for name, client in clients:
                if key == "for_node":
                    # CA asks NodeGroupForNode of every node on every loop: a node's first ask
                    # is timed apart, and the ask of the next loop, as CA makes it, is judged.
                    first.setdefault(name, []).extend(t.seconds for t in await client.timed(part))
                seconds[name].extend(t.seconds for t in await client.timed(part))
        if key == "for_node":  # throughput: all the calls
            ratio = sum(seconds["bare"]) / sum(seconds["osas"])
        else:
            ratio = statistics.median(seconds["bare"]) / statistics.median(seconds["osas"])
        result.add(key, ratio, note)
        if first:
            result.add("for_node_first", sum(first["bare"]) / sum(first["osas"]), note)
        for name in ("osas", "bare"):
            result.add(f"{key}_p50_{name}", statistics.median(seconds[name]) * 1000)


def _light(samples: list[Timed]) -> list[float]:
    return [t.seconds * 1000 for t in samples if t.method != "NodeGroupNodes"]


def _heavy(samples: list[Timed]) -> list[float]:
    return [t.seconds * 1000 for t in samples if t.method == "NodeGroupNodes"]


def tails(result: SizeResult, samples: list[Timed], bare_samples: list[Timed]) -> None:
    worst = max(samples, key=lambda t: t.seconds if t.method != "NodeGroupNodes" else 0.0)
    result.add("idle_worst", max(_light(samples)), f"e.g. {worst.method}")
    result.add("idle_worst_bare", max(_light(bare_samples)))
    result.add("idle_p99", percentile(_light(samples), 0.99))
    result.add("idle_p99_bare", percentile(_light(bare_samples), 0.99))
    result.add("idle_worst_nodes", max(_heavy(samples)))
    result.add("idle_worst_nodes_bare", max(_heavy(bare_samples)))


async def resync_phase(plan: Plan, result: SizeResult, setup: Setup, bare: Client) -> None:
    """osas resyncing every 20 s under CA's loop: tails during resyncs, traffic, memory; and
    the bare server under the same loop while the simulator serves the same listings."""
    await bare_under_listings(plan, result, setup, bare)
    since = sim_get(setup.sim, "/_bench/log?since=0")["next"]
    osas = await start_osas(setup, f"osas-{result.servers}-resync", resync="20s")
    client = Client(osas.port, setup.tls)
    try:
        provider_ids = await client.provider_ids(setup.groups[0])
        began = time.time()
        samples = await replay(client, setup, provider_ids, plan.loop_nodes, plan.resync_seconds)
        ended = time.time()
        rss, peak = rss_mib(osas.process.pid)
    finally:
        await client.close()
        osas.stop()
    windows = []
    for event in osas.events("complete listing applied"):
        end = datetime.fromisoformat(event["timestamp"]).timestamp()
        start = end - float(event["seconds"])
        if start >= began:
            windows.append((start, end))
    light = [t for t in samples if t.method != "NodeGroupNodes"]
    bare_worst = result.figures.get("resync_worst_bare")
    for worst in _worst_per_window(light, windows):
        result.add("resync_worst", worst)
        if bare_worst is not None:
            result.add("resync_worst_excess", worst - bare_worst.median)
    for start, end in windows:
        result.add("resync_seconds", end - start)
    busy, calm = _split(light, windows)
    if busy and calm:
        ratio = percentile(busy, 0.99) / percentile(calm, 0.99)
        result.add("resync_p99", ratio)
        result.add("resync_p999", percentile(busy, 0.999) / percentile(calm, 0.999))
        bare_ratio = result.figures.get("resync_p99_bare")
        if bare_ratio is not None:
            result.add("resync_p99_vs_bare", ratio / bare_ratio.median)
    result.add("rss", rss)
    result.add("rss_peak", peak)
    traffic(result, setup.sim, since, (began, ended), windows)


def _overlaps(t: Timed, start: float, end: float) -> bool:
    return t.start < end and t.start + t.seconds > start


def _worst_per_window(samples: list[Timed], windows: list[tuple[float, float]]) -> list[float]:
    """The slowest call (ms) overlapping each window that any call overlaps."""
    worst = []
    for start, end in windows:
        inside = [t.seconds * 1000 for t in samples if _overlaps(t, start, end)]
        if inside:
            worst.append(max(inside))
    return worst


def _split(
    samples: list[Timed], windows: list[tuple[float, float]]
) -> tuple[list[float], list[float]]:
    """Milliseconds of the calls that overlap a window, and of the others."""
    busy = [t.seconds * 1000 for t in samples if any(_overlaps(t, *w) for w in windows)]
    calm = [t.seconds * 1000 for t in samples if not any(_overlaps(t, *w) for w in windows)]
    return busy, calm


async def bare_under_listings(plan: Plan, result: SizeResult, setup: Setup, bare: Client) -> None:
    """The machine's share of a resync's tail: CA's loop against the bare server while the
    simulator, on the same cores, serves the listing a complete resync asks for (every
    server's details, by the cluster's tag, page by page; every 5 s, from a thread of this
    process that parses nothing). No osas runs meanwhile."""
    windows: list[tuple[float, float]] = []
    stop = threading.Event()

    def list_details() -> None:
        while not stop.wait(5.0):
            started = time.time()
            simulator_listing_seconds(setup.sim)
            windows.append((started, time.time()))

    lister = threading.Thread(target=list_details, name="bench-lister", daemon=True)
    lister.start()
    provider_ids = [f"openstack:///{uuid.uuid4()}" for _ in range(plan.loop_nodes)]
    try:
        samples = await replay(bare, setup, provider_ids, plan.loop_nodes, plan.resync_seconds / 2)
    finally:
        stop.set()
        await asyncio.to_thread(lister.join)
    light = [t for t in samples if t.method != "NodeGroupNodes"]
    for worst in _worst_per_window(light, windows):
        result.add("resync_worst_bare", worst)
    busy, calm = _split(light, windows)
    if busy and calm:
        result.add("resync_p99_bare", percentile(busy, 0.99) / percentile(calm, 0.99))


LISTINGS_FOR_MEMORY = 10
MEMORY_LIMIT_MIB = 120
# A sync every second, each a complete listing: listings one after the other.
_BACK_TO_BACK = {"interval": "1s", "full_resync_interval": "1s"}


def _listings_applied(osas: Osas) -> int:
    """Complete listings osas has applied, by its log."""
    return len(osas.events("complete listing applied"))


async def memory_phase(plan: Plan, result: SizeResult, setup: Setup) -> None:
    """osas's memory after its first complete listing (when it starts serving) and after
    ``LISTINGS_FOR_MEMORY`` of them, one after the other (a sync every second, each a complete
    one), with nothing else asked: whether a listing leaves anything behind."""
    osas = await start_osas(setup, f"osas-{result.servers}-memory", reconcile=_BACK_TO_BACK)
    try:
        result.add("rss_listing_1", rss_mib(osas.process.pid)[0])
        deadline = time.monotonic() + 30 * plan.resync_seconds
        while _listings_applied(osas) < LISTINGS_FOR_MEMORY:
            if time.monotonic() > deadline or osas.process.poll() is not None:
                return
            await asyncio.sleep(0.05)
        result.add(f"rss_listing_{LISTINGS_FOR_MEMORY}", rss_mib(osas.process.pid)[0])
        result.add("anon_listings", anonymous_mib(osas.process.pid))
    finally:
        osas.stop()


async def memory_limit_phase(plan: Plan, result: SizeResult, setup: Setup) -> None:
    """osas under a memory limit as the kubelet sets one for a container: a cgroup of
    ``MEMORY_LIMIT_MIB``, the page cache dropped first so that the libraries osas maps are
    charged to it as in a new container. Complete listings one after the other (a sync every
    second) with CA's loop answered without pause, until ``LISTINGS_FOR_MEMORY`` of them or
    osas's end. Left out where no cgroup can be made here."""
    limit = MemoryLimit.make(MEMORY_LIMIT_MIB)
    if limit is None:
        return
    try:
        drop_page_cache()
        try:
            osas = await start_osas(
                setup, f"osas-{result.servers}-limit", reconcile=_BACK_TO_BACK, wrap=limit.command
            )
        except RuntimeError:  # killed before it served
            result.add("limit_listings", 0)
            result.add("limit_oom_kills", limit.oom_kills())
            return
        worst = 0.0
        client = Client(osas.port, setup.tls)
        try:
            provider_ids = await client.provider_ids(setup.groups[0])
            calls = ca_loop(setup.groups, provider_ids, plan.loop_nodes, 0)
            deadline = time.monotonic() + 30 * plan.resync_seconds
            while (
                osas.process.poll() is None
                and time.monotonic() < deadline
                and _listings_applied(osas) < LISTINGS_FOR_MEMORY
            ):
                light = [t for t in await client.timed(calls) if t.method != "NodeGroupNodes"]
                worst = max([worst, *(t.seconds * 1000 for t in light)])
        except grpc.aio.AioRpcError:
            pass  # osas gone in the middle of a call: what it listed before says enough
        finally:
            await client.close()
            if osas.process.poll() is None:
                osas.stop()
        result.add("limit_listings", _listings_applied(osas))
        result.add("limit_oom_kills", limit.oom_kills())
        result.add("limit_worst", worst)
        result.add("limit_peak", limit.peak_mib())
    finally:
        limit.remove()


def _incremental_page(entry: list[Any]) -> bool:
    """A page of an incremental listing: what changed in the project (untagged)."""
    return entry[2] == "GET" and "changes-since" in str(entry[3])


def _listings(pages: list[list[Any]]) -> list[list[list[Any]]]:
    """Pages grouped by listing, in the order served: a page without a marker begins one."""
    listings: list[list[list[Any]]] = []
    for page in pages:
        if "marker=" not in str(page[3]) or not listings:
            listings.append([])
        listings[-1].append(page)
    return listings


@dataclass(frozen=True)
class Minute:
    """Nova's traffic from one osas in a minute at the default intervals."""

    megabytes: float
    requests: float


def a_minute(
    incremental: tuple[float, float], complete: tuple[float, float], other: tuple[float, float]
) -> Minute:
    """(bytes, requests) of one incremental sync, of one complete resync, and of the rest a
    minute (tokens), turned into a minute at the default intervals
    (``ReconcileSettings``): a sync every ``interval``, every ``full_resync_interval`` a
    complete one instead of an incremental one."""
    defaults = ReconcileSettings()
    complete_share = 60.0 / defaults.full_resync_interval
    incremental_share = 60.0 / defaults.interval - complete_share
    total = incremental_share * incremental[0] + complete_share * complete[0] + other[0]
    return Minute(
        total / 1e6,
        incremental_share * incremental[1] + complete_share * complete[1] + other[1],
    )


def _other(entries: list[list[Any]], span: tuple[float, float]) -> tuple[float, float]:
    """Bytes and requests a minute, over the span, of what belongs to no sync (tokens)."""
    minutes = (span[1] - span[0]) / 60.0
    return sum(e[5] for e in entries) / minutes, len(entries) / minutes


def traffic(
    result: SizeResult,
    sim: dict[str, Any],
    since: int,
    span: tuple[float, float],
    windows: list[tuple[float, float]],
) -> None:
    """Nova's requests and bytes per minute at the default intervals, from what one
    incremental sync and one complete resync cost in this run: a complete resync is all osas
    asked within the span it logged for one (its listing's pages, the flavors it reads again,
    a GET for a server the listing missed), an incremental one each changes-since listing;
    the rest is counted by time."""
    entries = [list(e) for e in sim_get(sim, f"/_bench/log?since={since}")["entries"]]

    def during(entry: list[Any], window: tuple[float, float]) -> bool:
        return bool(window[0] - 0.01 <= entry[0] <= window[1])

    complete = [[e for e in entries if during(e, w)] for w in windows]
    complete = [made for made in complete if made]
    within = [e for e in entries if span[0] <= e[0] <= span[1]]
    incremental = _listings([e for e in within if _incremental_page(e)])
    if not complete or not incremental:
        return
    rest = [
        e for e in within if not _incremental_page(e) and not any(during(e, w) for w in windows)
    ]
    resyncs = [float(sum(e[5] for e in made)) for made in complete]
    resync_requests = [float(len(made)) for made in complete]
    per_incremental = sum(e[5] for pages in incremental for e in pages) / len(incremental)
    incremental_requests = sum(len(pages) for pages in incremental) / len(incremental)
    minute = a_minute(
        (per_incremental, incremental_requests),
        (statistics.median(resyncs), statistics.median(resync_requests)),
        _other(rest, span),
    )
    result.add("nova_bytes", minute.megabytes)
    result.add("nova_requests", minute.requests)
    for resync, requests_made in zip(resyncs, resync_requests, strict=True):
        result.add("nova_resync_bytes", resync / 1e6)
        result.add("nova_resync_requests", requests_made)
    result.add("nova_incremental_bytes", per_incremental / 1e3)


async def churn_phase(plan: Plan, result: SizeResult, setup: Setup) -> None:
    """Nova's traffic from osas at its defaults while 1% of the project's other servers change
    each minute: incremental syncs list what changed in the project (untagged changes-since,
    so that deletions show), so their cost follows the project's churn, not its size. The
    complete resyncs (none within the phase at the default interval) cost what the resync
    phase measured: the other servers carry no cluster tag."""
    osas = await start_osas(setup, f"osas-{result.servers}-churn")
    since = sim_get(setup.sim, "/_bench/log?since=0")["next"]
    others = result.servers * OTHERS_PER_SERVER
    try:
        sim_get(setup.sim, f"/_bench/churn?per_minute={others * CHURN_SHARE}")
        began = time.time()
        await asyncio.sleep(plan.churn_seconds)
        ended = time.time()
    finally:
        sim_get(setup.sim, "/_bench/churn?per_minute=0")
        osas.stop()
    entries = [list(e) for e in sim_get(setup.sim, f"/_bench/log?since={since}")["entries"]]
    within = [e for e in entries if began <= e[0] <= ended]
    listings = _listings([e for e in within if _incremental_page(e)])
    resync = result.figures.get("nova_resync_bytes")
    resync_requests = result.figures.get("nova_resync_requests")
    if not listings or resync is None or resync_requests is None:
        return
    per_listing = sum(e[5] for pages in listings for e in pages) / len(listings)
    pages_per_listing = sum(len(pages) for pages in listings) / len(listings)
    minute = a_minute(
        (per_listing, pages_per_listing),
        (resync.median * 1e6, resync_requests.median),
        _other([e for e in within if not _incremental_page(e)], (began, ended)),
    )
    note = f"{others * CHURN_SHARE:.0f} of {others:,} other servers a minute"
    result.add("nova_incremental_bytes_churn", per_listing / 1e3, note)
    result.add("nova_bytes_churn", minute.megabytes, note)
    result.add("nova_requests_churn", minute.requests, note)


async def metrics_load_phase(plan: Plan, result: SizeResult, setup: Setup) -> None:
    """/healthz and CA's hottest call while the metrics port is loaded (``osas.bench.load``, a
    process of its own): idle connections, clients that send half a request line and stop,
    and clients polling /status and /metrics as fast as they are answered. The same calls with
    the port quiet first."""
    osas = await start_osas(setup, f"osas-{result.servers}-metrics", metrics=True)
    client = Client(osas.port, setup.tls)
    calls = [target_size(setup.groups[0])] * plan.load_calls

    def healthz() -> float:
        started = time.perf_counter()
        answer = requests.get(f"http://127.0.0.1:{osas.metrics}/healthz", timeout=10)
        answer.raise_for_status()
        return (time.perf_counter() - started) * 1000

    try:
        quiet = [t.seconds * 1000 for t in await client.timed(calls)]
        load = ["--port", str(osas.metrics), "--idle", str(IDLE_CONNECTIONS)]
        load += ["--slow", str(SLOW_CONNECTIONS), "--pollers", str(POLLERS)]
        with kit("osas.bench.load", *load):
            await asyncio.sleep(1.0)
            loaded = [t.seconds * 1000 for t in await client.timed(calls)]
            probes = [await asyncio.to_thread(healthz) for _ in range(40)]
    finally:
        await client.close()
        osas.stop()
    note = f"{IDLE_CONNECTIONS} idle, {SLOW_CONNECTIONS} slow, {POLLERS} polling"
    result.add("target_p99_quiet", percentile(quiet, 0.99))
    result.add("target_p99_loaded", percentile(loaded, 0.99), note)
    result.add("healthz_loaded", max(probes), note)


async def measure_creates(plan: Plan, tls: Tls, folder: Path) -> Figure:
    """IncreaseSize(100) at the default settings: time until Nova holds 100 more servers."""
    groups = [f"c{i}" for i in range(plan.create_rounds)]
    figure = Figure(KINDS["creates"])
    peaks = []
    with kit("osas.bench.cloud", "--servers", "0") as sim:
        osas = await start_osas(Setup(folder, tls, sim, groups), "osas-creates")
        client = Client(osas.port, tls)
        try:
            for group in groups:
                # A scale-up from a quiet start: the rate limit's bucket full again.
                await asyncio.sleep(3)
                sim_get(sim, "/_bench/creates")
                request = pb.NodeGroupIncreaseSizeRequest(id=group, delta=CREATES)
                increase = Call(
                    "NodeGroupIncreaseSize",
                    request.SerializeToString(),
                    pb.NodeGroupIncreaseSizeResponse,
                )
                started = time.perf_counter()
                await client.call(increase)
                while sim_get(sim, f"/_bench/count?group={group}")["count"] < CREATES:
                    await asyncio.sleep(0.01)
                figure.samples.append(time.perf_counter() - started)
                peaks.append(sim_get(sim, "/_bench/creates")["peak"])
        finally:
            await client.close()
            osas.stop()
    figure.note = f"at most {max(peaks)} creates at Nova at once"
    return figure


async def run(
    plan: Plan,
    out: Path,
    compare_with: Path | None,
    *,
    start_up_only: bool,
    takeover_only: bool = False,
    sizes_only: bool = False,
    ca_loop_only: bool = False,
    ca_loop_label: str = CA_LOOP_LABEL,
    places_only: bool = False,
    warm_only: bool = False,
) -> None:
    with tempfile.TemporaryDirectory(prefix="osas-bench-") as temporary:
        folder = Path(temporary)
        tls = Tls.make(folder)
        if start_up_only:
            startup = await measure_startup(plan.rounds, tls, folder, compare_with)
            replace_startup_section(out, startup, machine())
            return
        if takeover_only:
            takeover = await measure_takeover(plan.takeover_rounds, tls, folder)
            replace_takeover_section(out, takeover, machine())
            return
        if ca_loop_only:
            save_run(out, await measure_caloop(plan.ca_loop, tls, folder, ca_loop_label))
            replace_caloop_section(out, load_runs(out))
            return
        if places_only:
            places = await measure_places(plan.places, tls, folder)
            replace_marked_section(out, PLACES_BEGIN, PLACES_END, places_section(places, machine()))
            return
        if warm_only:
            warm = await measure_warm(plan.warm, tls, folder)
            replace_marked_section(out, WARM_BEGIN, WARM_END, warm_section(warm, machine()))
            return
        results = [await measure_size(plan, size, tls, folder) for size in plan.sizes]
        if sizes_only:
            replace_size_sections(out, results, machine())
            return
        creates = await measure_creates(plan, tls, folder)
        takeover = await measure_takeover(plan.takeover_rounds, tls, folder)
        promises = await measure_promises(tls, folder)
        burst = await measure_burst(plan.burst_rounds, tls, folder)
        save_run(out, await measure_caloop(plan.ca_loop, tls, folder, ca_loop_label))
        places = await measure_places(plan.places, tls, folder)
        warm = await measure_warm(plan.warm, tls, folder)
        startup = await measure_startup(plan.rounds, tls, folder, compare_with)
    write_report(
        out,
        machine(),
        dataclasses.asdict(plan),
        results,
        creates,
        startup,
        takeover,
        burst,
        load_runs(out),
    )
    replace_marked_section(out, PROMISES_BEGIN, PROMISES_END, promises)
    replace_marked_section(out, PLACES_BEGIN, PLACES_END, places_section(places, machine()))
    replace_marked_section(out, WARM_BEGIN, WARM_END, warm_section(warm, machine()))


def _places_asked(
    places: PlacesPlan, sizes: tuple[int, ...] | None, rounds: int | None
) -> PlacesPlan:
    """The places measure's plan, ``sizes[0]`` the servers of the place beside the healthy
    one, ``rounds`` its cycles."""
    if sizes:
        places = dataclasses.replace(places, big=sizes[0])
    if rounds:
        places = dataclasses.replace(places, rounds=rounds)
    return places


def run_benchmark(
    plan: Plan,
    *,
    sizes: tuple[int, ...] | None,
    rounds: int | None,
    out: Path,
    compare_with: Path | None = None,
    start_up_only: bool = False,
    takeover_only: bool = False,
    sizes_only: bool = False,
    ca_loop_only: bool = False,
    ca_loop_label: str = CA_LOOP_LABEL,
    places_only: bool = False,
    warm_only: bool = False,
) -> int:
    """``osas bench``: the plan, with the sizes and rounds asked for, and the report written
    (``start_up_only``, ``takeover_only``, ``ca_loop_only``: only that section of it;
    ``sizes_only``: only the sections per number of servers and their rows among the targets;
    ``places_only``: only the section on node groups in several places; ``warm_only``: only
    the section on warm pools; ``rounds`` then being that measure's rounds, with
    ``ca_loop_only`` ``sizes`` its node counts, with ``places_only`` ``sizes`` the servers of
    the place beside the healthy one, its first; ``warm_only`` takes no ``sizes``: its
    scale-ups are of 1 to ``osas.bench.warm.Plan.largest`` nodes).
    The CA loop's run is kept next to the report under ``ca_loop_label``, which
    replaces an earlier run of that label alone."""
    if ca_loop_only:
        ca_loop = plan.ca_loop
        if sizes:
            ca_loop = dataclasses.replace(ca_loop, sizes=sizes)
        if rounds:
            ca_loop = dataclasses.replace(ca_loop, rounds=rounds)
        plan = dataclasses.replace(plan, ca_loop=ca_loop)
    elif places_only:
        plan = dataclasses.replace(plan, places=_places_asked(plan.places, sizes, rounds))
    elif warm_only:
        if rounds:
            plan = dataclasses.replace(plan, warm=dataclasses.replace(plan.warm, rounds=rounds))
    else:
        if sizes:
            plan = dataclasses.replace(plan, sizes=sizes)
        if rounds:
            plan = dataclasses.replace(plan, rounds=rounds)
            if takeover_only:
                plan = dataclasses.replace(plan, takeover_rounds=rounds)
    asyncio.run(
        run(
            plan,
            out,
            compare_with,
            start_up_only=start_up_only,
            takeover_only=takeover_only,
            sizes_only=sizes_only,
            ca_loop_only=ca_loop_only,
            ca_loop_label=ca_loop_label,
            places_only=places_only,
            warm_only=warm_only,
        )
    )
    print(f"written: {out}")  # noqa: T201
    return 0
