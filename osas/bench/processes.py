"""What every benchmark starts and stops: its processes (the simulated OpenStack, ``osas serve``
and the benchmark's other kits, each a process of its own), their certificates and osas's
configuration, and a description of the machine they run on.

The measures (``run``, ``startup``, ``caloop``, ``burst``, ``takeover``) are built on it; it
imports none of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import requests
import trustme
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from osas.sim.server import DEFAULT_DOMAIN, DEFAULT_PASSWORD, DEFAULT_PROJECT, DEFAULT_USER

CLUSTER = "bench"
GROUP_SIZE = 10_000  # osas caps max_size at 10,000: larger clusters have more groups


# -- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> tuple[float, float]:
    """Resident memory now and at its peak (MiB), from /proc."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in {"VmRSS", "VmHWM"}:
            values[name] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def anonymous_mib(pid: int) -> float:
    """Resident memory of the process's own (anonymous) pages, MiB: its RSS less the shared
    code of the interpreter and its libraries, which the kernel can drop and read again."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == "Anonymous":
            return int(rest.split()[0]) / 1024
    return float("nan")


@contextmanager
def kit(module: str, *arguments: str, prefix: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """One of the benchmark's processes: it prints one JSON line when ready (handed to the
    caller) and stops when its standard input closes; its pipes are closed after it. A
    ``prefix`` runs it under another program (valgrind)."""
    command = [*prefix, sys.executable, "-m", module, *arguments]
    process = subprocess.Popen(  # noqa: S603 - our own module, arguments we build
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            msg = f"{module} exited before it was ready"
            raise RuntimeError(msg)
        yield dict(json.loads(line))
    finally:
        with suppress(OSError):
            if process.stdin:
                process.stdin.close()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


def sim_get(sim: dict[str, Any], path: str) -> dict[str, Any]:
    answer = requests.get(f"{sim['base_url']}{path}", timeout=30)
    answer.raise_for_status()
    return dict(answer.json())


# -- certificates and configuration -------------------------------------------------------------


@dataclass
class Tls:
    folder: Path
    ca: bytes
    client_cert: bytes
    client_key: bytes

    @classmethod
    def make(cls, folder: Path) -> Tls:
        authority = trustme.CA()
        server = authority.issue_cert("localhost", "127.0.0.1")
        client = authority.issue_cert("cluster-autoscaler.kube-system.svc")
        (folder / "tls.crt").write_bytes(b"".join(b.bytes() for b in server.cert_chain_pems))
        (folder / "tls.key").write_bytes(server.private_key_pem.bytes())
        (folder / "ca.crt").write_bytes(authority.cert_pem.bytes())
        return cls(
            folder,
            authority.cert_pem.bytes(),
            b"".join(b.bytes() for b in client.cert_chain_pems),
            client.private_key_pem.bytes(),
        )

    def server_files(self) -> dict[str, str]:
        return {
            "cert_file": str(self.folder / "tls.crt"),
            "key_file": str(self.folder / "tls.key"),
            "client_ca_file": str(self.folder / "ca.crt"),
        }


@dataclass
class Setup:
    """What every osas of a size is started with."""

    folder: Path
    tls: Tls
    sim: dict[str, Any]
    groups: list[str]


def osas_config(
    setup: Setup,
    *,
    resync: str | None = None,
    metrics: bool = False,
    election: dict[str, Any] | None = None,
    queue: dict[str, Any] | None = None,
    reconcile: dict[str, Any] | None = None,
) -> tuple[Path, int, int, int]:
    """A configuration at osas's defaults but for the node groups (and the resync interval,
    a metrics port, leader election, the queue's and the reconciler's settings, when asked);
    the file, its gRPC, health and metrics ports (0: none)."""
    port, health, metrics_port = free_port(), free_port(), free_port() if metrics else 0
    auth = {
        "auth_url": setup.sim["auth_url"],
        "username": DEFAULT_USER,
        "password": DEFAULT_PASSWORD,
        "project_name": DEFAULT_PROJECT,
        "user_domain_name": DEFAULT_DOMAIN,
        "project_domain_name": DEFAULT_DOMAIN,
    }
    group = {"min_size": 0, "max_size": GROUP_SIZE, "flavor": "m1.small", "image": "ubuntu-24.04"}
    group["networks"] = ["cluster-net"]
    data = {
        "cluster_name": CLUSTER,
        "listen": f"127.0.0.1:{port}",
        "health_listen": f"127.0.0.1:{health}",
        "tls": setup.tls.server_files(),
        "openstack": {"auth": auth},
        # The benchmark seeds a cloud of its own: no earlier osas has a create on its way
        # there, so its creates need not wait after the start. Under a lease the wait after a
        # takeover is part of what is measured: left at its default.
        "reconcile": ({} if election else {"hold_after_start": False})
        | ({"full_resync_interval": resync} if resync else {})
        | (reconcile or {}),
        "node_groups": [{"id": name, **group} for name in setup.groups],
    }
    if metrics_port:
        data["metrics_listen"] = f"127.0.0.1:{metrics_port}"
    if election:
        data["leader_election"] = election
    if queue:
        data["queue"] = queue
    path = setup.folder / f"osas-{port}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, port, health, metrics_port


@dataclass
class Osas:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    started: float  # seconds from spawn to SERVING
    metrics: int = 0  # the metrics port, 0 when there is none

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            with suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == name:
                    found.append(event)
        return found

    def stop(self) -> None:
        stop_process(self.process)


async def serve_osas(
    setup: Setup, config: Path, port: int, health: int, name: str, metrics: int = 0
) -> Osas:
    """``osas serve`` with this configuration, its log in ``<name>.log``, once SERVING."""
    log = setup.folder / f"{name}.log"
    spawned = time.perf_counter()
    with log.open("wb") as stream:
        process = subprocess.Popen(  # noqa: S603 - our own command
            [sys.executable, "-m", "osas", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=stream,
        )
    try:
        await wait_until_serving(health, process, log, poll=0.01)
    except BaseException:
        stop_process(process)
        raise
    return Osas(process, port, log, time.perf_counter() - spawned, metrics)


def stop_process(process: subprocess.Popen[Any], grace: float = 30.0) -> None:
    """SIGTERM, as Kubernetes stops osas; killed if it has not exited ``grace`` seconds later."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def wait_until_serving(
    health: int, process: subprocess.Popen[bytes], log: Path, *, poll: float
) -> None:
    """Return once osas's health service says SERVING; raise with the end of its log if it
    exits first."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{health}")
    stub = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    try:
        while True:
            if process.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                msg = f"osas exited with {process.returncode}; the end of its log:\n{tail}"
                raise RuntimeError(msg)
            with suppress(grpc.aio.AioRpcError):
                if (await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)).status == serving:
                    return
            await asyncio.sleep(poll)
    finally:
        await channel.close(None)


async def start_osas(
    setup: Setup,
    name: str,
    *,
    resync: str | None = None,
    metrics: bool = False,
    queue: dict[str, Any] | None = None,
    reconcile: dict[str, Any] | None = None,
    wrap: Callable[[list[str]], list[str]] | None = None,
) -> Osas:
    """``osas serve`` started and SERVING (``wrap``: its command run another way, inside a
    memory limit)."""
    config, port, health, metrics_port = osas_config(
        setup, resync=resync, metrics=metrics, queue=queue, reconcile=reconcile
    )
    log = setup.folder / f"{name}.log"
    command = [sys.executable, "-m", "osas", "serve", "--config", str(config)]
    spawned = time.perf_counter()
    with log.open("wb") as stream:
        process = subprocess.Popen(  # noqa: S603 - our own command, spawned at once
            command if wrap is None else wrap(command),
            stdout=subprocess.DEVNULL,
            stderr=stream,
        )
    await wait_until_serving(health, process, log, poll=0.005)
    return Osas(process, port, log, time.perf_counter() - spawned, metrics_port)


# -- the machine --------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "system": f"{platform.system()} {platform.release()}",
        "date": datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    }
