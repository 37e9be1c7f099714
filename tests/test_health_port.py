"""The plaintext health port, which anyone who reaches it may call: open Watch streams never
lock Check out, there or on the provider port, nor the HTTP /healthz of the metrics port."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import make_config, running

from osas.service.health import WATCH_LIMIT

SERVING = health_pb2.HealthCheckResponse.SERVING


async def first_answer(watch) -> object:
    """The first status a Watch stream sends, or the status code that refused it."""
    try:
        return (await watch.read()).status
    except grpc.aio.AioRpcError as error:
        return error.code()


def healthz(port: int) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
        return answer.status, answer.read()


async def test_64_watch_streams_leave_check_answering(tmp_path):
    async with running(make_config(tmp_path, metrics_listen="127.0.0.1:0")) as provider:
        server = provider.app.server
        probe = f"127.0.0.1:{server.health_port}"
        async with grpc.aio.insecure_channel(probe) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(64)]
            outcomes = [await first_answer(watch) for watch in watches]
            assert outcomes.count(SERVING) == WATCH_LIMIT
            assert outcomes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 64 - WATCH_LIMIT

            for address in (probe, provider.address):
                async with grpc.aio.insecure_channel(address) as other:
                    check = health_pb2_grpc.HealthStub(other).Check
                    for _ in range(20):  # more than the old cap of 16 calls at once
                        response = await check(health_pb2.HealthCheckRequest(), timeout=5)
                        assert response.status == SERVING

            # Kubelet's httpGet liveness probe, answered by the event loop itself.
            assert provider.app.ops is not None
            for _ in range(20):
                assert await asyncio.to_thread(healthz, provider.app.ops.port) == (200, b"ok\n")

            for watch in watches:
                watch.cancel()
