"""The benchmark of CA's loop by the server's CPU (``osas.bench.caloop``), run small: real
processes (the simulated OpenStack, ``osas serve``, the bare server) as it runs them, and its
report section with two labelled runs side by side."""

from __future__ import annotations

import dataclasses
import json

import pytest

from osas.bench.caloop import Plan, measure_caloop
from osas.bench.processes import Tls
from osas.bench.report import (
    BURST_END,
    CALOOP_BEGIN,
    CALOOP_END,
    STARTUP_BEGIN,
    TAKEOVER_END,
    replace_caloop_section,
    write_report,
)
from osas.bench.results import (
    KINDS,
    CaLoopRun,
    Figure,
    Side,
    SizeRow,
    Spent,
    StartupRow,
    TakeoverResult,
    load_runs,
    save_run,
)
from osas.bench.run import QUICK, run_benchmark

MACHINE = {
    "cpu": "a CPU",
    "cores": "2",
    "python": "3.11",
    "grpcio": "1.85",
    "date": "2026-01-01 00:00 UTC",
}


@pytest.mark.long
async def test_a_small_loop_is_answered_alike_by_osas_and_the_bare_server(tmp_path):
    """50 nodes, one round: every NodeGroupForNode names the node's own group (the bare server,
    osas's bytes for one of them), every GetOptions is UNIMPLEMENTED with osas's details from
    both servers (the bare one setting the status on its context and returning), and each
    server's CPU shows in every figure."""
    plan = Plan((50,), rounds=1, min_calls=500, idle_seconds=0.5)
    run = await measure_caloop(plan, Tls.make(tmp_path), tmp_path, "test")

    (row,) = run.rows
    assert (row.nodes, row.groups, row.calls) == (50, 6, 2 + 6 + 50 * 5)
    assert "/osas (" in run.osas_source
    for side in (row.osas, row.bare):
        # The warm-up loop, one measured loop, then each method alone (500 calls at least).
        assert side.answered["NodeGroupForNode"] == {"OK": 50 + 50 + 500}
        assert side.answered["Refresh"] == side.answered["NodeGroups"] == {"OK": 2}
        assert side.answered["NodeGroupTargetSize"] == {"OK": 12}
        assert side.unnamed == 0
        assert side.loop_cpu > 0
        assert side.options_per_call > 0
        assert side.for_node_per_call > 0
        assert side.loop_wall > 0
        assert side.idle is not None
        assert side.idle.wall >= 0.5
    assert row.osas.elsewhere == 0
    assert row.bare.elsewhere > 0  # g0's answer, whatever the node
    (refusal,) = row.osas.answered["NodeGroupGetOptions"]
    assert refusal.startswith("UNIMPLEMENTED: ")
    assert len(refusal) > len("UNIMPLEMENTED: ")
    assert row.bare.answered["NodeGroupGetOptions"] == {refusal: 2 * 200 + 600}
    assert row.osas.answered["NodeGroupGetOptions"] == {refusal: 2 * 200 + 600}


def _run(label: str, measured_at: float, loop_cpu: float) -> CaLoopRun:
    def side(cpu: float) -> Side:
        return Side(
            loops=[Spent(cpu, 3.0, 5_008)],
            options=[Spent(cpu * 0.6, 2.5, 4_000)],
            for_node=[Spent(cpu * 0.2, 0.6, 1_000)],
            idle=Spent(0.02, 10.0, 0),
        )

    row = SizeRow(1_000, 6, 5_008, side(loop_cpu), side(1.0))
    return CaLoopRun(label, f"/src/{label}/osas (abc1234)", 2, MACHINE, measured_at, [row])


def test_the_section_shows_every_labelled_run_between_its_markers(tmp_path):
    """Each run is kept next to the report under its label; the section, written before the
    start-up section, shows both runs and the later over the earlier, and a new run of a
    label replaces that label's alone."""
    report = tmp_path / "BENCHMARKS.md"
    startup = "<!-- start-up: osas bench, or osas bench --start-up-only -->\n## Start-up\n"
    report.write_text(f"# Benchmarks\n\n{startup}")
    for run in (_run("before", 1.0, 2.0), _run("after", 2.0, 9.0), _run("after", 3.0, 1.5)):
        save_run(report, run)
        replace_caloop_section(report, load_runs(report))

    assert (tmp_path / "benchmarks" / "caloop-before.json").exists()
    assert [run.label for run in load_runs(report)] == ["before", "after"]
    assert load_runs(report)[0] == _run("before", 1.0, 2.0)
    text = report.read_text()
    assert text.count(CALOOP_BEGIN) == text.count(CALOOP_END) == 1
    assert text.index(CALOOP_END) < text.index("## Start-up")
    section = text[text.index(CALOOP_BEGIN) : text.index(CALOOP_END)]
    assert "`/src/before/osas (abc1234)`" in section
    assert (
        "| nodes (calls a loop) | measure | before: osas | before: bare | before: osas/bare "
        "| after: osas | after: bare | after: osas/bare | osas after/before | bare after/before "
        "| osas/bare after/before |"
    ) in section
    # 2.0 s and 1.5 s a loop against the bare server's 1.0 s; after/before 0.75x.
    assert (
        "| 1,000 (5,008) | server CPU a loop | 2.00 s | 1.00 s | 2.00x "
        "| 1.50 s | 1.00 s | 1.50x | 0.75x | 1.00x | 0.75x |"
    ) in section
    assert "| NodeGroupGetOptions alone, server CPU a call | 300 µs |" in section
    assert "9.00 s" not in section
    # Round by round, for the noise: each run's loop osas/bare per round and their median.
    assert "- before, 1,000 nodes: 2.00; median **2.00x**" in section
    assert "- after, 1,000 nodes: 1.50; median **1.50x**" in section


def test_round_by_round_takes_the_median_of_the_pairs_not_the_ratio_of_the_means(tmp_path):
    """Three rounds where one is far off: the median of the per-round ratios ignores it,
    where the ratio of the means would not."""
    run = _run("noisy", 1.0, 1.0)
    (row,) = run.rows
    row.osas.loops = [Spent(cpu, 3.0, 5_008) for cpu in (1.1, 1.2, 3.0)]
    row.bare.loops = [Spent(1.0, 3.0, 5_008)] * 3
    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n")
    save_run(report, run)
    replace_caloop_section(report, load_runs(report))
    assert "- noisy, 1,000 nodes: 1.10, 1.20, 3.00; median **1.20x**" in report.read_text()


@pytest.mark.long
def test_osas_bench_measures_the_ca_loop_as_its_latest_run_beside_the_runs_kept_before(
    tmp_path, capsys
):
    """``osas bench``'s CA-loop-only run (sizes and rounds as asked): the real processes at 50
    nodes, kept as the run labelled latest next to the report, its section rewritten with the
    run kept before it side by side and the latest over it."""
    report = tmp_path / "BENCHMARKS.md"
    report.write_text(f"# Benchmarks\n\n{STARTUP_BEGIN}\n## Start-up\n")
    save_run(report, _run("before", 1.0, 2.0))
    small = Plan(QUICK.ca_loop.sizes, QUICK.ca_loop.rounds, min_calls=500, idle_seconds=0.5)
    plan = dataclasses.replace(QUICK, ca_loop=small)

    assert run_benchmark(plan, sizes=(50,), rounds=1, out=report, ca_loop_only=True) == 0

    assert capsys.readouterr().out.endswith(f"written: {report}\n")
    kept = json.loads((tmp_path / "benchmarks" / "caloop-latest.json").read_text())
    assert (kept["label"], kept["rounds"]) == ("latest", 1)
    assert [row["nodes"] for row in kept["rows"]] == [50]
    assert [run.label for run in load_runs(report)] == ["before", "latest"]
    text = report.read_text()
    assert text.count(CALOOP_BEGIN) == text.count(CALOOP_END) == 1
    section = text[text.index(CALOOP_BEGIN) : text.index(CALOOP_END)]
    assert "**latest**: osas from `" in section
    assert "| osas latest/before | bare latest/before | osas/bare latest/before |" in section
    assert "| 50 (258) | server CPU a loop | — | — | — |" in section  # not measured before
    assert text.index(CALOOP_END) < text.index("## Start-up")


def test_the_whole_report_holds_the_ca_loop_section_with_every_kept_run(tmp_path):
    """The report ``osas bench`` writes from a full run: its How names the CA loop's sizes and
    the label this run is kept under, and the CA-loop section, between the burst's (here the
    takeover's) and the start-up's, shows every kept run."""
    report = tmp_path / "BENCHMARKS.md"
    machine = {**MACHINE, "system": "Linux"}
    takeover = TakeoverResult(
        1_000, {"lease_duration": "15s", "renew_deadline": "10s", "retry_period": "2s"}, "20s"
    )
    takeover.add("takeover_killed", 3.0)
    startup = [StartupRow("bare interpreter", [4.0], [8.5], [25], [0])]
    runs = [_run("before", 1.0, 2.0), _run("latest", 2.0, 1.5)]
    plan = dataclasses.asdict(QUICK)

    write_report(report, machine, plan, [], Figure(KINDS["creates"]), startup, takeover, None, runs)

    text = report.read_text()
    assert "CA's loop as CA 1.36 makes it" in text
    assert "at\n  1,000 and 5,000 nodes" in text
    assert "this run kept as\n  **latest** beside the runs kept before it" in text
    assert "or `python -m osas.bench.caloop`" in text
    assert text.count(CALOOP_BEGIN) == text.count(CALOOP_END) == 1
    assert BURST_END not in text
    assert text.index(TAKEOVER_END) < text.index(CALOOP_BEGIN)
    assert text.index(CALOOP_END) < text.index(STARTUP_BEGIN)
    section = text[text.index(CALOOP_BEGIN) : text.index(CALOOP_END)]
    assert "| before: osas | before: bare | before: osas/bare | latest: osas |" in section
    assert "| 1,000 (5,008) | server CPU a loop | 2.00 s | 1.00 s | 2.00x | 1.50 s |" in section
