"""Promises kept by the cluster: what the promise record costs and what it buys.

Separate processes, as in a cluster: the Kubernetes API stand-in (``osas.sim.kubernetes``), the
simulated OpenStack (``osas.bench.cloud``, its faults set through ``/_sim/faults``) and
``osas serve`` with its pod's name, namespace and address as the downward API gives them, at
the election's defaults. CA's side calls with mTLS and CA's 5 s deadline.

- **DeleteNodes against Nova's latency.** DeleteNodes(1), one call after another, with every
  Nova call taking 0, 1 or 4 s, and with Nova out of reach (every call 503): with election on
  (the answer waits for the record's write to the API server) and, as the baseline measured in
  the same run, with election off (the answer waits for Nova: the fresh read, then the DELETE).
- **From kill -9 to the first scale-up accepted.** A holder and a warm standby; the holder is
  killed idle, or with N creates in flight (their POSTs held in Nova's API); CA's side calls
  IncreaseSize(1) where the Service leads until it is accepted.
- **Writes to the API server** (the holder's ``/status``, ``leader_election.writes``): per
  minute of CA's steady loop (nothing changing), and per scale-up and scale-down.

``python -m osas.bench.promises [--out PATH]`` measures this alone and rewrites its section
of the report (``osas bench`` measures it with everything else).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import requests

from osas.bench.client import CA_TIMEOUT, Call, Client, nodes, target_size
from osas.bench.processes import Osas, Setup, Tls, kit, machine, osas_config, stop_process
from osas.bench.report import replace_marked_section
from osas.bench.takeover import (
    LEASE,
    Service,
    answered_through_service,
    kube_standin,
    spawn_replica,
    wait_for,
)
from osas.protocol import externalgrpc_pb2 as pb

SERVERS = 1_000
CALLS = 10  # DeleteNodes per Nova latency
NOVA = (("0 s", {"latency": 0.0}), ("1 s", {"latency": 1.0}), ("4 s", {"latency": 4.0}))
UNREACHABLE = ("out of reach (503)", {"error_rate": 1.0})
IN_FLIGHT = 10
STEADY_SECONDS = 60.0
CA_LOOP = 10.0  # CA's scan interval
BEGIN = "<!-- promises: python -m osas.bench.promises -->"
END = "<!-- end of promises -->"
_WAIT = 60.0


def set_faults(sim: dict[str, Any], **faults: Any) -> None:
    answer = requests.post(f"{sim['base_url']}/_sim/faults", json=faults, timeout=10)
    answer.raise_for_status()


def sim_calls(sim: dict[str, Any], operation: str) -> int:
    answer = requests.get(f"{sim['base_url']}/_sim/calls", timeout=10)
    answer.raise_for_status()
    return int(answer.json().get("calls", {}).get(operation, 0))


def status(osas: Osas) -> dict[str, Any]:
    answer = requests.get(f"http://127.0.0.1:{osas.metrics}/status", timeout=10)
    answer.raise_for_status()
    return dict(answer.json())


def writes(osas: Osas) -> dict[str, int]:
    return dict(status(osas)["leader_election"].get("writes") or {})


def delete_call(provider_id: str) -> Call:
    node = pb.ExternalGrpcNode(name=f"node-{provider_id[-12:]}", providerID=provider_id)
    request = pb.NodeGroupDeleteNodesRequest(id="g0", nodes=[node]).SerializeToString()
    return Call("NodeGroupDeleteNodes", request, pb.NodeGroupDeleteNodesResponse)


def increase_call(delta: int) -> Call:
    request = pb.NodeGroupIncreaseSizeRequest(id="g0", delta=delta).SerializeToString()
    return Call("NodeGroupIncreaseSize", request, pb.NodeGroupIncreaseSizeResponse)


def spawn_alone(setup: Setup) -> Osas:
    """``osas serve`` with election off: the baseline that answers DeleteNodes from Nova."""
    config, port, _, metrics = osas_config(setup, metrics=True)
    log = setup.folder / f"alone-{port}.log"
    with log.open("wb") as stream:
        process = subprocess.Popen(  # noqa: S603 - our own command
            [sys.executable, "-m", "osas", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=stream,
            env=dict(os.environ),
        )
    return Osas(process, port, log, 0.0, metrics)


@contextmanager
def running(osas: Osas) -> Iterator[Osas]:
    try:
        yield osas
    finally:
        if osas.process.poll() is None:
            stop_process(osas.process)


async def delete_latencies(osas: Osas, tls: Tls, sim: dict[str, Any]) -> dict[str, str]:
    """Per Nova latency: DeleteNodes(1) ``CALLS`` times; "p50 / max, failures"."""
    client = Client(osas.port, tls)
    results: dict[str, str] = {}
    try:
        ids = iter(await client.provider_ids("g0"))
        for label, faults in (*NOVA, UNREACHABLE):
            set_faults(sim, **faults)
            seconds: list[float] = []
            failed = 0
            for _ in range(CALLS):
                started = time.perf_counter()
                try:
                    await client.call(delete_call(next(ids)))
                except grpc.aio.AioRpcError:
                    failed += 1
                seconds.append(time.perf_counter() - started)
            set_faults(sim, latency=0.0, error_rate=0.0)
            median, worst = statistics.median(seconds), max(seconds)
            results[label] = f"{_ms(median)} / {_ms(worst)}, {CALLS - failed} of {CALLS} OK"
            await asyncio.sleep(1.0)  # the last calls' deletes go out before the next phase
    finally:
        await client.close()
    return results


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


async def kill_to_scale_up(
    setup: Setup, kubeconfig: str, service: Service, in_flight: int, name: str
) -> tuple[float, int]:
    """Seconds from the holder's kill to the first scale-up its standby accepts, and the
    creates the standby took over from the record."""
    holder = spawn_replica(setup, kubeconfig, f"{name}a")
    with running(holder):
        await wait_for(holder, "health SERVING")
        standby = spawn_replica(setup, kubeconfig, f"{name}b")
        with running(standby):
            await wait_for(standby, "another osas holds the lease; standing by")
            if in_flight:
                set_faults(setup.sim, create_stall=60.0)  # their POSTs held in Nova's API
                sent = sim_calls(setup.sim, "compute.servers.create")
                client = Client(holder.port, setup.tls)
                try:
                    await client.call(increase_call(in_flight))
                finally:
                    await client.close()
                deadline = time.monotonic() + _WAIT
                while sim_calls(setup.sim, "compute.servers.create") < sent + in_flight:
                    if time.monotonic() > deadline:
                        msg = "the creates were not sent"
                        raise RuntimeError(msg)
                    await asyncio.sleep(0.05)
            await asyncio.sleep(2.0)  # the standby has looked at the Lease since
            began = time.perf_counter()
            holder.process.kill()
            holder.process.wait()
            answered = await answered_through_service(
                service, setup.tls, standby, call=increase_call(1), wait=300.0
            )
            seconds = answered - began
            set_faults(setup.sim, create_stall=0.0)
            took = await wait_for(standby, "took over the previous leader's promise record")
            return seconds, int(took.get("creates", 0))


async def api_writes(osas: Osas, tls: Tls) -> dict[str, str]:
    """Writes to the API server: per minute of CA's steady loop, per scale-up, per
    scale-down (each against the renews alone over the same time)."""
    client = Client(osas.port, tls)
    results: dict[str, str] = {}
    try:
        ids = await client.provider_ids("g0")
        before, began = writes(osas), time.monotonic()
        while time.monotonic() - began < STEADY_SECONDS:
            await client.call(
                Call("Refresh", pb.RefreshRequest().SerializeToString(), pb.RefreshResponse)
            )
            await client.call(target_size("g0"))
            await client.call(nodes("g0"))
            await asyncio.sleep(CA_LOOP)
        after = writes(osas)
        minutes = (time.monotonic() - began) / 60
        results["steady"] = _per(before, after, minutes, "a minute")
        for label, call in (
            ("scale-up (+5)", increase_call(5)),
            ("scale-down (1)", delete_call(ids[-1])),
        ):
            before = writes(osas)
            await client.call(call)
            await asyncio.sleep(10.0)  # the creates listed, the server gone
            results[label] = _per(before, writes(osas), 1.0, "the call and 10 s after")
    finally:
        await client.close()
    return results


def _per(before: dict[str, int], after: dict[str, int], scale: float, what: str) -> str:
    kinds = sorted(set(before) | set(after))
    counts = {kind: (after.get(kind, 0) - before.get(kind, 0)) / scale for kind in kinds}
    shown = ", ".join(f"{kind} {count:.0f}" for kind, count in counts.items() if count)
    return f"{sum(counts.values()):.0f} in {what} ({shown or 'none'})"


async def measure_promises(tls: Tls, folder: Path) -> list[str]:
    """The promises section of the report, measured."""
    print("== promises kept by the cluster", flush=True)  # noqa: T201
    with (
        kit("osas.bench.cloud", "--servers", str(SERVERS), "--groups", "1") as sim,
        kube_standin(folder) as kube,
    ):
        setup = Setup(folder, tls, sim, ["g0"])
        service = Service(kube)
        kubeconfig = str(kube["kubeconfig"])
        try:
            holder = spawn_replica(setup, kubeconfig, "osas-record")
            with running(holder):
                await wait_for(holder, "health SERVING")
                recorded = await delete_latencies(holder, tls, sim)
                written = await api_writes(holder, tls)
            alone = spawn_alone(setup)
            with running(alone):
                await wait_for(alone, "health SERVING")
                waited = await delete_latencies(alone, tls, sim)
            idle = await kill_to_scale_up(setup, kubeconfig, service, 0, "osas-idle-")
            busy = await kill_to_scale_up(setup, kubeconfig, service, IN_FLIGHT, "osas-busy-")
        finally:
            service.close()
    return section(recorded, waited, idle, busy, written)


def section(
    recorded: dict[str, str],
    waited: dict[str, str],
    idle: tuple[float, int],
    busy: tuple[float, int],
    written: dict[str, str],
) -> list[str]:
    info = machine()
    lines = [
        BEGIN,
        "## Promises kept by the cluster",
        "",
        (
            f"A cloud of {SERVERS:,} servers in one group, the Kubernetes API stand-in, `osas "
            "serve` with mTLS; the election at its defaults "
            f"({', '.join(f'{k} {v}' for k, v in LEASE.items())}). DeleteNodes(1), "
            f"{CALLS} calls one after another per row, CA's {CA_TIMEOUT:g} s deadline: the "
            "median and the slowest answer, and how many were OK. With election on the answer "
            "waits for the promise record's write to the API server; the baseline, measured in "
            "the same run, is osas with election off, whose answer waits for Nova (the fresh "
            f"read, then the DELETE). {info['date']}, {info['cpu']}, {info['cores']} cores."
        ),
        "",
        "| Nova | DeleteNodes, election on (record) | election off (waits on Nova) |",
        "|---|---|---|",
    ]
    lines += [f"| {label} | {recorded[label]} | {waited[label]} |" for label in recorded]
    lines += [
        "",
        (
            "From the holder's kill -9 to the first IncreaseSize(1) its standby accepts, "
            "called where CA's Service leads every 50 ms:"
        ),
        "",
        "| creates in flight at the kill | seconds | creates the standby took over |",
        "|---|---|---|",
        f"| 0 | {idle[0]:.1f} | {idle[1]} |",
        f"| {IN_FLIGHT} (POSTs held in Nova's API) | {busy[0]:.1f} | {busy[1]} |",
        "",
        "Writes to the API server by the holder (its `/status`, `leader_election.writes`):",
        "",
        "| | writes |",
        "|---|---|",
    ]
    lines += [f"| {label} | {value} |" for label, value in written.items()]
    return [*lines, END]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="osas-bench-") as temporary:
        folder = Path(temporary)
        lines = asyncio.run(measure_promises(Tls.make(folder), folder))
    replace_marked_section(args.out, BEGIN, END, lines)
    print("\n".join(lines))  # noqa: T201
    print(f"written: {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
