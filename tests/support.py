"""Shared test plumbing: configs, a running provider on loopback, and a CA-like client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import grpc
import openstack
import openstack.connection
import pytest
import trustme
import yaml
from fake_cloud import FakeCloud
from prometheus_client import CollectorRegistry

from osas.app import App, PlaceEngine, openstack_clouds
from osas.cloud.openstack import OpenStackCloud
from osas.cloud.openstack_settings import OpenStackAuth, OpenStackSettings
from osas.cloud.port import Cloud
from osas.config import OsasConfig, load_config
from osas.demo.client import CaClient, ClientTls, connect
from osas.domain.limits import NodeInfo
from osas.domain.servers import (
    META_CLUSTER,
    META_GROUP,
    META_REQUEST,
    META_WARM,
    TAG_CLUSTER_PREFIX,
    TAG_REQUEST_PREFIX,
    server_name,
)
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import DEFAULT_PASSWORD, SimulatedOpenStack
from osas.sim.kubernetes import KubeStandIn
from osas.sim.model import FakeNova, FakeServer
from osas.sim.server import APP_CREDENTIAL_ID, APP_CREDENTIAL_SECRET, CLOUD_NAME

CLUSTER = "testc"
TAG = f"{TAG_CLUSTER_PREFIX}{CLUSTER}"


def config_data(**overrides: Any) -> dict[str, Any]:
    """A valid configuration as YAML data, with two node groups."""
    data: dict[str, Any] = {
        "cluster_name": CLUSTER,
        "listen": "127.0.0.1:0",
        "health_listen": "127.0.0.1:0",
        "insecure": True,
        "reconcile": {
            "interval": "1h",
            "full_resync_interval": "1h",
            "max_inventory_age": "2h",
            "retry_backoff": 0.01,
            # A test's cloud is new: no earlier osas can have a create on its way to it. The
            # tests of restarts and takeovers set it true (tests/test_takeover.py).
            "hold_after_start": False,
        },
        "queue": {"capacity": 50, "workers": 2},
        "shutdown_grace": "5s",
        "node_groups": [
            {
                "id": "workers",
                "min_size": 1,
                "max_size": 10,
                "flavor": "m1.medium",
                "image": "ubuntu-24.04",
                "networks": ["cluster-net"],
                "labels": {"pool": "workers"},
                "user_data": "#cloud-config\nhostname: ${server_name}\n",
            },
            {
                "id": "gpu",
                "min_size": 0,
                "max_size": 3,
                "flavor": "g1.xlarge",
                "image": "ubuntu-24.04",
                "networks": ["cluster-net"],
                "gpu": {"count": 1, "type": "nvidia-a100"},
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                "options": {"scale_down_unneeded_time": "20m", "zero_or_max_node_scaling": True},
                "availability_zone": "az-1",
            },
        ],
    }
    data.update(overrides)
    return data


def config_on(sim: SimulatedOpenStack, **overrides: Any) -> dict[str, Any]:
    """``config_data`` for an osas that reaches ``sim`` over HTTP with its default user, as
    ``osas serve`` runs (it has no in-memory cloud to be pointed at)."""
    return config_data(**{"openstack": {"auth": sim.clouds_yaml_entry()["auth"]}, **overrides})


# A node group of what `osas sim` offers, for the lanes that run a real osas process against it.
SIM_WORKERS: dict[str, Any] = {
    "id": "workers",
    "min_size": 0,
    "max_size": 5,
    "flavor": "m1.small",
    "image": "ubuntu-24.04",
    "networks": ["cluster-net"],
    "user_data": "#cloud-config\nhostname: ${server_name}\n",
}


def wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    """``check()``'s first true answer, polled for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return result


# Replicas of osas under one Lease, as the chart runs them (two pods, one writer), on the
# Kubernetes API stand-in: short lease times so that a failover takes seconds.
NAMESPACE = "kube-system"
SERVICE = "osas"
LEASE_DURATION = 2.0
RENEW_DEADLINE = 1.2
RETRY_PERIOD = 0.2


def replica_election(kubeconfig: Path) -> dict[str, Any]:
    """The ``leader_election`` block of a replica: the Lease and CA's Service on the stand-in."""
    return {
        "enabled": True,
        "kubeconfig": str(kubeconfig),
        "lease_namespace": NAMESPACE,
        "lease_duration": f"{LEASE_DURATION}s",
        "renew_deadline": f"{RENEW_DEADLINE}s",
        "retry_period": f"{RETRY_PERIOD}s",
        "service_name": SERVICE,
    }


def pod_env(name: str) -> dict[str, str]:
    """The environment the chart's pod gives a replica: its name, namespace and address."""
    return {**os.environ, "POD_NAME": name, "POD_NAMESPACE": NAMESPACE, "POD_IP": "127.0.0.1"}


def service_address(kube: KubeStandIn) -> str | None:
    """Where kube-proxy sends a new connection to CA's Service now."""
    found = kube.service_endpoint(NAMESPACE, SERVICE)
    return None if found is None else f"{found[0]}:{found[1]}"


async def until_through(
    where: Callable[[], str | None],
    step: Callable[[CaClient], Awaitable[bool]],
    *,
    timeout: float,
) -> bool:
    """Run CA's ``step`` until it says done, its connection made where ``where`` says now (CA's
    Service: a new one after the old breaks, as gRPC reconnects, UNAVAILABLE from an old
    holder gone or a standby reached before the endpoint moved). False when time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        address = where()
        if address is None:
            await asyncio.sleep(0.1)
            continue
        try:
            async with ca_client(address) as ca:
                while time.monotonic() < deadline:
                    if await step(ca):
                        return True
                    await asyncio.sleep(0.2)
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            await asyncio.sleep(0.2)
    return False


def free_port() -> int:
    """A port nothing listens on now, on 127.0.0.1 (for an address a file must name)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without OpenStack's or osas's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "OSAS_", "GRPC_"))}
    env.update(extra)
    return env


@contextlib.contextmanager
def never_answering(path: str = "") -> Iterator[str]:
    """A URL on 127.0.0.1 that accepts connections and never answers (a Keystone behind a dead
    proxy): the kernel completes the handshakes of a listening socket nobody reads."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}{path}"


def run_osas(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``osas ARGS`` as a user runs it, in a process of its own; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "osas", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        cwd=cwd,
    )


def write_config(tmp_path: Path, data: dict[str, Any], name: str = "osas.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def make_config(tmp_path: Path, **overrides: Any) -> OsasConfig:
    return load_config(write_config(tmp_path, config_data(**overrides)))


@dataclass
class Certs:
    ca_pem: bytes
    server_cert: Path
    server_key: Path
    client_ca: Path
    client_cert_pem: bytes
    client_key_pem: bytes


def make_certs(tmp_path: Path) -> Certs:
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("cluster-autoscaler.kube-system.svc")
    server_cert = tmp_path / "tls.crt"
    server_key = tmp_path / "tls.key"
    client_ca = tmp_path / "ca.crt"
    server_cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server_key.write_bytes(server.private_key_pem.bytes())
    client_ca.write_bytes(ca.cert_pem.bytes())
    return Certs(
        ca_pem=ca.cert_pem.bytes(),
        server_cert=server_cert,
        server_key=server_key,
        client_ca=client_ca,
        client_cert_pem=b"".join(blob.bytes() for blob in client.cert_chain_pems),
        client_key_pem=client.private_key_pem.bytes(),
    )


class Provider:
    """An osas App running in the test's event loop, served on 127.0.0.1."""

    def __init__(
        self,
        config: OsasConfig,
        cloud: Cloud,
        registry: CollectorRegistry | None = None,
        *,
        config_path: Path | None = None,
    ) -> None:
        self.config = config
        self.cloud = cloud
        self.app = App(config, cloud, registry=registry, config_path=config_path)
        self._task: asyncio.Task[None] | None = None

    async def start(self, *, wait_serving: bool = True) -> None:
        self._task = asyncio.ensure_future(self.app.run())
        if wait_serving:
            await self.wait_serving()
        else:
            while not self.app.server.port:
                await asyncio.sleep(0.01)

    async def wait_serving(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not self.app.serving.is_set():
                assert self._task is not None
                if self._task.done():
                    self._task.result()
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.app.stop()
        if self._task is not None:
            async with asyncio.timeout(15):
                await self._task

    @property
    def nova(self) -> FakeNova:
        """The model behind the in-memory cloud (for providers built on FakeCloud)."""
        assert isinstance(self.cloud, FakeCloud)
        return self.cloud.nova

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.app.server.port}"

    async def sync(self, *, full: bool = True) -> None:
        await self.app.reconciler.reconcile_once(full=full)


@contextlib.asynccontextmanager
async def serving_places(
    config: OsasConfig, *, config_path: Path | None = None, timeout: float = 10.0
) -> AsyncIterator[tuple[Provider, CaClient]]:
    """osas as ``osas serve`` runs it, a cloud adapter for each place its node groups live in
    (counted in one registry), SERVING within ``timeout``; and CA's client to it."""
    clouds = openstack_clouds(config, CollectorRegistry())
    provider = Provider(config, clouds, config_path=config_path)  # type: ignore[arg-type]
    await provider.start(wait_serving=False)
    await provider.wait_serving(timeout=timeout)
    try:
        async with ca_client(provider.address) as ca:
            yield provider, ca
    finally:
        await provider.stop()


def engine_of(provider: Provider, region: str) -> PlaceEngine:
    """The engine of the place in ``region``."""
    return next(engine for engine in provider.app.places if engine.place.region == region)


@contextlib.asynccontextmanager
async def running(config: OsasConfig, cloud: FakeCloud | None = None) -> AsyncIterator[Provider]:
    provider = Provider(config, cloud or FakeCloud(FakeNova()))
    await provider.start()
    try:
        yield provider
    finally:
        await provider.stop()


@contextlib.asynccontextmanager
async def ca_client(address: str, certs: Certs | None = None) -> AsyncIterator[CaClient]:
    tls = None
    if certs is not None:
        tls = ClientTls(certs.ca_pem, certs.client_cert_pem, certs.client_key_pem)
    async with connect(address, tls) as client:
        yield client


async def eventually(
    check: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    """Wait until ``check()`` holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise AssertionError(msg)
        await asyncio.sleep(0.02)


async def expect_status(code: grpc.StatusCode, call: Awaitable[object]) -> str:
    """Await an RPC that must fail with ``code``; the status details."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    error = caught.value
    assert error.code() == code, f"expected {code.name}, got {error.code().name}: {error.details()}"
    return error.details() or ""


def provider_id(server_id: str) -> str:
    return f"openstack:///{server_id}"


def states(instances: list[pb.Instance]) -> dict[str, int]:
    return {i.id: i.status.instanceState for i in instances}


def os_environment(sim: SimulatedOpenStack, **extra: str) -> dict[str, str]:
    """The OS_* variables that reach ``sim`` with its default user, as every OpenStack tool
    reads them, and ``extra`` ones (OS_REGION_NAME, OS_COMPUTE_API_VERSION...)."""
    auth = sim.clouds_yaml_entry()["auth"]
    keys = ("auth_url", "username", "password", "project_name")
    keys += ("user_domain_name", "project_domain_name")
    return {f"OS_{key.upper()}": auth[key] for key in keys} | extra


def settings_for(sim: SimulatedOpenStack, **overrides: Any) -> OpenStackSettings:
    """Settings that reach ``sim`` with its default user, and retry fast."""
    entry = sim.clouds_yaml_entry()
    values = {
        "auth": OpenStackAuth(**entry["auth"]),
        "region_name": entry["region_name"],
        "backoff": 0.01,
        "backoff_max": 0.05,
        "rate_limit": 1000.0,
    }
    values.update(overrides)
    return OpenStackSettings(**values)


def seed_ours(nova: FakeNova, count: int, group: str = "workers") -> list[str]:
    """Servers of this cluster made by an earlier osas."""
    return [
        nova.seed(
            name=f"{CLUSTER}-{group}-{index}",
            metadata={META_CLUSTER: CLUSTER, META_GROUP: group},
            tags=[TAG],
        ).server_id
        for index in range(count)
    ]


def seed_earlier(
    nova: FakeNova, group: str, request_id: str, name: str | None = None
) -> FakeServer:
    """A server of an earlier osas: the cluster's and the group's marks and its request id in
    metadata and tag, named as osas names it unless ``name`` says otherwise."""
    return nova.seed(
        name=name or server_name(CLUSTER, group, request_id),
        metadata={META_CLUSTER: CLUSTER, META_GROUP: group, META_REQUEST: request_id},
        tags=[TAG, f"{TAG_REQUEST_PREFIX}{request_id}"],
    )


def nodes(pairs: list[tuple[str, str]]) -> list[NodeInfo]:
    """Nodes as CA names them in DeleteNodes: (name, provider id)."""
    return [NodeInfo(name, pid) for name, pid in pairs]


# -- osas against the simulated OpenStack ----------------------------------------------------------

# Warm pools (issue 36): what Nova holds of a group, and the invariants after every step.


def node_servers(sim: SimulatedOpenStack, group: str = "big") -> list[FakeServer]:
    """The group's servers in Nova that are nodes (not warm), not being deleted."""
    return [
        s
        for s in sim.nova.live_servers()
        if s.metadata.get(META_GROUP) == group
        and META_WARM not in s.metadata
        and s.task_state != "deleting"
    ]


def warm_servers(sim: SimulatedOpenStack) -> list[FakeServer]:
    return [s for s in sim.nova.live_servers() if META_WARM in s.metadata]


def deleted(sim: SimulatedOpenStack) -> list[str]:
    """Ids of the servers whose DELETE reached Nova."""
    return [asked.server_id for asked in sim.nova.deletes_asked]


async def check_warm_invariants(
    sim: SimulatedOpenStack, ca: CaClient, group: str, max_size: int
) -> None:
    """No warm server in CA's view; never beyond max_size nodes in Nova; one server per
    request."""
    # CA's view first, Nova's after: a claim only ever turns a warm server into a node, so a
    # server warm in Nova after CA answered would be one CA saw while it was warm.
    candidates = [f"openstack:///{s.server_id}" for s in sim.nova.live_servers()]
    groups = {pid: (await ca.group_for_node("n", pid)).id for pid in candidates}
    seen = {i.id for i in await ca.nodes(group)}
    for server in warm_servers(sim):
        provider_id = f"openstack:///{server.server_id}"
        assert provider_id not in seen
        assert groups.get(provider_id, "") == ""
    nodes = node_servers(sim, group)
    assert len(nodes) <= max_size
    requests = [s.metadata.get(META_REQUEST) for s in nodes]
    assert len(requests) == len(set(requests))


BIG = {
    "id": "big",
    "min_size": 0,
    "max_size": 60,
    "flavor": "m1.small",
    "image": "ubuntu-24.04",
    "networks": ["cluster-net"],
}


def sim_group(group_id: str, max_size: int, *, region_name: str | None = None) -> dict[str, Any]:
    """A node group of the simulator's flavor, image and network, from 0 to ``max_size``; in
    the region named, when not the top-level openstack block's."""
    block: dict[str, Any] = {**BIG, "id": group_id, "max_size": max_size}
    if region_name is not None:
        block["openstack"] = {"region_name": region_name}
    return block


# Short, so that creates left in doubt by injected faults are given up within a test.
API_TIMEOUT = 2.0


def cloud_for(sim: SimulatedOpenStack, **overrides: Any) -> OpenStackCloud:
    return OpenStackCloud(settings_for(sim, **{"api_timeout": API_TIMEOUT, **overrides}))


def big_config(tmp_path: Path, **overrides: Any) -> OsasConfig:
    """One group "big" (0..60), fast reconciliation, short timeouts and doubt window."""
    values: dict[str, Any] = {
        "node_groups": [BIG],
        "queue": {"capacity": 200, "workers": 8},
        "reconcile": {
            "interval": "0.2s",
            "full_resync_interval": "1s",
            "max_inventory_age": "1h",
            "retry_backoff": "0.01s",
            "delete_retry_after": "0.5s",
            "create_doubt_window": f"{API_TIMEOUT + 1}s",
            "hold_after_start": False,  # a new cloud: see config_data
        },
        "openstack": {"api_timeout": f"{API_TIMEOUT}s"},
    }
    data = config_data(**{**values, **overrides})
    return load_config(write_config(tmp_path, data))


def ours(sim: SimulatedOpenStack, group: str = "big") -> list[FakeServer]:
    """Live servers of a group in the simulated Nova."""
    return [s for s in sim.nova.live_servers() if s.metadata.get(META_GROUP) == group]


def kept(instances: list[pb.Instance]) -> list[pb.Instance]:
    """Instances that are servers, not being deleted, without error: what CA waits for."""
    return [
        i
        for i in instances
        if i.status.instanceState != pb.InstanceStatus.instanceDeleting
        and not i.status.HasField("errorInfo")
        and i.id.startswith("openstack:///")
    ]


async def ca_loop_until(
    ca: CaClient,
    want: int,
    sim: SimulatedOpenStack,
    deadline: float,
    group: str = "big",
) -> None:
    """What CA does each loop: clean up failed creates, ask for what is missing, until Nova
    holds ``want`` servers and the target agrees."""
    while time.monotonic() < deadline:
        await ca.refresh()
        instances = await ca.nodes(group)
        failed = [i for i in instances if i.status.HasField("errorInfo")]
        if failed:
            await ca.delete(group, [(i.id, i.id) for i in failed])
        target = await ca.target_size(group)
        if target < want:
            await ca.increase(group, want - target)
        if target == want and len(kept(instances)) == want and len(ours(sim, group)) == want:
            return
        await asyncio.sleep(0.2)
    msg = f"did not converge on {want}: Nova has {len(ours(sim, group))}"
    raise AssertionError(msg)


def read_events(
    process: subprocess.Popen[str], until: str, deadline: float
) -> list[dict[str, Any]]:
    """JSON log events of an ``osas serve`` process, up to the first ``until`` event."""
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


@contextlib.contextmanager
def osas_serve(
    config: Path | str,
    *args: str,
    env: dict[str, str] | None = None,
    python_flags: tuple[str, ...] = (),
) -> Iterator[subprocess.Popen[str]]:
    """``osas serve`` as an operator runs it: a process of its own, JSON events on stderr;
    killed if still running when the block ends. ``python_flags`` go to the interpreter."""
    process = subprocess.Popen(
        [sys.executable, *python_flags, "-m", "osas", "serve", "--config", str(config), *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


def killable_config(
    tmp_path: Path, sim: SimulatedOpenStack, group: dict[str, Any], **reconcile: Any
) -> Path:
    """The configuration of ``osas serve`` processes a test kills: one group, the simulator's
    credentials, short timeouts, eight workers, quick syncs (``reconcile`` over them)."""
    data = config_data(
        openstack={"auth": sim.clouds_yaml_entry()["auth"], "api_timeout": "2s"},
        node_groups=[group],
        queue={"capacity": 50, "workers": 8},
        reconcile={
            "interval": "0.3s",
            "full_resync_interval": "1h",
            "max_inventory_age": "1h",
            "retry_backoff": "0.05s",
            **reconcile,
        },
    )
    return write_config(tmp_path, data)


class ServedOsas:
    """``osas serve`` as a process of its own, as in production: its JSON events read from
    stderr on a thread as they come (so that a chatty process never blocks on a full pipe),
    SIGKILL or SIGTERM by pid."""

    def __init__(self, config: Path, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "osas", "serve", "--config", str(config)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "(not JSON)", "line": line.rstrip()}
            with self._lock:
                self.events.append(event)

    def seen(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [event for event in self.events if event.get("event") == name]

    def wait_for(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first ``name`` event, waited for; fails with what the process said."""
        deadline = time.monotonic() + timeout
        while not (found := self.seen(name)):
            if self.process.poll() is not None and not self._reader.is_alive():
                msg = f"osas serve exited {self.process.returncode} before {name!r}"
                raise AssertionError(f"{msg}: {[e.get('event') for e in self.events][-20:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {name!r} within {timeout}s")
            time.sleep(0.05)
        return found[0]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.wait_for('grpc listening')['port']}"

    def kill(self) -> None:
        """kill -9: nothing of osas runs after this."""
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, and the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.kill()
        self._reader.join(timeout=5)
        if self.process.stderr is not None:
            self.process.stderr.close()


class NovaWatch:
    """Nova's servers of a group watched from a thread of its own (the test's event loop may
    be blocked waiting for a process): the most it ever held at once, not being deleted, and
    every request id that had two servers at once."""

    def __init__(
        self, sim: SimulatedOpenStack, group: str = "big", *, nodes_only: bool = False
    ) -> None:
        self.sim = sim
        self.group = group
        self.nodes_only = nodes_only  # warm servers (``osas-warm``) are not nodes: left out
        self.most = 0
        self.twice: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def live(self) -> list[FakeServer]:
        return [
            s
            for s in self.sim.nova.live_servers()
            if s.metadata.get(META_GROUP) == self.group
            and s.deleting_since is None
            and not (self.nodes_only and META_WARM in s.metadata)
        ]

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            servers = self.live()
            self.most = max(self.most, len(servers))
            counts = Counter(s.metadata.get(META_REQUEST) for s in servers)
            self.twice |= {request for request, n in counts.items() if n > 1 and request}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


async def increase_once_allowed(ca: CaClient, group: str, delta: int, timeout: float) -> None:
    """IncreaseSize, sent again while headroom is held after a start or a takeover
    (FAILED_PRECONDITION, the reason saying for how long)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await ca.increase(group, delta)
        except grpc.aio.AioRpcError as error:
            held = error.code() is grpc.StatusCode.FAILED_PRECONDITION
            if not held or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
        else:
            return


def write_clouds_yaml(
    sim: SimulatedOpenStack,
    path: Path,
    credential_id: str = APP_CREDENTIAL_ID,
    secret: str = APP_CREDENTIAL_SECRET,
) -> None:
    """The simulator's application-credential entry as the clouds.yaml at ``path``, replaced
    whole as the kubelet updates a Secret's volume (a new file in its place)."""
    entry = sim.clouds_yaml_entry(application_credential=True)
    entry["auth"].update(
        application_credential_id=credential_id, application_credential_secret=secret
    )
    staging = path.with_name(f".{path.name}.new")
    staging.write_text(yaml.safe_dump({"clouds": {CLOUD_NAME: entry}}))
    staging.replace(path)


def rotate_application_credential(
    sim: SimulatedOpenStack, path: Path, old_id: str, new_id: str
) -> None:
    """As an operator rotates it: a new application credential made, the clouds.yaml osas
    reads replaced, the old credential deleted (and every token issued from it)."""
    identity = sim.identity
    user = identity.application_credentials[old_id].user
    secret = f"secret-{new_id}"
    identity.add_application_credential(new_id, secret, user, name=new_id)
    write_clouds_yaml(sim, path, new_id, secret)
    identity.delete_application_credential(old_id)


# The lines ``osas status`` shows in three states an operator meets, as docs/operations.md
# shows them from real runs: the tests that bring each state about check the live screen
# with them, and tests/test_operations.py checks the docs' screens.
STATUS_SCREENS: dict[str, tuple[str, ...]] = {
    "an unreachable cloud": (
        r"^cluster \S+ \(config \S+\)$",
        (
            r"^osas \S+: NOT READY: first sync with OpenStack not done yet: failing for \d+s "
            r"\(\d+ attempt\(s\) failed\), the last: cannot reach http\S+: connection refused: "
            r"nothing listens at that address and port; check the address"
        ),
        r"^last sync never; 0 full, 0 incremental, \d+ failed$",
        r"^OpenStack FAILING for \d+s \(\d+ in a row\); last error: above$",
        r"^quota headroom: not read \(not yet, or it cannot be: see the log; ",
    ),
    "a stuck server": (
        r"^cluster \S+",
        r"^quota headroom: (\S+ no limit, )*\S+ no limit \(MAX is max_size\)$",
        r"^servers needing a person: error 0, build-stuck 1, ",
        (
            r"^  build-stuck \S+/\S+ \(id [0-9a-f-]{36}, \d+[smh] old, for \d+[smh]\): in "
            r"BUILD longer than reconcile\.stuck_build_after \(\S+\)$"
        ),
    ),
    "a rejected reload": (
        r"^cluster \S+ \(config \S+\)$",
        (
            r"^configuration reload REJECTED \d+[smh] ago \(\S+\); the configuration loaded "
            r"before stays in force:$"
        ),
        (
            r"^  \S+: node_groups\[0\]\(workers\): min_size \d+ is greater than max_size \d+ "
            r"\(line \d+\)$"
        ),
    ),
}


def assert_status_screen(state: str, screen: str) -> None:
    """``screen`` has every line ``STATUS_SCREENS`` holds for ``state``."""
    missing = [line for line in STATUS_SCREENS[state] if not re.search(line, screen, re.MULTILINE)]
    assert not missing, f"{state}: no line matches {missing} in\n{screen}"


def sdk_connection(sim: SimulatedOpenStack, **overrides: Any) -> openstack.connection.Connection:
    """Unmodified openstacksdk connected to ``sim`` as osas's user, in its first region."""
    values: dict[str, Any] = {
        "auth_url": sim.auth_url,
        "username": "osas",
        "password": DEFAULT_PASSWORD,
        "project_name": "k8s",
        "user_domain_name": "Default",
        "project_domain_name": "Default",
        "region_name": "RegionOne",
    }
    values.update(overrides)
    return openstack.connect(**values)
