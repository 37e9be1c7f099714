"""The benchmark of CA's loop by the server's CPU (``osas.bench.caloop``), run small: real
processes (the simulated OpenStack, ``osas serve``, the bare server) as it runs them, and its
report section with two labelled runs side by side."""

from __future__ import annotations

from osas.bench.caloop import Plan, measure_caloop
from osas.bench.processes import Tls
from osas.bench.report import CALOOP_BEGIN, CALOOP_END, replace_caloop_section
from osas.bench.results import CaLoopRun, Side, SizeRow, Spent, load_runs, save_run

MACHINE = {
    "cpu": "a CPU",
    "cores": "2",
    "python": "3.11",
    "grpcio": "1.85",
    "date": "2026-01-01 00:00 UTC",
}


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
