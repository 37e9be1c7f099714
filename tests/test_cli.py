"""The ``osas`` command as an operator runs it: a real process, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import TextIO

import anyio
import grpc
import openstack
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import (
    config_data,
    config_on,
    make_config,
    osas_serve,
    read_events,
    running,
    write_config,
)

from osas import __version__
from osas.demo.client import ClientTls, connect
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova


def test_version():
    result = subprocess.run(
        [sys.executable, "-m", "osas", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"osas {__version__}"


@pytest.mark.parametrize(
    ("transport", "loop"), [({}, "uvloop"), ({"event_loop": "asyncio"}, "asyncio")]
)
def test_serve_answers_then_stops_gracefully_on_sigterm(tmp_path, sim, transport, loop):
    config = write_config(tmp_path, {**config_on(sim), "transport": transport})
    with osas_serve(str(config)) as process:
        events = read_events(process, "health SERVING", time.monotonic() + 20)
        listening = next(e for e in events if e["event"] == "grpc listening")
        assert listening["event_loop"] == loop  # uvloop's unless the configuration says asyncio
        assert any(
            e["event"] == "serving plaintext without client authentication (insecure: true)"
            for e in events
        )
        with grpc.insecure_channel(f"127.0.0.1:{listening['port']}") as channel:
            groups = pb_grpc.CloudProviderStub(channel).NodeGroups(
                pb.NodeGroupsRequest(), timeout=5
            )
            assert {g.id for g in groups.nodeGroups} == {"workers", "gpu"}
        with grpc.insecure_channel(f"127.0.0.1:{listening['health_port']}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        events = read_events(process, "grpc stopped", time.monotonic() + 20)
        assert events[0]["event"] == "signal received"
        assert process.wait(timeout=20) == 0


def test_serve_refuses_a_bad_config_without_starting(tmp_path):
    config = write_config(tmp_path, config_data(cluster_name="Bad_Name"))
    result = subprocess.run(
        [sys.executable, "-m", "osas", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert str(config) in result.stderr
    assert "cluster_name" in result.stderr
    assert "grpc listening" not in result.stderr


@pytest.mark.long
def test_demo_runs_to_completion():
    result = subprocess.run(
        [sys.executable, "-m", "osas", "demo"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for step in range(1, 12):
        assert f"[{step}/11]" in out
    assert "errorCode=QuotaExceeded class=1" in out
    assert "servers left in Nova: 1" in out
    # A second group in RegionTwo: that region fails (its scale-ups refused), the first scales
    # on, Refresh never fails.
    assert "node group workers-two: min 0, max 4 (in osas-sim, region RegionTwo" in out
    assert "region RegionTwo (workers-two): OpenStack FAILING for" in out
    assert "/readyz: 200 ready" in out
    assert "workers scaled to 3 running in RegionOne while RegionTwo failed" in out
    assert "refused, UNAVAILABLE: node group 'workers-two' cannot scale up now" in out
    assert re.search(
        r"CA's Refresh answered OK in all \d+ of its loops while RegionTwo failed", out
    )
    # RegionTwo recovers, and its group scales on.
    assert "RegionTwo recovered and workers-two scaled on; " in out
    assert "servers in Nova: RegionOne 3, RegionTwo 3" in out
    # RegionThree: a warm scale-up beside a cold one, at the same moment; the pool refills.
    assert "build 3 s, start 0.5 s, a warm guest's preparation 1 s (simulated)" in out
    full = "/status: warm pool of workers-warm: 2 ready of 2 wanted, 0 preparing, 0 refilling"
    assert out.count(full) == 2  # filled before the scale-ups, and again after
    warm = re.search(
        r"workers-warm: node running (\d+\.\d) s after the call: claimed from the pool "
        r"\(server [0-9a-f-]{36}\), metadata replaced, started; its console says osas-node-joined",
        out,
    )
    cold = re.search(
        r"workers-cold: node running (\d+\.\d) s after the call: created and built from the "
        r"image",
        out,
    )
    assert warm, out
    assert cold, out
    assert float(warm[1]) < float(cold[1])
    assert float(cold[1]) >= 3.0  # the build takes 3 s
    assert re.search(r"the warm scale-up ran \d+\.\d s sooner", out)
    assert out.index(warm[0]) > out.index(full)
    assert "workers-warm's pool is full again: 2 ready; servers in RegionThree's Nova: 4 " in out
    assert "osas-sim, region RegionTwo (workers-two): last sync" in out  # osas status
    assert "warm pool workers-warm (shutoff): ready 2 of 2, preparing 0, refilling 0\n" in out
    assert "warm pool workers-cold" not in out
    assert "osas status --url http://127.0.0.1:" in out  # read over HTTP from metrics_listen
    assert "GROUP" in out
    assert "failures CA sees: none" in out
    assert "address: osas.kube-system.svc:8086" in out


def test_check_config_finds_a_missing_flavor_and_network(tmp_path):
    with SimulatedOpenStack(FakeNova()) as sim:
        clouds = tmp_path / "clouds.yaml"
        sim.write_clouds_yaml(clouds, "osas-sim")
        group = config_data()["node_groups"][0]
        broken = {**group, "id": "broken", "flavor": "m9.huge", "networks": ["no-such-net"]}
        data = config_data(
            openstack={"cloud": "osas-sim"},
            node_groups=[{**group, "key_name": "ops", "security_groups": ["default"]}, broken],
        )
        config = write_config(tmp_path, data)
        env = {**os.environ, "OS_CLIENT_CONFIG_FILE": str(clouds)}
        result = subprocess.run(
            [sys.executable, "-m", "osas", "check-config", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["broken", "flavor", "m9.huge", "NOT", "FOUND"] in rows
    assert ["broken", "network", "no-such-net", "NOT", "FOUND"] in rows
    assert any(row[:3] == ["workers", "flavor", "m1.medium"] and row[3] == "ok" for row in rows)
    assert any(row[:3] == ["workers", "keypair", "ops"] and row[3] == "ok" for row in rows)
    assert "2 problem(s)" in result.stdout


@pytest.mark.long
def test_check_config_waits_for_a_cloud_that_is_still_starting(tmp_path):
    """Started before the cloud's clouds.yaml exists: without --wait it fails at once (exit 3);
    with --wait it keeps trying and passes once the cloud is there."""
    clouds = tmp_path / "clouds.yaml"
    config = write_config(
        tmp_path,
        config_data(openstack={"cloud": "osas-sim"}),
    )
    env = {**os.environ, "OS_CLIENT_CONFIG_FILE": str(clouds)}
    command = [sys.executable, "-m", "osas", "check-config", "--config", str(config)]
    at_once = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert at_once.returncode == 3, at_once.stdout + at_once.stderr
    assert "cloud: PROBLEM" in at_once.stdout
    waiting = subprocess.Popen(
        [*command, "--wait", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        time.sleep(3)  # it has tried and failed at least once by now
        assert waiting.poll() is None
        with SimulatedOpenStack(FakeNova()) as sim:
            sim.write_clouds_yaml(clouds, "osas-sim")
            out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out + err
    assert "all resources found" in out


@contextlib.contextmanager
def osas_sim(*arguments: str) -> Iterator[TextIO]:
    """`osas sim` with ``arguments`` running; what it says on stdout; SIGTERM at the end."""
    process = subprocess.Popen(
        [sys.executable, "-m", "osas", "sim", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    try:
        yield process.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
        process.stdout.close()


def test_sim_command_serves_and_writes_clouds_yaml(tmp_path, monkeypatch):
    clouds = tmp_path / "clouds.yaml"
    with osas_sim("--port", "0", "--clouds-yaml", str(clouds)) as said:
        line = said.readline()
        assert "http://127.0.0.1:" in line
        auth_url = line.split()[-1]
        entry = yaml.safe_load(clouds.read_text())["clouds"]["osas-sim"]
        assert entry["auth"]["auth_url"] == auth_url
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
        conn = openstack.connect(cloud="osas-sim")
        assert any(f.name == "m1.small" for f in conn.compute.flavors())
        conn.close()


def test_sim_command_serves_regions_and_names_its_cloud(tmp_path, monkeypatch):
    """`osas sim --region A --region B --cloud-name NAME`: one Keystone, a Nova per region,
    the clouds.yaml entry under NAME in the first region; a server made in B is not in A."""
    clouds = tmp_path / "clouds.yaml"
    regions = ["--region", "North", "--region", "South", "--cloud-name", "private"]
    with osas_sim("--clouds-yaml", str(clouds), *regions) as said:
        lines = [said.readline() for _ in range(3)]
        assert "regions: North, South (each its own Nova)" in lines[2]
        entry = yaml.safe_load(clouds.read_text())["clouds"]["private"]
        assert entry["region_name"] == "North"
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
        north = openstack.connect(cloud="private")
        south = openstack.connect(cloud="private", region_name="South")
        try:
            flavor = south.compute.find_flavor("m1.small", ignore_missing=False)
            network = south.network.find_network("cluster-net", ignore_missing=False)
            image = next(iter(south.image.images(name="ubuntu-24.04")))
            south.compute.create_server(
                name="s1", flavor_id=flavor.id, image_id=image.id, networks=[{"uuid": network.id}]
            )
            assert [s.name for s in south.compute.servers()] == ["s1"]
            assert list(north.compute.servers()) == []
        finally:
            north.close()
            south.close()


async def test_osas_certs_make_a_working_mtls_pair(tmp_path):
    """`osas certs`: osas serves mTLS with them, and a client with CA's files gets in."""
    out = tmp_path / "certs"
    result = await anyio.run_process(
        [sys.executable, "-m", "osas", "certs", "--out", str(out)], check=True
    )
    stdout = result.stdout.decode()
    assert f"cert_file: {out / 'tls.crt'}" in stdout
    assert oct((out / "tls.key").stat().st_mode & 0o777) == "0o600"
    tls = {
        "cert_file": str(out / "tls.crt"),
        "key_file": str(out / "tls.key"),
        "client_ca_file": str(out / "ca.crt"),
        "server_names": ["localhost"],
    }
    config = make_config(tmp_path, insecure=False, tls=tls)
    async with running(config) as provider:
        client = ClientTls(
            (out / "ca.crt").read_bytes(),
            (out / "client.crt").read_bytes(),
            (out / "client.key").read_bytes(),
        )
        async with connect(f"localhost:{provider.app.server.port}", client) as ca:
            assert {g.id for g in await ca.node_groups()} == {"workers", "gpu"}


KITS = ("osas.sim", "osas.demo", "osas.bench")


def test_osas_serve_never_imports_the_kits(tmp_path, sim):
    """The simulator, the demo and the benchmark are imported only by the commands that run
    them: ``osas serve``, from start through a scale-up to SIGTERM, loads none of them.
    ``python -X importtime`` lists every import as it happens, lazy ones included."""
    config = write_config(tmp_path, config_on(sim))
    imported: list[str] = []
    events: list[str] = []
    with osas_serve(config, python_flags=("-X", "importtime")) as process:
        assert process.stderr is not None
        stderr = process.stderr

        def read_until(event: str, deadline: float) -> dict:
            while time.monotonic() < deadline:
                line = stderr.readline()
                if not line:
                    break
                if line.startswith("import time:"):
                    imported.append(line.rpartition("|")[2].strip())
                    continue
                parsed = json.loads(line)
                events.append(parsed["event"])
                if parsed["event"] == event:
                    return parsed
            raise AssertionError(f"no {event!r} event; got {events}")

        listening = read_until("grpc listening", time.monotonic() + 30)
        read_until("health SERVING", time.monotonic() + 30)
        with grpc.insecure_channel(f"127.0.0.1:{listening['port']}") as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            stub.Refresh(pb.RefreshRequest(), timeout=5)
            stub.NodeGroupIncreaseSize(
                pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1), timeout=5
            )
        read_until("server created", time.monotonic() + 30)
        process.send_signal(signal.SIGTERM)
        read_until("grpc stopped", time.monotonic() + 30)
        assert process.wait(timeout=20) == 0
    # What serve does import shows up: the listing is complete.
    assert {"osas.cli", "osas.app", "osas.engine.workers", "openstack"} <= set(imported)
    loaded_kits = [m for m in imported if any(m == k or m.startswith(f"{k}.") for k in KITS)]
    assert loaded_kits == []
