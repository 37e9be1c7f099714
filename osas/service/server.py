"""The gRPC servers: the provider port (mTLS by default) and a plaintext health-only port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from osas.engine.controller import Controller
from osas.protocol import externalgrpc_pb2
from osas.service.servicer import CloudProviderServicer
from osas.service.settings import ServerSettings, TransportSettings
from osas.service.tls import CertificateFiles, ClientAllowList

logger = structlog.get_logger(__name__)

_SERVICE = externalgrpc_pb2.DESCRIPTOR.services_by_name["CloudProvider"]
SERVICE_NAME = _SERVICE.full_name

Handler = Callable[[Message, grpc.aio.ServicerContext[Any, Any]], Awaitable[Message]]


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


def _guarded(
    name: str, handle: Handler, request_class: type[Message], allow: ClientAllowList | None
) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[Message]]:
    """Decode the request ourselves, so that undecodable bytes get INVALID_ARGUMENT (not the
    INTERNAL gRPC would answer), and admit only allowed client identities."""

    async def call(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
        if allow:
            admitted, identity = allow.admits(context.auth_context())
            if not admitted:
                names = identity.names() if identity else []
                logger.warning("client refused: not in allowed_clients", rpc=name, client=names)
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED, "client identity is not allowed"
                )
        try:
            request = request_class.FromString(raw)
        except DecodeError:
            logger.warning("rpc refused", rpc=name, code="INVALID_ARGUMENT", reason="undecodable")
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request is not a valid {request_class.DESCRIPTOR.name} message",
            )
        return await handle(request, context)

    return call


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def provider_handler(
    servicer: CloudProviderServicer, allow: ClientAllowList | None
) -> grpc.GenericRpcHandler[Any, Any]:
    """The CloudProvider service, every method behind ``_guarded``."""
    handlers = {}
    for method in _SERVICE.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        handle = getattr(servicer, method.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(method.name, handle, request_class, allow),
            request_deserializer=None,
            response_serializer=_serialize,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


class ProviderServer:
    """Both gRPC servers with their health services; NOT_SERVING until ``set_serving``."""

    def __init__(self, controller: Controller, settings: ServerSettings) -> None:
        self._controller = controller
        self._settings = settings
        # grpc-stubs predates health.aio; it is there at runtime since grpcio 1.33.
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._public_health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._servers: list[grpc.aio.Server] = []
        self.port = 0
        self.health_port = 0

    async def start(self) -> None:
        """Bind and start both servers (in the running loop: grpc.aio binds to it)."""
        settings = self._settings
        options = server_options(settings.transport)
        server = grpc.aio.server(
            options=options, maximum_concurrent_rpcs=settings.transport.max_concurrent_rpcs
        )
        allow = ClientAllowList(settings.tls.allowed_clients) if settings.tls else None
        servicer = CloudProviderServicer(self._controller)
        server.add_generic_rpc_handlers((provider_handler(servicer, allow),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        # Kubelet probes cannot present a client certificate: health alone, in plaintext.
        health_server = grpc.aio.server(options=options, maximum_concurrent_rpcs=16)
        health_pb2_grpc.add_HealthServicer_to_server(self._public_health, health_server)
        if settings.tls is None:
            logger.warning("serving plaintext without client authentication (insecure: true)")
            self.port = server.add_insecure_port(settings.listen)
        else:
            credentials = CertificateFiles(settings.tls).credentials()
            self.port = server.add_secure_port(settings.listen, credentials)
        self.health_port = health_server.add_insecure_port(settings.health_listen)
        for servicer in (self._health, self._public_health):
            for name in ("", SERVICE_NAME):
                await servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._servers = [server, health_server]
        await server.start()
        await health_server.start()
        logger.info(
            "grpc listening",
            listen=settings.listen,
            port=self.port,
            health_port=self.health_port,
            tls=settings.tls is not None,
        )

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
            await health_server.stop(None)
            self._servers = []
            logger.info("grpc stopped")

    async def close(self) -> None:
        """Stop both servers at once, cancelling calls in flight (after ``stop``, nothing)."""
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(None)
