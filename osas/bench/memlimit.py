"""A memory limit as the kubelet sets one for a container: a memory cgroup of the benchmark's
own (cgroup v2, else v1's memory hierarchy), which a process joins before its first
instruction. Where no cgroup can be made (not Linux, not root, a read-only hierarchy), there
is none, and the benchmark's rows under a limit are left out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

_V2 = Path("/sys/fs/cgroup")
_V1 = Path("/sys/fs/cgroup/memory")
_MIB = 2**20


@dataclass(frozen=True)
class MemoryLimit:
    """One cgroup limited to ``mib`` MiB (memory and swap alike)."""

    folder: Path
    mib: int
    v2: bool

    @classmethod
    def make(cls, mib: int, name: str = "osas-bench") -> MemoryLimit | None:
        """A new cgroup with the limit, or None where none can be made here."""
        v2 = "memory" in _read(_V2 / "cgroup.controllers").split()
        root = _V2 if v2 else _V1
        if not (root / "cgroup.procs").exists():
            return None
        folder = root / f"{name}-{os.getpid()}"
        limit = str(mib * _MIB)
        try:
            folder.mkdir(exist_ok=True)
            if v2:
                (folder / "memory.max").write_text(limit)
                with contextlib.suppress(OSError):  # no swap accounting: no swap to limit
                    (folder / "memory.swap.max").write_text("0")
            else:
                (folder / "memory.limit_in_bytes").write_text(limit)
                with contextlib.suppress(OSError):
                    (folder / "memory.memsw.limit_in_bytes").write_text(limit)
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()
            return None
        return cls(folder, mib, v2)

    def command(self, command: list[str]) -> list[str]:
        """``command``, run inside the cgroup from its first instruction (the shell joins it,
        then becomes the command)."""
        join = f'echo $$ > {self.folder / "cgroup.procs"} && exec "$@"'
        return ["sh", "-c", join, "sh", *command]

    def peak_mib(self) -> float:
        """The most the group was charged (memory.peak, memory.max_usage_in_bytes)."""
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        text = _read(self.folder / name)
        return int(text) / _MIB if text.strip().isdigit() else float("nan")

    def oom_kills(self) -> int:
        """Processes of the group the kernel killed for memory."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in _read(self.folder / name).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        """The cgroup gone (its processes must have exited)."""
        with contextlib.suppress(OSError):
            self.folder.rmdir()


def drop_page_cache() -> bool:
    """Ask the kernel to drop clean cached pages, so that the libraries a process maps are
    charged to its own group when it reads them (as in a new container) rather than to
    whichever group read them first. False where that is not allowed."""
    try:
        subprocess.run(["sync"], check=False)  # noqa: S607 - coreutils' sync, from PATH
        Path("/proc/sys/vm/drop_caches").write_text("3")
    except OSError:
        return False
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
