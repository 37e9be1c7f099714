"""``osas --help`` and each command's: what every command does, its own exit codes (the whole
table once, at the top), the defaults of its options, and the simulator's credentials and
control API, held to what the simulator serves over HTTP."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from osas.cli import main
from osas.cli.exit_codes import COMMANDS
from osas.cli.parser import build_parser
from osas.sim import (
    APP_CREDENTIAL_ID,
    APP_CREDENTIAL_SECRET,
    DEFAULT_PASSWORD,
    DEFAULT_PROJECT,
    DEFAULT_USER,
)
from osas.sim.server import DEFAULT_DOMAIN

DOCS = Path(__file__).parent.parent / "docs"
# A row of an exit-code block: the code, then its meaning ("  130 interrupted ...").
CODE_ROW = re.compile(r"^  (\d{1,3}) +\S", re.MULTILINE)


def shown(capsys, *argv: str) -> str:
    """What ``osas ARGV --help`` prints, run through the real entry point."""
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def exit_codes_in(help_text: str) -> list[int]:
    return [int(code) for code in CODE_ROW.findall(help_text.split("exit codes")[1])]


def flat(text: str) -> str:
    return " ".join(text.split())


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return dict(commands.choices)


def test_every_command_describes_itself(capsys):
    assert tuple(subcommands()) == COMMANDS
    for command in COMMANDS:
        text = shown(capsys, command)
        description = text.split("\n\n")[1]
        assert len(description) > 80, f"osas {command} --help: {description!r}"
        assert not description.startswith(("options:", "exit codes")), command
    serve, check, status = (flat(shown(capsys, c)) for c in ("serve", "check-config", "status"))
    assert "SIGHUP" in serve
    assert "SIGTERM" in serve
    assert "nothing is created or changed" in check
    assert "only metrics_listen is read" in status


def test_the_exit_code_table_is_whole_once_and_each_command_shows_its_own(capsys):
    top = shown(capsys)
    every = exit_codes_in(top)
    assert every == [0, 1, 2, 3, 4, 5, 6, 7, 8, 130, 141]
    assert "a traceback means a bug" in top
    for command in COMMANDS:
        text = shown(capsys, command)
        own = exit_codes_in(text)
        assert f"exit codes of osas {command} (every command's: osas --help" in text
        assert set(own) < set(every), command
        assert {0, 2, 130} <= set(own), command
        assert "a traceback means a bug" not in text, command
    assert set(exit_codes_in(shown(capsys, "status"))) == {0, 1, 2, 3, 130, 141}
    assert set(exit_codes_in(shown(capsys, "bench"))) == {0, 2, 6, 7, 130, 141}
    demo = shown(capsys, "demo")
    assert set(exit_codes_in(demo)) == {0, 1, 2, 130, 141}
    assert "a step did not reach the state it waits for" in demo
    assert "lost the leader lease" not in flat(demo)


def test_docs_cli_lists_the_exit_codes_osas_help_does(capsys):
    page = (DOCS / "cli.md").read_text().split("## Exit codes")[1].split("\n## ")[0]
    documented = [int(code) for code in re.findall(r"^\| (\d+) \|", page, re.MULTILINE)]
    assert documented == exit_codes_in(shown(capsys))


def test_every_option_with_a_default_shows_it(capsys):
    for command, parser in subcommands().items():
        for action in parser._actions:
            if action.default in (None, False, [], argparse.SUPPRESS) or action.required:
                continue
            assert "default: " in (action.help or ""), f"osas {command} {action.option_strings}"
    sim, certs = flat(shown(capsys, "sim")), flat(shown(capsys, "certs"))
    assert "--port PORT the port of Keystone and every service (default: 0, a free port)" in sim
    assert "how long servers stay in BUILD (default: 3.0)" in sim
    assert "how long they are valid (default: 30)" in certs


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("127.0.0.1:8088", "not a URL: '127.0.0.1:8088' (write http://127.0.0.1:8088)"),
        ("localhost:9090", "not a URL: 'localhost:9090' (write http://localhost:9090)"),
        ("ftp://127.0.0.1:9090", "not an http:// or https:// URL: 'ftp://127.0.0.1:9090'"),
        ("http://:9090", "no host in the URL: 'http://:9090'"),
    ],
)
def test_status_url_without_a_scheme_is_a_usage_error(url, said):
    result = subprocess.run(
        [sys.executable, "-m", "osas", "status", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("usage: osas status")
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"osas status: error: argument --url: {said}"
    assert "Traceback" not in result.stderr


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - the sim's http://
        return answer.status, answer.read()


def test_sim_help_names_its_credentials_and_the_control_api_it_serves(capsys, sim):
    text = shown(capsys, "sim")
    for value in (DEFAULT_USER, DEFAULT_PASSWORD, DEFAULT_PROJECT, DEFAULT_DOMAIN):
        assert re.search(rf"\b{re.escape(value)}\b", text), value
    assert f"application credential id {APP_CREDENTIAL_ID}, secret {APP_CREDENTIAL_SECRET}" in text
    # The index at /_sim/ (and /_sim), read over HTTP from the running simulator.
    for path in ("/_sim/", "/_sim"):
        status, body = get(f"{sim.base_url}{path}")
        assert status == 200
        endpoints = json.loads(body)["endpoints"]
    listed = {(e["method"], e["path"]) for e in endpoints}
    assert ("GET", "/_sim/") in listed
    assert ("POST", "/_sim/identity/revoke") in listed
    assert all(e["does"] for e in endpoints)
    # Every endpoint the index lists (tests/test_sim.py: each is served) is one the help names,
    # and the help names no other.
    for _, path in listed:
        named = path.replace("{server_id}", "ID")
        assert named in text, named
    named_in_help = set(re.findall(r"/_sim/[a-z/]*[a-z]", text))
    assert named_in_help <= {path for _, path in listed}


def test_bench_measures_cas_loop_alone_under_a_run_name_it_can_keep(capsys):
    args = build_parser().parse_args(["bench", "--ca-loop-only", "--label", "after-1.2"])
    assert (args.ca_loop_only, args.label) == (True, "after-1.2")
    assert build_parser().parse_args(["bench"]).label == "latest"
    for wrong in ("", "../x", "a b"):
        with pytest.raises(SystemExit) as refused:
            main(["bench", "--ca-loop-only", "--label", wrong])
        assert refused.value.code == 2
        assert "not a run name" in capsys.readouterr().err
