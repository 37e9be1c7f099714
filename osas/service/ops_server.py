"""The operations port (``metrics_listen``): plain HTTP for Prometheus, kubelet and people.

- ``/metrics``: the app's registry in Prometheus' text format;
- ``/healthz``: 200 as long as the event loop answers (it serves this very request), so an
  OpenStack outage never turns into a restart loop;
- ``/readyz``: 200 once the first sync is done and while the inventory is younger than
  ``reconcile.max_inventory_age``, else 503 with the reason;
- ``/status``: what osas is doing, as JSON (``osas status`` prints it as a table).

Served by the event loop itself, like everything osas does: a scrape reads the inventory
between two changes, never during one. A small HTTP/1.1 server of our own (one request per
connection), since that is all it takes; requests are bounded in size, time and number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from osas.service.server import BindError, bind_problem

logger = structlog.get_logger(__name__)

_READ_TIMEOUT = 5.0
_MAX_HEADER_LINES = 64
_MAX_LINE = 8192
# Anyone who reaches the port may connect: past this many at once, new ones are closed.
_MAX_CONNECTIONS = 64
_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class _Answer:
    status: HTTPStatus
    content_type: str
    body: bytes


def _text(status: HTTPStatus, text: str) -> _Answer:
    return _Answer(status, _TEXT, f"{text}\n".encode())


class OperationsServer:
    """``/metrics``, ``/healthz``, ``/readyz`` and ``/status`` on one address."""

    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        *,
        readiness: Callable[[], str | None],
        status: Callable[[], dict[str, Any]],
        prepare: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._listen = listen
        # Run before /metrics and /status: work that may give the event loop turns (a
        # scrape itself cannot: prometheus_client's collectors are synchronous).
        self._prepare = prepare
        self._registry = registry
        self._readiness = readiness
        self._status = status
        self._server: asyncio.Server | None = None
        self._open = 0
        self.port = 0

    async def start(self) -> None:
        host, _, port = self._listen.rpartition(":")
        try:
            self._server = await asyncio.start_server(
                self._serve, host.strip("[]") or None, int(port), limit=_MAX_LINE
            )
        except OSError:
            problem = bind_problem(self._listen)
            raise BindError(
                f"cannot listen on {self._listen} (metrics_listen): {problem}"
            ) from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        logger.info("metrics listening", listen=self._listen, port=self.port)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    def answer(self, method: str, path: str) -> _Answer:
        if method not in {"GET", "HEAD"}:
            return _text(HTTPStatus.METHOD_NOT_ALLOWED, "only GET and HEAD")
        route = {
            "/metrics": self._metrics,
            "/healthz": lambda: _text(HTTPStatus.OK, "ok"),
            "/readyz": self._ready,
            "/status": self._status_document,
        }.get(path)
        if route is None:
            return _text(
                HTTPStatus.NOT_FOUND, "not found: try /metrics, /healthz, /readyz, /status"
            )
        return route()

    def _metrics(self) -> _Answer:
        return _Answer(HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self._registry))

    def _ready(self) -> _Answer:
        reason = self._readiness()
        if reason is None:
            return _text(HTTPStatus.OK, "ready")
        return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason}")

    def _status_document(self) -> _Answer:
        return _Answer(HTTPStatus.OK, _JSON, json.dumps(self._status(), indent=1).encode())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open > _MAX_CONNECTIONS:
                return
            try:
                async with asyncio.timeout(_READ_TIMEOUT):
                    method, path = await _read_request(reader)
            except (TimeoutError, ValueError, ConnectionError, asyncio.IncompleteReadError):
                answer = _text(HTTPStatus.BAD_REQUEST, "bad request")
                method = "GET"
            else:
                if self._prepare is not None and path in {"/metrics", "/status"}:
                    await self._prepare()
                answer = self.answer(method, path)
            head = (
                f"HTTP/1.1 {answer.status.value} {answer.status.phrase}\r\n"
                f"Content-Type: {answer.content_type}\r\n"
                f"Content-Length: {len(answer.body)}\r\n"
                "Cache-Control: no-store\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1"))
            if method != "HEAD":
                writer.write(answer.body)
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(_READ_TIMEOUT):
                    await writer.drain()
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError, OSError):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of one request; its headers are read and ignored."""
    request_line = (await reader.readline()).decode("latin-1").strip()
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):  # noqa: PLR2004 - method, target, version
        raise ValueError("not an HTTP request line")
    for _ in range(_MAX_HEADER_LINES):
        line = await reader.readline()
        if line in {b"\r\n", b"\n", b""}:
            return parts[0], parts[1].split("?", 1)[0]
    raise ValueError("too many header lines")


def fetch_status(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """``/status`` of a running osas (blocking: ``osas status``, or a thread of the demo)."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http:// URL")
    with urllib.request.urlopen(f"{base}/status", timeout=timeout) as response:  # noqa: S310 - checked above
        data: dict[str, Any] = json.loads(response.read())
    return data
