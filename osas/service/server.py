"""The gRPC servers: the provider port (mTLS by default) and a plaintext health-only port."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass
from operator import methodcaller
from typing import Any

import grpc
import structlog
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from prometheus_client import CollectorRegistry
from structlog.contextvars import bind_contextvars

from osas.domain.limits import MAX_NODES_PER_REQUEST
from osas.engine.places import CaController
from osas.protocol import externalgrpc_pb2
from osas.service.answers import refuse
from osas.service.gate import RpcGate
from osas.service.health import ProbeHealthServicer
from osas.service.metrics import RpcMetrics
from osas.service.servicer import CloudProviderServicer
from osas.service.settings import ServerSettings, TransportSettings
from osas.service.tls import CertificateFiles, ClientAllowList
from osas.service.wire import more_records_than

logger = structlog.get_logger(__name__)

_SERVICE = externalgrpc_pb2.DESCRIPTOR.services_by_name["CloudProvider"]
SERVICE_NAME = _SERVICE.full_name
# Seconds open health Watch streams get at shutdown to write NOT_SERVING before they are
# cancelled.
_HEALTH_WATCH_FLUSH = 0.5

Screen = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Message | None]


class BindError(Exception):
    """A gRPC server cannot listen on its configured address."""


@dataclass(frozen=True, slots=True)
class _Cap:
    """A repeated field of a request whose length the domain caps."""

    field: str
    limit: int


# Counted on the wire before decoding (see ``osas.service.wire``).
_CAPPED_FIELDS = {"NodeGroupDeleteNodes": _Cap("nodes", MAX_NODES_PER_REQUEST)}

_BIND_HINTS = {
    errno.EADDRINUSE: "another process (another osas?) listens there; stop it or choose "
    "another port",
    errno.EACCES: "permission denied; ports below 1024 need privileges, choose a higher port",
    errno.EADDRNOTAVAIL: "no interface of this host has that address; listen on 0.0.0.0 or "
    "an address of this host",
}


def server_options(transport: TransportSettings) -> list[tuple[str, int]]:
    def ms(seconds: float) -> int:
        return int(seconds * 1000)

    return [
        ("grpc.max_receive_message_length", transport.max_message_bytes),
        ("grpc.max_send_message_length", transport.max_message_bytes),
        # Two processes must never share a port silently.
        ("grpc.so_reuseport", 0),
        ("grpc.max_connection_age_ms", ms(transport.max_connection_age)),
        ("grpc.max_connection_age_grace_ms", ms(transport.max_connection_age_grace)),
        ("grpc.keepalive_time_ms", ms(transport.keepalive_time)),
        ("grpc.keepalive_timeout_ms", ms(transport.keepalive_timeout)),
        ("grpc.keepalive_permit_without_calls", 1),
        # CA's grpc-go client sends no keepalive pings; tolerate sparse ones from others.
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


def bind_problem(address: str) -> str:
    """Why ``address`` cannot be listened on, found by binding it once more ourselves: gRPC
    only says that it failed."""
    host, _, port = address.rpartition(":")
    try:
        candidates = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        return f"the host does not resolve ({exc.strerror})"
    for family, kind, protocol, _, sockaddr in candidates:
        with socket.socket(family, kind, protocol) as probe:
            # As gRPC binds: connections of an earlier process in TIME_WAIT do not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                hint = _BIND_HINTS.get(exc.errno or 0, "")
                return f"{exc.strerror.lower() if exc.strerror else exc}" + (
                    f": {hint}" if hint else ""
                )
    return "gRPC could not bind it (GRPC_VERBOSITY=debug shows gRPC's own reason)"


def _listen(key: str, address: str, add: Callable[[str], int]) -> int:
    try:
        return add(address)
    except RuntimeError:
        raise BindError(f"cannot listen on {address} ({key}): {bind_problem(address)}") from None


def _screen(name: str, request_class: type[Message], allow: ClientAllowList | None) -> Screen:
    """Decode the request ourselves, so that undecodable bytes get INVALID_ARGUMENT (not the
    INTERNAL gRPC would answer), refuse a capped repeated field that is too long before
    decoding it, and admit only allowed client identities. A refusal sets its status
    (``answers.refuse``) and gives None; it is logged once, in the call's access line
    (``gate``), with the reason given here. Synchronous: the gate calls it inline, not as one
    more coroutine a call."""
    cap = _CAPPED_FIELDS.get(name)
    capped_number = request_class.DESCRIPTOR.fields_by_name[cap.field].number if cap else 0

    def decode(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Message | None:
        if allow:
            admitted, identity = allow.admits(context.auth_context())
            if not admitted:
                # Who was refused goes into the call's access line.
                bind_contextvars(client=identity.names() if identity else [])
                refuse(context, grpc.StatusCode.PERMISSION_DENIED, "client identity is not allowed")
                return None
        if cap and more_records_than(raw, capped_number, cap.limit):
            refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"more than {cap.limit} {cap.field} in one request; at most {cap.limit} "
                "are accepted",
            )
            return None
        try:
            return request_class.FromString(raw)
        except DecodeError:
            refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request is not a valid {request_class.DESCRIPTOR.name} message",
            )
            return None

    return decode


def _admits(allow: ClientAllowList) -> Callable[[grpc.aio.ServicerContext[Any, Any]], bool]:
    """Whether the calling client is on the allow list, with no refusal set (the screen sets
    it, and the gate writes its line, when the call goes that way)."""

    def admits(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
        return allow.admits(context.auth_context())[0]

    return admits


# A message's SerializeToString, called from C: no Python frame of ours between grpc.aio and
# the message's own serialiser (protobuf's, or a Serialized's stored bytes).
_serialize = methodcaller("SerializeToString")


def provider_handler(
    servicer: CloudProviderServicer, allow: ClientAllowList | None, gate: RpcGate
) -> grpc.GenericRpcHandler[Any, Any]:
    """The CloudProvider service, every method screened (``_screen``) and gated (``RpcGate``)."""
    handlers = {}
    standing = servicer.standing_answers()
    admits = None if allow is None else _admits(allow)
    for method in _SERVICE.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        screen = _screen(method.name, request_class, allow)
        behavior = getattr(servicer, method.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            gate.wrap(method.name, screen, behavior, standing.get(method.name), admits),
            request_deserializer=None,
            response_serializer=_serialize,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


class _GenericHandlersOnly:
    """A server as generated ``add_*_to_server`` functions see it, keeping their generic
    handlers and dropping their registered ones. grpc.aio's server keeps one pending task
    per registered method and waits on all of them again for every call it takes, generic
    ones included: health's three methods and reflection's one cost each of CA's calls four
    futures' callbacks, 7% of the bare server's instructions a call. Generic, these services are
    found by name when asked, and CA's calls (found first) pay nothing for them."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        del service, handlers  # the generic handler added beside them serves these methods


def _add_generic(
    add: Callable[[Any, Any], None], servicer: object, server: grpc.aio.Server
) -> None:
    """Register a generated service's handlers on ``server`` as generic ones only."""
    add(servicer, _GenericHandlersOnly(server))


# Health service names of the plaintext probe port, for kubelet's gRPC probes: alive while
# the process runs; ready once the inventory is warm (leader or standby: a standby's pod is
# Ready, so that rollouts and disruption budgets work; CA's Service reaches the leader alone).
LIVENESS = "liveness"
READINESS = "readiness"


class ProviderServer:
    """Both gRPC servers with their health services: the provider service (and "") NOT_SERVING
    until ``set_serving`` (this process is the writer), ``readiness`` until ``set_warm``."""

    def __init__(
        self,
        controller: CaController,
        settings: ServerSettings,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._controller = controller
        self._settings = settings
        methods = [method.name for method in _SERVICE.methods]
        self._rpc_metrics = RpcMetrics(registry or CollectorRegistry(), methods)
        self._gate = RpcGate(
            _SERVICE, self._rpc_metrics, max_concurrent=settings.transport.max_concurrent_rpcs
        )
        # grpc-stubs predates health.aio; it is there at runtime since grpcio 1.33.
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._public_health = ProbeHealthServicer()
        self._servers: list[grpc.aio.Server] = []
        self.port = 0
        self.health_port = 0
        self.certificates: CertificateFiles | None = None

    async def start(self) -> None:
        """Bind and start both servers (in the running loop: grpc.aio binds to it)."""
        settings = self._settings
        options = server_options(settings.transport)
        server = grpc.aio.server(options=options)
        # No list (the default) admits every client the handshake lets in, at no cost a call.
        tls = settings.tls
        allow = (
            ClientAllowList(
                tls.allowed_clients, on_new_certificate=self._rpc_metrics.client_certificate_seen
            )
            if tls and tls.allowed_clients
            else None
        )
        servicer = CloudProviderServicer(self._controller)
        server.add_generic_rpc_handlers((provider_handler(servicer, allow, self._gate),))
        _add_generic(health_pb2_grpc.add_HealthServicer_to_server, self._health, server)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        _add_generic(
            reflection_pb2_grpc.add_ServerReflectionServicer_to_server,
            # Public API (the module's __all__), missing from grpc-stubs' copy of the module.
            reflection.aio.ReflectionServicer(names),  # type: ignore[attr-defined]
            server,
        )
        # Kubelet probes cannot present a client certificate: health alone, in plaintext. No
        # cap on concurrent calls: open Watch streams must never lock Check out (health.py).
        health_server = grpc.aio.server(options=options)
        _add_generic(
            health_pb2_grpc.add_HealthServicer_to_server, self._public_health, health_server
        )
        if settings.tls is None:
            logger.warning("serving plaintext without client authentication (insecure: true)")
            self.port = _listen("listen", settings.listen, server.add_insecure_port)
        else:
            self.certificates = CertificateFiles(settings.tls)
            warning = self.certificates.expiry_warning()
            if warning:
                logger.warning("TLS certificate expires soon", reason=warning)
            credentials = self.certificates.credentials()
            self.port = _listen(
                "listen",
                settings.listen,
                lambda address: server.add_secure_port(address, credentials),
            )
        self.health_port = _listen(
            "health_listen", settings.health_listen, health_server.add_insecure_port
        )
        for servicer in (self._health, self._public_health):
            for name in ("", SERVICE_NAME):
                await servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._public_health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self._public_health.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._servers = [server, health_server]
        await server.start()
        await health_server.start()
        logger.info(
            "grpc listening",
            listen=settings.listen,
            port=self.port,
            health_port=self.health_port,
            tls=settings.tls is not None,
            # The loop that runs (transport.event_loop): uvloop's, or asyncio's own.
            event_loop=type(asyncio.get_running_loop()).__module__.partition(".")[0],
        )

    async def set_warm(self) -> None:
        """The inventory is synced: ready to serve or to take over (kubelet's readiness)."""
        await self._public_health.set(READINESS, health_pb2.HealthCheckResponse.SERVING)

    async def set_serving(self) -> None:
        for servicer in (self._health, self._public_health):
            for name in ("", SERVICE_NAME):
                await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        logger.info("health SERVING")

    async def stop(self) -> None:
        """NOT_SERVING at once, then stop accepting and let in-flight calls finish."""
        for servicer in (self._health, self._public_health):
            await servicer.enter_graceful_shutdown()
        if self._servers:
            server, health_server = self._servers
            await server.stop(self._settings.shutdown_grace)
            # Not None: that cancels open Watch streams at once, and one may not have written
            # NOT_SERVING yet. A stream never ends by itself, so this is the whole wait.
            await health_server.stop(_HEALTH_WATCH_FLUSH)
            self._servers = []
            logger.info("grpc stopped")

    async def close(self) -> None:
        """Stop both servers at once, cancelling calls in flight (after ``stop``, nothing)."""
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(None)
