"""The gRPC servers: the provider port (mTLS by default) and a plaintext health-only port."""

from __future__ import annotations

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from osas.engine.controller import Controller
from osas.protocol import externalgrpc_pb2, externalgrpc_pb2_grpc
from osas.service.servicer import CloudProviderServicer
from osas.service.settings import ServerSettings, TlsFiles

logger = structlog.get_logger(__name__)

SERVICE_NAME = externalgrpc_pb2.DESCRIPTOR.services_by_name["CloudProvider"].full_name
# CA accepts at most 4 MiB per response; requests from CA are far smaller.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Two processes must never share a port silently.
    ("grpc.so_reuseport", 0),
]


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """mTLS: our certificate, and client certificates required and checked against the CA."""
    return grpc.ssl_server_credentials(
        [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
        root_certificates=tls.client_ca_file.read_bytes(),
        require_client_auth=True,
    )


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
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        externalgrpc_pb2_grpc.add_CloudProviderServicer_to_server(
            CloudProviderServicer(self._controller), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        # Kubelet probes cannot present a client certificate: health alone, in plaintext.
        health_server = grpc.aio.server(options=_SERVER_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(self._public_health, health_server)
        if settings.tls is None:
            logger.warning("serving plaintext without client authentication (insecure: true)")
            self.port = server.add_insecure_port(settings.listen)
        else:
            self.port = server.add_secure_port(settings.listen, server_credentials(settings.tls))
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
