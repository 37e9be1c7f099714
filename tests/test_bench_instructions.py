"""Instructions a call, counted by valgrind's callgrind (``osas.bench.instructions``), run
small: the same processes as the CA-loop benchmark, each server under callgrind."""

from __future__ import annotations

import pytest

from osas.bench.caloop import OsasCode
from osas.bench.instructions import count, valgrind_missing
from osas.bench.processes import Tls

pytestmark = [
    pytest.mark.valgrind,
    pytest.mark.skipif(valgrind_missing() is not None, reason=str(valgrind_missing())),
]


@pytest.mark.long
async def test_each_stretch_is_counted_on_both_servers_and_answered_alike(tmp_path):
    """20 nodes: every stretch counted on each server, for its own calls only (a gRPC call
    is tens of thousands of instructions at the least, never millions), and both servers
    answering every call as osas answered it first (``count`` checks it, or raises)."""
    figures = await count(20, 40, Tls.make(tmp_path), tmp_path, OsasCode.at(None, tmp_path))

    assert {name: f.calls for name, f in figures.items()} == {
        "loop": 2 + 6 + 20 * 5,
        "options": 80,
        "for_node": 40,
    }
    for figure in figures.values():
        for per_call in (
            figure.osas,
            figure.bare,
            figure.osas_all_threads,
            figure.bare_all_threads,
        ):
            assert 10_000 < per_call < 5_000_000
