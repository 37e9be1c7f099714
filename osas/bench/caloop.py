"""The server's own CPU for Cluster Autoscaler's loop: osas against a bare grpc.aio server.

CA's Go client is cheap per call; a Python client is not (some 290 µs of its own CPU a call),
so a latency measured from Python mostly measures the client. What CA's loop costs the server
is read from the kernel instead: utime + stime of the server's process (``/proc/<pid>/stat``)
before and after a loop, the client's CPU in another process and not counted.

Separate processes, as in a cluster: the simulated OpenStack (``osas.bench.cloud``) seeded with
N servers spread over the six node groups of CA's cluster, all ACTIVE; ``osas serve`` against it
with mTLS at its defaults (a sync every 10 s, no option overrides: GetOptions is answered
UNIMPLEMENTED, "keep your defaults"); and a bare grpc.aio server answering osas's own bytes and
statuses (captured from osas first) without decoding a request. The bare server answers a
non-OK status the cheapest way grpc.aio allows: the handler sets the code and details on its
context and returns; ``context.abort`` (``osas.bench.bare``) raises through the handler. Both
are started once per size and warmed with one loop; then they take turns.

One CA loop as CA 1.36 makes it, serially, one call in flight: Refresh, NodeGroups,
NodeGroupTargetSize per group, then per node a NodeGroupForNode (the Node as kubelet registers
it: its name, ``openstack:///<uuid>`` and the labels kubelet sets) and four NodeGroupGetOptions
with CA's default options. Besides whole loops, each hot method alone (the calls of a loop's
GetOptions, or of its NodeGroupForNode, repeated to at least ``MIN_CALLS`` calls a round), and
each server idle for one sync interval (osas's syncs are in its loops' figures too).

``osas bench`` measures this with everything else (``osas.bench.run``), and keeps it as the run
labelled ``latest``. ``python -m osas.bench.caloop [--nodes 1000 5000 10000] [--rounds R]
[--label TEXT] [--osas-python PATH] [--out PATH]`` measures it alone, keeps the run as
``benchmarks/caloop-<label>.json`` next to the report, and rewrites only its section of the
report, with every labelled run kept there side by side (``--label before`` with an older
checkout's osas through ``--osas-python``, then ``--label after``). ``--serve-bare FILE`` is the
bare server itself, which the measure starts in a process of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import uvloop

from osas.bench.client import CA_TIMEOUT, SERVICE, Client, options, target_size
from osas.bench.processes import (
    CLUSTER,
    Osas,
    Setup,
    Tls,
    kit,
    machine,
    osas_config,
    sim_get,
    stop_process,
    wait_until_serving,
)
from osas.bench.report import replace_caloop_section
from osas.bench.results import (
    OPTIONS_PER_NODE,
    CaLoopRun,
    Side,
    SizeRow,
    Spent,
    load_runs,
    save_run,
)
from osas.domain.servers import META_CLUSTER, META_GROUP
from osas.protocol import externalgrpc_pb2 as pb

SIZES = (1_000, 5_000, 10_000)
ROUNDS = 2
GROUPS = 6  # the node groups of CA's cluster; the servers are spread over them
MIN_CALLS = 5_000  # per round of a method alone: enough for the kernel's 10 ms CPU ticks
IDLE_SECONDS = 10.0  # one sync interval at osas's defaults
FLAVOR = "m1.small"  # the flavor of osas_config's node groups
ZONE = "nova"  # the simulator's one availability zone
SERVERS = ("osas", "bare")


# -- the server's CPU ---------------------------------------------------------------------------


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, every thread of it included, in the kernel's clock ticks
    (``SC_CLK_TCK`` a second), from ``/proc/<pid>/stat``."""
    # The command name, in parentheses, may hold spaces: fields are counted after it.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(ticks: int) -> float:
    return ticks / os.sysconf("SC_CLK_TCK")


# -- the bare server ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What a server answered a method: a status, its details, the answer's bytes (when OK)."""

    code: str
    details: str = ""
    data: bytes = b""

    def text(self) -> str:
        return self.code if not self.details else f"{self.code}: {self.details}"


Handler = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes | None]]


def _canned(answer: Answer) -> Handler:
    if answer.code == "OK":
        data = answer.data

        async def answer_ok(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            del request, context  # never decoded: the bare limit
            return data

        return answer_ok
    code, details = grpc.StatusCode[answer.code], answer.details

    async def answer_status(
        request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes | None:
        # No exception: grpc.aio sends the status set here, with these details, and discards
        # whatever a handler returns once its code is not OK.
        del request
        context.set_code(code)
        context.set_details(details)
        return None

    return answer_status


async def serve_bare(path: Path) -> None:
    """The bare server: osas's answers (a JSON file: TLS files, and per method its status,
    details and base64 bytes), over the same mTLS; it prints its port and pid as one JSON line
    and stops when its standard input closes."""
    spec = json.loads(path.read_text())
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            _canned(Answer(a["code"], a["details"], base64.b64decode(a["data"]))),
            request_deserializer=None,
            response_serializer=None,
        )
        for method, a in spec["answers"].items()
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    credentials = grpc.ssl_server_credentials(
        [(Path(spec["key"]).read_bytes(), Path(spec["cert"]).read_bytes())],
        root_certificates=Path(spec["client_ca"]).read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    # As osas serve does once started: what exists now is kept out of the collector's passes.
    gc.freeze()
    sys.stdout.write(json.dumps({"port": port, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


def write_answers(folder: Path, answers: dict[str, Answer]) -> Path:
    files = {"cert": "tls.crt", "key": "tls.key", "client_ca": "ca.crt"}
    spec: dict[str, Any] = {key: str(folder / name) for key, name in files.items()}
    spec["answers"] = {
        method: {
            "code": a.code,
            "details": a.details,
            "data": base64.b64encode(a.data).decode(),
        }
        for method, a in answers.items()
    }
    path = folder / "caloop-answers.json"
    path.write_text(json.dumps(spec))
    return path


# -- osas ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OsasCode:
    """Where ``osas serve`` runs from: this interpreter and tree, another checkout (a folder put
    first on PYTHONPATH, and made the working directory so that the ``-m`` lookup cannot find
    this tree's osas first), or another interpreter."""

    python: str
    env: dict[str, str] | None = None
    cwd: str | None = None
    prefix: tuple[str, ...] = ()  # a program osas runs under (valgrind)

    @classmethod
    def at(cls, path: Path | None, scratch: Path) -> OsasCode:
        if path is None:
            return cls(sys.executable)
        path = path.resolve()
        if path.is_dir():
            paths = [str(path), *filter(None, [os.environ.get("PYTHONPATH")])]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
            return cls(sys.executable, env, str(path))
        return cls(str(path), None, str(scratch))

    def describe(self) -> str:
        """The osas package this code imports, and its checkout's commit (``-dirty`` when it
        has changes not committed)."""
        where = subprocess.run(  # noqa: S603 - our interpreter, a fixed program
            [self.python, "-c", "import osas; print(osas.__file__)"],
            capture_output=True,
            text=True,
            check=True,
            env=self.env,
            cwd=self.cwd,
        ).stdout.strip()
        package = Path(where).parent
        commit = subprocess.run(  # noqa: S603 - git, a fixed command
            ["git", "-C", str(package), "describe", "--always", "--dirty"],  # noqa: S607
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return f"{package} ({commit or 'not a git checkout'})"


async def start_osas_from(
    code: OsasCode, setup: Setup, name: str, reconcile: dict[str, Any] | None = None
) -> Osas:
    """``osas serve`` at its defaults (``osas_config``; the reconciler's settings given),
    from ``code``, once SERVING."""
    config, port, health, _ = osas_config(setup, reconcile=reconcile)
    log = setup.folder / f"{name}.log"
    spawned = time.perf_counter()
    with log.open("wb") as stream:
        process = subprocess.Popen(  # noqa: S603 - our own command
            [*code.prefix, code.python, "-m", "osas", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=stream,
            env=code.env,
            cwd=code.cwd,
        )
    try:
        await wait_until_serving(health, process, log, poll=0.01)
    except BaseException:
        stop_process(process)
        raise
    return Osas(process, port, log, time.perf_counter() - spawned)


# -- CA's side ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A node as kubelet registers it on an OpenStack server."""

    name: str
    provider_id: str
    group: str  # the node group osas made its server for


class Ask(NamedTuple):
    method: str
    request: bytes
    group: str  # NodeGroupForNode: the node's group; otherwise ""


class Outcome(NamedTuple):
    method: str
    group: str
    code: str
    details: str
    data: bytes


def cluster_nodes(sim: dict[str, Any]) -> list[Node]:
    """The cluster's servers as nodes, from the simulator's own listing."""
    servers = sim_get(sim, "/_sim/servers")["servers"]
    return [
        Node(s["name"], f"openstack:///{s['id']}", s["metadata"][META_GROUP])
        for s in servers
        if s["metadata"].get(META_CLUSTER) == CLUSTER
    ]


def for_node(node: Node) -> Ask:
    labels = {
        "kubernetes.io/hostname": node.name,
        "node.kubernetes.io/instance-type": FLAVOR,
        "topology.kubernetes.io/zone": ZONE,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
    }
    message = pb.ExternalGrpcNode(name=node.name, providerID=node.provider_id, labels=labels)
    request = pb.NodeGroupForNodeRequest(node=message).SerializeToString()
    return Ask("NodeGroupForNode", request, node.group)


def _ask(method: str, request: bytes) -> Ask:
    return Ask(method, request, "")


def refresh() -> Ask:
    return _ask("Refresh", pb.RefreshRequest().SerializeToString())


def node_groups() -> Ask:
    return _ask("NodeGroups", pb.NodeGroupsRequest().SerializeToString())


class Loop:
    """The requests of CA's loop over the nodes, serialised once; and those of its
    NodeGroupGetOptions and NodeGroupForNode calls alone."""

    def __init__(self, groups: list[str], nodes: list[Node]) -> None:
        # CA's default options in the request, as the main benchmark's loop sends them.
        get_options = {
            group: _ask(options(group).method, options(group).request) for group in groups
        }
        self.for_node = [for_node(node) for node in nodes]
        self.options = [get_options[node.group] for node in nodes for _ in range(OPTIONS_PER_NODE)]
        self.calls = [refresh(), node_groups()]
        self.calls += [_ask(target_size(g).method, target_size(g).request) for g in groups]
        for index, node in enumerate(nodes):
            self.calls.append(self.for_node[index])
            self.calls += [get_options[node.group]] * OPTIONS_PER_NODE


def repeated(asks: list[Ask], least: int) -> list[Ask]:
    """``asks`` over again until at least ``least`` calls."""
    return asks * max(1, -(-least // len(asks)))


class Server:
    """One server as CA's side sees it: a channel, a stub per method, its process's pid, and
    every answer it gave, tallied."""

    def __init__(self, name: str, port: int, pid: int, tls: Tls) -> None:
        self.name = name
        self.pid = pid
        self.client = Client(port, tls)
        self.stubs: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}
        self.tally: Counter[Outcome] = Counter()

    def _stub(self, method: str) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        stub = self.stubs.get(method)
        if stub is None:
            stub = self.stubs[method] = self.client.channel.unary_unary(
                f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None
            )
        return stub

    async def answer(self, ask: Ask) -> Answer:
        try:
            return Answer("OK", "", bytes(await self._stub(ask.method)(ask.request)))
        except grpc.aio.AioRpcError as error:
            return Answer(error.code().name, error.details() or "")

    async def spend(self, asks: list[Ask]) -> Spent:
        """The calls, serially; the server's CPU and the wall time they took."""
        stubs = {method: self._stub(method) for method in {ask.method for ask in asks}}
        tally: Counter[Outcome] = Counter()
        # What this process holds is frozen from its collector meanwhile (as client.Client does):
        # its pauses would stretch the wall time, not the server's CPU.
        gc.freeze()
        try:
            before, started = cpu_ticks(self.pid), time.perf_counter()
            for ask in asks:
                try:
                    data = await stubs[ask.method](ask.request, timeout=CA_TIMEOUT)
                    tally[Outcome(ask.method, ask.group, "OK", "", data)] += 1
                except grpc.aio.AioRpcError as error:
                    code, details = error.code().name, error.details() or ""
                    tally[Outcome(ask.method, ask.group, code, details, b"")] += 1
            wall = time.perf_counter() - started
            cpu = cpu_seconds(cpu_ticks(self.pid) - before)
        finally:
            gc.unfreeze()
        self.tally.update(tally)
        return Spent(cpu, wall, len(asks))

    def summarise(self, side: Side) -> None:
        """What it answered, into ``side``: statuses by method, and the groups
        NodeGroupForNode named."""
        answered: dict[str, Counter[str]] = {}
        for outcome, count in self.tally.items():
            text = Answer(outcome.code, outcome.details).text()
            answered.setdefault(outcome.method, Counter())[text] += count
            if outcome.method == "NodeGroupForNode" and outcome.code == "OK":
                named = pb.NodeGroupForNodeResponse.FromString(outcome.data).nodeGroup.id
                if not named:
                    side.unnamed += count
                elif named != outcome.group:
                    side.elsewhere += count
        side.answered = {method: dict(counts) for method, counts in sorted(answered.items())}

    async def close(self) -> None:
        await self.client.close()


async def capture(server: Server, loop: Loop) -> dict[str, Answer]:
    """osas's own answer to each method of the loop (its first call of each), for the bare
    server."""
    answers: dict[str, Answer] = {}
    for ask in loop.calls:
        if ask.method not in answers:
            answers[ask.method] = await server.answer(ask)
    return answers


def check(answers: dict[str, Answer], sides: dict[str, Side]) -> None:
    """Every call answered as osas answered it first (a server refusing or failing calls
    would be measured doing something else)."""
    for name, side in sides.items():
        for method, counts in side.answered.items():
            expected = answers[method].text()
            if set(counts) != {expected}:
                msg = f"{name} answered {method} {counts}, not {expected!r} alone"
                raise RuntimeError(msg)
    if sides["osas"].unnamed or sides["osas"].elsewhere or sides["bare"].unnamed:
        msg = "NodeGroupForNode did not name each node's group"
        raise RuntimeError(msg)


# -- the measure --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...] = SIZES
    rounds: int = ROUNDS
    min_calls: int = MIN_CALLS
    idle_seconds: float = IDLE_SECONDS


def _in_turns(servers: list[Server], index: int) -> list[Server]:
    """Both servers, the first of them changing round by round."""
    return servers if index % 2 == 0 else servers[::-1]


async def idle(servers: list[Server], seconds: float) -> list[Spent]:
    """Each server's CPU over the same stretch with nothing asked."""
    before = [cpu_ticks(server.pid) for server in servers]
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - started
    return [
        Spent(cpu_seconds(cpu_ticks(s.pid) - b), wall, 0)
        for s, b in zip(servers, before, strict=True)
    ]


class Servers(NamedTuple):
    """osas and the bare server, started on one simulated cloud: CA's loop over its nodes,
    osas's first answer to each of the loop's methods, and both servers (osas first)."""

    loop: Loop
    answers: dict[str, Answer]
    servers: list[Server]


@asynccontextmanager
async def osas_and_bare(
    nodes: int,
    tls: Tls,
    folder: Path,
    code: OsasCode,
    *,
    reconcile: dict[str, Any] | None = None,
    prefix: tuple[str, ...] = (),
) -> AsyncIterator[Servers]:
    """The simulated OpenStack with ``nodes`` servers over the six groups, ``osas serve``
    against it (from ``code``, with ``reconcile``'s settings) and the bare server answering
    osas's own answers, both under ``prefix`` (valgrind) when given; stopped after."""
    groups = [f"g{i}" for i in range(GROUPS)]
    async with AsyncExitStack() as stack:
        cloud = ("osas.bench.cloud", "--servers", str(nodes), "--groups", str(len(groups)))
        setup = Setup(folder, tls, stack.enter_context(kit(*cloud)), groups)
        loop = Loop(groups, cluster_nodes(setup.sim))
        code = replace(code, prefix=prefix)
        osas = await start_osas_from(code, setup, f"caloop-osas-{nodes}", reconcile)
        stack.callback(osas.stop)
        servers = [Server("osas", osas.port, osas.process.pid, tls)]
        stack.push_async_callback(servers[0].close)
        answers = await capture(servers[0], loop)
        bare = ("osas.bench.caloop", "--serve-bare", str(write_answers(folder, answers)))
        ready = stack.enter_context(kit(*bare, prefix=prefix))
        servers.append(Server("bare", ready["port"], ready["pid"], tls))
        stack.push_async_callback(servers[1].close)
        yield Servers(loop, answers, servers)


def summarise_and_check(started: Servers, sides: dict[str, Side]) -> None:
    """Each server's answers into its side, then ``check``: every call answered as osas
    answered it first."""
    for server in started.servers:
        server.summarise(sides[server.name])
    check(started.answers, sides)


async def measure_size(plan: Plan, nodes: int, tls: Tls, folder: Path, code: OsasCode) -> SizeRow:
    print(f"== {nodes:,} nodes in {GROUPS} groups", flush=True)  # noqa: T201
    async with osas_and_bare(nodes, tls, folder, code) as started:
        row = SizeRow(nodes, GROUPS, len(started.loop.calls))
        await measure_servers(plan, row, started.loop, started.servers)
    summarise_and_check(started, {"osas": row.osas, "bare": row.bare})
    return row


async def measure_servers(plan: Plan, row: SizeRow, loop: Loop, servers: list[Server]) -> None:
    """Warm-up, idle, whole loops, then each hot method alone; the servers taking turns."""
    for server in servers:
        await server.spend(loop.calls)
    if plan.idle_seconds > 0:
        for server, spent in zip(servers, await idle(servers, plan.idle_seconds), strict=True):
            row.side(server.name).idle = spent
    for index in range(plan.rounds):
        for server in _in_turns(servers, index):
            row.side(server.name).loops.append(await server.spend(loop.calls))
    alone = (
        ("options", repeated(loop.options, plan.min_calls)),
        ("for_node", repeated(loop.for_node, plan.min_calls)),
    )
    for key, asks in alone:
        for index in range(plan.rounds):
            for server in _in_turns(servers, index):
                getattr(row.side(server.name), key).append(await server.spend(asks))
    for server in servers:
        side = row.side(server.name)
        print(  # noqa: T201
            f"   {server.name}: {side.loop_cpu:.3f} s CPU a loop "
            f"({side.loop_per_call * 1e6:.0f} µs a call, {side.loop_wall:.1f} s wall); "
            f"GetOptions {side.options_per_call * 1e6:.0f} µs, "
            f"NodeGroupForNode {side.for_node_per_call * 1e6:.0f} µs",
            flush=True,
        )


async def measure_caloop(
    plan: Plan, tls: Tls, folder: Path, label: str, osas_python: Path | None = None
) -> CaLoopRun:
    code = OsasCode.at(osas_python, folder)
    source = code.describe()
    print(f"== CA's loop, server CPU; osas from {source}", flush=True)  # noqa: T201
    run = CaLoopRun(label, source, plan.rounds, machine(), time.time())
    for nodes in plan.sizes:
        run.rows.append(await measure_size(plan, nodes, tls, folder, code))
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"))
    parser.add_argument(
        "--label", default="current", help="names the osas measured (e.g. before, after)"
    )
    parser.add_argument(
        "--osas-python",
        type=Path,
        help="run `osas serve` from this checkout (a folder, put first on PYTHONPATH) or this "
        "interpreter; the bare server and the client always run from this tree",
    )
    parser.add_argument("--serve-bare", type=Path, help="be the bare server (the measure's own)")
    args = parser.parse_args(argv)
    if args.serve_bare:
        uvloop.run(serve_bare(args.serve_bare))  # the event loop osas serve runs by default
        return 0
    plan = Plan(tuple(args.nodes), args.rounds)
    with tempfile.TemporaryDirectory(prefix="osas-bench-") as temporary:
        folder = Path(temporary)
        run = asyncio.run(
            measure_caloop(plan, Tls.make(folder), folder, args.label, args.osas_python)
        )
    kept = save_run(args.out, run)
    replace_caloop_section(args.out, load_runs(args.out))
    print(f"written: {args.out} and {kept}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
