"""Fresh certificates for a local try (``osas certs``) and the demo: a private CA, a server
certificate and a client certificate, made with ``cryptography`` (already installed with
openstacksdk), so that neither needs a test library. Not for production: there, cert-manager
issues them (docs/install.md)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    return alternatives


class DemoAuthority:
    """A private CA, for one demo run by default, or as long as ``valid`` says."""

    def __init__(self, *, valid: timedelta = _VALID, name: str = "osas demo CA") -> None:
        self._valid = valid
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + valid)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, *names: str) -> Issued:
        """A certificate for ``names`` (DNS names or IP addresses), good for server and client
        authentication."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + self._valid)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(_names(names)), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


# What ``osas certs`` writes, named as osas's ``tls:`` block and CA's cloud-config expect.
LOCAL_FILES = ("ca.crt", "tls.crt", "tls.key", "client.crt", "client.key")
CLIENT_NAME = "cluster-autoscaler.kube-system.svc"


def write_local_certs(out: Path, server_names: tuple[str, ...], days: int) -> list[Path]:
    """A CA, osas's server certificate for ``server_names`` and a client certificate for
    CA, written under ``out`` (keys readable by their owner only); the files written."""
    authority = DemoAuthority(valid=timedelta(days=days), name="osas local CA")
    server = authority.issue(*server_names)
    client = authority.issue(CLIENT_NAME)
    out.mkdir(parents=True, exist_ok=True)
    contents = (
        authority.cert_pem,
        server.cert_pem,
        server.key_pem,
        client.cert_pem,
        client.key_pem,
    )
    written = []
    for name, data in zip(LOCAL_FILES, contents, strict=True):
        path = out / name
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
        written.append(path)
    return written
