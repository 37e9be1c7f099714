"""The README's "Try it on your machine" commands, run verbatim in a fresh copy of the
repository, as a newcomer would (``nox -s readme``; skipped elsewhere: it makes a venv and
installs osas, a minute or two).

The blocks that run are the shell blocks right after a ``<!-- readme-test -->`` comment; only a
clean-up is added after them (the commands leave `osas sim` and `osas serve` running in the
background, as the README says).
"""

from __future__ import annotations

import os
import re
import shutil
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


def test_the_readme_commands_run_verbatim(tmp_path):
    blocks = readme_blocks((ROOT / "README.md").read_text())
    assert blocks, "no <!-- readme-test --> block in README.md"
    work = fresh_copy(tmp_path / "osas")
    script = (
        "set -e\n" + "\n".join(blocks) + "\nkill $(jobs -p) 2>/dev/null || true\nwait || true\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "OSAS_", "VIRTUAL_ENV"))}
    result = subprocess.run(
        [shutil.which("bash") or "bash", "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    shown = f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == 0, shown
    assert "osas sim: keystone at" in result.stdout, shown
    assert "all resources found" in result.stdout, shown  # check-config
    assert "workers" in result.stdout, shown  # osas status's table
