"""Settings of the gRPC servers, as plain values (kept apart so config need not import grpc)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_file: Path
    key_file: Path
    client_ca_file: Path


@dataclass(frozen=True, slots=True)
class ServerSettings:
    listen: str
    health_listen: str
    tls: TlsFiles | None  # None only when the operator chose plaintext explicitly
    shutdown_grace: float = 20.0
