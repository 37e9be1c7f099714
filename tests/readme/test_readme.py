"""The README's "Try it on your machine" commands, run verbatim in a fresh copy of the
repository, as a newcomer would (``nox -s readme``; skipped elsewhere: it makes a venv and
installs osas, a minute or two).

The blocks that run are the shell blocks right after a ``<!-- readme-test -->`` comment, under
``set -e``; the processes they leave in the background (`osas sim` and `osas serve`, as the
README says) are stopped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- readme-test -->"

pytestmark = pytest.mark.skipif(
    os.environ.get("OSAS_README_TEST") != "1", reason="run by nox -s readme"
)


def readme_blocks(text: str) -> list[str]:
    pattern = re.compile(re.escape(MARKER) + r"\s*```sh\n(.*?)```", re.DOTALL)
    return pattern.findall(text)


def fresh_copy(target: Path) -> Path:
    """What a clone holds: the tracked files, and those not yet committed but not ignored
    (so that the test also checks work before it is committed)."""
    listed = subprocess.run(
        [shutil.which("git") or "git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        source = ROOT / name
        if source.is_file():
            destination = target / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    return target


def ports_in_use(text: str) -> list[int]:
    """The 127.0.0.1 ports the commands use that something on this machine already holds (the
    commands would then fail for a reason that is not theirs: say so instead)."""
    ports = {int(port) for port in re.findall(r"127\.0\.0\.1:(\d+)", text)}
    ports |= {int(port) for port in re.findall(r"--port (\d+)", text)}
    taken = []
    for port in sorted(ports):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    return taken


def test_the_readme_commands_run_verbatim(tmp_path):
    blocks = readme_blocks((ROOT / "README.md").read_text())
    assert blocks, "no <!-- readme-test --> block in README.md"
    work = fresh_copy(tmp_path / "osas")
    config = (work / "examples" / "osas.yaml").read_text()
    assert not ports_in_use("\n".join(blocks) + config), "ports the README uses are taken here"
    script = "set -e\n" + "\n".join(blocks)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "OSAS_", "VIRTUAL_ENV"))}
    # Output to files, not pipes: the commands leave `osas sim` and `osas serve` running in the
    # background, and they would hold a pipe open after the script is done. Their own session,
    # so that all of them are stopped at the end whatever happened.
    stdout_path, stderr_path = tmp_path / "stdout", tmp_path / "stderr"
    with stdout_path.open("w") as stdout, stderr_path.open("w") as stderr:
        script_process = subprocess.Popen(
            [shutil.which("bash") or "bash", "-c", script],
            cwd=work,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            returncode = script_process.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(script_process.pid, signal.SIGTERM)
    out, err = stdout_path.read_text(), stderr_path.read_text()
    shown = f"exit {returncode}\nstdout:\n{out[-6000:]}\nstderr:\n{err[-6000:]}"
    assert returncode == 0, shown
    assert "osas sim: keystone at" in out, shown
    assert "all resources found" in out, shown  # check-config
    assert "workers" in out, shown  # osas status's table
