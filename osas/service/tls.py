"""mTLS for the provider port: certificates that rotate under a running server, and an optional
allow-list of client identities.

cert-manager rotates a Secret by swapping a symlink (``..data``) under the mounted files. gRPC
asks ``CertificateFiles.fetch`` for fresh material on every new TLS handshake; the files are
re-read only when their content changed, and a new set that does not hold together (unreadable,
a key that does not match the certificate, a CA that is not a certificate) is refused with an
error in the log while the last good set stays in use. Connections already open keep their
session until the server's maximum connection age sends them away to handshake again.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from osas.service.settings import TlsFiles

logger = structlog.get_logger(__name__)


class CertificateError(Exception):
    """The certificate files do not make a usable server identity."""


@dataclass(frozen=True, slots=True)
class _Material:
    key: bytes
    chain: bytes
    client_ca: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.key + self.chain + self.client_ca).hexdigest()


def _public_bytes(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _check(material: _Material) -> None:
    try:
        chain = x509.load_pem_x509_certificates(material.chain)
        key = serialization.load_pem_private_key(material.key, password=None)
        x509.load_pem_x509_certificates(material.client_ca)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"cannot parse: {exc}") from exc
    if _public_bytes(chain[0].public_key()) != _public_bytes(key.public_key()):
        raise CertificateError("the private key does not match the certificate")


class CertificateFiles:
    """The server's certificate, key and client CA, re-read when the files change."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._current = self._load()
        _check(self._current)

    def _load(self) -> _Material:
        try:
            return _Material(
                key=self._files.key_file.read_bytes(),
                chain=self._files.cert_file.read_bytes(),
                client_ca=self._files.client_ca_file.read_bytes(),
            )
        except OSError as exc:
            raise CertificateError(f"cannot read {exc.filename}: {exc.strerror}") from exc

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        material = self._current
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.chain)], root_certificates=material.client_ca
        )

    def credentials(self) -> grpc.ServerCredentials:
        # grpc-stubs types the fetcher as never returning None; gRPC documents None as
        # "no change", which is what it returns nearly every time.
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(),
            self.fetch,  # type: ignore[arg-type]
            require_client_authentication=True,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake, on its own threads: new material or None."""
        with self._lock:
            try:
                fresh = self._load()
                if fresh.digest == self._current.digest:
                    return None
                _check(fresh)
            except CertificateError as exc:
                logger.error("new TLS files refused; keeping the previous ones", reason=str(exc))
                return None
            self._current = fresh
            logger.info("TLS certificates reloaded", digest=fresh.digest[:12])
            return self._configuration()


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    common_name: str | None
    dns_names: tuple[str, ...]
    uris: tuple[str, ...]

    def names(self) -> list[str]:
        names = [f"dns:{name}" for name in self.dns_names]
        names += [f"uri:{uri}" for uri in self.uris]
        if self.common_name:
            names.append(f"cn:{self.common_name}")
        return names


def client_identity(pem: bytes) -> ClientIdentity:
    cert = x509.load_pem_x509_certificate(pem)
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ClientIdentity(str(common[0].value) if common else None, (), ())
    dns = tuple(san.get_values_for_type(x509.DNSName))
    uris = tuple(san.get_values_for_type(x509.UniformResourceIdentifier))
    return ClientIdentity(str(common[0].value) if common else None, dns, uris)


class ClientAllowList:
    """Client identities allowed to call the provider: ``dns:NAME``, ``uri:URI``, ``cn:NAME``."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self._allowed = frozenset(allowed)
        self._seen: dict[bytes, ClientIdentity] = {}

    def __bool__(self) -> bool:
        return bool(self._allowed)

    def admits(
        self, auth_context: Mapping[str, Iterable[bytes]]
    ) -> tuple[bool, ClientIdentity | None]:
        pem = next(iter(auth_context.get("x509_pem_cert") or ()), None)
        if pem is None:
            return False, None
        identity = self._seen.get(pem)
        if identity is None:
            identity = client_identity(pem)
            if len(self._seen) > 64:  # noqa: PLR2004 - a handful of clients at most
                self._seen.clear()
            self._seen[pem] = identity
        return bool(self._allowed.intersection(identity.names())), identity
