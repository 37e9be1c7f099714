"""The benchmark's start-up of ``osas serve`` (``osas.bench.startup``), run small: the bare
interpreter and ``osas serve`` under ``python -X importtime``, real processes as ``osas bench``
runs them, and its report section."""

from __future__ import annotations

from osas.bench.processes import Tls
from osas.bench.report import STARTUP_BEGIN, STARTUP_END, replace_startup_section
from osas.bench.startup import measure_startup

MACHINE = {"date": "2026-01-01 00:00 UTC"}


async def test_one_round_reads_each_process_imports_and_memory_into_its_row(tmp_path):
    """One round: the bare interpreter imports a few modules, ``osas serve`` hundreds and none
    of the kits'; each holds memory; the section shows both rows, osas's over the bare one."""
    bare, osas = await measure_startup(1, Tls.make(tmp_path), tmp_path)

    assert bare.label == "bare interpreter"
    assert osas.label.startswith("osas serve at ")
    for row in (bare, osas):
        assert len(row.import_ms) == len(row.modules) == len(row.kits) == len(row.rss_mib) == 1
        assert row.rss_mib[0] > 0
    assert osas.modules[0] > 10 * bare.modules[0]
    assert osas.import_ms[0] > bare.import_ms[0]
    assert osas.kits == [0]
    assert osas.rss_mib[0] > bare.rss_mib[0]

    report = tmp_path / "BENCHMARKS.md"
    replace_startup_section(report, [bare, osas], MACHINE)
    text = report.read_text()
    section = text[text.index(STARTUP_BEGIN) : text.index(STARTUP_END)]
    assert f"| {osas.label} | {osas.import_ms[0]:.0f} ms |" in section
    assert "median of 1 rounds" in section
