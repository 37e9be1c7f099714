"""The benchmark's memory limit (``osas.bench.memlimit``): a real cgroup, real processes. Where
this machine lets no cgroup be made (not root, no writable hierarchy), there is nothing to
test, and the benchmark leaves its rows under a limit out."""

from __future__ import annotations

import subprocess
import sys

import pytest

from osas.bench.memlimit import MemoryLimit


@pytest.fixture
def limit():
    made = MemoryLimit.make(64, name="osas-test")
    if made is None:
        pytest.skip("no memory cgroup can be made here (root and a writable hierarchy needed)")
    yield made
    made.remove()


def run_inside(limit: MemoryLimit, mib: int) -> int:
    """A process that fills ``mib`` MiB, run inside the limit: its exit code."""
    code = f"block = bytearray({mib} * 2**20); block[::4096] = b'x' * len(block[::4096])"
    return subprocess.run(limit.command([sys.executable, "-c", code]), check=False).returncode


def test_a_process_within_the_limit_runs_and_one_beyond_it_is_killed(limit):
    assert run_inside(limit, 16) == 0
    assert 16 <= limit.peak_mib() <= 64
    assert limit.oom_kills() == 0

    assert run_inside(limit, 200) != 0  # the kernel's OOM killer: SIGKILL
    assert limit.oom_kills() == 1
    assert limit.peak_mib() <= 64 + 1
