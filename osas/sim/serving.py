"""HTTP on 127.0.0.1 in a daemon thread, for the simulated clouds (OpenStack's and
Kubernetes'): the server keeps its open connections, so that stopping cuts keep-alive
connections their threads would go on serving, and a client that gave up (its timeout, a
cancelled task) is not reported as a failure of the server."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class TrackedHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.open_connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up on a request resets the connection: what a real server sees
        # every day, not a failure.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class TrackedHandler(BaseHTTPRequestHandler):
    """Keep-alive, as the clients' connection pools expect; each connection known to its
    server while it is open."""

    protocol_version = "HTTP/1.1"
    server: TrackedHttpServer
    timeout = 60  # an idle keep-alive connection does not hold a thread forever

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; without this, Nagle's algorithm and the
        # client's delayed ACK hold every answer back some 40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.connections_lock:
            self.server.open_connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.open_connections.discard(self.connection)
        super().finish()


class BackgroundHttp:
    """A ``TrackedHttpServer`` served in a daemon thread; ``stopping`` is set while it stops
    (answers that wait, like a stalled create, watch it)."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._http: TrackedHttpServer | None = None
        self._thread: threading.Thread | None = None

    def _serve(self, http: TrackedHttpServer, name: str) -> None:
        """Serve ``http`` in a thread of its own; returns once its socket accepts."""
        if self._http is not None:
            http.server_close()
            raise RuntimeError(f"{name} is already running")
        self.stopping.clear()
        self._http = http
        self._thread = threading.Thread(
            target=http.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{name}-{http.server_address[1]}",
            daemon=True,
        )
        self._thread.start()

    @property
    def serving_port(self) -> int | None:
        return None if self._http is None else int(self._http.server_address[1])

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        http, thread = self._http, self._thread
        if http is None:
            return
        self.stopping.set()
        http.shutdown()
        with http.connections_lock:
            for connection in list(http.open_connections):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        http.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._http, self._thread = None, None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
