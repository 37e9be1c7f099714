"""The ``osas`` command as a new user meets it: a fresh copy of the repository, a fresh venv
with ``pip install -e .`` as the README makes it (no extra), then every command's ``--help`` and
every user error docs/cli.md lists, each run as written (``nox -s readme``).

Every option has help text; every documented error ends with exit code and line the page says,
and nothing a user can cause prints a traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_readme import ROOT, fresh_copy

pytestmark = pytest.mark.skipif(
    os.environ.get("OSAS_README_TEST") != "1", reason="run by nox -s readme"
)

# Every command and option of the parser, with its help text, as the installed osas has them.
PARSER_DUMP = """
import json, argparse
from osas.cli.parser import build_parser
parser = build_parser()
(commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
out = {}
for name, sub in commands.choices.items():
    out[name] = {
        "description": sub.description or "",
        "options": {a.option_strings[-1] if a.option_strings else a.dest: a.help or ""
                    for a in sub._actions},
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def osas(tmp_path_factory) -> Path:
    """``osas`` in a fresh venv, installed from a fresh copy as the README does."""
    work = fresh_copy(tmp_path_factory.mktemp("fresh") / "osas")
    subprocess.run([sys.executable, "-m", "venv", str(work / ".venv")], check=True)
    pip = [str(work / ".venv/bin/pip"), "install", "-q", "-e", str(work)]
    subprocess.run(pip, check=True, capture_output=True, timeout=900)
    return work / ".venv/bin/osas"


def run(osas: Path, line: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "OSAS_"))}
    words = line.split()
    assert words[0] == "osas"
    return subprocess.run(
        [str(osas), *words[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def test_every_command_and_option_has_help_text(osas, tmp_path):
    python = osas.parent / "python"
    dump = subprocess.run(
        [str(python), "-c", PARSER_DUMP], capture_output=True, text=True, check=True
    )
    commands = json.loads(dump.stdout)
    assert set(commands) == {"serve", "check-config", "status", "sim", "certs", "demo", "bench"}
    top = run(osas, "osas --help", tmp_path)
    assert top.returncode == 0, top.stderr
    for command, parsed in commands.items():
        assert command in top.stdout
        missing = [option for option, text in parsed["options"].items() if not text]
        assert missing == [], f"osas {command}: options without help text"
        shown = run(osas, f"osas {command} --help", tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert shown.stderr == ""
        assert f"usage: osas {command}" in shown.stdout
        assert parsed["description"], f"osas {command}: no description"
    assert "Traceback" not in top.stdout + top.stderr


def documented_errors() -> dict[str, tuple[int, str]]:
    """docs/cli.md's table: the command as run -> (exit code, the line on stderr)."""
    table = (ROOT / "docs" / "cli.md").read_text().split("## What a user can get wrong")[1]
    rows = re.findall(
        r"^\| `(osas [^`]+)`[^|]*\| [^|]* \| (\d+) \| `(.+)` \|$", table, re.MULTILINE
    )
    return {command: (int(code), line.replace("\\|", "|")) for command, code, line in rows}


def busy_port(cwd: Path) -> Callable[[], None]:
    """Something listening on 8774 (this test, unless something else already does)."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 8774))
        listener.listen()
    except OSError:
        listener.close()
    return listener.close


def a_file_named(name: str) -> Callable[[Path], Callable[[], None]]:
    def setup(cwd: Path) -> Callable[[], None]:
        (cwd / name).write_text("a file, not a folder\n")
        return lambda: None

    return setup


def a_list_in(name: str) -> Callable[[Path], Callable[[], None]]:
    def setup(cwd: Path) -> Callable[[], None]:
        (cwd / name).write_text("- not\n- a mapping\n")
        return lambda: None

    return setup


def unclosed_quote_in(name: str) -> Callable[[Path], Callable[[], None]]:
    def setup(cwd: Path) -> Callable[[], None]:
        (cwd / name).write_text("metrics_listen: '127.0.0.1:9090\n")
        return lambda: None

    return setup


def missing_tls_files(cwd: Path) -> Callable[[], None]:
    """A configuration whose TLS files are not there, and no cloud to reach either."""
    (cwd / "no-tls-files.yaml").write_text(
        "cluster_name: c\n"
        "tls: {cert_file: tls.crt, key_file: tls.key, client_ca_file: ca.crt}\n"
        "node_groups:\n"
        "- {id: workers, min_size: 0, max_size: 3, flavor: m1.small, image: ubuntu,"
        " networks: [net]}\n"
    )
    return lambda: None


def certificates_in(name: str) -> Callable[[Path], Callable[[], None]]:
    def setup(cwd: Path) -> Callable[[], None]:
        (cwd / name).mkdir()
        for file in ("ca.crt", "tls.crt", "tls.key", "client.crt", "client.key"):
            (cwd / name / file).write_text("made by an earlier run\n")
        return lambda: None

    return setup


def nothing(cwd: Path) -> Callable[[], None]:
    (cwd / "osas.yaml").write_text("cluster_name: c\n")
    return lambda: None


# What each documented row needs around it; a row without a case here fails the test.
CASES: dict[str, Callable[[Path], Callable[[], None]]] = {
    "osas serve": nothing,
    "osas serve --config missing.yaml": nothing,
    "osas check-config --config missing.yaml": nothing,
    "osas check-config --config osas.yaml --wait soon": nothing,
    "osas check-config --config no-tls-files.yaml": missing_tls_files,
    "osas status": nothing,
    "osas status --config broken.yaml": unclosed_quote_in("broken.yaml"),
    "osas status --url 127.0.0.1:8088": nothing,
    "osas status --url http://127.0.0.1:9": nothing,
    "osas certs --out certs": a_file_named("certs"),
    "osas certs --out made": certificates_in("made"),
    "osas certs --out certs --days 0": nothing,
    "osas sim --port 8774": busy_port,
    "osas sim --port 0 --clouds-yaml clouds.yaml": a_list_in("clouds.yaml"),
    "osas sim --port 70000": nothing,
    "osas sim --region a/b": nothing,
    "osas bench --quick": nothing,
    "osas bench --out report/BENCHMARKS.md": a_file_named("report"),
    "osas bench --sizes-only": nothing,
    "osas bench --compare-with elsewhere": nothing,
    "osas serv": nothing,
    "osas status --url http://127.0.0.1:9 --wait 60": nothing,  # then Ctrl-C
}


def test_the_page_lists_the_errors_this_test_runs():
    assert set(documented_errors()) == set(CASES)


@pytest.mark.parametrize("command", CASES)
def test_a_documented_user_error_ends_in_its_line_and_exit_code(osas, tmp_path, command):
    code, line = documented_errors()[command]
    cleanup = CASES[command](tmp_path)
    try:
        if "--wait 60" in command:
            done = interrupted(osas, command, tmp_path)
        else:
            done = run(osas, command, tmp_path)
    finally:
        cleanup()
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == code, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    if command.startswith("osas serve"):  # serve's JSON log events come first
        assert all(json.loads(entry) for entry in done.stderr.strip().splitlines()[:-1])
    assert last.startswith(line), last


def interrupted(osas: Path, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command, then Ctrl-C (SIGINT, as a terminal sends it) once it is waiting."""
    # As a terminal's foreground job gets it: a shell that started these tests in the
    # background (`cmd &` without job control) hands SIGINT down ignored, and an ignored
    # signal stays ignored across exec, where a handler is reset to the default.
    inherited = signal.getsignal(signal.SIGINT)
    if inherited is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "OSAS_"))}
    try:
        process = subprocess.Popen(
            [str(osas), *command.split()[1:]],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, inherited)
    time.sleep(3)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
