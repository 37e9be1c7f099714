"""docs/BENCHMARKS.md and its plot (a hand-written SVG: no plotting library needed)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from osas.bench.results import (
    KINDS,
    BurstResult,
    CaLoopRun,
    Figure,
    SizeResult,
    StartupRow,
    TakeoverResult,
)
from osas.engine.settings import ReconcileSettings

# The targets of issue 10, in the order of its table: (figure key, size it is judged at).
TARGETS = (
    ("for_node", 50_000),
    ("target", 10_000),
    ("nodes", 10_000),
    ("idle_worst", 50_000),
    ("resync_worst", 50_000),
    ("resync_worst_excess", 50_000),
    ("resync_p99_vs_bare", 50_000),
    ("nova_bytes", 50_000),
    ("nova_bytes_churn", 50_000),
    ("healthz_loaded", 10_000),
    ("target_p99_loaded", 10_000),
    ("rss", 50_000),
    ("rss_listing_10", 50_000),
    ("limit_listings", 50_000),
    ("start", 50_000),
)
PLOTTED = (
    ("for_node", "NodeGroupForNode"),
    ("target", "NodeGroupTargetSize"),
    ("nodes", "NodeGroupNodes"),
)
COLOURS = {"for_node": "#1f77b4", "target": "#2ca02c", "nodes": "#d62728"}


def _number(value: float, unit: str) -> str:
    if math.isnan(value):
        return "—"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "/s":
        return f"{value:.1f} /s"
    if unit in {"ms", "s", "MiB", "MB", "kB"}:
        digits = 0 if value >= 100 else 1 if value >= 10 else 2  # noqa: PLR2004
        return f"{value:.{digits}f} {unit}"
    return f"{value:.1f}"


def verdict(figure: Figure) -> str:
    """A figure against its target: met, **missed**, or — where it has none."""
    met = figure.met
    return "—" if met is None else "met" if met else "**missed**"


def figure_row(figure: Figure, suffix: str = "") -> str:
    """One figure as a row of ``HEADER``'s table."""
    kind, samples = figure.kind, figure.samples
    low = min(samples) if samples else float("nan")
    high = max(samples) if samples else float("nan")
    note = f" ({figure.note})" if figure.note else ""
    return (
        f"| {kind.name}{note}{suffix} | {kind.target} | {_number(low, kind.unit)} | "
        f"{_number(figure.median, kind.unit)} | {_number(high, kind.unit)} | "
        f"{len(samples)} | {verdict(figure)} |"
    )


HOW = """\
Everything runs on 127.0.0.1 as separate processes: the simulated OpenStack seeded with the
cluster's servers (`osas.bench.cloud`), `osas serve` against it with mTLS at its default
settings, and a bare grpc.aio server (`osas.bench.bare`) with the same mTLS that answers every
call with the bytes osas answered it, without decoding the request: the limit of gRPC in Python
on this machine. One Python client, serial calls, requests serialised beforehand, answers
parsed; while it times calls, what it already holds is frozen from its garbage collector, so
that its own full collections are not charged to the server it measures. Ratios are bare time /
osas time (1.0x: osas costs nothing above gRPC itself), measured back to back in each round,
osas and bare taking turns to go first; min / median / max are over rounds (over complete
resyncs for the resync rows). Servers are spread over node groups of at
most 10,000 (osas caps max_size there): 50k servers are 5 groups. Targets are judged at the
size the table names (at every size when it names none).

- **Idle tails**: CA's loop (Refresh, NodeGroups, TemplateNodeInfo and NodeGroupNodes per
  group, NodeGroupForNode and GetOptions for {loop_nodes} nodes, TargetSize three times per
  group) replayed for {idle_seconds:.0f} s per round against osas syncing every 10 s (its
  default), and for half as long against the bare server. NodeGroupNodes is reported apart: its
  answer is 570 kB at 10,000 instances, and its cost is gRPC's (see the ratio).
- **Resync tails**: the same loop for {resync_seconds:.0f} s against an osas doing a complete
  resync every 20 s. A call is *during* a resync when it overlaps the span osas logs for it
  (`complete listing applied`: from the listing's start to its application). The simulator
  serving that resync's listing shares the same two cores, so the same loop is also replayed
  for half as long against the bare server, with no osas running, while the simulator serves the
  listing a complete resync asks for (every server's details, by the cluster's tag) every 5 s:
  the bare server's own ratio, and its worst call in those windows, are the machine's share of
  the tail. osas is judged against them: its worst call in each resync beyond the bare
  server's worst (median of its windows), and its p99 ratio over the bare server's.
- **Nova traffic**: requests and bytes the simulator served in the resync phase, turned into a
  minute at the default intervals: a sync every {interval:.0f} s, and every
  {full_resync_minutes:.0f} min a complete resync instead, which reads every server's details
  again (one detail listing by the cluster's tag, `GET /servers/detail?tags=...`, paged at
  1,000). One complete resync is what osas asked within the span it logged for one (the
  listing's pages, the flavors it reads again); one incremental sync is the mean of its
  `changes-since` listings; anything else (tokens) is counted by time. The project also holds
  as many servers of another cluster; incremental syncs list what changed in the whole project
  (untagged `changes-since` from Nova's clock, so that a server deleted by hand shows), so the
  same is measured again for {churn_seconds:.0f} s against an osas at its defaults while 1% of
  those other servers change every minute. These are the writer's figures: a warm standby
  keeps its inventory in step with the incremental syncs alone (the rows' incremental part,
  a few bytes a minute idle) and makes no complete listing until it takes the Lease.
- **The metrics port under load**: {load_calls} NodeGroupTargetSize calls with the metrics port
  quiet, then again with 200 idle connections, 64 clients that sent half a request line, and 50
  clients polling `/status` and `/metrics` as fast as they are answered; 40 `/healthz` probes
  under the same load.
- **Memory**: osas's RSS from /proc after the resync phase (several complete resyncs, CA's
  loop answered meanwhile); then a fresh osas syncing every second, each sync a complete
  listing, with nothing else asked: its RSS when it starts serving (after its first complete
  listing) and after the tenth, and its own (anonymous) pages then. Where the benchmark can
  make a memory cgroup (Linux, as root), once more inside a 120 MiB limit as the kubelet sets
  one for a container, the page cache dropped first so that the libraries' pages are charged
  to it, with CA's loop answered meanwhile: the complete listings it made, whether the kernel
  killed it, its worst call, the group's peak charge.
- **Start**: from spawning `osas serve` to health SERVING, the first complete listing included.
  The simulator serving that listing (50 pages of detail at 50k, the listing of a complete
  resync) is timed alone, with a client that parses nothing, and subtracted for osas's part.
- **Creates**: IncreaseSize(100) at the default settings, until the simulator holds 100 more
  servers; the simulator counts the creates it has in hand at once.
- **Takeover**: a warm standby becoming the writer under a Kubernetes Lease, in a section of
  its own below.
- **A burst against a rate-limited cloud**: one large IncreaseSize against a cloud whose rate
  limit is below osas's own, in a section of its own below.
- **The CA loop, by the server's CPU**: CA's loop as CA 1.36 makes it (Refresh, NodeGroups, a
  TargetSize per group, and per node a NodeGroupForNode and four GetOptions) at
  {ca_loop_nodes} nodes, against osas and a bare server answering its bytes and statuses, the
  servers' own CPU read from /proc; in a section of its own below, this run kept as
  **{ca_loop_label}** beside the runs kept before it.
"""

HEADER = "| measure | target | min | median | max | n | |\n|---|---|---|---|---|---|---|"


STARTUP_BEGIN = "<!-- start-up: osas bench, or osas bench --start-up-only -->"
STARTUP_END = "<!-- end of start-up -->"
TAKEOVER_BEGIN = "<!-- takeover: osas bench, or python -m osas.bench.takeover -->"
TAKEOVER_END = "<!-- end of takeover -->"
BURST_BEGIN = "<!-- burst: osas bench, or python -m osas.bench.burst -->"
BURST_END = "<!-- end of burst -->"


def takeover_section(result: TakeoverResult, machine: dict[str, str]) -> list[str]:
    """The takeover table: each figure over rounds."""
    lease = {key: value.replace("s", " s") for key, value in result.lease.items()}
    rounds = max((len(f.samples) for f in result.figures.values()), default=0)
    lines = [
        TAKEOVER_BEGIN,
        "## A standby taking over",
        "",
        (
            f"Leader election at its defaults (lease_duration {lease['lease_duration']}, "
            f"renew_deadline {lease['renew_deadline']}, retry_period {lease['retry_period']}), "
            "in separate processes: the Kubernetes API stand-in (`osas.sim.kubernetes`, Leases "
            f"and EndpointSlices), the simulated OpenStack ({result.servers:,} servers) and two "
            "`osas serve` with their pod's name, namespace and address. CA's side reads where "
            "the Service leads (the EndpointSlice the holder publishes: where kube-proxy sends a "
            "new connection) every 50 ms and calls NodeGroupTargetSize there until it is "
            "answered; a real CA's channel adds its own reconnection backoff. The holder is "
            "SIGKILLed (it neither releases the lease nor empties its endpoint); then a new "
            "standby joins and the new holder is stopped with SIGTERM, as Kubernetes stops a "
            "pod; each at a moment of the standby's retry period, spread over it by round. "
            "Scale-ups held: `scale_ups_held_seconds` in the new holder's `/status` when it "
            "first answers, and what IncreaseSize(1) got then. The holder is idle here, so its "
            "promise record holds no create in flight and the new holder holds nothing (with "
            "creates in flight it counts exactly those, each in its group: the promises "
            "section); *until scale-ups are allowed again* is the time to answer plus any "
            "hold. "
            f"{rounds} round{'s' * (rounds != 1)}, fresh replicas each; {machine['date']}."
        ),
        "",
        HEADER,
    ]
    lines += [figure_row(figure) for figure in result.figures.values()]
    return [*lines, TAKEOVER_END]


def _replace_section(out: Path, begin: str, end: str, section: list[str]) -> None:
    """Write a marked section into an existing report (where it was, else before the
    start-up section, else at the end), leaving the rest as it is."""
    text = out.read_text() if out.exists() else "# Benchmarks\n"
    body = "\n".join(section)
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        tail = rest.partition(end)[2]
        text = f"{head}{body}{tail}"
    elif begin != STARTUP_BEGIN and STARTUP_BEGIN in text:
        head, _, rest = text.partition(STARTUP_BEGIN)
        text = f"{head}{body}\n\n{STARTUP_BEGIN}{rest}"
    else:
        text = f"{text.rstrip()}\n\n{body}\n"
    out.write_text(text)


def replace_marked_section(out: Path, begin: str, end: str, section: list[str]) -> None:
    """Write a section a measure renders itself (between ``begin`` and ``end``) into an
    existing report, leaving the rest as it is."""
    _replace_section(out, begin, end, section)


def replace_takeover_section(out: Path, result: TakeoverResult, machine: dict[str, str]) -> None:
    """Write the takeover section into an existing report, leaving the rest as it is."""
    _replace_section(out, TAKEOVER_BEGIN, TAKEOVER_END, takeover_section(result, machine))


def burst_section(result: BurstResult, machine: dict[str, str]) -> list[str]:
    """The burst table: each figure over rounds."""
    rounds = max((len(f.samples) for f in result.figures.values()), default=0)
    lines = [
        BURST_BEGIN,
        "## A burst against a rate-limited cloud",
        "",
        (
            f"A cloud that allows {result.rate:g} server creates a second: the simulated "
            "OpenStack's rate limit in front of Nova (`create_rate`, a token bucket with a "
            "second's burst), which answers a create above it 429 with `Retry-After` and never "
            f"lets it reach Nova. osas at its defaults but for room for the burst: "
            f"`openstack.rate_limit` {result.rate_limit:g}/s, {result.workers} queue workers, "
            f"a sync every {result.sync_interval:g} s. Separate processes: `osas sim` (builds of "
            f"{result.build_seconds:g} s) and `osas serve` against it with mTLS; CA's side calls "
            f"NodeGroupIncreaseSize({result.count:,}) once, then NodeGroupNodes every second, as "
            f"CA's loop would, until {result.count:,} instances are running (or "
            f"{result.time_limit:.0f} s pass). The ideal is {result.count:,} / {result.rate:g} = "
            f"{result.ideal:.0f} s: every create at the cloud's rate, none lost to it. osas "
            "shows a server running once a sync has seen it ACTIVE, so the last one shows up to "
            "a build and a sync interval after Nova stored it. The 429s, the servers Nova stored "
            "and the create POSTs it was sent are the simulator's counts (`/_sim/calls`, "
            "`/_sim/servers`); the pace is osas's `/metrics` once the last instance runs. "
            f"{rounds} round{'s' * (rounds != 1)}, a fresh cloud and osas each; "
            f"{machine['date']}."
        ),
        "",
        HEADER,
    ]
    lines += [figure_row(figure) for figure in result.figures.values()]
    return [*lines, BURST_END]


def replace_burst_section(out: Path, result: BurstResult, machine: dict[str, str]) -> None:
    """Write the burst section into an existing report, leaving the rest as it is."""
    _replace_section(out, BURST_BEGIN, BURST_END, burst_section(result, machine))


CALOOP_BEGIN = "<!-- ca loop: osas bench, or python -m osas.bench.caloop -->"
CALOOP_END = "<!-- end of ca loop -->"
# What the CA-loop table shows of each server at a size: ``SizeRow.figures``' key, a name,
# a unit; ratios are shown for the first four.
_CALOOP_ROWS = (
    ("loop_cpu", "server CPU a loop", "s"),
    ("loop_per_call", "server CPU a call, over the loop", "µs"),
    ("options_per_call", "NodeGroupGetOptions alone, server CPU a call", "µs"),
    ("for_node_per_call", "NodeGroupForNode alone, server CPU a call", "µs"),
    ("options_share", "the loop's GetOptions, share of its server CPU", "%"),
    ("for_node_share", "the loop's NodeGroupForNode, share of it", "%"),
    ("loop_wall", "loop wall time (a Python client)", "s"),
    ("idle", "idle (one sync interval), server CPU", "ms/s"),
)
_CALOOP_RATIOS = 4


def _caloop_number(value: float, unit: str) -> str:
    if math.isnan(value):
        return "—"
    if unit in {"µs", "%"}:
        return f"{value:,.0f} {unit}"
    if unit == "ms/s":
        return f"{value:.1f} {unit}"
    if unit == "x":
        return f"{value:.2f}x"
    digits = 3 if value < 1 else 2 if value < 10 else 1  # noqa: PLR2004
    return f"{value:.{digits}f} {unit}"


def _ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom and not math.isnan(bottom) else math.nan


def caloop_section(runs: list[CaLoopRun]) -> list[str]:
    """The CA-loop table: per size and figure, each labelled run's osas, bare and osas/bare
    side by side, then each later run over the first: osas's change, the bare server's (the
    same code: the machine's drift between the runs), and osas/bare's (osas's change with
    that drift taken out)."""
    first = runs[0]
    described = "; ".join(
        f"**{run.label}**: osas from `{run.osas_source}`, {run.rounds} round"
        f"{'s' * (run.rounds != 1)}, {run.machine['date']}"
        for run in runs
    )
    machine = first.machine
    lines = [
        CALOOP_BEGIN,
        "## The CA loop: the server's CPU",
        "",
        (
            "What Cluster Autoscaler's loop costs the server, read from the kernel (utime + "
            "stime of the server's process in `/proc/<pid>/stat`, before and after), so that "
            "the Python client's own CPU, far above what CA's Go client spends a call, is not "
            "counted (the wall time includes it). Separate processes: the simulated OpenStack "
            "with N servers spread over 6 node groups, all ACTIVE; `osas serve` against it "
            "with mTLS at its defaults (a sync every 10 s, no option overrides: GetOptions "
            "answers UNIMPLEMENTED, keep your defaults); and a bare grpc.aio server with the "
            "same mTLS answering osas's own bytes and statuses without decoding a request, "
            "its UNIMPLEMENTED set on the context and returned (no exception), on uvloop's "
            "event loop as `osas serve` runs by default (`transport.event_loop`; runs kept "
            "before 2026-11-27 08:00 UTC had both servers on asyncio's, so the bare server's "
            "change over them is uvloop's with the machine's drift), its heap frozen once "
            "started as osas freezes its own (`gc.freeze()`; not in runs kept before "
            "2026-11-27 15:30 UTC, 0.1-0.3% of its instructions a call). One loop as CA "
            "1.36 makes it, serially: Refresh, NodeGroups, NodeGroupTargetSize per group, "
            "then per node a NodeGroupForNode (name, `openstack:///<uuid>`, kubelet's labels) "
            "and 4 NodeGroupGetOptions with CA's default options. Each server is started once "
            "per size and warmed with one loop; the servers take turns. A loop's figures are "
            "the mean over rounds; a call's, a stretch's CPU over its calls; each method "
            "alone is its calls in a loop, repeated to at least 5,000 a round. The shares are "
            "the method's calls a loop times its CPU a call alone, over the loop's CPU. Idle: "
            "the same stretch of one sync interval with nothing asked (osas's syncs are in "
            "its loops' figures too). `osas bench` measures this tree's osas at 1,000, 5,000 "
            "and 10,000 nodes (`--quick`: 1,000 and 5,000) and keeps it as the run **latest** "
            "in `benchmarks/caloop-latest.json`, replacing the previous one; `python -m "
            "osas.bench.caloop --label NAME [--osas-python CHECKOUT]` measures one osas (this "
            "tree's, or an older checkout's) and keeps it in `benchmarks/caloop-NAME.json`. "
            "Every kept run is shown, and each later one over the first: the bare server's is "
            "the machine's drift between the runs (it is the same code), its osas/bare the "
            "change of osas with that drift taken out. "
            f"Machine: {machine['cpu']}, {machine['cores']} cores; Python {machine['python']}, "
            f"grpcio {machine['grpcio']}."
        ),
        "",
        f"Runs: {described}.",
        "",
    ]
    head = ["nodes (calls a loop)", "measure"]
    for run in runs:
        head += [f"{run.label}: osas", f"{run.label}: bare", f"{run.label}: osas/bare"]
    head += [
        f"{who} {run.label}/{first.label}"
        for run in runs[1:]
        for who in ("osas", "bare", "osas/bare")
    ]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    sizes = sorted({row.nodes for run in runs for row in run.rows})
    for nodes in sizes:
        rows = [next((row for row in run.rows if row.nodes == nodes), None) for run in runs]
        calls = next(row.calls for row in rows if row is not None)
        figures = [
            (row.figures(row.osas), row.figures(row.bare)) if row is not None else ({}, {})
            for row in rows
        ]
        for index, (key, name, unit) in enumerate(_CALOOP_ROWS):
            ratios = index < _CALOOP_RATIOS
            values = [(o.get(key, math.nan), b.get(key, math.nan)) for o, b in figures]
            cells = [f"{nodes:,} ({calls:,})" if index == 0 else "", name]
            for osas, bare in values:
                cells += [_caloop_number(osas, unit), _caloop_number(bare, unit)]
                cells.append(_caloop_number(_ratio(osas, bare), "x") if ratios else "")
            (osas_was, bare_was) = values[0]
            for osas, bare in values[1:]:
                changes = (
                    _ratio(osas, osas_was),
                    _ratio(bare, bare_was),
                    _ratio(_ratio(osas, bare), _ratio(osas_was, bare_was)),
                )
                cells += [_caloop_number(c, "x") if ratios else "" for c in changes]
            lines.append("| " + " | ".join(cells) + " |")
    return [*lines, *_round_by_round(runs), CALOOP_END]


def _round_by_round(runs: list[CaLoopRun]) -> list[str]:
    """osas/bare for the whole loop in each round (the servers measured back to back), and
    their median: on a shared machine one round moves by 5-15%, and the median of the pairs
    holds better than the ratio of the means above."""
    lines = ["", "osas/bare for the loop, round by round (the median of the rounds last):", ""]
    for run in runs:
        for row in run.rows:
            pairs = [
                osas.cpu / bare.cpu
                for osas, bare in zip(row.osas.loops, row.bare.loops, strict=False)
                if bare.cpu > 0
            ]
            if not pairs:
                continue
            rounds = ", ".join(f"{pair:.2f}" for pair in pairs)
            lines.append(
                f"- {run.label}, {row.nodes:,} nodes: {rounds}; "
                f"median **{statistics.median(pairs):.2f}x**"
            )
    return lines


def replace_caloop_section(out: Path, runs: list[CaLoopRun]) -> None:
    """Write the CA-loop section, every labelled run in it, into an existing report (before
    the start-up section when it is new), leaving the rest as it is."""
    _replace_section(out, CALOOP_BEGIN, CALOOP_END, caloop_section(runs))


def startup_section(rows: list[StartupRow], machine: dict[str, str]) -> list[str]:
    """The start-up table: medians over rounds, and each process next to the bare one."""
    bare = rows[0]
    lines = [
        STARTUP_BEGIN,
        "## Start-up of `osas serve`",
        "",
        (
            "`osas serve` against the simulated OpenStack (1,000 servers) under `python -X "
            "importtime`, to SERVING: the time spent importing (the sum over every module, lazy "
            "imports included), how many modules, how many of them the kits' (simulator, demo, "
            "benchmark), and the resident memory half a second after SERVING; next to the bare "
            "interpreter waiting for input. Separate processes taking turns, median of "
            f"{len(bare.import_ms)} rounds; {machine['date']}."
        ),
        "",
        "| process | import time | vs bare | modules | of them kits | RSS at SERVING | vs bare |",
        "|---|---|---|---|---|---|---|",
    ]
    base_ms, base_rss = bare.median(bare.import_ms), bare.median(bare.rss_mib)
    for row in rows:
        import_ms, rss = row.median(row.import_ms), row.median(row.rss_mib)
        lines.append(
            f"| {row.label} | {import_ms:.0f} ms | {import_ms / base_ms:.1f}x "
            f"| {row.median(row.modules):.0f} | {row.median(row.kits):.0f} "
            f"| {rss:.1f} MiB | {rss / base_rss:.1f}x |"
        )
    return [*lines, STARTUP_END]


def replace_startup_section(out: Path, rows: list[StartupRow], machine: dict[str, str]) -> None:
    """Write the start-up section into an existing report, leaving the rest as it is."""
    _replace_section(out, STARTUP_BEGIN, STARTUP_END, startup_section(rows, machine))


def _counted(numbers: list[int] | tuple[int, ...]) -> str:
    """1,000, 5,000 and 10,000."""
    named = [f"{number:,}" for number in numbers]
    return " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)


def write_report(
    out: Path,
    machine: dict[str, str],
    plan: dict[str, Any],
    results: list[SizeResult],
    creates: Figure,
    startup: list[StartupRow],
    takeover: TakeoverResult,
    burst: BurstResult | None = None,
    ca_loop: list[CaLoopRun] | None = None,
) -> None:
    """The whole report from one run (``ca_loop``: every kept run of the CA loop, this run's
    last)."""
    by_size = {result.servers: result for result in results}
    defaults = ReconcileSettings()
    how = HOW.format(
        **plan,
        interval=defaults.interval,
        full_resync_minutes=defaults.full_resync_interval / 60,
        ca_loop_nodes=_counted(plan["ca_loop"]["sizes"]),
        ca_loop_label=ca_loop[-1].label if ca_loop else "—",
    )
    lines = [
        "# Benchmarks",
        "",
        (
            "Written by `osas bench` (`nox -s bench`); every figure below comes from the run that "
            "wrote this page (the start-up, takeover, promises, burst and CA-loop sections may "
            "come from a later `osas bench --start-up-only`, `python -m osas.bench.takeover`, "
            "`python -m osas.bench.promises`, `python -m osas.bench.burst` or `python -m "
            "osas.bench.caloop`, which rewrite their section alone and date it; the CA-loop "
            "section also shows the runs kept before this one)."
        ),
        "",
        (
            f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['system']}; Python "
            f"{machine['python']}, grpcio {machine['grpcio']}; {machine['date']}."
        ),
        "",
        "## How",
        "",
        how,
        "",
        "## The targets",
        "",
        HEADER,
    ]
    for key, size in TARGETS:
        result = by_size.get(size) or (results[-1] if results else None)
        if result is None or key not in result.figures:
            continue
        lines.append(figure_row(result.figures[key], f", {result.servers:,} servers"))
    lines.append(figure_row(creates))
    lines += ["", "## Latency against inventory size", "", "![p50 latency](benchmarks-latency.svg)"]
    lines += ["", _latency_table(results), ""]
    for result in results:
        lines += [*size_section(result), ""]
    lines += [*takeover_section(takeover, machine), ""]
    if burst is not None:
        lines += [*burst_section(burst, machine), ""]
    if ca_loop:
        lines += [*caloop_section(ca_loop), ""]
    lines += [*startup_section(startup, machine), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip() + "\n")
    (out.parent / "benchmarks-latency.svg").write_text(_plot(results))


def _size_heading(servers: int) -> str:
    return f"## {servers:,} servers ("


def size_section(result: SizeResult, measured: str = "") -> list[str]:
    """The rows of one number of servers (``measured``: a line saying which run they are
    from, when the rest of the page is another's)."""
    groups = f"{result.groups} group{'s' * (result.groups > 1)}"
    lines = [f"{_size_heading(result.servers)}{groups})", ""]
    if measured:
        lines += [measured, ""]
    return [*lines, HEADER, *(figure_row(figure) for figure in result.figures.values())]


def replace_size_sections(out: Path, results: list[SizeResult], machine: dict[str, str]) -> None:
    """Rewrite the sections of the numbers of servers measured, and their rows among the
    targets, in an existing report (``osas bench --sizes-only``); the rest stays as it was, from
    its own run. A size the report did not have is added before the next section."""
    lines = out.read_text().splitlines()
    sizes = ", ".join(f"{result.servers:,}" for result in results)
    measured = (
        f"Measured by `osas bench --sizes-only` on {machine['date']} ({machine['cpu']}, "
        f"{machine['cores']} cores), after the rest of this page."
    )
    for result in results:
        section = size_section(result, measured)
        heading = _size_heading(result.servers)
        start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
        if start is None:
            start = next(i for i, line in enumerate(lines) if line.startswith("<!--"))
            lines[start:start] = [*section, ""]
            continue
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "<!--"))),
            len(lines),
        )
        lines[start:end] = [*section, ""]
    by_size = {result.servers: result for result in results}
    first = lines.index(HEADER.splitlines()[1], lines.index("## The targets")) + 1
    last = next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))
    kept, rows = lines[first:last], []
    for key, size in TARGETS:
        kind, suffix = KINDS[key], f", {size:,} servers |"
        old = [row for row in kept if row.startswith(f"| {kind.name}") and suffix in row]
        fresh = by_size.get(size)
        if fresh is not None and key in fresh.figures:
            rows.append(figure_row(fresh.figures[key], f", {size:,} servers"))
        else:
            rows += old[:1]
        kept = [row for row in kept if row not in old]
    # What is left of the sizes measured is what they no longer judge: gone with its run.
    kept = [row for row in kept if not any(f", {size:,} servers |" in row for size in by_size)]
    note = f"Rows at {sizes} servers: `osas bench --sizes-only` of {machine['date']}."
    above = lines[: first - 2]  # the heading and a blank line, or a note of an earlier run too
    if above[-2].startswith("Rows at "):
        above[-2] = note
    else:
        above += [note, ""]
    lines = [*above, *lines[first - 2 : first], *rows, *kept, *lines[last:]]
    out.write_text("\n".join(lines).rstrip() + "\n")


def _latency_table(results: list[SizeResult]) -> str:
    head = "| p50 (median of rounds) | " + " | ".join(f"{r.servers:,}" for r in results) + " |"
    rows = [head, "|---|" + "---|" * len(results)]
    for key, label in PLOTTED:
        for who in ("osas", "bare"):
            cells = []
            for result in results:
                figure = result.figures.get(f"{key}_p50_{who}")
                cells.append(_number(figure.median, "ms") if figure else "—")
            rows.append(f"| {label}, {who} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _plot(results: list[SizeResult]) -> str:
    """p50 latency of the three hot reads against the number of servers, log-log."""
    width, height, left, right, top, bottom = 640, 400, 70, 170, 30, 50
    sizes = [r.servers for r in results]
    values = [
        f.median
        for r in results
        for key, _ in PLOTTED
        for who in ("osas", "bare")
        if (f := r.figures.get(f"{key}_p50_{who}")) and f.samples
    ]
    if not sizes or not values:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'
    x_low, x_high = math.log10(min(sizes)), math.log10(max(sizes)) or 1.0
    y_low = math.floor(math.log10(min(values)))
    y_high = math.ceil(math.log10(max(values)))
    y_high = max(y_high, y_low + 1)

    def x(size: float) -> float:
        span = (x_high - x_low) or 1.0
        return left + (math.log10(size) - x_low) / span * (width - left - right)

    def y(ms: float) -> float:
        return top + (y_high - math.log10(ms)) / (y_high - y_low) * (height - top - bottom)

    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="sans-serif" font-size="12">'
        ),
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18">p50 latency (ms, log) against servers in the inventory</text>',
    ]
    for power in range(y_low, y_high + 1):
        level = y(10.0**power)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{level:.1f}" y2="{level:.1f}" '
            'stroke="#ddd"/>'
        )
        parts.append(
            f'<text x="{left - 8}" y="{level + 4:.1f}" text-anchor="end">{10.0**power:g}</text>'
        )
    parts.extend(
        f'<text x="{x(size):.1f}" y="{height - bottom + 18}" text-anchor="middle">{size:,}</text>'
        for size in sizes
    )
    legend = top
    for key, label in PLOTTED:
        for who, dash in (("osas", ""), ("bare", ' stroke-dasharray="5,4"')):
            points = [
                (x(r.servers), y(f.median))
                for r in results
                if (f := r.figures.get(f"{key}_p50_{who}")) and f.samples
            ]
            if not points:
                continue
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{COLOURS[key]}" '
                f'stroke-width="2"{dash}/>'
            )
            parts += [
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{COLOURS[key]}"/>'
                for px, py in points
            ]
            parts.append(
                f'<line x1="{width - right + 10}" x2="{width - right + 35}" y1="{legend}" '
                f'y2="{legend}" stroke="{COLOURS[key]}" stroke-width="2"{dash}/>'
            )
            parts.append(f'<text x="{width - right + 40}" y="{legend + 4}">{label}, {who}</text>')
            legend += 18
    parts.append(
        f'<text x="{(left + width - right) / 2:.1f}" y="{height - 10}" '
        'text-anchor="middle">servers (log)</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
