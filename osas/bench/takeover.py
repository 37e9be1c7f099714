"""The time a warm standby takes to become the writer under a Kubernetes Lease, at the default
lease settings (lease_duration 15 s, renew_deadline 10 s, retry_period 2 s).

Separate processes, as in a cluster: the Kubernetes API stand-in (``osas.sim.kubernetes``:
Leases and EndpointSlices), the simulated OpenStack, and ``osas serve`` twice with its pod's
name, namespace and address as the downward API gives them. The holder publishes itself as
the one endpoint of CA's Service; CA's side here reads that endpoint from the stand-in (what
kube-proxy routes a new connection to) and calls NodeGroupTargetSize there until it is
answered. Each round:

- the holder is SIGKILLed: the time until the standby answers CA through the Service, and
  until it allows scale-ups again (it holds its headroom for ``create_doubt_window`` after a
  takeover from a holder that may have left creates in Nova's API: read from its ``/status``
  when it first answers, ``scale_ups_held_seconds``, rather than waited for);
- a new standby joins the new holder, which is then stopped cleanly (SIGTERM): it releases
  the lease saying no create of its is in flight, and the standby serves within a retry
  period, with nothing held.

``python -m osas.bench.takeover [--rounds N] [--out PATH]`` measures this alone and rewrites
only its section of the report (``osas bench`` measures it with everything else).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import requests

from osas.bench.client import Call, Client, target_size
from osas.bench.processes import Osas, Setup, Tls, kit, machine, osas_config, stop_process
from osas.bench.report import replace_takeover_section
from osas.bench.results import TakeoverResult
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim.kubernetes import SERVICE_NAME_LABEL, routes

SERVERS = 1_000  # a small cluster: the election, not the listing, is measured
ROUNDS = 3
NAMESPACE = "kube-system"
SERVICE_NAME = "osas"
# The election at its defaults (ElectionSettings), spelled out as the report states them.
LEASE = {"lease_duration": "15s", "renew_deadline": "10s", "retry_period": "2s"}
POLL = 0.05  # how often CA's side looks where the Service leads and calls there
# The standby looks at the lease this often. The holder goes at moments spread over it, one a
# round (else it would go just after the standby's first look, every round alike).
RETRY_PERIOD = 2.0
_WAIT = 60.0  # the longest any step of a round may take


# -- processes ----------------------------------------------------------------------------------


@contextmanager
def kube_standin(folder: Path) -> Iterator[dict[str, Any]]:
    """The Kubernetes API stand-in in a process of its own (it prints one JSON line once it
    serves, and stops on SIGTERM), with a kubeconfig for it."""
    kubeconfig = folder / "kubeconfig"
    command = [sys.executable, "-m", "osas.sim.kubernetes", "--port", "0"]
    command += ["--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE]
    process = subprocess.Popen(  # noqa: S603 - our own module, arguments we build
        command, stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            msg = "osas.sim.kubernetes exited before it was ready"
            raise RuntimeError(msg)
        yield dict(json.loads(line))
    finally:
        stop_process(process, grace=20.0)


class Service:
    """Where kube-proxy sends a new connection to CA's Service: the ready endpoint of the
    EndpointSlices labelled for it, read from the stand-in's API."""

    def __init__(self, kube: dict[str, Any]) -> None:
        self.url = f"{kube['url']}/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {kube['token']}"

    def endpoint(self) -> int | None:
        """The port of the Service's one endpoint (every replica listens on 127.0.0.1)."""
        selector = {"labelSelector": f"{SERVICE_NAME_LABEL}={SERVICE_NAME}"}
        answer = self.session.get(self.url, params=selector, timeout=5)
        answer.raise_for_status()
        found = {
            (address, port) for item in answer.json()["items"] for address, port, _ in routes(item)
        }
        if len(found) > 1:
            msg = f"CA's Service has several endpoints: {found}"
            raise RuntimeError(msg)
        return found.pop()[1] if found else None

    def close(self) -> None:
        self.session.close()


def spawn_replica(setup: Setup, kubeconfig: str, name: str) -> Osas:
    """``osas serve`` as one replica of the chart's Deployment: leader election at its
    defaults, its pod's name, namespace and address in its environment."""
    election = {
        "enabled": True,
        "kubeconfig": kubeconfig,
        "lease_namespace": NAMESPACE,
        "service_name": SERVICE_NAME,
        **LEASE,
    }
    config, port, _, metrics = osas_config(setup, metrics=True, election=election)
    log = setup.folder / f"takeover-{name}.log"
    env = {**os.environ, "POD_NAME": name, "POD_NAMESPACE": NAMESPACE, "POD_IP": "127.0.0.1"}
    with log.open("wb") as stream:
        process = subprocess.Popen(  # noqa: S603 - our own command
            [sys.executable, "-m", "osas", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=stream,
            env=env,
        )
    return Osas(process, port, log, 0.0, metrics)


async def wait_for(osas: Osas, event: str) -> dict[str, Any]:
    """The first ``event`` osas logs; raise with the end of its log if it exits first."""
    deadline = time.monotonic() + _WAIT
    while not (found := osas.events(event)):
        if osas.process.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(osas.log.read_text(errors="replace").splitlines()[-15:])
            msg = f"no {event!r} from osas ({osas.process.poll()}); the end of its log:\n{tail}"
            raise RuntimeError(msg)
        await asyncio.sleep(0.02)
    return found[0]


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def _exited(process: subprocess.Popen[bytes]) -> float:
    """When (perf_counter) the process exits."""
    process.wait(timeout=_WAIT)
    return time.perf_counter()


def held_window(osas: Osas) -> str:
    """The hold osas logged when it took over ("180 s"), "" if none."""
    for line in osas.log.read_text(errors="replace").splitlines():
        with suppress(ValueError):
            event = json.loads(line)
            if str(event.get("event", "")).startswith("scale-ups held") and "seconds" in event:
                return f"{event['seconds']} s"
    return ""


def held_seconds(osas: Osas) -> float:
    """``scale_ups_held_seconds`` from osas's /status (0: nothing held)."""
    answer = requests.get(f"http://127.0.0.1:{osas.metrics}/status", timeout=10)
    answer.raise_for_status()
    return float(answer.json().get("scale_ups_held_seconds") or 0.0)


async def answered_through_service(
    service: Service,
    tls: Tls,
    standby: Osas,
    *,
    call: Call | None = None,
    wait: float = _WAIT,
) -> float:
    """Make ``call`` (NodeGroupTargetSize by default) where CA's Service leads, until the
    standby answers it OK; the time (perf_counter) of the answer. The old holder's endpoint,
    none, or any refusal (the standby's UNAVAILABLE, a held scale-up) mean: look again."""
    deadline = time.monotonic() + wait
    clients: dict[int, Client] = {}
    call = call or target_size("g0")
    try:
        while time.monotonic() < deadline:
            port = service.endpoint()
            if port == standby.port:
                client = clients.get(port) or clients.setdefault(port, Client(port, tls))
                with suppress(grpc.aio.AioRpcError):
                    await client.call(call)
                    return time.perf_counter()
            await asyncio.sleep(POLL)
    finally:
        for client in clients.values():
            await client.close()
    msg = f"the standby (port {standby.port}) did not answer through the Service in {wait:.0f} s"
    raise RuntimeError(msg)


async def increase_answer(tls: Tls, osas: Osas) -> str:
    """IncreaseSize(1) at osas: the status it answers (OK, or FAILED_PRECONDITION while its
    scale-ups are held)."""
    client = Client(osas.port, tls)
    request = pb.NodeGroupIncreaseSizeRequest(id="g0", delta=1).SerializeToString()
    try:
        await client.call(Call("NodeGroupIncreaseSize", request, pb.NodeGroupIncreaseSizeResponse))
    except grpc.aio.AioRpcError as error:
        return str(error.code().name)
    finally:
        await client.close()
    return "OK"


# -- the rounds ---------------------------------------------------------------------------------


async def _holder_and_standby(
    setup: Setup,
    kubeconfig: str,
    service: Service,
    names: tuple[str, str],
    holder: Osas | None,
    phase: float,
) -> tuple[Osas, Osas]:
    """A holder serving CA through the Service (started here unless given) and a standby
    that has stood by for (1 + ``phase``) retry periods since its first look at the lease."""
    if holder is None:
        holder = spawn_replica(setup, kubeconfig, names[0])
        await wait_for(holder, "health SERVING")
    standby = spawn_replica(setup, kubeconfig, names[1])
    await wait_for(standby, "another osas holds the lease; standing by")
    deadline = time.monotonic() + _WAIT
    while service.endpoint() != holder.port:
        if time.monotonic() > deadline:
            msg = "the holder is not CA's Service's endpoint"
            raise RuntimeError(msg)
        await asyncio.sleep(POLL)
    await asyncio.sleep(RETRY_PERIOD * (1.0 + phase))
    return holder, standby


async def one_round(
    result: TakeoverResult,
    setup: Setup,
    kubeconfig: str,
    service: Service,
    index: int,
    rounds: int,
) -> list[str]:
    """A kill, then a clean stop; the status IncreaseSize got after each."""
    replicas: list[Osas] = []
    try:
        phase = (index + 0.5) / rounds
        holder, standby = await _holder_and_standby(
            setup, kubeconfig, service, (f"osas-{index}a", f"osas-{index}b"), None, phase
        )
        replicas += [holder, standby]
        # (a) The holder SIGKILLed: it neither releases the lease nor empties its endpoint.
        wall, began = time.time(), time.perf_counter()
        holder.process.kill()
        holder.process.wait()
        answered = await answered_through_service(service, setup.tls, standby)
        held = held_seconds(standby)
        result.add(
            "takeover_killed_lease", _at(await wait_for(standby, "became the leader")) - wall
        )
        result.add("takeover_killed", answered - began)
        result.add("takeover_killed_held", held)
        result.add("takeover_killed_allowed", answered - began + held)
        after_kill = await increase_answer(setup.tls, standby)
        # (b) A new standby joins; the holder is stopped as Kubernetes stops a pod.
        holder, standby = await _holder_and_standby(
            setup, kubeconfig, service, ("", f"osas-{index}c"), standby, phase
        )
        replicas.append(standby)
        wall, began = time.time(), time.perf_counter()
        holder.process.send_signal(signal.SIGTERM)
        exiting = asyncio.create_task(asyncio.to_thread(_exited, holder.process))
        answered = await answered_through_service(service, setup.tls, standby)
        held = held_seconds(standby)
        exited = await exiting
        result.add(
            "takeover_stopped_lease", _at(await wait_for(standby, "became the leader")) - wall
        )
        result.add("takeover_stopped", answered - began)
        result.add("takeover_stopped_held", held)
        result.add("takeover_stopped_exit", exited - began)
        after_stop = await increase_answer(setup.tls, standby)
        result.window = held_window(replicas[1]) or result.window
    finally:
        for replica in replicas:
            if replica.process.poll() is None:
                stop_process(replica.process)
    return [after_kill, after_stop]


async def measure_takeover(rounds: int, tls: Tls, folder: Path) -> TakeoverResult:
    """``rounds`` kills and clean stops, each with fresh replicas, against one stand-in and one
    simulator."""
    print("== a standby taking over (leader election at its defaults)", flush=True)  # noqa: T201
    result = TakeoverResult(SERVERS, dict(LEASE), "")
    with (
        kit("osas.bench.cloud", "--servers", str(SERVERS), "--groups", "1") as sim,
        kube_standin(folder) as kube,
    ):
        setup = Setup(folder, tls, sim, ["g0"])
        service = Service(kube)
        try:
            kubeconfig = str(kube["kubeconfig"])
            answers = [
                await one_round(result, setup, kubeconfig, service, index, rounds)
                for index in range(rounds)
            ]
        finally:
            service.close()
    killed = {a[0] for a in answers}
    stopped = {a[1] for a in answers}
    result.figures[
        "takeover_killed_held"
    ].note = f"IncreaseSize answered {'/'.join(sorted(killed))}"
    result.figures[
        "takeover_stopped_held"
    ].note = f"IncreaseSize answered {'/'.join(sorted(stopped))}"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="osas-bench-") as temporary:
        folder = Path(temporary)
        result = asyncio.run(measure_takeover(args.rounds, Tls.make(folder), folder))
    replace_takeover_section(args.out, result, machine())
    print(f"written: {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
