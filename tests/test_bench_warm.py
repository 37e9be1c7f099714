"""The benchmark's warm pools against cold creates (``osas.bench.warm``), run tiny: real
processes as ``osas bench --warm-only`` runs them (the simulator with its request records and
watcher, ``osas serve``, the bare openstacksdk client), and its report section. Timings are not
judged here beyond their order: every scale-up claims warm servers while the pool has some,
each node's steps come in order, and a warm node is up before a cold one."""

from __future__ import annotations

import math

import pytest

from osas.bench.processes import Tls
from osas.bench.report import replace_marked_section
from osas.bench.run import FULL, QUICK
from osas.bench.warm import (
    BEGIN,
    COLD,
    END,
    WARM,
    BareNode,
    Node,
    Plan,
    ScaleUp,
    WarmResult,
    measure_warm,
    percentile,
    section,
)
from osas.cli.parser import build_parser

MACHINE = {"date": "2026-01-01 00:00 UTC", "cpu": "a CPU", "cores": "2"}
# Scale-ups of 1 to 3 nodes against a pool of 2: the third node of the largest goes cold.
TINY = Plan(largest=3, rounds=1, pool=2, scale=100.0)


@pytest.mark.long
async def test_scale_ups_claim_warm_servers_while_the_pool_has_some_and_warm_is_up_first(
    tmp_path,
):
    result = await measure_warm(TINY, Tls.make(tmp_path), tmp_path)

    assert len(result.scale_ups) == 2 * TINY.largest
    for made in result.scale_ups:
        if made.group == WARM:
            assert made.ready == TINY.pool_size
            assert made.claimed == min(made.size, made.ready), made
            assert made.cold == made.size - made.claimed
        else:
            assert (made.claimed, made.cold) == (0, made.size)
    nodes = sum(range(1, TINY.largest + 1))
    assert len(result.nodes) == 2 * nodes
    assert len(result.bare) == 2 * nodes
    assert sum(1 for b in result.bare if b.claimed) == nodes
    for node in result.nodes:
        assert node.called <= node.answered
        assert node.start <= node.active <= node.joined
        if node.claimed:
            assert node.read is not None
            assert node.written is not None
            assert node.read <= node.written <= node.start
    for bare in result.bare:
        assert bare.began <= bare.start
        if bare.claimed:
            assert bare.read is not None
            assert bare.written is not None
            assert bare.read <= bare.written <= bare.start

    figures = result.series()
    for key in ("active_s", "joined_s", "active_unscaled_s", "joined_unscaled_s"):
        warm, cold = figures[f"warm_{key}"], figures[f"cold_{key}"]
        assert len(warm) == nodes - 1  # the third node of the largest went cold
        assert len(cold) == nodes
        assert percentile(warm, 0.5) < percentile(cold, 0.5), key
    # Unscaled, the cloud's part is the real cloud's: more than its timings, if barely.
    timings = TINY.timings
    assert min(figures["cold_active_unscaled_s"]) >= timings.build
    assert min(figures["warm_joined_unscaled_s"]) >= timings.start + timings.warm_join
    for key in ("cold_to_start_ms", "warm_to_start_ms", "claim_trips_ms"):
        assert figures[key], key
        assert figures[f"bare_{key}"], key
    assert result.seconds > 0

    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\nkept by hand\n")
    replace_marked_section(report, BEGIN, END, section(result, MACHINE))
    text = report.read_text()
    assert text.startswith("# Benchmarks\n\nkept by hand\n")
    body = text[text.index(BEGIN) : text.index(END)]
    assert "## Warm pools: IncreaseSize to start, cold against warm" in body
    assert "| IncreaseSize answered, cold | `POST /servers` at Nova |" in body
    assert "| IncreaseSize answered, warm | `os-start` at Nova |" in body
    assert "| the claim's GET at Nova | `os-start` at Nova |" in body
    for name in ("ACTIVE, measured (scaled)", "joined, unscaled"):
        assert f"| {name} |" in body
    assert f"| {TINY.largest} |" in body
    assert "1 of the warm group's 6 nodes were created cold" in body
    assert "divided by 100 in the simulator" in body


def _node(group: str, *, claimed: bool, start: float, active: float) -> Node:
    read, written = (0.010, 0.015) if claimed else (None, None)
    return Node(group, claimed, 1, 0.0, 0.002, start, read, written, active, active)


def test_the_section_gives_osas_beside_the_bare_client_and_the_unscaled_figures():
    plan = Plan(largest=1, rounds=1, scale=10.0)
    result = WarmResult(
        plan,
        nodes=[
            _node(COLD, claimed=False, start=0.004, active=4.004),
            _node(WARM, claimed=True, start=0.022, active=1.022),
        ],
        bare=[
            BareNode(claimed=False, size=1, began=1.0, start=1.002, read=None, written=None),
            BareNode(claimed=True, size=1, began=2.0, start=2.011, read=2.001, written=2.006),
        ],
        scale_ups=[ScaleUp(COLD, 1, 1, 0, 1), ScaleUp(WARM, 1, 1, 1, 0)],
        seconds=60.0,
    )
    figures = result.series()
    # osas's part as measured, the simulator's times the scale, the join unscaled.
    (cold,) = figures["cold_joined_unscaled_s"]
    assert math.isclose(cold, 0.004 + 4.0 * 10 + plan.timings.first_join)
    (warm,) = figures["warm_active_unscaled_s"]
    assert math.isclose(warm, 0.022 + 1.0 * 10)
    (scaled,) = figures["warm_joined_s"]
    assert math.isclose(scaled, 1.022 + plan.timings.warm_join / 10)

    body = "\n".join(section(result, MACHINE))
    assert (
        "| IncreaseSize answered, cold | `POST /servers` at Nova | 2.0 ms | 2.0 ms | 2.0 ms" in body
    )
    assert "| the claim's GET at Nova | `os-start` at Nova | 12.0 ms | 12.0 ms | 10.0 ms" in body
    assert "| 1.2x | 1 |" in body
    assert "A claim adds 18.0 ms to osas's time to the start request" in body
    assert "the bare client's claim adds 9.0 ms to its own" in body
    assert "| joined, unscaled | 100.00 s | 100.00 s | 30.02 s | 30.02 s | 0.3x |" in body


def test_osas_bench_measures_warm_pools_alone_on_asking():
    assert build_parser().parse_args(["bench", "--warm-only"]).warm_only is True
    assert build_parser().parse_args(["bench"]).warm_only is False
    assert FULL.warm == Plan()
    assert QUICK.warm.rounds < FULL.warm.rounds
