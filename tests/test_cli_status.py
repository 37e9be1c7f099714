"""``osas status --config FILE`` reads only the file's ``metrics_listen``: it answers after a
reload osas rejected (the moment an operator runs it), and says plainly when the file cannot be
read for the port. The screen shows each group's warm pool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from typing import Any

import pytest
import yaml
from support import ServedOsas, config_on, free_port, run_osas, wait_for, write_config

from osas.cli.status_table import PROBLEMS, render_status
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova


def osas(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_osas(*args, env=env, timeout=60)


def environment(**extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("OSAS_")}
    return {**kept, **extra}


def test_status_answers_from_a_file_osas_refused_to_reload(tmp_path, sim):
    listen = f"127.0.0.1:{free_port()}"
    config = write_config(tmp_path, config_on(sim, metrics_listen=listen))
    with ServedOsas(config, env=environment()) as served:
        served.wait_for("health SERVING")
        assert served.wait_for("metrics listening")["port"] == int(listen.rpartition(":")[2])
        # What an operator's edit may leave: a value osas refuses, a key given twice.
        broken = yaml.safe_load(config.read_text())
        broken["queue"]["workers"] = 0
        config.write_text(yaml.safe_dump(broken) + f"metrics_listen: {listen}\n")
        served.process.send_signal(signal.SIGHUP)
        served.wait_for("configuration reload rejected; the configuration in force stays")
        refused = osas("check-config", "--config", str(config), env=environment())
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "configuration error" in refused.stderr

        result = osas("status", "--config", str(config), "--wait", "30", env=environment())
        assert result.returncode == 0, (result.stderr, served.process.poll())
        first, second = result.stdout.splitlines()[:2]
        assert first.startswith("cluster testc ")
        assert "ready" in second
        assert "configuration reload REJECTED" in result.stdout
        assert "workers" in result.stdout
        assert served.stop() == 0


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            "cluster_name: c\nmetrics_listen: '127.0.0.1:9090\n",
            (
                "not valid YAML at line 3, column 1 (in what starts at line 2, column 17): a token "
                "cannot be read (an unclosed quote, a tab, a stray ':'): no metrics_listen to "
                "read; give --url"
            ),
        ),
        (
            "- cluster_name: c\n- metrics_listen: 127.0.0.1:9090\n",
            "the top level is not a mapping of keys: no metrics_listen to read; give --url",
        ),
        (
            "metrics_listen: [9090]\n",
            "metrics_listen: [9090] is not HOST:PORT: no metrics_listen to read; give --url",
        ),
    ],
)
def test_status_says_why_a_file_gives_no_metrics_port(tmp_path, content, said):
    config = tmp_path / "osas.yaml"
    config.write_text(content)
    result = osas("status", "--config", str(config), env=environment())
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"osas status: {config}: {said}\n"


def test_status_without_metrics_listen_asks_for_url(tmp_path):
    config = tmp_path / "osas.yaml"
    config.write_text("cluster_name: c\nnode_groups: not even a list\n")
    result = osas("status", "--config", str(config), env=environment())
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"osas status: {config} sets no metrics_listen; give --url\n"


def test_status_takes_the_port_from_osas_metrics_listen_as_serve_does(tmp_path):
    """The variable overrides the file for ``osas serve``, so it does for ``osas status``:
    it asks that port (where nothing answers here: exit 3, the URL named)."""
    config = tmp_path / "osas.yaml"
    config.write_text("metrics_listen: 127.0.0.1:9090\n")
    port = free_port()
    env = environment(OSAS_METRICS_LISTEN=f"0.0.0.0:{port}")
    result = osas("status", "--config", str(config), env=env)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith(f"osas status: nothing listens at 127.0.0.1:{port}: is osas")


def group_entry(group_id: str, warm_pool: dict[str, Any]) -> dict[str, Any]:
    """A node group of ``/status`` with nothing going on but its warm pool."""
    return {
        "id": group_id,
        "min_size": 0,
        "max_size": 5,
        "target_size": 1,
        "servers": {"running": 1, "creating": 0, "error": 0, "deleting": 0},
        "creates": {"queued": 0, "sending": 0, "created": 0, "in_doubt": 0, "failed": 0},
        "failures": [],
        "quota_headroom": None,
        "warm_pool": warm_pool,
    }


def status_document(*groups: dict[str, Any]) -> dict[str, Any]:
    """A ``/status`` document of a ready osas in one place, with these groups."""
    return {
        "cluster_name": "c",
        "config_file": None,
        "version": "0.0.0",
        "ready": True,
        "not_ready_reason": None,
        "inventory_age_seconds": 1.0,
        "syncs": {"full": 1, "incremental": 2, "failures": 0, "failing_for_seconds": None},
        "leader_election": {"enabled": False},
        "places": [],
        "groups": list(groups),
        "queue": {"creates": 0, "deletes": 0, "capacity": 50, "workers": 2, "workers_busy": 0},
        "problems": dict.fromkeys(PROBLEMS, 0),
        "problem_servers": [],
        "problem_servers_not_shown": 0,
        "group_problems": [],
        "config_reload": None,
        "restart_needed_for": [],
        "rejected_certificate_reloads": 0,
    }


def kept_pool(state: str = "shutoff", **counts: Any) -> dict[str, Any]:
    """A pool as ``/status`` shows it after the keeper's first pass."""
    pool = {"wanted": 2, "ready": 2, "preparing": 0, "refilling": 0, "why_not": None, **counts}
    return {"servers": pool["ready"], "by_status": {}, "state": state, **pool}


def test_status_shows_each_groups_warm_pool():
    screen = render_status(
        status_document(
            group_entry("full", kept_pool()),
            group_entry("filling", kept_pool("paused", ready=0, preparing=1, refilling=1)),
            group_entry(
                "short",
                kept_pool(
                    "shelved_offloaded",
                    ready=1,
                    why_not="the project's quota has no room (instances is the limit)",
                ),
            ),
            group_entry("cold", {"servers": 0, "by_status": {}}),
        )
    )
    lines = screen.splitlines()
    pools = [line for line in lines if line.startswith("warm pool ")]
    assert pools == [
        "warm pool full (shutoff): ready 2 of 2, preparing 0, refilling 0",
        "warm pool filling (paused): ready 0 of 2, preparing 1, refilling 1",
        (
            "warm pool short (shelved_offloaded): ready 1 of 2, preparing 0, refilling 0; "
            "not filling: the project's quota has no room (instances is the limit)"
        ),
    ]
    # Below the table and its quota line, which show every group.
    assert (
        lines.index(pools[0])
        == next(index for index, line in enumerate(lines) if line.startswith("quota headroom: "))
        + 1
    )
    assert "cold" in screen  # in the table, with no pool line


def test_status_shows_a_pool_not_judged_yet_and_warm_servers_left_unconfigured():
    screen = render_status(
        status_document(
            group_entry(
                "standby",
                {"servers": 3, "by_status": {"SHUTOFF": 2, "BUILD": 1}, "state": "shutoff"},
            ),
            group_entry("fresh", {"servers": 0, "by_status": {}, "state": "suspended"}),
            group_entry("dropped", {"servers": 2, "by_status": {"SHUTOFF": 2}}),
            {k: v for k, v in group_entry("old", {}).items() if k != "warm_pool"},
        )
    )
    pools = [line for line in screen.splitlines() if line.startswith("warm pool ")]
    assert pools == [
        (
            "warm pool standby (shutoff): 3 server(s) (BUILD 1, SHUTOFF 2); not judged yet "
            "(osas keeps pools once it has synced, and only while it may write)"
        ),
        (
            "warm pool fresh (suspended): 0 server(s); not judged yet "
            "(osas keeps pools once it has synced, and only while it may write)"
        ),
        "warm pool dropped: none configured; 2 warm server(s) of it left, which osas deletes",
    ]


def test_status_of_a_running_osas_shows_its_warm_pool_filled(tmp_path):
    """``osas status`` against ``osas serve`` with a warm pool: the simulator's guests prepare
    and power off, and the pool is shown ready, the group without a pool has no line."""
    nova = FakeNova(build_seconds=0.05)
    with SimulatedOpenStack(nova) as sim:
        listen = f"127.0.0.1:{free_port()}"
        data = config_on(sim, metrics_listen=listen)
        data["reconcile"] = {**data["reconcile"], "interval": "0.2s"}
        workers, gpu = data["node_groups"]
        workers["warm_pool"] = {"size": 2}
        data["node_groups"] = [workers, gpu]
        config = write_config(tmp_path, data)
        url = f"http://{listen}"
        with ServedOsas(config, env=environment()) as served:
            served.wait_for("metrics listening")

            def pool_ready() -> bool:
                with urllib.request.urlopen(f"{url}/status", timeout=5) as answer:  # noqa: S310
                    status = json.load(answer)
                (group,) = (g for g in status["groups"] if g["id"] == "workers")
                return bool(group["warm_pool"].get("ready") == 2)

            wait_for("a full warm pool", pool_ready, timeout=30)
            result = osas("status", "--url", url, env=environment())
            assert result.returncode == 0, result.stdout + result.stderr
            assert "warm pool workers (shutoff): ready 2 of 2, preparing 0, refilling 0\n" in (
                result.stdout
            )
            assert "warm pool gpu" not in result.stdout
            assert served.stop() == 0
