"""mTLS for the provider port: certificates that rotate under a running server, and an optional
allow-list of client identities.

cert-manager rotates a Secret by swapping a symlink (``..data``) under the mounted files. gRPC
asks ``CertificateFiles.fetch`` for fresh material on every new TLS handshake; the files are
re-read only when their content changed, and a new set that would not serve is refused with an
error in the log while the last good set stays in use: unreadable, a key that does not match
the certificate, a certificate not valid now (expired or not yet valid), one that does not
cover ``tls.server_names``, a client CA that is not a certificate. The same checks run at start
and in ``osas check-config``. Connections already open keep their session until the server's
maximum connection age sends them away to handshake again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from osas.engine.userdata import relative_note
from osas.service.settings import TlsFiles

logger = structlog.get_logger(__name__)

# A certificate closer than this to its end is worth a warning: cert-manager renews at 2/3 of
# the lifetime, so a week left usually means renewal is failing.
EXPIRY_WARNING = timedelta(days=7)


class CertificateError(Exception):
    """The certificate files do not make a usable server identity."""


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class _Material:
    key: bytes
    chain: bytes
    client_ca: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.key + self.chain + self.client_ca).hexdigest()


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What a usable set of files presents: the server certificate's names and validity."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    not_before: datetime
    not_after: datetime

    def names(self) -> list[str]:
        return [*self.dns_names, *self.ip_addresses]

    def covers(self, name: str) -> bool:
        """Whether a client dialling ``name`` accepts this certificate (RFC 6125: SANs only,
        a wildcard stands for exactly one leftmost label)."""
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            pass
        else:
            return any(ipaddress.ip_address(ip) == address for ip in self.ip_addresses)
        wanted = name.lower().rstrip(".")
        for pattern in (dns.lower().rstrip(".") for dns in self.dns_names):
            if pattern == wanted:
                return True
            if pattern.startswith("*.") and wanted.partition(".")[2] == pattern[2:]:
                return True
        return False

    def expiry_warning(self, now: datetime) -> str | None:
        left = self.not_after - now
        if left > EXPIRY_WARNING:
            return None
        return f"the server certificate expires in {_span(left)}, on {_utc(self.not_after)}"


def _span(delta: timedelta) -> str:
    hours = int(delta.total_seconds() // 3600)
    return f"{hours // 24} days" if hours >= 48 else f"{hours} hours"  # noqa: PLR2004


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _public_bytes(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _identity(cert: x509.Certificate) -> ServerIdentity:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        dns: list[str] = []
        ips: list[str] = []
    else:
        dns = san.get_values_for_type(x509.DNSName)
        ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return ServerIdentity(
        tuple(dns), tuple(ips), cert.not_valid_before_utc, cert.not_valid_after_utc
    )


def _check(material: _Material, files: TlsFiles, now: datetime) -> ServerIdentity:
    """Everything a handshake will need of these files, checked now: raises CertificateError
    naming the file and the reason, else the server identity they present."""
    try:
        chain = x509.load_pem_x509_certificates(material.chain)
    except ValueError:
        raise CertificateError(f"{files.cert_file} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(material.key, password=None)
    except (ValueError, TypeError):
        raise CertificateError(
            f"{files.key_file} holds no PEM private key (or one that needs a password)"
        ) from None
    try:
        x509.load_pem_x509_certificates(material.client_ca)
    except ValueError:
        raise CertificateError(
            f"{files.client_ca_file} holds no PEM certificate (the CA of the clients' certificates)"
        ) from None
    if _public_bytes(chain[0].public_key()) != _public_bytes(key.public_key()):
        raise CertificateError(
            f"the private key in {files.key_file} does not match the certificate "
            f"in {files.cert_file}"
        )
    identity = _identity(chain[0])
    if now < identity.not_before:
        raise CertificateError(
            f"the certificate in {files.cert_file} is not valid before {_utc(identity.not_before)}"
        )
    if now > identity.not_after:
        raise CertificateError(
            f"the certificate in {files.cert_file} expired on {_utc(identity.not_after)}"
        )
    missing = [name for name in files.server_names if not identity.covers(name)]
    if missing:
        raise CertificateError(
            f"the certificate in {files.cert_file} does not cover {', '.join(missing)} "
            f"(tls.server_names); it names {', '.join(identity.names()) or 'nothing'}"
        )
    return identity


def _read(files: TlsFiles) -> _Material:
    try:
        chain = files.cert_file.read_bytes()
        key = files.key_file.read_bytes()
        return _Material(key=key, chain=chain, client_ca=files.client_ca_file.read_bytes())
    except OSError as exc:
        note = "" if exc.filename is None else relative_note(exc.filename)
        raise CertificateError(f"cannot read {exc.filename}: {exc.strerror}{note}") from None


def inspect_files(files: TlsFiles, now: datetime | None = None) -> ServerIdentity:
    """Read and check the files as a handshake would use them (for start and check-config)."""
    return _check(_read(files), files, now or _now())


class CertificateFiles:
    """The server's certificate, key and client CA, re-read when the files change. A new set
    that fails the checks is refused and counted in ``rejected_reloads``; the last good set
    keeps serving."""

    def __init__(self, files: TlsFiles, *, clock: Callable[[], datetime] = _now) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._current = _read(files)
        self.identity = _check(self._current, files, clock())
        if not files.server_names:
            # The names CA dials are those of the certificate it was given with: a renewal
            # must keep them, or CA's next handshake fails.
            files = dataclasses.replace(files, server_names=tuple(self.identity.names()))
            logger.info(
                "tls.server_names is not set: renewed certificates must cover the names of "
                "the one in use",
                names=self.identity.names(),
            )
        self._files = files
        self.rejected_reloads = 0
        # The last set refused (its digest, or why it could not be read): a bad set is checked
        # again at every handshake, in case time makes it valid, but logged and counted once.
        self._refused: str | None = None

    def expiry_warning(self) -> str | None:
        return self.identity.expiry_warning(self._clock())

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
            fresh: _Material | None = None
            try:
                fresh = _read(self._files)
                if fresh.digest == self._current.digest:
                    self._refused = None
                    return None
                identity = _check(fresh, self._files, self._clock())
            except CertificateError as exc:
                refused = fresh.digest if fresh is not None else str(exc)
                if refused != self._refused:
                    self._refused = refused
                    self.rejected_reloads += 1
                    logger.error(
                        "new TLS files refused; keeping the previous ones", reason=str(exc)
                    )
                return None
            self._current, self.identity, self._refused = fresh, identity, None
            logger.info(
                "TLS certificates reloaded",
                digest=fresh.digest[:12],
                names=identity.names(),
                not_after=_utc(identity.not_after),
            )
            warning = self.expiry_warning()
            if warning:
                logger.warning("TLS certificate expires soon", reason=warning)
            return self._configuration()


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    common_name: str | None
    dns_names: tuple[str, ...]
    uris: tuple[str, ...]
    not_after: datetime | None = None

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
        dns: tuple[str, ...] = ()
        uris: tuple[str, ...] = ()
    else:
        dns = tuple(san.get_values_for_type(x509.DNSName))
        uris = tuple(san.get_values_for_type(x509.UniformResourceIdentifier))
    common_name = str(common[0].value) if common else None
    return ClientIdentity(common_name, dns, uris, cert.not_valid_after_utc)


class ClientAllowList:
    """Client identities allowed to call the provider: ``dns:NAME``, ``uri:URI``, ``cn:NAME``."""

    def __init__(
        self,
        allowed: Iterable[str],
        *,
        on_new_certificate: Callable[[ClientIdentity], None] | None = None,
    ) -> None:
        self._allowed = frozenset(allowed)
        # a client certificate -> whether it is allowed, and whose it is
        self._seen: dict[bytes, tuple[bool, ClientIdentity]] = {}
        # Told of each certificate the first time a client presents it (its expiry is watched:
        # CA reads its certificate only at start, and keeps presenting a renewed one's
        # predecessor until it restarts).
        self._on_new_certificate = on_new_certificate

    def __bool__(self) -> bool:
        return bool(self._allowed)

    def admits(
        self, auth_context: Mapping[str, Iterable[bytes]]
    ) -> tuple[bool, ClientIdentity | None]:
        if not self._allowed:
            return True, None  # no list: whoever the handshake let in
        pem = next(iter(auth_context.get("x509_pem_cert") or ()), None)
        if pem is None:
            return False, None
        seen = self._seen.get(pem)
        if seen is None:
            identity = client_identity(pem)
            seen = bool(self._allowed.intersection(identity.names())), identity
            if seen[0] and self._on_new_certificate is not None:
                self._on_new_certificate(identity)
            if len(self._seen) > 64:  # noqa: PLR2004 - a handful of clients at most
                self._seen.clear()
            self._seen[pem] = seen
        return seen
