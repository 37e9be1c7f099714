"""The instructions each server executes for CA's calls, counted by valgrind's callgrind.

A server's CPU seconds for the same calls move by 10-20% from one run to the next on a shared
machine; the instructions it executes barely move: two runs of the same code agreed within 0.1%
on the event loop's thread, where all of a server's Python runs, and 0.2% over all its threads.
gRPC's own threads wait in loops whose laps depend on timing, so their counts move when the
machine is busy (by up to 10% beside another valgrind run): run it alone.

``python -m osas.bench.instructions [--nodes N] [--calls C] [--label TEXT] [--osas-python PATH]
[--out FOLDER]`` sets up what ``osas.bench.caloop`` measures (the simulated OpenStack with N
servers in six groups, ``osas serve`` with mTLS, and the bare server answering osas's own bytes
and statuses), starts both servers under ``valgrind --tool=callgrind`` with counting off, and
for each stretch (CA's loop over the nodes, its GetOptions alone, its NodeGroupForNode alone,
each repeated to at least C calls) runs it once uncounted, as a warm-up, then once counted. It
prints instructions a call and osas over bare, and keeps the run as
``instructions-<label>.json`` in FOLDER when given.

Counted instructions leave out what CPU seconds include: cache misses, branch mispredictions
and the kernel's work. They say what a change removes from the work itself. osas's reconciler
syncs once an hour here, not every 10 s: under valgrind a call is some fifty times slower, so
syncs every 10 s of the clock would weigh fifty times what they weigh between real calls (the
CPU benchmark's idle figure shows them).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from osas.bench.caloop import (
    OsasCode,
    Server,
    osas_and_bare,
    repeated,
    summarise_and_check,
)
from osas.bench.processes import Tls, machine
from osas.bench.results import Side

NODES = 1_000
CALLS = 2_000
# Syncs an hour apart (see the module's docstring); an inventory that old still answers.
QUIET_RECONCILER = {"interval": "1h", "full_resync_interval": "1h", "max_inventory_age": "2h"}
_TOTALS = re.compile(rb"^(?:totals|summary):\s*(\d+)", re.MULTILINE)


def valgrind_missing() -> str | None:
    """Why instructions cannot be counted here, or None."""
    for program in ("valgrind", "callgrind_control"):
        if shutil.which(program) is None:
            return f"{program} is not installed (Debian: apt install valgrind)"
    return None


def callgrind(folder: Path) -> tuple[str, ...]:
    """The command a server runs under: callgrind, counting nothing until told to."""
    return (
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--separate-threads=yes",
        f"--log-file={folder}/valgrind.%p.log",
        f"--callgrind-out-file={folder}/callgrind.%p",
    )


class Counted:
    """One server under callgrind: counting switched on and off, and what was counted read
    back from the dump callgrind writes."""

    def __init__(self, server: Server, folder: Path) -> None:
        self.server = server
        self._folder = folder
        self._dumps = 0

    def _control(self, *arguments: str) -> None:
        subprocess.run(  # noqa: S603 - a fixed program, our own arguments
            ["callgrind_control", *arguments, str(self.server.pid)],  # noqa: S607
            check=True,
            capture_output=True,
        )

    async def instructions(self, asks: list[Any]) -> tuple[int, int]:
        """The instructions the server executed for ``asks`` after a warm-up with the same
        calls: on its main thread (the event loop, where every line of Python runs), and on
        all its threads."""
        await self.server.spend(asks)
        self._control("--instr=on")
        await self.server.spend(asks[: min(len(asks), 100)])  # past the switch's own work
        self._control("--zero")
        await self.server.spend(asks)
        self._control("--dump")
        self._control("--instr=off")
        self._dumps += 1
        main, every = 0, 0
        # One file a thread: callgrind.<pid>.<dump>-<thread>, the main thread being 01.
        for dump in self._folder.glob(f"callgrind.{self.server.pid}.{self._dumps}-*"):
            found = _TOTALS.search(dump.read_bytes())
            if found is None:
                msg = f"no total in {dump}"
                raise RuntimeError(msg)
            every += int(found.group(1))
            if dump.name.endswith("-01"):
                main = int(found.group(1))
        if not main:
            msg = f"no count of the main thread of {self.server.pid}"
            raise RuntimeError(msg)
        return main, every


@dataclasses.dataclass
class Stretch:
    """Instructions a call of one stretch of calls, on each server's main thread (the event
    loop's) and on all its threads (gRPC's poller threads wait in loops whose laps depend on
    timing, so that count moves between runs more than the main thread's)."""

    calls: int
    osas: float = 0.0
    bare: float = 0.0
    osas_all_threads: float = 0.0
    bare_all_threads: float = 0.0

    @property
    def ratio(self) -> float:
        return self.osas / self.bare if self.bare else 0.0

    @property
    def ratio_all_threads(self) -> float:
        return self.osas_all_threads / self.bare_all_threads if self.bare_all_threads else 0.0


async def count(
    nodes: int, calls: int, tls: Tls, folder: Path, code: OsasCode
) -> dict[str, Stretch]:
    """Each stretch's instructions a call on osas and on the bare server."""
    prefix = callgrind(folder)
    quiet = QUIET_RECONCILER
    async with osas_and_bare(nodes, tls, folder, code, reconcile=quiet, prefix=prefix) as started:
        loop = started.loop
        stretches = {
            "loop": loop.calls,
            "options": repeated(loop.options, calls),
            "for_node": repeated(loop.for_node, calls),
        }
        counted = [Counted(server, folder) for server in started.servers]
        figures: dict[str, Stretch] = {}
        for name, asks in stretches.items():
            figure = figures[name] = Stretch(len(asks))
            for each in counted:
                main, every = await each.instructions(asks)
                setattr(figure, each.server.name, main / len(asks))
                setattr(figure, f"{each.server.name}_all_threads", every / len(asks))
            print(  # noqa: T201
                f"   {name}: instructions a call on the main thread: osas {figure.osas:,.0f}, "
                f"bare {figure.bare:,.0f} ({figure.ratio:.3f}x); on all threads: osas "
                f"{figure.osas_all_threads:,.0f}, bare {figure.bare_all_threads:,.0f} "
                f"({figure.ratio_all_threads:.3f}x)",
                flush=True,
            )
    summarise_and_check(started, {server.name: Side() for server in started.servers})
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--label", default="latest")
    parser.add_argument("--osas-python", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="a folder for the run's JSON")
    args = parser.parse_args(argv)
    missing = valgrind_missing()
    if missing is not None:
        print(missing, file=sys.stderr)  # noqa: T201
        return 1
    with tempfile.TemporaryDirectory(prefix="osas-instructions-") as scratch:
        folder = Path(scratch)
        code = OsasCode.at(args.osas_python, folder)
        source = code.describe()
        print(f"== instructions a call, {args.nodes:,} nodes; osas from {source}", flush=True)  # noqa: T201
        figures = asyncio.run(count(args.nodes, args.calls, Tls.make(folder), folder, code))
    if args.out is not None:
        run = {
            "label": args.label,
            "osas": source,
            "nodes": args.nodes,
            "machine": machine(),
            "at": time.time(),
            "stretches": {name: dataclasses.asdict(f) for name, f in figures.items()},
        }
        path = args.out / f"instructions-{args.label}.json"
        path.write_text(json.dumps(run, indent=2) + "\n")
        print(f"written: {path}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
