"""The operations port (``metrics_listen``): plain HTTP for Prometheus, kubelet and people.

- ``/metrics``: the app's registry in Prometheus' text format;
- ``/healthz``: 200 while the event loop keeps its heartbeat (it beats four times a second),
  so an OpenStack outage never turns into a restart loop, and a stuck loop does;
- ``/readyz``: 200 once the first sync is done and while the inventory is younger than
  ``reconcile.max_inventory_age`` and OpenStack accepts osas's credentials, else 503 with the
  reason;
- ``/status``: what osas is doing, as JSON (``osas status`` prints it as a table).

Nothing an HTTP client does here can delay a gRPC answer or fail liveness: the port is served
by the standard library's threading HTTP server in threads of its own (one per connection, a
read timeout on each), never by the event loop. ``/healthz`` reads the heartbeat and nothing
else. What the others say is read on the event loop, where the inventory is never seen
half-changed: ``/readyz`` asks it each time (a cheap question), ``/metrics`` and ``/status``
are rendered there at most five times a second however many clients poll, and served from that
copy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from osas.service.server import BindError, bind_problem

logger = structlog.get_logger(__name__)

# A connection that sends nothing for this long is closed (slow or idle clients).
_READ_TIMEOUT = 5.0
_HEARTBEAT = 0.25
# /healthz fails once the event loop has not beaten for this long: stuck, not busy.
_STALL_LIMIT = 10.0
# How long a request waits for the event loop to answer it, and how old a rendered /metrics
# or /status may be before it is rendered again.
_LOOP_TIMEOUT = 5.0
_RENDER_EVERY = 0.2
_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class _Answer:
    status: HTTPStatus
    content_type: str
    body: bytes


def _text(status: HTTPStatus, text: str) -> _Answer:
    return _Answer(status, _TEXT, f"{text}\n".encode())


_NOT_FOUND = _text(HTTPStatus.NOT_FOUND, "not found: try /metrics, /healthz, /readyz, /status")
_BUSY = _text(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: the event loop did not answer in time")
_FAILED = _text(HTTPStatus.INTERNAL_SERVER_ERROR, "failed: see the log event of the same time")


@dataclass(slots=True)
class _Rendered:
    answer: _Answer | None = None
    at: float = 0.0
    pending: concurrent.futures.Future[_Answer] | None = None


class OperationsServer:
    """``/metrics``, ``/healthz``, ``/readyz`` and ``/status`` on one address, in threads of
    their own."""

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
        # Run before /metrics and /status are rendered: work that may give the event loop
        # turns (a scrape itself cannot: prometheus_client's collectors are synchronous).
        self._prepare = prepare
        self._registry = registry
        self._readiness = readiness
        self._status = status
        self._http: ThreadingHTTPServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat = time.monotonic()
        self._heartbeat: asyncio.Task[None] | None = None
        self._rendered = {"/metrics": _Rendered(), "/status": _Rendered()}
        self._render_lock = threading.Lock()
        self.port = 0

    async def start(self) -> None:
        host, _, port = self._listen.rpartition(":")
        host = host.strip("[]")
        handler = type("_Handler", (_Handler,), {"ops": self})
        server = _Server6 if ":" in host else _Server
        try:
            http = server((host or "0.0.0.0", int(port)), handler)  # noqa: S104 - as configured
        except OSError:
            problem = bind_problem(self._listen)
            raise BindError(
                f"cannot listen on {self._listen} (metrics_listen): {problem}"
            ) from None
        self._http = http
        self._loop = asyncio.get_running_loop()
        self._beat = time.monotonic()
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="osas-heartbeat")
        threading.Thread(target=http.serve_forever, name="osas-metrics", daemon=True).start()
        self.port = int(http.server_address[1])
        logger.info("metrics listening", listen=self._listen, port=self.port)

    async def close(self) -> None:
        http, self._http = self._http, None
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if http is not None:
            # shutdown() waits for serve_forever to notice (half a second at most).
            await asyncio.to_thread(http.shutdown)
            http.server_close()

    async def _beat_forever(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(_HEARTBEAT)

    # -- answers, on the server's threads ----------------------------------------------------

    def answer(self, method: str, path: str) -> _Answer:
        if method not in {"GET", "HEAD"}:
            return _text(HTTPStatus.METHOD_NOT_ALLOWED, "only GET and HEAD")
        if path == "/healthz":
            return self._health()
        if path == "/readyz":
            return self._ready()
        if path in self._rendered:
            return self._render(path)
        return _NOT_FOUND

    def _health(self) -> _Answer:
        silent = time.monotonic() - self._beat
        if silent > _STALL_LIMIT:
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"the event loop is stuck ({silent:.0f}s)")
        return _text(HTTPStatus.OK, "ok")

    def _in_loop(self, work: Callable[[], Awaitable[_Answer]]) -> _Answer:
        loop = self._loop
        if loop is None or loop.is_closed():
            return _BUSY
        future = asyncio.run_coroutine_threadsafe(_awaited(work), loop)
        try:
            return future.result(_LOOP_TIMEOUT)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
            future.cancel()
            return _BUSY
        except Exception:
            logger.exception("metrics port: an answer failed")
            return _FAILED

    def _ready(self) -> _Answer:
        async def ask() -> _Answer:
            reason = self._readiness()
            if reason is None:
                return _text(HTTPStatus.OK, "ready")
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason}")

        return self._in_loop(ask)

    def _render(self, path: str) -> _Answer:
        """The last rendering if it is younger than ``_RENDER_EVERY``; else a new one, made
        once on the event loop for every request that asks meanwhile."""
        rendered = self._rendered[path]
        with self._render_lock:
            if rendered.answer is not None and time.monotonic() - rendered.at < _RENDER_EVERY:
                return rendered.answer
            if rendered.pending is None:
                rendered.pending = concurrent.futures.Future()
                owner = True
            else:
                owner = False
            pending = rendered.pending
        if not owner:
            try:
                return pending.result(_LOOP_TIMEOUT + 1)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                return _BUSY
        answer = self._in_loop(lambda: self._make(path))
        with self._render_lock:
            if answer is not _BUSY:
                rendered.answer, rendered.at = answer, time.monotonic()
            rendered.pending = None
        pending.set_result(answer)
        return answer

    async def _make(self, path: str) -> _Answer:
        if self._prepare is not None:
            await self._prepare()
        if path == "/metrics":
            return _Answer(HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self._registry))
        return _Answer(HTTPStatus.OK, _JSON, json.dumps(self._status(), indent=1).encode())


async def _awaited(work: Callable[[], Awaitable[_Answer]]) -> _Answer:
    return await work()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client still connected never holds the process at exit
    # Connections wait here until the single accepting thread starts a thread for each. At 128,
    # a burst of a few hundred idle clients filled it, Linux dropped the next SYN, and a kubelet
    # probe retried it only after 1 s: a failed /healthz. The kernel caps it at somaxconn.
    request_queue_size = 1024


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    ops: OperationsServer
    timeout = _READ_TIMEOUT
    protocol_version = "HTTP/1.0"  # one request per connection
    server_version = "osas"
    sys_version = ""

    def do_GET(self) -> None:
        self._reply(self.ops.answer("GET", self.path.split("?", 1)[0]), body=True)

    def do_HEAD(self) -> None:
        self._reply(self.ops.answer("HEAD", self.path.split("?", 1)[0]), body=False)

    def _reply(self, answer: _Answer, *, body: bool) -> None:
        self.send_response(answer.status.value)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            with contextlib.suppress(OSError):
                self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Requests are not logged: probes come every few seconds."""


def fetch_status(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """``/status`` of a running osas (blocking: ``osas status``, or a thread of the demo)."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http:// URL")
    with urllib.request.urlopen(f"{base}/status", timeout=timeout) as response:  # noqa: S310 - checked above
        data: dict[str, Any] = json.loads(response.read())
    return data
