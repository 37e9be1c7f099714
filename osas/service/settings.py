"""Settings of the gRPC servers, as plain values (kept apart so config need not import grpc)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_file: Path
    key_file: Path
    client_ca_file: Path
    # Client identities allowed to call ("dns:NAME", "uri:URI", "cn:NAME"); empty: any client
    # with a certificate from client_ca_file.
    allowed_clients: tuple[str, ...] = ()
    # DNS names and IP addresses CA dials; the server certificate must cover each.
    server_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TransportSettings:
    # CA accepts at most 4 MiB per response; its requests are far smaller.
    max_message_bytes: int = 4 * 1024 * 1024
    max_concurrent_rpcs: int = 256
    # Connections are sent away after this long, so that clients handshake again and pick up
    # rotated certificates; calls in flight get the grace period to finish.
    max_connection_age: float = 600.0
    max_connection_age_grace: float = 30.0
    keepalive_time: float = 60.0
    keepalive_timeout: float = 20.0
    # The process's event loop, chosen before it starts (osas.cli.serve): uvloop's lowers
    # grpc.aio's own CPU a call by some 10% (docs/BENCHMARKS.md).
    event_loop: str = "uvloop"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    listen: str
    health_listen: str
    tls: TlsFiles | None  # None only when the operator chose plaintext explicitly
    metrics_listen: str | None = None  # /metrics, /healthz, /readyz, /status; None: off
    shutdown_grace: float = 20.0
    transport: TransportSettings = field(default_factory=TransportSettings)
