"""The promises benchmark's accounting of API server writes, and its report section."""

from __future__ import annotations

from osas.bench.promises import BEGIN, END, _per, section


def test_writes_are_counted_by_kind_over_the_window():
    before = {"renew": 10, "record": 2, "endpoint": 1}
    after = {"renew": 40, "record": 2, "endpoint": 1, "release": 0}
    assert _per(before, after, 1.0, "a minute") == "30 in a minute (renew 30)"
    assert _per(before, {**after, "record": 3}, 0.5, "x") == "62 in x (record 2, renew 60)"
    assert _per(before, before, 1.0, "x") == "0 in x (none)"


def test_the_section_is_marked_and_holds_every_row():
    lines = section(
        {"0 s": "a", "1 s": "b"},
        {"0 s": "c", "1 s": "d"},
        (16.1, 0),
        (15.8, 10),
        {"steady": "30 in a minute (renew 30)"},
    )
    assert lines[0] == BEGIN
    assert lines[-1] == END
    assert "| 1 s | b | d |" in lines
    assert "| 0 | 16.1 | 0 |" in lines
    assert "| steady | 30 in a minute (renew 30) |" in lines
