"""Startup failures as an operator meets them: ``osas serve`` in a real process, a cloud on
loopback, real certificate files. Each failure ends in one line on stderr that names the cause
and what to fix, one ``startup failed`` JSON event with the same reason, its own exit code, and
no traceback."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
import yaml
from support import (
    Provider,
    clean_env,
    config_data,
    config_on,
    make_config,
    never_answering,
    os_environment,
    osas_serve,
    read_events,
    write_config,
)

from osas.app import openstack_cloud
from osas.check import CHECK_REQUEST_TIMEOUT
from osas.sim import (
    APP_CREDENTIAL_SECRET,
    SimulatedOpenStack,
)
from osas.sim.model import FakeNova

EXIT_CONFIG, EXIT_CLOUD, EXIT_TLS, EXIT_BIND = 2, 3, 4, 5


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    def one_line(self, code: int) -> str:
        """The contract: JSON events, then exactly one plain line; the exit code; no traceback.
        The ``startup failed`` event carries the same reason as the line."""
        assert self.code == code, self.stderr
        assert "Traceback" not in self.stdout + self.stderr
        plain, events = [], []
        for line in self.stderr.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                plain.append(line)
        assert len(plain) == 1, plain
        [line] = plain
        assert line.startswith("osas: ")
        assert self.stderr.rstrip("\n").endswith(line)  # the last thing printed
        [failed] = [e for e in events if e["event"] == "startup failed"]
        assert failed["reason"] == line.removeprefix("osas: ")
        assert failed["exit_code"] == code
        return line


def osas(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Outcome:
    result = subprocess.run(
        [sys.executable, "-m", "osas", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or clean_env(),
        cwd=cwd,
        check=False,
    )
    return Outcome(result.returncode, result.stdout, result.stderr)


def serve(config: Path, **env: str) -> Outcome:
    return osas("serve", "--config", str(config), env=clean_env(**env))


@pytest.fixture
def sim():
    with SimulatedOpenStack(FakeNova()) as simulated:
        yield simulated


def on_sim(tmp_path: Path, openstack: dict, **overrides) -> Path:
    return write_config(tmp_path, config_data(openstack=openstack, **overrides))


# -- the cloud: exit 3 ---------------------------------------------------------------------------


def test_a_cloud_name_not_in_clouds_yaml(sim, tmp_path):
    clouds = tmp_path / "clouds.yaml"
    sim.write_clouds_yaml(clouds, "osas-sim")
    config = on_sim(tmp_path, {"cloud": "prod"})
    line = serve(config, OS_CLIENT_CONFIG_FILE=str(clouds)).one_line(EXIT_CLOUD)
    assert f"{clouds} has no cloud 'prod' (it has osas-sim)" in line
    assert "fix openstack.cloud" in line


def test_no_clouds_yaml_at_all(sim, tmp_path):
    if any(Path(d, "clouds.yaml").exists() for d in ("/etc/openstack", "/etc/xdg/openstack")):
        pytest.skip("this machine has a clouds.yaml of its own")
    config = on_sim(tmp_path, {"cloud": "osas-sim"})
    outcome = osas(
        "serve",
        "--config",
        str(config),
        env=clean_env(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / ".config")),
        cwd=tmp_path,
    )
    line = outcome.one_line(EXIT_CLOUD)
    assert "no clouds.yaml to find openstack.cloud 'osas-sim'" in line
    assert "OS_CLIENT_CONFIG_FILE" in line


def test_a_wrong_password(sim, tmp_path):
    auth = {**sim.clouds_yaml_entry()["auth"], "password": "not-the-password-4711"}
    outcome = serve(on_sim(tmp_path, {"auth": auth, "region_name": "RegionOne"}))
    line = outcome.one_line(EXIT_CLOUD)
    assert "HTTP 401" in line
    assert "openstack.auth" in line
    assert "not-the-password-4711" not in outcome.stdout + outcome.stderr


def test_a_wrong_application_credential_secret(sim, tmp_path):
    auth = {
        **sim.clouds_yaml_entry(application_credential=True)["auth"],
        "application_credential_secret": "not-the-secret-4711",
    }
    outcome = serve(on_sim(tmp_path, {"auth": auth, "region_name": "RegionOne"}))
    line = outcome.one_line(EXIT_CLOUD)
    assert "HTTP 401" in line
    assert "application credential" in line
    assert "not-the-secret-4711" not in outcome.stdout + outcome.stderr


def test_a_pinned_compute_microversion(sim, tmp_path):
    config = write_config(tmp_path, config_data())
    environment = os_environment(sim, OS_REGION_NAME="RegionOne", OS_COMPUTE_API_VERSION="2.1")
    line = serve(config, **environment).one_line(EXIT_CLOUD)
    assert "pinned to 2.1" in line
    assert "remove the pin" in line


def test_an_outage_at_start_is_waited_out_not_fatal(sim, tmp_path):
    """The other side of the rule: a 5xx is transient, retried until OpenStack answers."""
    sim.nova.faults.error_rate = 1.0
    config = on_sim(tmp_path, {"auth": sim.clouds_yaml_entry()["auth"]})
    with osas_serve(str(config), env=clean_env()) as process:
        read_events(process, "first sync failed; retrying", time.monotonic() + 30)
        sim.nova.faults.error_rate = 0.0
        read_events(process, "health SERVING", time.monotonic() + 30)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


# -- an auth block stands alone ------------------------------------------------------------------


async def test_an_auth_block_ignores_clouds_yaml_and_os_variables(tmp_path, monkeypatch):
    with (
        SimulatedOpenStack(FakeNova()) as ours,
        SimulatedOpenStack(FakeNova()) as elsewhere,
    ):
        # Everything openstacksdk would find on its own points at another cloud, with a
        # password and a microversion pin that would each break the application credential.
        clouds = tmp_path / "clouds.yaml"
        elsewhere.write_clouds_yaml(clouds, "only-one")
        other = elsewhere.clouds_yaml_entry()["auth"]
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
        monkeypatch.setenv("OS_AUTH_URL", other["auth_url"])
        monkeypatch.setenv("OS_USERNAME", other["username"])
        monkeypatch.setenv("OS_PASSWORD", other["password"])
        monkeypatch.setenv("OS_PROJECT_NAME", other["project_name"])
        monkeypatch.setenv("OS_COMPUTE_API_VERSION", "2.1")
        auth = ours.clouds_yaml_entry(application_credential=True)["auth"]
        config = make_config(tmp_path, openstack={"auth": auth})
        provider = Provider(config, openstack_cloud(config))
        await provider.start()  # ready: the first sync went through
        await provider.stop()
    assert sum(elsewhere.calls.values()) == 0
    tokens = [x for x in ours.history if x.operation == "identity.tokens.create"]
    assert tokens
    assert all(x.status == 201 for x in tokens)


# -- TLS: exit 4 ---------------------------------------------------------------------------------


def write_tls(folder: Path, *, names=("localhost", "127.0.0.1"), **validity) -> dict[str, str]:
    """A server certificate, its key and a client CA in ``folder``; the tls block naming them."""
    authority = trustme.CA()
    server = authority.issue_cert(*names, **validity)
    folder.mkdir(exist_ok=True)
    files = {
        "cert_file": folder / "tls.crt",
        "key_file": folder / "tls.key",
        "client_ca_file": folder / "ca.crt",
    }
    files["cert_file"].write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    files["key_file"].write_bytes(server.private_key_pem.bytes())
    files["client_ca_file"].write_bytes(authority.cert_pem.bytes())
    return {key: str(path) for key, path in files.items()}


def with_tls(tmp_path: Path, tls: dict) -> Path:
    return write_config(tmp_path, config_data(insecure=False, tls=tls))


def test_tls_files_missing(tmp_path):
    tls = {key: str(tmp_path / "nowhere" / name) for key, name in (
        ("cert_file", "tls.crt"), ("key_file", "tls.key"), ("client_ca_file", "ca.crt")
    )}  # fmt: skip
    line = serve(with_tls(tmp_path, tls)).one_line(EXIT_TLS)
    assert f"cannot read {tmp_path / 'nowhere' / 'tls.crt'}: No such file or directory" in line
    assert "tls.cert_file" in line


def test_a_key_that_does_not_match_the_certificate(tmp_path):
    tls = write_tls(tmp_path / "tls")
    Path(tls["key_file"]).write_bytes(trustme.CA().issue_cert("x").private_key_pem.bytes())
    line = serve(with_tls(tmp_path, tls)).one_line(EXIT_TLS)
    assert f"the private key in {tls['key_file']} does not match the certificate" in line


def test_an_expired_certificate(tmp_path):
    yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    tls = write_tls(
        tmp_path / "tls", not_before=yesterday - dt.timedelta(days=90), not_after=yesterday
    )
    line = serve(with_tls(tmp_path, tls)).one_line(EXIT_TLS)
    assert f"the certificate in {tls['cert_file']} expired on {yesterday:%Y-%m-%d}" in line


def test_a_certificate_without_the_names_ca_dials(tmp_path):
    tls = write_tls(tmp_path / "tls", names=("osas.example",))
    tls["server_names"] = ["osas.kube-system.svc", "10.0.0.7"]
    line = serve(with_tls(tmp_path, tls)).one_line(EXIT_TLS)
    assert "does not cover osas.kube-system.svc, 10.0.0.7 (tls.server_names)" in line
    assert "it names osas.example" in line


# -- binding: exit 5 -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["listen", "health_listen"])
def test_a_port_in_use(tmp_path, key):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        line = serve(write_config(tmp_path, config_data(**{key: address}))).one_line(EXIT_BIND)
    assert f"cannot listen on {address} ({key}): address already in use" in line
    assert "choose another port" in line


# -- the configuration: exit 2 -------------------------------------------------------------------


def test_a_yaml_error_on_the_password_line_never_shows_the_password(tmp_path):
    config = tmp_path / "osas.yaml"
    text = yaml.safe_dump(config_data()) + (
        "openstack:\n"
        "  auth:\n"
        "    auth_url: https://keystone.example/v3\n"
        "    username: osas\n"
        "    password: 'hunter2-s3cret\n"
    )
    config.write_text(text, encoding="utf-8")
    opening = text.splitlines().index("    password: 'hunter2-s3cret") + 1
    outcome = serve(config)
    line = outcome.one_line(EXIT_CONFIG)
    assert f"{config}: not valid YAML at line" in line
    assert f"(in what starts at line {opening}, column 15)" in line
    assert "hunter2" not in outcome.stdout + outcome.stderr


def test_several_config_problems_on_one_line(tmp_path):
    config = write_config(tmp_path, config_data(cluster_name="Bad_Name", queue={"workers": 0}))
    line = serve(config).one_line(EXIT_CONFIG)
    assert "cluster_name" in line
    assert "queue.workers" in line


def test_a_key_given_twice_stops_serve_with_both_lines(tmp_path):
    config = tmp_path / "osas.yaml"
    text = yaml.safe_dump(config_data()) + "cluster_name: other\n"
    config.write_text(text, encoding="utf-8")
    first, again = (n for n, line in enumerate(text.splitlines(), 1) if line.startswith("cluster_"))
    line = serve(config).one_line(EXIT_CONFIG)
    assert line == (
        f"osas: configuration error: {config}: cluster_name: duplicate key at lines {first} and "
        f"{again} (YAML would keep the last and drop the others unseen); keep one"
    )


def test_a_missing_user_data_file_stops_serve_and_check_config_alike(tmp_path):
    """Found at start, not by the first create; check-config, which found it before, now
    stops on the same configuration error, with the same words and exit code."""
    data = config_data()
    data["node_groups"][1]["user_data_file"] = str(tmp_path / "bootstrap" / "user-data")
    config = write_config(tmp_path, data)
    problem = (
        f"{config}: node_groups[1](gpu).user_data_file: {tmp_path / 'bootstrap' / 'user-data'} "
        "does not exist"
    )
    line = serve(config).one_line(EXIT_CONFIG)
    assert line == f"osas: configuration error: {problem}"
    checked = osas("check-config", "--config", str(config))
    assert checked.code == EXIT_CONFIG, checked.stdout + checked.stderr
    assert checked.stderr == f"osas check-config: configuration error: {problem}\n"


def test_osas_status_reads_only_the_port_of_a_file_whose_user_data_files_are_elsewhere(tmp_path):
    """`osas status --config` on a host where the pod's mounted Secret is not: the file still
    tells where osas answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    data = config_data(metrics_listen=f"127.0.0.1:{port}")
    data["node_groups"][1]["user_data_file"] = "/etc/osas/bootstrap/user-data"
    outcome = osas("status", "--config", str(write_config(tmp_path, data)))
    assert outcome.code == EXIT_CLOUD, outcome.stderr
    assert outcome.stderr.startswith(f"osas status: nothing listens at 127.0.0.1:{port}: is osas")


# -- check-config --------------------------------------------------------------------------------


def test_check_config_fails_on_missing_tls_files(tmp_path):
    tls = {
        key: str(tmp_path / "nowhere" / key) for key in ("cert_file", "key_file", "client_ca_file")
    }
    outcome = osas("check-config", "--config", str(with_tls(tmp_path, tls)))
    assert outcome.code == EXIT_TLS, outcome.stdout + outcome.stderr
    assert f"tls: PROBLEM: cannot read {tmp_path / 'nowhere' / 'cert_file'}" in outcome.stdout
    assert "Traceback" not in outcome.stdout + outcome.stderr


def test_check_config_passes_good_tls_files_and_warns_before_they_expire(sim, tmp_path):
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=3)
    tls = write_tls(tmp_path / "tls", names=("*.kube-system.svc",), not_after=soon)
    tls["server_names"] = ["osas.kube-system.svc"]
    config = write_config(tmp_path, config_on(sim, insecure=False, tls=tls))
    outcome = osas("check-config", "--config", str(config))
    assert outcome.code == 0, outcome.stdout + outcome.stderr
    assert "tls: ok:" in outcome.stdout
    assert "covers tls.server_names (osas.kube-system.svc)" in outcome.stdout
    assert "tls: WARNING: the server certificate expires in 2 days" in outcome.stdout


def test_check_config_names_a_cloud_that_cannot_be_used(sim, tmp_path):
    auth = {**sim.clouds_yaml_entry()["auth"], "password": "wrong"}
    outcome = osas("check-config", "--config", str(on_sim(tmp_path, {"auth": auth})))
    assert outcome.code == EXIT_CLOUD, outcome.stdout + outcome.stderr
    assert "cloud: PROBLEM: the cloud cannot be used:" in outcome.stdout
    assert "HTTP 401" in outcome.stdout


def test_check_config_says_what_a_closed_port_means_in_one_line(sim, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    auth = {**sim.clouds_yaml_entry()["auth"], "auth_url": f"http://127.0.0.1:{port}/identity/v3"}
    outcome = osas("check-config", "--config", str(on_sim(tmp_path, {"auth": auth})))
    assert outcome.code == EXIT_CLOUD, outcome.stdout + outcome.stderr
    [line] = [line for line in outcome.stdout.splitlines() if line.startswith("cloud:")]
    assert line == (
        f"cloud: PROBLEM: the cloud cannot be used: cannot reach http://127.0.0.1:{port}"
        "/identity/v3: connection refused: nothing listens at that address and port; check "
        "the address (auth_url, or the endpoint Keystone's catalog gives for the service) and "
        "that osas can reach it"
    )
    assert "HTTPConnectionPool" not in outcome.stdout + outcome.stderr
    # keystoneauth's warnings are said by osas's line, which ends on stderr as one line.
    assert outcome.stderr == (
        "osas check-config: 1 problem(s) (each above, marked PROBLEM or NOT FOUND); the first: "
        f"{line.replace(': PROBLEM', '', 1)}; fix it and run osas check-config again\n"
    )


@pytest.mark.long
def test_check_config_answers_soon_when_keystone_accepts_and_never_answers(sim, tmp_path):
    """The kernel completes the handshakes of a listening socket nobody reads: the requests
    go out and no answer ever comes. check-config's requests wait CHECK_REQUEST_TIMEOUT each
    (discovery, then the token), once, whatever openstack.api_timeout and attempts say."""
    with never_answering("/identity/v3") as url:
        auth = {**sim.clouds_yaml_entry()["auth"], "auth_url": url}
        openstack = {"auth": auth, "api_timeout": "30s", "attempts": 4}
        begun = time.monotonic()
        outcome = osas("check-config", "--config", str(on_sim(tmp_path, openstack)))
        took = time.monotonic() - begun
    assert outcome.code == EXIT_CLOUD, outcome.stdout + outcome.stderr
    assert took < 2 * CHECK_REQUEST_TIMEOUT + 8, took  # 129 s with the serve settings
    # Discovery's GET, or the token's POST after it (a URL ending in /v3 is tried as v3).
    assert re.search(
        f"^cloud: PROBLEM: the cloud cannot be used: cannot reach {url}(/auth/tokens)?: it "
        "accepted the connection but sent no answer in time; check the address",
        outcome.stdout,
        re.MULTILINE,
    ), outcome.stdout
    # Then one line on stderr, as every failing command ends.
    assert outcome.stderr.startswith(
        "osas check-config: 1 problem(s) (each above, marked PROBLEM or NOT FOUND); the "
        f"first: cloud: the cloud cannot be used: cannot reach {url}"
    ), outcome.stderr
    assert outcome.stderr.count("\n") == 1


# -- what osas says when it does start -----------------------------------------------------------


def test_the_settings_event_names_what_runs_and_no_secret(tmp_path, sim):
    secrets = [APP_CREDENTIAL_SECRET, "bootstrap-token-abcdef.0123456789"]
    # The secret comes from the environment, the rest of the credential from the file.
    auth = sim.clouds_yaml_entry(application_credential=True)["auth"]
    assert auth.pop("application_credential_secret") == APP_CREDENTIAL_SECRET
    data = config_data(openstack={"auth": auth})
    data["node_groups"][0]["user_data"] = f"#cloud-config\ntoken: {secrets[1]}\n"
    config = write_config(tmp_path, data)
    with osas_serve(
        str(config),
        "--log-level",
        "debug",
        env=clean_env(OSAS_OPENSTACK__AUTH__APPLICATION_CREDENTIAL_SECRET=APP_CREDENTIAL_SECRET),
    ) as process:
        events = read_events(process, "health SERVING", time.monotonic() + 20)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
        assert process.stderr is not None
        rest = process.stderr.read()
    [settings] = [e for e in events if e["event"] == "settings"]
    assert settings["listen"] == "127.0.0.1:0"
    assert settings["tls"] == "off (insecure: true)"
    assert settings["openstack"]["auth_type"] == "v3applicationcredential"
    assert settings["openstack"]["auth_url"] == sim.auth_url
    assert settings["reconcile"]["interval"] == 3600.0
    assert settings["queue"] == {"capacity": 50, "workers": 2}
    assert {
        g["id"]: (g["min_size"], g["max_size"], g["flavor"]) for g in settings["node_groups"]
    } == {
        "workers": (1, 10, "m1.medium"),
        "gpu": (0, 3, "g1.xlarge"),
    }
    printed = json.dumps(events) + rest
    for secret in secrets:
        assert secret not in printed


def test_a_retired_cloud_backend_is_ignored_with_a_warning(tmp_path, sim):
    """A file written for an earlier release, with ``cloud_backend: openstack``, still
    starts; the warning says the key can go."""
    auth = sim.clouds_yaml_entry()["auth"]
    config = on_sim(tmp_path, {"auth": auth}, cloud_backend="openstack")
    with osas_serve(str(config), env=clean_env()) as process:
        events = read_events(process, "health SERVING", time.monotonic() + 30)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    retired = [e for e in events if e["event"].startswith("cloud_backend is retired")]
    assert [e["level"] for e in retired] == ["warning"]
