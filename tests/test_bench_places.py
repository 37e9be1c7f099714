"""The benchmark's node groups in several places (``osas.bench.places``), run tiny: real
processes as ``osas bench`` runs them (the simulator with its regions, a second cloud stopped
under osas, ``osas serve`` for each run), and its report section. Timings are not judged here:
only that every run is measured, every call of the healthy place answered, and the figures
hang together."""

from __future__ import annotations

import pytest

from osas.bench.places import (
    BEGIN,
    COMPARISONS,
    END,
    VARIANTS,
    Plan,
    kind_of,
    measure_places,
    section,
)
from osas.bench.processes import Tls
from osas.bench.report import replace_marked_section

MACHINE = {"date": "2026-01-01 00:00 UTC", "cpu": "a CPU", "cores": "2"}
TINY = Plan(
    big=300, healthy=100, rounds=1, seconds=0.3, per_place=(0, 200), most_places=2, memory_rounds=1
)


@pytest.mark.long
async def test_every_run_is_measured_and_the_section_holds_its_rows(tmp_path):
    result = await measure_places(TINY, Tls.make(tmp_path), tmp_path)
    figures = result.figures

    for variant in VARIANTS:
        key = variant.key
        p50, p99, worst = (figures[f"{key}_{q}"].median for q in ("p50", "p99", "worst"))
        assert 0 < p50 <= p99 <= worst, key
        # The healthy place answered every call, and every node in its own group, whatever
        # the other place did.
        assert figures[f"{key}_failed"].samples == [0], key
        assert figures[f"{key}_misplaced"].samples == [0], key
        assert figures[f"{key}_rss"].median > 20, key  # MiB: a Python process serving
        assert figures[f"{key}_cpu"].median > 0, key
    for run, baseline, _ in COMPARISONS:
        for quantile in ("p50", "p99", "worst"):
            [ratio] = figures[f"{run}_over_{baseline}_{quantile}"].samples
            expected = (
                figures[f"{run}_{quantile}"].median / figures[f"{baseline}_{quantile}"].median
            )
            assert ratio == expected
    for servers in TINY.per_place:
        one, two = (figures[f"memory_{servers}_{count}"].median for count in (1, 2))
        assert one > 20
        assert figures[f"memory_{servers}_each"].samples == [two - one]
    assert result.seconds > 0

    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\nkept by hand\n")
    replace_marked_section(report, BEGIN, END, section(result, MACHINE))
    text = report.read_text()
    assert text.startswith("# Benchmarks\n\nkept by hand\n")
    body = text[text.index(BEGIN) : text.index(END)]
    for variant in VARIANTS:
        assert f"| `{variant.key}`: " in body
    assert "| `down` | `one` |" in body
    assert "| `big_listing` | `one_listing_busy` |" in body
    assert "| each place of 200 servers adds |" in body
    assert "Medians over 1 cycles" in body
    assert "| osas serving | p50 | p99 | worst | failed | misplaced | osas CPU | RSS |" in body


def test_only_the_p99_ratios_compared_for_a_verdict_carry_the_target():
    judged = [(run, base) for run, base, judged in COMPARISONS if judged]
    assert ("down", "one") in judged
    assert ("refused", "one") in judged
    for run, base, is_judged in COMPARISONS:
        p99 = kind_of(f"{run}_over_{base}_p99")
        assert (p99.threshold is not None) == is_judged
        assert kind_of(f"{run}_over_{base}_worst").threshold is None
    assert kind_of("down_failed").threshold == 0
    assert kind_of("memory_0_each").unit == "MiB"
