"""The floor under every call: a bare grpc.aio server's own CPU per unary call, by setting.

Each setting runs a bare server of its own in a separate process (plaintext, one method that
answers UNIMPLEMENTED by setting the status, the cheapest answer grpc.aio allows), fed serially
by a client in this process; the server's CPU over the calls is read from ``/proc``. Settings
take turns over rounds, and the median is reported: on a shared 2-core machine one round's
figure moves by 10% or more.

``python -m osas.bench.floor [--calls N] [--rounds R]`` prints one line per setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import uvloop

SERVICE = "floor.Bare"
# name -> (server options, environment): what grpc.aio lets a server choose per process.
SETTINGS: dict[str, tuple[list[tuple[str, Any]], dict[str, str]]] = {
    "defaults": ([], {}),
    "generic and registered method handlers": ([("registered", 1)], {}),
    "grpc.optimization_target=latency": ([("grpc.optimization_target", "latency")], {}),
    "grpc.optimization_target=throughput": ([("grpc.optimization_target", "throughput")], {}),
    "GRPC_POLL_STRATEGY=poll": ([], {"GRPC_POLL_STRATEGY": "poll"}),
    "no channelz, no default compression": (
        [("grpc.enable_channelz", 0), ("grpc.default_compression_algorithm", 0)],
        {},
    ),
    "grpc.max_concurrent_streams=1": ([("grpc.max_concurrent_streams", 1)], {}),
    # Not an option of gRPC's: the server's event loop is uvloop's (osas serve's default).
    "event loop: uvloop": ([("uvloop", 1)], {}),
}
_OURS = ("registered", "uvloop")  # settings of this module's, not gRPC options


async def _serve(options: list[tuple[str, Any]]) -> None:
    async def answer(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        del request
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details("node group has no option overrides; CA keeps its defaults")
        return b""

    handlers = {"Call": grpc.unary_unary_rpc_method_handler(answer)}
    registered = ("registered", 1) in options
    server = grpc.aio.server(options=[o for o in options if o[0] not in _OURS])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    if registered:
        server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _refused_stream(exc: grpc.RpcError) -> bool:
    """A stream the server refused before taking it (HTTP/2 REFUSED_STREAM, code 7). With
    ``grpc.max_concurrent_streams=1`` a busy machine sees it: the next call's stream can reach
    the server before it has counted the previous one closed."""
    return exc.code() is grpc.StatusCode.UNAVAILABLE and "error code 7" in (exc.details() or "")


def cpu_per_call(setting: str, calls: int) -> float:
    """Microseconds of the bare server's CPU per call, under ``setting``."""
    options, environment = SETTINGS[setting]
    process = subprocess.Popen(  # noqa: S603 - this module, arguments we build
        [sys.executable, "-m", "osas.bench.floor", "--serve", json.dumps(options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **environment},
    )
    try:
        port = int(process.stdout.readline() if process.stdout else "0")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/Call", None, None)

            def once() -> None:
                while True:
                    try:
                        call(b"")
                    except grpc.RpcError as exc:
                        if _refused_stream(exc):
                            continue  # never taken by the server: sent again, as HTTP/2 allows
                        if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                            raise
                    return

            for _ in range(calls // 5):  # warm up
                once()
            begun = _cpu_seconds(process.pid)
            for _ in range(calls):
                once()
            return (_cpu_seconds(process.pid) - begun) / calls * 1e6
    finally:
        if process.stdin:
            process.stdin.close()
        process.wait(timeout=20)
        if process.stdout:
            process.stdout.close()


def measure(calls: int, rounds: int) -> dict[str, list[float]]:
    """Every setting's CPU per call, over rounds, the order reversed every other round."""
    names = list(SETTINGS)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            figures[name].append(cpu_per_call(name, calls))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        options = [tuple(o) for o in json.loads(args.serve)]
        if ("uvloop", 1) in options:
            uvloop.run(_serve(options))
        else:
            asyncio.run(_serve(options))
        return 0
    for name, figures in measure(args.calls, args.rounds).items():
        rounded = ", ".join(f"{figure:.0f}" for figure in figures)
        print(f"{name}: median {statistics.median(figures):.0f} µs a call ({rounded})")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
