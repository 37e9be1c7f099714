"""The benchmark's burst against a rate-limited cloud (``osas.bench.burst``), run small: real
processes (``osas sim``, ``osas serve``) as ``osas bench`` runs them, and its report section."""

from __future__ import annotations

import pytest

from osas.bench.burst import measure_burst
from osas.bench.processes import Tls
from osas.bench.report import BURST_BEGIN, BURST_END, replace_burst_section
from osas.bench.results import BurstResult

MACHINE = {"date": "2026-01-01 00:00 UTC"}


@pytest.mark.long
async def test_a_small_burst_completes_at_the_clouds_pace_with_nothing_reported_failed(
    tmp_path,
):
    """20 creates against a cloud allowing 5 a second: osas, at 50 a second, is answered 429
    some of the time, yet every create is stored once and runs, and CA sees no failure."""
    result = await measure_burst(1, Tls.make(tmp_path), tmp_path, count=20, rate=5.0)

    def value(key: str) -> float:
        (sample,) = result.figures[key].samples
        return sample

    assert value("burst_shown_running") == 20
    assert value("burst_failed") == 0
    assert value("burst_throttled") > 0
    assert value("burst_servers") == 20
    assert "20 POSTs let through, 20 request ids" in result.figures["burst_servers"].note
    assert value("burst_running") < result.time_limit
    assert value("burst_ideal") == value("burst_running") / 4.0
    assert 0 < value("burst_pace") <= 50


def test_the_burst_section_is_written_between_its_markers_and_rewritten_in_place(tmp_path):
    """The section goes before the start-up section, and a second run replaces it whole."""
    report = tmp_path / "BENCHMARKS.md"
    startup = "<!-- start-up: osas bench, or osas bench --start-up-only -->\n## Start-up\n"
    report.write_text(f"# Benchmarks\n\n{startup}")
    result = BurstResult(1_000, 5.0, 900.0, 1.0, 50.0, 10, 10.0)
    for running in (212.0, 230.0):
        result.figures.clear()
        result.add("burst_running", running)
        result.add("burst_failed", 0)
        replace_burst_section(report, result, MACHINE)

    text = report.read_text()
    assert text.count(BURST_BEGIN) == text.count(BURST_END) == 1
    assert text.index(BURST_END) < text.index("## Start-up")
    section = text[text.index(BURST_BEGIN) : text.index(BURST_END)]
    assert "NodeGroupIncreaseSize(1,000)" in section
    assert "The ideal is 1,000 / 5 = 200 s" in section
    assert "| 230 s | 230 s | 230 s | 1 |" in section
    assert "212" not in section
    assert "| 0 | 0 | 0 | 0 | 1 | met |" in section
