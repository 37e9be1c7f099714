"""Warm pools against cold creates: IncreaseSize to the request that starts a node, and to the
node's server ACTIVE and joined, for a node group with a warm pool beside one without.

Separate processes, as in a cluster: the simulated OpenStack (this module's ``--cloud``: the
simulator with a record of every request that concerns one server, each stamped when it reached
the simulator, and a watcher noting when each server turns ACTIVE and when its guest writes
``osas-node-joined``), ``osas serve`` against it with mTLS, a bare openstacksdk client (this
module's ``--bare``), and CA's side (a gRPC client in this process). osas serves two node groups
of the same flavor, image and user data: ``warm`` with a warm pool of ``pool`` servers kept shut
off, ``cold`` without one. Its syncs run every ``interval`` seconds (the default is 10 s: the
pool refills in more passes, which only the waits between scale-ups would feel).

Each round, for every size n from 1 to ``largest``, the two groups take turns (in an order that
turns round by round): once the warm pool is full in Nova and osas says so (its ``/status``: the
last sync's warm servers, the keeper's last pass), nothing of it under way, CA's side calls
NodeGroupIncreaseSize(n) on the group, and waits until the simulator has been sent the n
requests that start the nodes (a claimed warm server's ``os-start``, or a cold ``POST
/servers``) and has seen each server ACTIVE and joined. Then, once the pool is full again, the
bare client does what osas did, from a standing start, with as many threads as nodes and one
openstacksdk connection among them (as osas's adapter does): for a warm scale-up, per node a GET
of the server, a PUT of its metadata (replacing all of it, with as many keys as a claim writes)
and the ``os-start`` action, on servers of another cluster kept shut off; for a cold one, per
node the POST of a server with the body osas sends. Every time comes from the wall clock of one
machine: the bench's (IncreaseSize sent and answered, the bare client's start) and the
simulator's (when a request reached it; when the watcher, every ``WATCH`` seconds, first saw a
server ACTIVE or joined).

The cloud's timings are real clouds' orders of magnitude (``Timings``), scaled down ``scale``
times so that the phase runs in a minute or two; the report gives both the measured (scaled)
figures and the unscaled ones: osas's own part as measured (real time, never scaled) plus the
simulator's part after the start request times ``scale``. The simulated guest joins the moment
it boots; the time a real node then takes to join (cloud-init and kubeadm on a cold node's first
boot; kubelet's start and the join on a prepared one) is added as stated.

``python -m osas.bench.warm [--largest N] [--rounds R] [--pool P] [--scale S] [--rate-limit R]
[--out PATH]`` measures this alone and rewrites only its section of the report (``osas bench
--warm-only`` too; ``osas bench`` measures it with everything else).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import openstack
import openstack.connection
import openstack.exceptions
import requests
import yaml
from openstack import utils as sdk_utils

from osas.bench.client import Call, Client
from osas.bench.processes import (
    Osas,
    Setup,
    Tls,
    kit,
    machine,
    osas_config,
    serve_osas,
)
from osas.bench.report import replace_marked_section
from osas.cloud.openstack_settings import OpenStackSettings
from osas.domain.servers import META_CLAIMED, META_CLUSTER, META_GROUP, META_WARM
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova
from osas.sim.routing import Response
from osas.sim.server import DEFAULT_DOMAIN, DEFAULT_PASSWORD, DEFAULT_PROJECT, DEFAULT_USER

BEGIN = "<!-- warm pools: osas bench, osas bench --warm-only, or python -m osas.bench.warm -->"
END = "<!-- end of warm pools -->"
WARM, COLD = "warm", "cold"  # the two node groups
FLAVOR, IMAGE, NETWORK = "m1.small", "ubuntu-24.04", "cluster-net"  # both groups'
USER_DATA = (
    "#cloud-config\n"
    "# osas's per-boot script: prepare and power off while osas-warm is in the metadata,\n"
    "# else join with the labels and taints osas wrote there.\n"
    "runcmd:\n"
    "  - [sh, -c, 'echo booting ${server_name}']\n"
)
WATCH = 0.002  # seconds between two looks of the simulator's watcher
POLL = 0.1  # how often the bench asks the simulator or osas whether a step is done
_WAIT = 120.0  # the longest a scale-up or a refill of the pool may take
BARE_CLUSTER = "bare"  # the marks of the bare client's servers (not osas's cluster)
BARE_KEY = "osas-bench-bare"  # metadata naming each of the bare client's creates
# The requests that concern servers, on the simulator's paths (its regions' too).
_SERVER_PATH = re.compile(r"/servers(?:/([0-9a-f-]{36}))?(?:/(action|metadata))?$")


@dataclass(frozen=True)
class Timings:
    """A real cloud's timings (seconds), unscaled: orders of magnitude, not one cloud's."""

    build: float = 40.0  # a cold create to ACTIVE: scheduling, the image on the host, spawn
    first_join: float = 60.0  # a cold node's first boot: cloud-init, packages, images, join
    start: float = 10.0  # os-start of a stopped server to ACTIVE
    warm_join: float = 20.0  # a prepared server's boot: kubelet started, kubeadm join
    prepare: float = 90.0  # a refill's first boot: packages and images, then poweroff
    power_off: float = 5.0  # the guest's poweroff until Nova shows the server SHUTOFF


@dataclass(frozen=True)
class Plan:
    largest: int = 5  # scale-ups of 1 .. largest nodes
    rounds: int = 3  # each size, each group, once a round
    pool: int | None = None  # the warm pool's size; None: largest (every scale-up claimed)
    scale: float = 40.0  # the cloud's timings divided by this
    interval: float = 1.0  # osas's reconcile.interval (its syncs, the pool's passes)
    rate_limit: float | None = None  # osas's openstack.rate_limit; None: its default
    timings: Timings = field(default_factory=Timings)

    @property
    def pool_size(self) -> int:
        return self.largest if self.pool is None else self.pool

    def scaled(self, seconds: float) -> float:
        return seconds / self.scale


QUICK = Plan(largest=3, rounds=2)


def pace(plan: Plan) -> float:
    """osas's requests to the cloud a second (``osas.cloud.pacing``)."""
    return OpenStackSettings().rate_limit if plan.rate_limit is None else plan.rate_limit


# -- the cloud: a process of its own ----------------------------------------------------------


class TimedOpenStack(SimulatedOpenStack):
    """The simulator, keeping every request that concerns a server (when it reached the
    simulator, what it asked) and, from a watcher, when each server turned ACTIVE and when its
    guest joined. ``GET /_bench/warm?since=I`` answers the requests from index I, and every
    server's turns to ACTIVE and joins so far."""

    def __init__(self, nova: FakeNova) -> None:
        super().__init__(nova)
        self._records: list[list[Any]] = []
        self._active: dict[str, list[float]] = {}
        self._joined: dict[str, float] = {}
        self._record_lock = threading.Lock()
        self._stop_watching = threading.Event()

    def dispatch(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> Response:
        arrived = time.time()
        if target.startswith("/_bench/"):
            return self._bench(target)
        response = super().dispatch(method, target, headers, body)
        record = self._record(arrived, method, target, body, response)
        if record is not None:
            with self._record_lock:
                self._records.append(record)
        return response

    def _record(
        self, arrived: float, method: str, target: str, body: bytes, response: Response
    ) -> list[Any] | None:
        """[arrived, answered, method, kind, server id, group, mark, status]; None for what
        concerns no one server (listings, tokens)."""
        found = _SERVER_PATH.search(urlsplit(target).path)
        if found is None:
            return None
        server_id, sub = found.group(1) or "", found.group(2)
        kind, group, mark = "", "", ""
        if not server_id:
            if method != "POST":
                return None
            kind = "create"
            with suppress(ValueError, KeyError, TypeError, AttributeError):
                metadata = json.loads(body)["server"].get("metadata") or {}
                group = str(metadata.get(META_GROUP, ""))
                mark = "warm" if META_WARM in metadata else str(metadata.get(BARE_KEY, ""))
            with suppress(ValueError, KeyError, TypeError):
                server_id = str(json.loads(response.body)["server"]["id"])
        elif sub is None:
            kind = {"GET": "get", "DELETE": "delete"}.get(method, "")
        elif sub == "metadata":
            kind = "metadata"
            with suppress(ValueError, KeyError, TypeError, AttributeError):
                if META_CLAIMED in (json.loads(body).get("metadata") or {}):
                    mark = "claim"
        else:
            with suppress(ValueError, StopIteration, AttributeError, TypeError):
                kind = f"action:{next(iter(json.loads(body)))}"
        if not kind:
            return None
        if kind.startswith("action:"):  # the server's group, for os-start
            server = self.nova.find_server(server_id)
            if server is not None:
                group = server.metadata.get(META_GROUP, "")
        return [arrived, time.time(), method, kind, server_id, group, mark, response.status]

    def _bench(self, target: str) -> Response:
        split = urlsplit(target)
        if split.path == "/_bench/pool":
            return Response.json(200, self._pool(parse_qs(split.query).get("group", [""])[0]))
        if split.path != "/_bench/warm":
            return Response.json(404, {"error": "not served"})
        since = parse_qs(split.query).get("since", ["0"])[0]
        with self._record_lock:
            start = len(self._records) if since == "end" else int(since)
            return Response.json(
                200,
                {
                    "requests": self._records[start:],
                    "next": len(self._records),
                    "active": self._active,
                    "joined": self._joined,
                },
            )

    def _pool(self, group: str) -> dict[str, int]:
        """The group's servers with the warm mark: all of them, and those ready (shut off,
        nothing under way)."""
        warm = [
            s
            for s in self.nova.live_servers()
            if META_WARM in s.metadata and s.metadata.get(META_GROUP) == group
        ]
        ready = [s for s in warm if s.status == "SHUTOFF" and s.task_state is None]
        return {"servers": len(warm), "ready": len(ready)}

    def watch(self) -> None:
        """Note, every ``WATCH`` seconds, the servers that turned ACTIVE (no task under way)
        and the guests that joined since the last look."""
        was_active: dict[str, bool] = {}
        had_joined: dict[str, bool] = {}
        while not self._stop_watching.wait(WATCH):
            with self.nova.lock:
                seen = [
                    (s.server_id, s.status == "ACTIVE" and s.task_state is None, s.guest.joined)
                    for s in self.nova.live_servers()
                ]
            now = time.time()
            with self._record_lock:
                for server_id, active, joined in seen:
                    if active and not was_active.get(server_id, False):
                        self._active.setdefault(server_id, []).append(now)
                    was_active[server_id] = active
                    # A server first seen joined (seeded so) is no join seen.
                    if joined and had_joined.get(server_id) is False:
                        self._joined[server_id] = now
                    had_joined[server_id] = joined

    def stop_watching(self) -> None:
        self._stop_watching.set()


def _cloud_main(settings: dict[str, Any]) -> int:
    nova = FakeNova(build_seconds=settings["build"])
    nova.start_seconds = settings["start"]
    nova.stop_seconds = settings["power_off"]
    nova.warm_prepare_seconds = settings["prepare"]
    bare = [
        nova.seed(
            name=f"bare-{index}", metadata={META_CLUSTER: BARE_CLUSTER}, status="SHUTOFF"
        ).server_id
        for index in range(int(settings["bare_servers"]))
    ]
    simulator = TimedOpenStack(nova)
    with simulator:
        watcher = threading.Thread(target=simulator.watch, daemon=True, name="watcher")
        watcher.start()
        info = {"auth_url": simulator.auth_url, "base_url": simulator.base_url, "bare": bare}
        sys.stdout.write(json.dumps(info) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the benchmark closes it (or dies)
        simulator.stop_watching()
        watcher.join()
    return 0


# -- the bare client: a process of its own ----------------------------------------------------


def _connect(auth_url: str) -> openstack.connection.Connection:
    return openstack.connect(
        auth_url=auth_url,
        username=DEFAULT_USER,
        password=DEFAULT_PASSWORD,
        project_name=DEFAULT_PROJECT,
        user_domain_name=DEFAULT_DOMAIN,
        project_domain_name=DEFAULT_DOMAIN,
        load_yaml_config=False,
        load_envvars=False,
    )


def _claim_metadata(group: str) -> dict[str, str]:
    """As many keys as osas's claim writes (marks, claim time, labels), another cluster's."""
    return {
        META_CLUSTER: BARE_CLUSTER,
        META_GROUP: group,
        "osas-request-id": uuid.uuid4().hex,
        META_CLAIMED: str(int(time.time())),
        "osas-node-labels": f"osas/node-group={group}",
    }


def _bare_main(auth_url: str, workers: int) -> int:
    """Claims and creates on command (one JSON line on stdin each), each of n nodes in a
    thread of its own over one connection; answers with the wall clock it began at."""
    conn = _connect(auth_url)
    version = sdk_utils.maximum_supported_microversion(conn.compute, "2.100")
    flavor = conn.compute.find_flavor(FLAVOR, ignore_missing=False)
    image = conn.image.find_image(IMAGE, ignore_missing=False)
    network = conn.network.find_network(NETWORK, ignore_missing=False)
    once = {"connect_retries": 0, "status_code_retries": 0, "retriable_status_codes": []}

    def claim(server_id: str) -> None:
        conn.compute.get_server(server_id)
        answer = conn.compute.put(
            f"/servers/{server_id}/metadata",
            json={"metadata": _claim_metadata("bare")},
            microversion=version,
            raise_exc=False,
        )
        openstack.exceptions.raise_from_response(answer)
        answer = conn.compute.post(
            f"/servers/{server_id}/action",
            json={"os-start": None},
            microversion=version,
            raise_exc=False,
            **once,
        )
        openstack.exceptions.raise_from_response(answer)

    def create(tag: str) -> None:
        metadata = {**_claim_metadata("bare"), BARE_KEY: tag}
        del metadata[META_CLAIMED]
        server = {
            "name": f"bare-{tag}",
            "flavorRef": flavor.id,
            "imageRef": image.id,
            "networks": [{"uuid": network.id}],
            "metadata": metadata,
            "tags": [f"{META_CLUSTER}={BARE_CLUSTER}"],
            "user_data": "I2Nsb3VkLWNvbmZpZwo=",
        }
        answer = conn.compute.post(
            "/servers", json={"server": server}, microversion=version, raise_exc=False, **once
        )
        openstack.exceptions.raise_from_response(answer)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bare") as pool:
        list(pool.map(lambda _: conn.compute.get("/flavors"), range(workers)))  # warm
        sys.stdout.write(json.dumps({"ready": True}) + "\n")
        sys.stdout.flush()
        for line in sys.stdin:
            command = json.loads(line)
            began = time.time()
            if "claim" in command:
                list(pool.map(claim, command["claim"]))
            else:
                list(pool.map(create, command["create"]))
            sys.stdout.write(json.dumps({"began": began}) + "\n")
            sys.stdout.flush()
    return 0


class Bare:
    """The bare client's process: a command in, the wall clock it began at out."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def ask(self, command: dict[str, Any]) -> float:
        stdin, stdout = self.process.stdin, self.process.stdout
        if stdin is None or stdout is None:
            msg = "the bare client has no pipes"
            raise RuntimeError(msg)
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            msg = "the bare client exited"
            raise RuntimeError(msg)
        return float(json.loads(line)["began"])


@contextmanager
def bare_client(auth_url: str, workers: int) -> Iterator[Bare]:
    command = [sys.executable, "-m", "osas.bench.warm", "--bare", auth_url, str(workers)]
    process = subprocess.Popen(  # noqa: S603 - our own module, arguments we build
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        if not (process.stdout and process.stdout.readline()):
            msg = "the bare client exited before it was ready"
            raise RuntimeError(msg)
        yield Bare(process)
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


# -- what was measured ------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One node of one of osas's scale-ups (wall clock, seconds since the epoch)."""

    group: str
    claimed: bool  # a warm server claimed; else a cold create
    size: int  # the scale-up's n
    called: float  # IncreaseSize sent
    answered: float  # IncreaseSize's answer read
    start: float  # the request that starts it (os-start, or the create) reached Nova
    read: float | None  # a claim's GET reached Nova
    written: float | None  # a claim's PUT of the metadata reached Nova
    active: float  # the watcher first saw the server ACTIVE after the start request
    joined: float  # the watcher first saw its guest joined


@dataclass(frozen=True)
class BareNode:
    """One node of the bare client's (wall clock)."""

    claimed: bool
    size: int
    began: float
    start: float  # its os-start, or its create, reached Nova
    read: float | None  # a claim's GET reached Nova
    written: float | None  # a claim's PUT of the metadata reached Nova


@dataclass(frozen=True)
class ScaleUp:
    group: str
    size: int
    ready: int  # servers ready in the warm pool before it, as osas's /status said
    claimed: int
    cold: int


@dataclass
class WarmResult:
    plan: Plan
    nodes: list[Node] = field(default_factory=list)
    bare: list[BareNode] = field(default_factory=list)
    scale_ups: list[ScaleUp] = field(default_factory=list)
    seconds: float = 0.0  # the measure's own wall time

    def _osas(self, group: str, claimed: bool) -> list[Node]:
        return [n for n in self.nodes if n.group == group and n.claimed is claimed]

    def series(self) -> dict[str, list[float]]:
        """Every figure's samples: milliseconds (``*_ms``) or seconds (``*_s``)."""
        plan, t = self.plan, self.plan.timings
        warm, cold = self._osas(WARM, claimed=True), self._osas(COLD, claimed=False)
        bare_warm = [b for b in self.bare if b.claimed]
        bare_cold = [b for b in self.bare if not b.claimed]
        found: dict[str, list[float]] = {
            "increase_ms": [(n.answered - n.called) * 1000 for n in self.nodes],
            "warm_to_start_ms": [(n.start - n.answered) * 1000 for n in warm],
            "cold_to_start_ms": [(n.start - n.answered) * 1000 for n in cold],
            "bare_warm_to_start_ms": [(b.start - b.began) * 1000 for b in bare_warm],
            "bare_cold_to_start_ms": [(b.start - b.began) * 1000 for b in bare_cold],
        }
        # A claim's steps, each reaching Nova: its GET, its PUT, its os-start.
        for node in warm:
            for key, value in _steps(node, node.answered).items():
                found.setdefault(f"{key}_ms", []).append(value * 1000)
        for bare in bare_warm:
            for key, value in _steps(bare, bare.began).items():
                found.setdefault(f"bare_{key}_ms", []).append(value * 1000)
        for name, nodes, join in (("warm", warm, t.warm_join), ("cold", cold, t.first_join)):
            found[f"{name}_start_s"] = [n.start - n.called for n in nodes]
            found[f"{name}_active_s"] = [n.active - n.called for n in nodes]
            found[f"{name}_joined_s"] = [n.joined - n.called + plan.scaled(join) for n in nodes]
            # osas's part as measured, the simulator's after the start request unscaled.
            found[f"{name}_active_unscaled_s"] = [
                n.start - n.called + (n.active - n.start) * plan.scale for n in nodes
            ]
            found[f"{name}_joined_unscaled_s"] = [
                n.start - n.called + (n.joined - n.start) * plan.scale + join for n in nodes
            ]
        return found


def _steps(node: Node | BareNode, began: float) -> dict[str, float]:
    """A claim's steps (seconds): to its GET reaching Nova, from there to its PUT, from there
    to its os-start, and from its GET to its os-start; none when a step was not seen."""
    if node.read is None or node.written is None:
        return {}
    return {
        "to_read": node.read - began,
        "read_to_written": node.written - node.read,
        "written_to_start": node.start - node.written,
        "claim_trips": node.start - node.read,
    }


def percentile(values: list[float], share: float) -> float:
    """The value ``share`` of the way through the sorted values (nearest rank below): with
    fewer than 100 values, p99 is the largest."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else math.nan


# -- the measure --------------------------------------------------------------------------------


def _sim(sim: dict[str, Any], since: int | str) -> dict[str, Any]:
    answer = requests.get(f"{sim['base_url']}/_bench/warm?since={since}", timeout=30)
    answer.raise_for_status()
    return dict(answer.json())


def _latest_before(
    records: list[list[Any]], server_id: str, kind: str, before: float, mark: str | None = None
) -> float | None:
    times = [
        r[0]
        for r in records
        if r[4] == server_id and r[3] == kind and r[0] <= before and (mark is None or r[6] == mark)
    ]
    return max(times) if times else None


def _starts(records: list[list[Any]], group: str) -> list[tuple[float, str, bool]]:
    """The requests that started nodes of the group, in order: (reached Nova, server id,
    claimed). Refills of the warm pool start nothing: their guest prepares and powers off."""
    found = []
    for arrived, _, _, kind, server_id, of_group, mark, status in records:
        if of_group != group or not 200 <= status < 300:  # noqa: PLR2004
            continue
        if kind == "create" and mark != "warm":
            found.append((arrived, server_id, False))
        elif kind == "action:os-start":
            found.append((arrived, server_id, True))
    return found


def _turned(seen: dict[str, Any], server_id: str, after: float) -> tuple[float, float] | None:
    """When the server turned ACTIVE after ``after``, and when its guest joined."""
    active = next((t for t in seen["active"].get(server_id, []) if t >= after), None)
    joined = seen["joined"].get(server_id)
    return None if active is None or joined is None else (active, joined)


def _nodes_of(
    seen: dict[str, Any], group: str, size: int, called: float, answered: float
) -> list[Node] | None:
    """The scale-up's nodes once all are ACTIVE and joined; None until then."""
    records = seen["requests"]
    starts = _starts(records, group)
    if len(starts) < size:
        return None
    nodes = []
    for arrived, server_id, claimed in starts[:size]:
        turned = _turned(seen, server_id, arrived)
        if turned is None:
            return None
        read = written = None
        if claimed:
            written = _latest_before(records, server_id, "metadata", arrived, "claim")
            read = None if written is None else _latest_before(records, server_id, "get", written)
        nodes.append(Node(group, claimed, size, called, answered, arrived, read, written, *turned))
    return nodes


def increase(group: str, delta: int) -> Call:
    request = pb.NodeGroupIncreaseSizeRequest(id=group, delta=delta).SerializeToString()
    return Call("NodeGroupIncreaseSize", request, pb.NodeGroupIncreaseSizeResponse)


async def scale_up(
    client: Client, sim: dict[str, Any], group: str, size: int, ready: int
) -> tuple[ScaleUp, list[Node]]:
    """IncreaseSize(size) on the group, until each of its nodes is ACTIVE and joined."""
    since = _sim(sim, "end")["next"]
    called = time.time()
    await client.call(increase(group, size))
    answered = time.time()
    deadline = time.monotonic() + _WAIT
    while True:
        seen = _sim(sim, since)
        nodes = _nodes_of(seen, group, size, called, answered)
        if nodes is not None:
            claimed = sum(1 for n in nodes if n.claimed)
            return ScaleUp(group, size, ready, claimed, size - claimed), nodes
        if time.monotonic() > deadline:
            found = len(_starts(seen["requests"], group))
            msg = f"IncreaseSize({size}) on {group}: {found} start(s) in {_WAIT:.0f} s"
            raise RuntimeError(msg)
        await asyncio.sleep(POLL)


def bare_scale_up(
    bare: Bare, sim: dict[str, Any], size: int, servers: list[str] | None
) -> list[BareNode]:
    """The bare client's claims of ``servers``, or its ``size`` creates, at once."""
    since = _sim(sim, "end")["next"]
    if servers is not None:
        began = bare.ask({"claim": servers})
    else:
        tag = uuid.uuid4().hex[:12]
        began = bare.ask({"create": [f"{tag}-{i}" for i in range(size)]})
    records = _sim(sim, since)["requests"]
    found = []
    for arrived, _, _, kind, server_id, _, mark, _ in records:
        if servers is not None and kind == "action:os-start" and server_id in servers:
            written = _latest_before(records, server_id, "metadata", arrived)
            read = None if written is None else _latest_before(records, server_id, "get", written)
            found.append(
                BareNode(
                    claimed=True, size=size, began=began, start=arrived, read=read, written=written
                )
            )
        elif servers is None and kind == "create" and mark.startswith(tag):
            found.append(
                BareNode(
                    claimed=False, size=size, began=began, start=arrived, read=None, written=None
                )
            )
    if len(found) != size:
        msg = f"the bare client's {size} node(s): {len(found)} reached the simulator"
        raise RuntimeError(msg)
    return found


def pool_status(osas: Osas) -> dict[str, Any]:
    answer = requests.get(f"http://127.0.0.1:{osas.metrics}/status", timeout=10)
    answer.raise_for_status()
    for group in answer.json()["groups"]:
        if group["id"] == WARM:
            return dict(group["warm_pool"])
    msg = "osas's /status shows no warm group"
    raise RuntimeError(msg)


async def pool_full(osas: Osas, sim: dict[str, Any], size: int) -> int:
    """Until the warm pool holds ``size`` ready servers in Nova and nothing else, and osas
    says so too: its inventory (the last sync) holds those servers alone, its keeper's last
    pass found them ready, nothing preparing or refilling. The servers ready, as osas says."""
    deadline = time.monotonic() + _WAIT
    while True:
        answer = requests.get(f"{sim['base_url']}/_bench/pool?group={WARM}", timeout=10)
        answer.raise_for_status()
        nova = answer.json()
        pool = pool_status(osas) if nova == {"servers": size, "ready": size} else {}
        if (
            pool.get("by_status") == {"SHUTOFF": size}
            and pool.get("ready") == pool.get("wanted") == size
            and not pool.get("preparing")
            and not pool.get("refilling")
        ):
            return int(pool["ready"])
        if time.monotonic() > deadline or osas.process.poll() is not None:
            msg = f"the warm pool did not fill in {_WAIT:.0f} s: Nova {nova}, osas {pool}"
            raise RuntimeError(msg)
        await asyncio.sleep(POLL)


def write_config(setup: Setup, plan: Plan) -> tuple[Path, int, int, int]:
    """``osas_config``'s configuration, both groups given user data and labels, the warm one
    its pool, and syncs every ``interval``."""
    path, port, health, metrics = osas_config(
        setup, metrics=True, reconcile={"interval": f"{plan.interval:g}s"}
    )
    data = yaml.safe_load(path.read_text())
    for group in data["node_groups"]:
        group["user_data"] = USER_DATA
        group["labels"] = {"osas/node-group": group["id"]}
        if group["id"] == WARM:
            group["warm_pool"] = {"size": plan.pool_size}
    if plan.rate_limit is not None:
        data["openstack"]["rate_limit"] = plan.rate_limit
    path.write_text(yaml.safe_dump(data))
    return path, port, health, metrics


async def serve(setup: Setup, plan: Plan) -> Osas:
    config, port, health, metrics = write_config(setup, plan)
    return await serve_osas(setup, config, port, health, "osas-warm", metrics)


async def measure_warm(plan: Plan, tls: Tls, folder: Path) -> WarmResult:
    result = WarmResult(plan)
    began = time.perf_counter()
    cloud = {
        "build": plan.scaled(plan.timings.build),
        "start": plan.scaled(plan.timings.start),
        "prepare": plan.scaled(plan.timings.prepare),
        "power_off": plan.scaled(plan.timings.power_off),
        "bare_servers": plan.rounds * plan.largest * (plan.largest + 1) // 2,
    }
    print(f"== warm pools: scale-ups of 1..{plan.largest}, {plan.rounds} rounds", flush=True)  # noqa: T201
    with kit("osas.bench.warm", "--cloud", json.dumps(cloud)) as sim:
        setup = Setup(folder, tls, sim, [WARM, COLD])
        spare: list[str] = list(sim["bare"])
        osas = await serve(setup, plan)
        client = Client(osas.port, tls)
        try:
            with bare_client(sim["auth_url"], plan.largest) as bare:
                for index in range(plan.rounds):
                    for size in range(1, plan.largest + 1):
                        order = (WARM, COLD) if (index + size) % 2 == 0 else (COLD, WARM)
                        for group in order:
                            ready = await pool_full(osas, sim, plan.pool_size)
                            made, nodes = await scale_up(client, sim, group, size, ready)
                            result.scale_ups.append(made)
                            result.nodes += nodes
                            await pool_full(osas, sim, plan.pool_size)
                            servers = None
                            if group == WARM:
                                servers, spare = spare[:size], spare[size:]
                            result.bare += bare_scale_up(bare, sim, size, servers)
                    print(f"   round {index + 1} of {plan.rounds}", flush=True)  # noqa: T201
        finally:
            await client.close()
            osas.stop()
    result.seconds = time.perf_counter() - began
    return result


# -- the report ---------------------------------------------------------------------------------


def _ms(values: list[float], share: float) -> str:
    value = percentile(values, share)
    return "—" if math.isnan(value) else f"{value:.1f} ms"


def _s(values: list[float], share: float) -> str:
    value = percentile(values, share)
    return "—" if math.isnan(value) else f"{value:.2f} s"


def _x(top: float, bottom: float) -> str:
    if math.isnan(top) or math.isnan(bottom) or bottom <= 0:
        return "—"
    return f"{top / bottom:.1f}x"


def _p50(values: list[float]) -> float:
    return percentile(values, 0.5)


def _by_size(result: WarmResult, size: int) -> list[str]:
    """p50 to the start request of one size's nodes: warm (osas, bare), cold (osas, bare)."""
    cells = []
    for group, claimed in ((WARM, True), (COLD, False)):
        mine = [
            (n.start - n.answered) * 1000
            for n in result.nodes
            if n.size == size and n.group == group and n.claimed is claimed
        ]
        bare = [
            (b.start - b.began) * 1000
            for b in result.bare
            if b.size == size and b.claimed is claimed
        ]
        cells += [_ms(mine, 0.5), _ms(bare, 0.5)]
    return cells


_OWN_ROWS = (
    ("IncreaseSize answered, cold", "`POST /servers` at Nova", "cold_to_start_ms"),
    ("IncreaseSize answered, warm", "`os-start` at Nova", "warm_to_start_ms"),
    ("IncreaseSize answered, warm", "the claim's GET at Nova", "to_read_ms"),
    ("the claim's GET at Nova", "its PUT at Nova", "read_to_written_ms"),
    ("the claim's PUT at Nova", "`os-start` at Nova", "written_to_start_ms"),
    ("the claim's GET at Nova", "`os-start` at Nova", "claim_trips_ms"),
)
_END_TO_END = (
    ("the start request at Nova", "start_s"),
    ("ACTIVE, measured (scaled)", "active_s"),
    ("joined, measured (scaled)", "joined_s"),
    ("ACTIVE, unscaled", "active_unscaled_s"),
    ("joined, unscaled", "joined_unscaled_s"),
)


def section(result: WarmResult, info: dict[str, str]) -> list[str]:
    """The report's section: osas's own time to the start request beside the bare client's,
    by scale-up size, and IncreaseSize to ACTIVE and joined, scaled and unscaled."""
    plan, t, s = result.plan, result.plan.timings, result.series()
    warm_ups = [u for u in result.scale_ups if u.group == WARM]
    claimed, cold_in_warm = sum(u.claimed for u in warm_ups), sum(u.cold for u in warm_ups)
    rate = pace(plan)
    changed_pace = (
        ""
        if plan.rate_limit is None
        else f" and its `openstack.rate_limit`, {rate:g}/s rather than "
        f"{OpenStackSettings().rate_limit:g}/s"
    )
    lines = [
        BEGIN,
        "## Warm pools: IncreaseSize to start, cold against warm",
        "",
        (
            "Separate processes on 127.0.0.1: the simulated OpenStack (`python -m "
            "osas.bench.warm --cloud`: the simulator, keeping when each request that concerns "
            "a server reached it, with a watcher that notes every "
            f"{WATCH * 1000:g} ms which servers turned ACTIVE and which guests joined), "
            "`osas serve` against it with mTLS, a bare openstacksdk client (`--bare`) and CA's "
            "side (a gRPC client). osas serves two node groups of the same flavor, image and "
            f"user data: `{WARM}`, with a warm pool of {plan.pool_size} servers kept shut off, "
            f"and `{COLD}`, without one. osas is at its defaults (10 queue workers) but for "
            f"its syncs, every {plan.interval:g} s rather than 10 s (the pool refills in fewer "
            f"passes, which only the waits between scale-ups feel){changed_pace}. "
            f"{plan.rounds} rounds; in each, for every n from 1 to "
            f"{plan.largest}, each group in turn (the order turns round by round), once the "
            "pool is full in Nova and osas says so (its `/status`: the last sync's warm "
            "servers, the pool's last pass), nothing of it under way: "
            "NodeGroupIncreaseSize(n), then a wait until the n nodes are ACTIVE and joined. "
            "After each, once the pool is full again, the bare client does the same work from "
            "a standing start, n threads over one connection as osas's adapter has: per node "
            "a GET of the server, a PUT replacing its metadata (as many keys as a claim "
            "writes) and the `os-start` action, on shut-off servers of another cluster; or per "
            "node the POST of a server with osas's body. All times are one machine's wall "
            "clock: the bench's (IncreaseSize sent, its answer read, the bare client's start) "
            "and the simulator's (a request reaching it; a server seen ACTIVE or joined, to "
            f"{WATCH * 1000:g} ms). {len(result.scale_ups)} scale-ups: "
            f"{len(s['warm_to_start_ms'])} warm nodes claimed, {len(s['cold_to_start_ms'])} "
            f"cold; {cold_in_warm} of the warm group's {claimed + cold_in_warm} nodes were "
            f"created cold. {info['date']}, {info['cpu']}, {info['cores']} cores; the measure "
            f"took {result.seconds / 60:.1f} min."
        ),
        "",
        "### osas's own time: IncreaseSize's answer to the request that starts the node",
        "",
        (
            "For the warm group the `os-start` of the claimed server reaching Nova, after the "
            "claim's GET and PUT of its metadata; for the cold group its `POST /servers`. The "
            "bare client's from its start, for the same requests. Every node of every size; "
            "p99 over fewer than 100 nodes is the largest. osas / bare: the p50s' ratio (1.0x: "
            "osas adds nothing to the round trips themselves). osas spaces all its requests to "
            f"a cloud {1000 / rate:g} ms apart (1 / `openstack.rate_limit`, "
            "`osas.cloud.pacing`: never a burst), its syncs' and the pool's included; the "
            "bare client does not."
        ),
        "",
        "| from | to | osas p50 | osas p99 | bare p50 | bare p99 | osas / bare | nodes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for begin, end, key in _OWN_ROWS:
        mine, bare = s.get(key, []), s.get(f"bare_{key}", [])
        lines.append(
            f"| {begin} | {end} | {_ms(mine, 0.5)} | {_ms(mine, 0.99)} | {_ms(bare, 0.5)} | "
            f"{_ms(bare, 0.99)} | {_x(_p50(mine), _p50(bare))} | {len(mine)} |"
        )
    added = _p50(s["warm_to_start_ms"]) - _p50(s["cold_to_start_ms"])
    bare_added = _p50(s["bare_warm_to_start_ms"]) - _p50(s["bare_cold_to_start_ms"])
    lines += [
        "",
        (
            f"A claim adds {added:.1f} ms to osas's time to the start request (warm p50 less "
            f"cold p50); the bare client's claim adds {bare_added:.1f} ms to its own. "
            f"IncreaseSize itself: p50 {_ms(s['increase_ms'], 0.5)}, p99 "
            f"{_ms(s['increase_ms'], 0.99)} (sent to answer read)."
        ),
        "",
        (
            "By scale-up size, p50 to the start request (osas from IncreaseSize's answer, "
            "bare from its start):"
        ),
        "",
        "| n | warm, osas | warm, bare | cold, osas | cold, bare |",
        "|---|---|---|---|---|",
    ]
    for size in range(1, plan.largest + 1):
        lines.append(f"| {size} | {' | '.join(_by_size(result, size))} |")
    lines += [
        "",
        "### IncreaseSize to the node's server ACTIVE and joined",
        "",
        (
            "The cloud's timings, real clouds' orders of magnitude, divided by "
            f"{plan.scale:g} in the simulator: a cold create {t.build:g} s to ACTIVE "
            f"({plan.scaled(t.build):g} s), then a first boot that joins in {t.first_join:g} s "
            f"(cloud-init, packages, images, kubeadm join; {plan.scaled(t.first_join):g} s); a "
            f"prepared server's `os-start` {t.start:g} s to ACTIVE ({plan.scaled(t.start):g} s), "
            f"then a boot that joins in {t.warm_join:g} s ({plan.scaled(t.warm_join):g} s). A "
            f"refill prepares for {t.prepare:g} s ({plan.scaled(t.prepare):g} s) and powers "
            f"off in {t.power_off:g} s ({plan.scaled(t.power_off):g} s), between scale-ups. The "
            "simulated guest joins the moment it boots (it writes `osas-node-joined` on its "
            "console, a cold server's as a claimed one's); the join time above is added to "
            "that moment. Measured: from IncreaseSize sent. Unscaled: osas's part (to the "
            "start request reaching Nova) as measured, plus the simulator's part after it "
            f"times {plan.scale:g} (the watcher's {WATCH * 1000:g} ms becomes "
            f"{WATCH * plan.scale * 1000:g} ms), plus the join time unscaled."
        ),
        "",
        "| from IncreaseSize to | cold p50 | cold p99 | warm p50 | warm p99 | warm / cold |",
        "|---|---|---|---|---|---|",
    ]
    for name, key in _END_TO_END:
        cold, warm = s[f"cold_{key}"], s[f"warm_{key}"]
        show = _s
        if key == "start_s":
            show, cold, warm = _ms, [v * 1000 for v in cold], [v * 1000 for v in warm]
        lines.append(
            f"| {name} | {show(cold, 0.5)} | {show(cold, 0.99)} | {show(warm, 0.5)} | "
            f"{show(warm, 0.99)} | {_x(_p50(warm), _p50(cold))} |"
        )
    return [*lines, END]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--largest", type=int, default=Plan.largest)
    parser.add_argument("--rounds", type=int, default=Plan.rounds)
    parser.add_argument("--pool", type=int, default=None)
    parser.add_argument("--scale", type=float, default=Plan.scale)
    parser.add_argument("--rate-limit", type=float, default=None, help="osas's, requests/s")
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"))
    parser.add_argument("--cloud", metavar="JSON", help="be the simulated OpenStack")
    parser.add_argument(
        "--bare", nargs=2, metavar=("AUTH_URL", "THREADS"), help="be the bare client"
    )
    args = parser.parse_args(argv)
    if args.cloud:
        return _cloud_main(json.loads(args.cloud))
    if args.bare:
        return _bare_main(args.bare[0], int(args.bare[1]))
    plan = Plan(
        largest=args.largest,
        rounds=args.rounds,
        pool=args.pool,
        scale=args.scale,
        rate_limit=args.rate_limit,
    )
    with tempfile.TemporaryDirectory(prefix="osas-bench-") as temporary:
        folder = Path(temporary)
        result = asyncio.run(measure_warm(plan, Tls.make(folder), folder))
    lines = section(result, machine())
    replace_marked_section(args.out, BEGIN, END, lines)
    print("\n".join(lines))  # noqa: T201
    print(f"written: {args.out}")  # noqa: T201
    print(json.dumps(asdict(plan)))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
