"""``osas status --config FILE`` reads only the file's ``metrics_listen``: it answers after a
reload osas rejected (the moment an operator runs it), and says plainly when the file cannot be
read for the port."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import yaml
from support import ServedOsas, config_on, free_port, run_osas, write_config


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
