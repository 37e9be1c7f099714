"""``osas bench --sizes-only``: the sections of the sizes measured, and their rows among the
targets, rewritten in an existing report; everything else left as its own run wrote it."""

from __future__ import annotations

from osas.bench.report import HEADER, replace_size_sections, size_section
from osas.bench.results import SizeResult

MACHINE = {"date": "2026-12-05 13:00 UTC", "cpu": "a CPU", "cores": "2"}


def sized(servers: int, groups: int, rss: float, excess: float) -> SizeResult:
    result = SizeResult(servers, groups)
    result.add("resync_worst_excess", excess)
    result.add("rss_listing_10", rss)
    return result


def report(*results: SizeResult) -> str:
    """A report shaped as ``write_report`` writes one: the targets, the sizes, then a section
    of another measure."""
    lines = ["# Benchmarks", "", "## The targets", "", HEADER]
    for result in results:
        for key in ("resync_worst_excess", "rss_listing_10"):
            figure = result.figures[key]
            lines.append(
                f"| {figure.kind.name}, {result.servers:,} servers | {figure.kind.target} | "
                f"old | old | old | 1 | met |"
            )
    lines += [
        "| a row no longer judged, 50,000 servers | <= 1.5x | 9x | 9x | 9x | 1 | **missed** |",
        "| 100 creates reaching Nova | <= 1.5 s | 1 s | 1 s | 1 s | 1 | met |",
        "",
    ]
    for result in results:
        lines += [*size_section(result), ""]
    lines += ["<!-- takeover: osas bench, or python -m osas.bench.takeover -->", "takeover"]
    return "\n".join(lines) + "\n"


def test_only_the_sizes_measured_are_rewritten(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(report(sized(1_000, 1, 80.0, 1.0), sized(50_000, 5, 160.0, 30.0)))

    replace_size_sections(out, [sized(50_000, 5, 118.0, 4.0)], MACHINE)
    replace_size_sections(out, [sized(50_000, 5, 117.0, 3.0)], MACHINE)  # again: one note

    text = out.read_text()
    targets = text[text.index("## The targets") : text.index("## 1,000 servers")]
    assert targets.count("Rows at 50,000 servers: `osas bench --sizes-only` of 2026-12-05") == 1
    assert "| RSS after 10 complete listings, one after the other, 50,000 servers |" in targets
    assert "| 117 MiB | 117 MiB | 117 MiB | 1 | met |" in targets
    assert "160" not in text  # the old 50,000 rows, gone from both places
    assert "no longer judged" not in text
    # The 1,000 rows and the rows of other measures are as they were.
    assert "| RSS after 10 complete listings, one after the other, 1,000 servers |" in targets
    assert "| 100 creates reaching Nova |" in targets
    small = text[text.index("## 1,000 servers") : text.index("## 50,000 servers")]
    assert small == "\n".join([*size_section(sized(1_000, 1, 80.0, 1.0)), "", ""])
    large = text[text.index("## 50,000 servers") : text.index("<!-- takeover")]
    assert "Measured by `osas bench --sizes-only` on 2026-12-05 13:00 UTC" in large
    assert "| 3.00 ms | 3.00 ms | 3.00 ms | 1 | met |" in large
    assert text.endswith("takeover\n")


def test_a_size_the_report_lacks_is_added_before_the_next_measure(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(report(sized(1_000, 1, 80.0, 1.0)))

    replace_size_sections(out, [sized(10_000, 1, 90.0, 2.0)], MACHINE)

    text = out.read_text()
    assert text.index("## 1,000 servers") < text.index("## 10,000 servers (1 group)")
    assert text.index("## 10,000 servers") < text.index("<!-- takeover")
