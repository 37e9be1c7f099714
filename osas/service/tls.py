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

The certificates are read with asn1crypto, and the key is checked against the certificate by
the standard library's ``ssl`` (OpenSSL): ``cryptography``'s native module would cost every
``osas serve`` process some 9 MiB of memory for these few checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import ipaddress
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import grpc
import structlog
from asn1crypto import x509
from asn1crypto.pem import unarmor

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


class _Unreadable(ValueError):
    """Not a certificate asn1crypto can read."""


# The PEM labels cryptography and OpenSSL read as a certificate; other blocks are skipped.
_CERTIFICATE_LABELS = frozenset({"CERTIFICATE", "X509 CERTIFICATE"})


def _certificates(data: bytes) -> list[x509.Certificate]:
    """The certificates in a PEM file, parsed now (asn1crypto parses on access, and a value
    that cannot parse must be refused here, not at a later read): raises _Unreadable when
    there is none or one does not parse."""
    with _asn1_errors():
        certificates = [
            x509.Certificate.load(der, strict=True)
            for label, _, der in unarmor(data, multiple=True)
            if label in _CERTIFICATE_LABELS
        ]
        for cert in certificates:
            _parse(cert)
    if not certificates:
        raise _Unreadable("no certificate")
    return certificates


@contextlib.contextmanager
def _asn1_errors() -> Iterator[None]:
    """asn1crypto's errors on input it cannot read, as _Unreadable."""
    try:
        yield
    except (ValueError, TypeError, KeyError) as exc:
        raise _Unreadable(str(exc)) from None


def _parse(cert: x509.Certificate) -> None:
    """Parses every field now, so that a certificate gRPC could not load is refused here; the
    extensions' values are parsed when read (the leaf's, for its names, in _identity)."""
    tbs = cert["tbs_certificate"]
    for field in tbs:
        if field == "extensions":
            for extension in tbs[field]:
                _ = extension["extn_id"].native, extension["critical"].native
        else:
            _ = tbs[field].native
    _ = cert["signature_algorithm"].native, cert["signature_value"].native


def _moment(value: Any) -> datetime:
    # RFC 5280 times are UTC ("Z"): one without a zone, or one a datetime cannot hold
    # (asn1crypto's extended_datetime for year 0), is a certificate that does not parse.
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise _Unreadable("not a UTC time")
    return value.astimezone(UTC)


def _alt_names(cert: x509.Certificate, kind: str) -> list[str]:
    """The subject alternative names of one kind, as the certificate spells them: asn1crypto's
    ``.native`` would turn IDNA and percent-encoded names into Unicode, which no client
    dials and no allow list spells."""
    found: list[str] = []
    for name in cert.subject_alt_name_value or ():
        if name.name != kind:
            continue
        raw = name.chosen.contents
        if kind == "ip_address":
            found.append(str(ipaddress.ip_address(raw)))  # 4 or 16 bytes, else ValueError
        else:
            found.append(raw.decode())
    return found


def _identity(cert: x509.Certificate) -> ServerIdentity:
    with _asn1_errors():
        return ServerIdentity(
            tuple(_alt_names(cert, "dns_name")),
            tuple(_alt_names(cert, "ip_address")),
            _moment(cert.not_valid_before),
            _moment(cert.not_valid_after),
        )


def _common_name(cert: x509.Certificate) -> str | None:
    """The subject's first common name, as cryptography's ``get_attributes_for_oid`` gave it."""
    for relative in cert.subject.chosen:
        for attribute in relative:
            if attribute["type"].native == "common_name":
                return str(attribute["value"].native)
    return None


class _PasswordNeeded(Exception):
    """Raised from OpenSSL's password callback: an encrypted key cannot serve."""


def _needs_no_password() -> bytes:
    raise _PasswordNeeded


@contextlib.contextmanager
def _as_files(*blobs: bytes) -> Iterator[list[str]]:
    """Paths that read as ``blobs``, for OpenSSL, which loads a key from a file only: memory
    files where Linux has them (the key is never written to a disk, and the check is of the
    bytes already read, not of files that may have changed since), else a private folder."""
    with contextlib.ExitStack() as stack:
        try:
            paths = [_memory_file(stack, blob) for blob in blobs]
        except OSError:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="osas-tls-")))
            paths = []
            for number, blob in enumerate(blobs):
                path = folder / str(number)  # the folder is the user's alone (mode 0700)
                path.write_bytes(blob)
                paths.append(str(path))
        yield paths


def _memory_file(stack: contextlib.ExitStack, blob: bytes) -> str:
    if not hasattr(os, "memfd_create"):
        raise OSError("no memfd_create here")
    fd = os.memfd_create("osas-tls", os.MFD_CLOEXEC)
    stack.callback(os.close, fd)
    with open(fd, "wb", closefd=False) as file:
        file.write(blob)
    path = f"/proc/self/fd/{fd}"
    if not Path(path).exists():  # /proc not mounted
        raise FileNotFoundError(path)
    return path


# OpenSSL's reasons when the key loaded but is not the certificate's: another key of the same
# type, or of another type (then OpenSSL files it beside the certificate, with none of its own).
_MISMATCH_REASONS = frozenset(
    {"KEY_VALUES_MISMATCH", "KEY_TYPE_MISMATCH", "NO_CERTIFICATE_ASSIGNED"}
)


def _key_fit(material: _Material) -> Literal["fits", "unreadable", "mismatch"]:
    """Whether the key is an unencrypted PEM private key for the first certificate of the
    chain, as OpenSSL reads the two files. Raises OSError when they cannot be written."""
    with _as_files(material.chain, material.key) as (chain_path, key_path):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # Security level 0: the question is whether the pair matches, not whether this
        # OpenSSL's policy likes the key's size or the signature's hash (gRPC serves with its
        # own BoringSSL, which has no such levels).
        context.set_ciphers("ALL:@SECLEVEL=0")
        try:
            # A callable that raises: OpenSSL never prompts on a terminal for a password.
            context.load_cert_chain(chain_path, key_path, password=_needs_no_password)
        except _PasswordNeeded:
            return "unreadable"
        except ssl.SSLError as exc:
            return "mismatch" if exc.reason in _MISMATCH_REASONS else "unreadable"
        except OSError:  # _ssl reports a failed load as OSError when errno happens to be set
            return "unreadable"
    return "fits"


def _check(material: _Material, files: TlsFiles, now: datetime) -> ServerIdentity:
    """Everything a handshake will need of these files, checked now: raises CertificateError
    naming the file and the reason, else the server identity they present."""
    try:
        identity = _identity(_certificates(material.chain)[0])
    except _Unreadable:
        raise CertificateError(f"{files.cert_file} holds no PEM certificate") from None
    try:
        fit = _key_fit(material)
    except OSError as exc:
        raise CertificateError(
            f"cannot check the key in {files.key_file}: {exc.strerror or exc}"
        ) from None
    if fit == "unreadable":
        raise CertificateError(
            f"{files.key_file} holds no PEM private key (or one that needs a password)"
        )
    try:
        _certificates(material.client_ca)
    except _Unreadable:
        raise CertificateError(
            f"{files.client_ca_file} holds no PEM certificate (the CA of the clients' certificates)"
        ) from None
    if fit == "mismatch":
        raise CertificateError(
            f"the private key in {files.key_file} does not match the certificate "
            f"in {files.cert_file}"
        )
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
    """The identity in a client's PEM certificate; ValueError when it holds none."""
    cert = _certificates(pem)[0]
    with _asn1_errors():
        return ClientIdentity(
            _common_name(cert),
            tuple(_alt_names(cert, "dns_name")),
            tuple(_alt_names(cert, "uniform_resource_identifier")),
            _moment(cert.not_valid_after),
        )


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
