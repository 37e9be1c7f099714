"""The start-up of ``osas serve``: what it imports, and the memory it holds once SERVING,
next to the bare interpreter, measured in separate processes in the same run.

``python -X importtime`` lists every import as it happens (lazy ones included) with the time
spent in it; their sum is the process's import time. The same is measured for another
checkout of osas when asked (``--compare-with``: the same code before a change), run from its
own folder so that its modules, not the installed ones, are imported.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from osas.bench.processes import (
    Setup,
    Tls,
    kit,
    osas_config,
    rss_mib,
    stop_process,
    wait_until_serving,
)
from osas.bench.results import StartupRow

SERVERS = 1_000  # a small cluster: start-up, not listing, is measured
KITS = ("osas.sim", "osas.demo", "osas.bench")
_IMPORT_LINE = "import time:"
_SETTLE_SECONDS = 0.5  # after SERVING, before memory is read


def _imports(log: Path) -> tuple[float, int, int]:
    """Import time (ms), modules imported, of them the kits', from an importtime log."""
    total_us, modules, kits = 0, 0, 0
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith(_IMPORT_LINE) or "self [us]" in line:
            continue
        self_us, _, rest = line.removeprefix(_IMPORT_LINE).partition("|")
        name = rest.rpartition("|")[2].strip()
        total_us += int(self_us.strip())
        modules += 1
        kits += any(name == kit or name.startswith(f"{kit}.") for kit in KITS)
    return total_us / 1000, modules, kits


async def _serve_once(setup: Setup, row: StartupRow, tree: Path | None, index: int) -> None:
    config, _, health, _ = osas_config(setup)
    log = setup.folder / f"startup-{row.label.replace(' ', '-')}-{index}.log"
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    command = [sys.executable, "-X", "importtime", "-m", "osas", "serve", "--config", str(config)]
    with log.open("wb") as stream:
        process = subprocess.Popen(  # noqa: S603 - our own command
            command,
            stdout=subprocess.DEVNULL,
            stderr=stream,
            env=env,
            # -m puts the working folder first on sys.path: the tree's own modules, or (from the
            # benchmark's folder) the installed ones.
            cwd=tree or setup.folder,
        )
    try:
        await wait_until_serving(health, process, log, poll=0.02)
        await asyncio.sleep(_SETTLE_SECONDS)
        rss = rss_mib(process.pid)[0]
    finally:
        stop_process(process)
    row.add(*_imports(log), rss)


def _bare_once(folder: Path, row: StartupRow, index: int) -> None:
    """The interpreter alone: its own start-up imports, and its memory while it waits."""
    log = folder / f"startup-bare-{index}.log"
    command = [sys.executable, "-X", "importtime", "-c", "import sys; sys.stdin.readline()"]
    with log.open("wb") as stream:
        process = subprocess.Popen(  # noqa: S603 - the interpreter, no input of ours
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stream, cwd=folder
        )
    try:
        time.sleep(_SETTLE_SECONDS)
        rss = rss_mib(process.pid)[0]
    finally:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=30)
    row.add(*_imports(log), rss)


def _commit(tree: Path) -> str:
    """The checkout's commit, as a name for its row (the folder's name outside git)."""
    found = subprocess.run(  # noqa: S603 - git, arguments we build
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() or tree.name


async def measure_startup(
    rounds: int, tls: Tls, folder: Path, compare_with: Path | None = None
) -> list[StartupRow]:
    """The bare interpreter, ``osas serve`` of this tree, and of ``compare_with`` if given,
    each ``rounds`` times, taking turns."""
    print("== start-up of osas serve", flush=True)  # noqa: T201
    bare = StartupRow("bare interpreter")
    this = StartupRow(f"osas serve at {_commit(Path.cwd())}")
    other = StartupRow(f"osas serve at {_commit(compare_with)}") if compare_with else None
    with kit("osas.bench.cloud", "--servers", str(SERVERS), "--groups", "1") as sim:
        setup = Setup(folder, tls, sim, ["g0"])
        for index in range(rounds):
            _bare_once(folder, bare, index)
            await _serve_once(setup, this, None, index)
            if other is not None and compare_with is not None:
                await _serve_once(setup, other, compare_with, index)
    return [bare, this] + ([other] if other else [])
