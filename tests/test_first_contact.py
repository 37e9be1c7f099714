"""What a new operator meets first, through the real commands and processes: a start against a
cloud that hangs, refuses or is slow says within seconds what osas waits for and since when;
every failing command ends with one line on stderr; ``osas status`` with nothing listening says
what to check."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import (
    Provider,
    ServedOsas,
    ca_client,
    clean_env,
    cloud_for,
    config_data,
    config_on,
    free_port,
    never_answering,
    run_osas,
    write_config,
)

from osas.cli.parser import build_parser
from osas.cli.status_table import render_status
from osas.config import load_config
from osas.service.ops_server import fetch_status

# What "within seconds" means to a person watching a start (issue 34: ten seconds).
SAID_WITHIN = 10.0


def osas(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_osas(*args, env=clean_env(), cwd=cwd)


def refused_identity() -> str:
    """An identity endpoint where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/identity/v3"


@contextlib.contextmanager
def cloud_that_is(kind: str, sim) -> Iterator[dict]:
    auth = dict(sim.clouds_yaml_entry()["auth"])
    if kind == "hung":
        with never_answering("/identity/v3") as url:
            yield {**auth, "auth_url": url}
    elif kind == "refused":
        yield {**auth, "auth_url": refused_identity()}
    else:  # slow: Keystone answers, Nova's listing takes longer than anyone waits here
        sim.nova.faults.latency = 60.0
        try:
            yield auth
        finally:
            sim.nova.faults.latency = 0.0


@pytest.mark.parametrize(
    ("kind", "waits_for"),
    [
        pytest.param("hung", "the cloud's check", id="hung"),
        pytest.param("refused", "the cloud's check", id="refused"),
        pytest.param("slow", "a complete listing of the servers", id="slow"),
    ],
)
def test_a_start_says_within_seconds_what_it_waits_for_and_since_when(
    sim, tmp_path, kind, waits_for
):
    """Log, /status and ``osas status`` alike, before the first attempt has ended."""
    metrics = f"127.0.0.1:{free_port()}"
    with cloud_that_is(kind, sim) as auth:
        config = write_config(
            tmp_path,
            config_data(
                openstack={"auth": auth, "api_timeout": "60s", "attempts": 4},
                metrics_listen=metrics,
                reconcile={**config_data()["reconcile"], "retry_backoff": 1.0},
            ),
        )
        started = time.monotonic()
        with ServedOsas(config, env=clean_env()) as served:
            event = served.wait_for("still waiting for OpenStack: the first sync is not done")
            assert time.monotonic() - started < SAID_WITHIN
            state = event["state"]
            assert re.search(rf"waiting \d+s for {re.escape(waits_for)}", state), state
            if kind == "refused":  # each try refused at once, and tried again
                assert re.search(
                    r": cannot reach \S+: connection refused: .* \(try \d of openstack.attempts, "
                    r"4; trying again\)",
                    state,
                ), state
            else:
                assert "from OpenStack: no answer yet (each request waits up to " in state, state
            status = fetch_status(f"http://{metrics}")
            reason = status["not_ready_reason"]
            assert reason.startswith("first sync with OpenStack not done yet: "), reason
            assert f"for {waits_for}" in reason, reason
            syncs = status["syncs"]
            assert syncs["waiting_for"].startswith(waits_for)
            assert syncs["waiting_seconds"] >= 4
            assert syncs["failing_for_seconds"] is None  # no attempt has ended yet
            assert (syncs["retrying"] is not None) == (kind == "refused"), syncs
            screen = osas("status", "--url", f"http://{metrics}")
            assert screen.returncode == 1, screen.stderr
            line = next(x for x in screen.stdout.splitlines() if "NOT READY" in x)
            assert "first sync with OpenStack not done yet: waiting " in line, line
            assert time.monotonic() - started < SAID_WITHIN + 5


def test_a_hung_clouds_failures_are_counted_from_the_first_attempt(sim, tmp_path):
    """An attempt against a cloud that never answers fails only at its timeout: the time in
    the failing state includes it, and the log says how long each attempt took."""
    with never_answering("/identity/v3") as url:
        auth = {**sim.clouds_yaml_entry()["auth"], "auth_url": url}
        metrics = f"127.0.0.1:{free_port()}"
        config = write_config(
            tmp_path,
            config_data(
                openstack={"auth": auth, "api_timeout": "2s", "attempts": 1},
                metrics_listen=metrics,
            ),
        )
        with ServedOsas(config, env=clean_env()) as served:
            failed = served.wait_for("first sync failed; retrying", timeout=30)
            assert failed["attempt_seconds"] >= 2
            status = fetch_status(f"http://{metrics}")
            assert status["syncs"]["failing_for_seconds"] >= failed["attempt_seconds"]


# -- every failing command ends with one line on stderr -------------------------------------------


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failing command ends with: the last on stderr, after all of stdout."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("broken", "code", "first"),
    [
        pytest.param(
            {"tls_missing": True},
            4,
            "tls: cannot read {tmp}/nowhere/tls.crt: No such file or directory",
            id="tls-file",
        ),
        pytest.param(
            {"flavor": "no-such-flavor"},
            1,
            "cloud: node group 'workers': flavor 'no-such-flavor' not found",
            id="flavor",
        ),
    ],
)
def test_check_config_ends_a_failure_with_one_line_on_stderr(sim, tmp_path, broken, code, first):
    """Its rows on stdout as before, then the count of problems and the first of them on
    stderr: the last line a person sees is never ``all resources found`` after a failure."""
    data = config_data(openstack={"auth": sim.clouds_yaml_entry()["auth"]})
    if broken.get("tls_missing"):
        data["insecure"] = False
        data["tls"] = {
            key: str(tmp_path / "nowhere" / name)
            for key, name in (
                ("cert_file", "tls.crt"),
                ("key_file", "tls.key"),
                ("client_ca_file", "ca.crt"),
            )
        }
    if "flavor" in broken:
        data["node_groups"][0]["flavor"] = broken["flavor"]
    result = osas("check-config", "--config", str(write_config(tmp_path, data)))
    assert result.returncode == code, result.stdout + result.stderr
    line = last_line(result)
    assert line == (
        "osas check-config: 1 problem(s) (each above, marked PROBLEM or NOT FOUND); the first: "
        f"{first.format(tmp=tmp_path)}; fix it and run osas check-config again"
    ), line
    assert result.stderr.count("\n") == 1  # that line alone


def test_check_config_that_passes_writes_nothing_on_stderr(sim, tmp_path):
    data = config_data(openstack={"auth": sim.clouds_yaml_entry()["auth"]})
    result = osas("check-config", "--config", str(write_config(tmp_path, data)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert result.stdout.rstrip().endswith("all resources found")


def test_status_with_nothing_listening_says_what_to_check():
    port = free_port()
    result = osas("status", "--url", f"http://127.0.0.1:{port}")
    assert result.returncode == 3
    assert last_line(result) == (
        f"osas status: nothing listens at 127.0.0.1:{port}: is osas running, and is that its "
        "metrics_listen? (osas serve logs the port it listens at as 'metrics listening'; give "
        "--url or --config)"
    )


def test_status_against_something_that_never_answers_says_so(tmp_path):
    with never_answering("/identity/v3") as url:
        where = url.removeprefix("http://").split("/")[0]
        result = osas("status", "--url", f"http://{where}")
    assert result.returncode == 3
    assert last_line(result).startswith(
        f"osas status: {where} accepted the connection but sent no /status in time: is osas running"
    )


# -- the status screen adds up -------------------------------------------------------------------

# The columns that add up to TARGET, in the screen's order (DELETING is outside it).
TARGET_PARTS = ("RUNNING", "BUILDING", "ERROR", "QUEUED", "SENT", "IN-DOUBT", "FAILED")


def screen_rows(screen: str) -> dict[str, dict[str, int | str]]:
    """The screen's group table: group -> column -> value."""
    lines = screen.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("GROUP "))
    header = lines[header_at].split()
    rows = {}
    for line in lines[header_at + 1 :]:
        cells = line.split()
        if len(cells) != len(header):
            break
        rows[cells[0]] = {
            name: (cell if not cell.lstrip("-").isdigit() else int(cell))
            for name, cell in zip(header, cells, strict=True)
        }
    return rows


def assert_adds_up(screen: str) -> dict[str, dict[str, int | str]]:
    rows = screen_rows(screen)
    for group, row in rows.items():
        if row["TARGET"] == "-":
            continue
        assert sum(int(row[part]) for part in TARGET_PARTS) == row["TARGET"], (group, screen)
    return rows


async def test_the_status_screen_adds_up_to_the_target_through_a_scale_up(sim, tmp_path):
    """From IncreaseSize to the servers listed: every screen's columns sum to TARGET, and the
    creates osas sent before any listing shows their servers are on the screen (SENT)."""
    data = config_on(sim, metrics_listen="127.0.0.1:0")  # syncs only when the test says
    provider = Provider(load_config(write_config(tmp_path, data)), cloud_for(sim))
    await provider.start()
    screens: list[str] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            screens.append(render_status(provider.app.status()))
            await asyncio.sleep(0)  # every turn the event loop gives it

    watcher = asyncio.create_task(watch())
    try:
        async with ca_client(provider.address) as ca:
            await ca.increase("workers", 2)
            await eventually_sent(sim, 2)
            await asyncio.sleep(0.2)  # the workers have recorded Nova's answers
            assert provider.app.ops is not None
            url = f"http://127.0.0.1:{provider.app.ops.port}"
            shown = await asyncio.to_thread(osas, "status", "--url", url)
            row = assert_adds_up(shown.stdout)["workers"]
            assert (row["TARGET"], row["SENT"], row["QUEUED"]) == (2, 2, 0), shown.stdout
            await provider.sync()
            row = assert_adds_up(render_status(provider.app.status()))["workers"]
            assert row["SENT"] == 0
            assert row["BUILDING"] + row["RUNNING"] == 2
    finally:
        stop.set()
        await watcher
        await provider.stop()
    assert len(screens) > 10
    for screen in screens:
        assert_adds_up(screen)


async def eventually_sent(sim, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(sim.nova.live_servers()) < count:
        assert time.monotonic() < deadline, "the creates never reached Nova"
        await asyncio.sleep(0.02)


# -- a reload that needs a restart says so until the restart -------------------------------------


def test_a_reload_that_changes_a_key_needing_a_restart_shows_until_the_restart(sim, tmp_path):
    metrics = f"127.0.0.1:{free_port()}"
    data = config_on(sim, metrics_listen=metrics)
    config = write_config(tmp_path, data)
    with ServedOsas(config, env=clean_env()) as served:
        served.wait_for("health SERVING")
        url = f"http://{metrics}"
        assert fetch_status(url)["restart_needed_for"] == []
        write_config(tmp_path, {**data, "listen": f"127.0.0.1:{free_port()}"})
        served.process.send_signal(signal.SIGHUP)
        assert served.wait_for("configuration reloaded")["restart_needed"] == ["listen"]
        # /status is rendered at most every 0.2 s: the one before the reload may still be served.
        status_until(url, lambda status: status["restart_needed_for"] == ["listen"])
        screen = osas("status", "--url", url)
        assert screen.returncode == 0, screen.stderr  # ready: the values in force serve on
        assert (
            "RESTART NEEDED: the configuration file changes listen, which a reload does not "
            "apply; the values osas started with stay in force until a restart"
        ) in screen.stdout.splitlines()
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:  # noqa: S310
            assert "osas_config_restart_needed 1.0" in answer.read().decode()
        # Put back as it runs: nothing waits for a restart any more.
        write_config(tmp_path, data)
        served.process.send_signal(signal.SIGHUP)
        status_until(url, lambda status: status["restart_needed_for"] == [])
        assert "RESTART NEEDED" not in osas("status", "--url", url).stdout


def status_until(url: str, holds: Callable[[dict], bool], timeout: float = 30) -> dict:
    """The first /status for which ``holds`` is true; fails with the last one after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not holds(status := fetch_status(url)):
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


# -- configuration errors in the file's words ----------------------------------------------------


def test_configuration_errors_name_the_line_the_key_meant_and_the_form(tmp_path):
    (tmp_path / "osas.yaml").write_text(
        "cluster_name: c\n"
        "insecure: true\n"
        "listen: 127.0.0.1:8086\n"
        "node_grops: []\n"
        "node_groups:\n"
        "- id: workers\n"
        "  min_size: 0\n"
        "  max_size: 3\n"
        "  image: ubuntu\n"
        "  networks: [net]\n"
    )
    result = run_osas(
        "check-config", "--config", "osas.yaml", env=clean_env(OSAS_LISTEN="8086"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "osas check-config: configuration error:",
        (
            "osas.yaml: listen: '8086' is not HOST:PORT (for example 127.0.0.1:8086, 0.0.0.0:8086 "
            "or [::]:8086) (from OSAS_LISTEN)"
        ),
        (
            "osas.yaml: node_groups[0](workers).flavor: required, and not given (in the block at "
            "line 6)"
        ),
        "osas.yaml: node_grops: not a key osas knows here; did you mean node_groups? (line 4)",
    ]


def test_a_relative_path_says_it_is_read_from_the_working_directory(tmp_path):
    data = config_data()
    data["node_groups"][0].pop("user_data")
    data["node_groups"][0]["user_data_file"] = "bootstrap/user-data"
    write_config(tmp_path, data)
    result = run_osas("check-config", "--config", "osas.yaml", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2
    assert last_line(result) == (
        "osas check-config: configuration error: osas.yaml: node_groups[0](workers)."
        "user_data_file: bootstrap/user-data does not exist (a relative path: read from the "
        f"working directory, {tmp_path})"
    )
    data = config_data(
        insecure=False,
        tls={"cert_file": "tls.crt", "key_file": "tls.key", "client_ca_file": "ca.crt"},
    )
    write_config(tmp_path, data)
    result = run_osas("check-config", "--config", "osas.yaml", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 4
    assert (
        "tls: cannot read tls.crt: No such file or directory (a relative path: read from the "
        f"working directory, {tmp_path})"
    ) in last_line(result)


# -- osas certs and osas bench: what they write, and what they leave alone ----------------------


def test_certs_say_every_setting_and_keep_what_is_there(tmp_path):
    out = tmp_path / "certs"
    first = run_osas(
        "certs", "--out", str(out), env=clean_env(OSAS_LISTEN="127.0.0.1:18086"), cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    assert "  server_names: [localhost, 127.0.0.1]\n" in first.stdout
    assert "address: localhost:18086   # from OSAS_LISTEN\n" in first.stdout
    made = (out / "ca.crt").read_bytes()
    again = run_osas("certs", "--out", str(out), env=clean_env(), cwd=tmp_path)
    assert again.returncode == 6
    assert last_line(again) == (
        f"osas certs: {out / 'ca.crt'} and 4 more already exist: osas certs keeps them (a "
        "running osas or CA may use them); give --force to replace them, or another --out"
    )
    assert (out / "ca.crt").read_bytes() == made  # untouched
    forced = run_osas("certs", "--out", str(out), "--force", env=clean_env(), cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "(replacing the ones there)" in forced.stdout
    assert "address: localhost:8086   # osas serve's default; OSAS_LISTEN moves it\n" in (
        forced.stdout
    )
    assert (out / "ca.crt").read_bytes() != made


def test_bench_writes_its_report_in_the_working_directory_by_default():
    args = build_parser().parse_args(["bench", "--quick"])
    assert str(args.out) == "BENCHMARKS.md"  # never the repository's docs/BENCHMARKS.md


def test_check_config_says_what_it_waits_for_while_the_cloud_does_not_answer(sim, tmp_path):
    """Its rows come as they are checked: against a Keystone that never answers, a line says
    so within seconds, long before the requests time out."""
    with never_answering("/identity/v3") as url:
        auth = {**sim.clouds_yaml_entry()["auth"], "auth_url": url}
        config = write_config(tmp_path, config_data(openstack={"auth": auth}))
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "osas", "check-config", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        try:
            assert process.stdout is not None
            while not (line := process.stdout.readline()).startswith("cloud: waiting"):
                assert line, "check-config ended without saying it waited"
            assert time.monotonic() - started < SAID_WITHIN
            assert re.match(
                r"cloud: waiting \d+s for OpenStack's answer to the cloud's check \(a Keystone "
                r"token, Nova's versions\): no answer yet; each request waits up to 5s$",
                line.rstrip("\n"),
            ), line
        finally:
            process.kill()
            process.communicate()


def test_bench_refuses_at_once_to_rewrite_sections_of_a_report_that_is_not_there(tmp_path):
    result = run_osas("bench", "--sizes-only", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2
    assert last_line(result) == (
        "osas bench: --sizes-only rewrites the sections of an existing report, and "
        "BENCHMARKS.md is none; give --out docs/BENCHMARKS.md (the repository's) or run "
        "without --sizes-only"
    )
