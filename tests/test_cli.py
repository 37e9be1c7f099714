"""The ``osas`` command as an operator runs it: a real process, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import config_data, write_config

from osas import __version__
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc


def test_version():
    result = subprocess.run(
        [sys.executable, "-m", "osas", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"osas {__version__}"


def read_events(process: subprocess.Popen[str], until: str, deadline: float) -> list[dict]:
    events = []
    assert process.stderr is not None
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        event = json.loads(line)
        events.append(event)
        if event["event"] == until:
            return events
    msg = f"no {until!r} event; got {[e['event'] for e in events]}"
    raise AssertionError(msg)


def test_serve_answers_then_stops_gracefully_on_sigterm(tmp_path):
    config = write_config(tmp_path, config_data())
    process = subprocess.Popen(
        [sys.executable, "-m", "osas", "serve", "--config", str(config)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        events = read_events(process, "health SERVING", time.monotonic() + 20)
        listening = next(e for e in events if e["event"] == "grpc listening")
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
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


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
