"""The checks of the TLS files (osas.service.tls) on real certificates: what they refuse, with
which message, and what they read, against what cryptography reads of the same bytes."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtensionOID, NameOID

from osas.service.settings import TlsFiles
from osas.service.tls import CertificateError, client_identity, inspect_files


def pem_chain(cert: trustme.LeafCert) -> bytes:
    return b"".join(blob.bytes() for blob in cert.cert_chain_pems)


def write(folder: Path, chain: bytes, key: bytes, ca: bytes) -> TlsFiles:
    files = TlsFiles(folder / "tls.crt", folder / "tls.key", folder / "ca.crt")
    files.cert_file.write_bytes(chain)
    files.key_file.write_bytes(key)
    files.client_ca_file.write_bytes(ca)
    return files


@pytest.fixture
def authority():
    return trustme.CA()


@pytest.fixture
def good(tmp_path, authority):
    """A usable set: a server certificate for localhost, its key, the clients' CA."""
    leaf = authority.issue_cert("localhost", "127.0.0.1")
    return leaf, write(
        tmp_path, pem_chain(leaf), leaf.private_key_pem.bytes(), authority.cert_pem.bytes()
    )


def refusal(files: TlsFiles) -> str:
    with pytest.raises(CertificateError) as refused:
        inspect_files(files)
    return str(refused.value)


def pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def self_signed(key, *, extensions=(), subject=None, not_before=None, not_after=None) -> bytes:
    """A PEM certificate for ``key`` made with cryptography, for what trustme does not make."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    name = subject or x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "osas tests")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - dt.timedelta(hours=1))
        .not_valid_after(not_after or now + dt.timedelta(days=30))
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


# -- the key ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key_type", ["ECDSA", "RSA"])
def test_a_leaf_of_either_key_type_is_accepted(tmp_path, key_type):
    kind = getattr(trustme.KeyType, key_type)
    authority = trustme.CA(key_type=kind)
    leaf = authority.issue_cert("localhost", "127.0.0.1", key_type=kind)
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    assert isinstance(
        key, {"ECDSA": ec.EllipticCurvePrivateKey, "RSA": rsa.RSAPrivateKey}[key_type]
    )
    files = write(
        tmp_path, pem_chain(leaf), leaf.private_key_pem.bytes(), authority.cert_pem.bytes()
    )
    assert inspect_files(files).names() == ["localhost", "127.0.0.1"]


@pytest.mark.parametrize("key_type", ["ECDSA", "RSA"], ids=["same type", "other type"])
def test_a_key_from_another_certificate_does_not_match(good, key_type):
    _, files = good  # an ECDSA leaf
    kind = getattr(trustme.KeyType, key_type)
    other = trustme.CA().issue_cert("localhost", key_type=kind)
    files.key_file.write_bytes(other.private_key_pem.bytes())
    assert refusal(files) == (
        f"the private key in {files.key_file} does not match the certificate in {files.cert_file}"
    )


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b"not a key at all\n",
        b"-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
        "certificate",
        "truncated",
    ],
    ids=["empty", "garbage", "armoured garbage", "a certificate", "truncated"],
)
def test_a_key_file_without_a_usable_key_is_refused(good, key):
    leaf, files = good
    if key == "certificate":
        key = pem_chain(leaf)
    elif key == "truncated":
        whole = leaf.private_key_pem.bytes()
        key = whole[:60] + whole[-30:]
    files.key_file.write_bytes(key)
    assert refusal(files) == (
        f"{files.key_file} holds no PEM private key (or one that needs a password)"
    )


def test_a_key_file_with_the_certificate_before_the_key_is_accepted(good):
    """As cryptography did, and as gRPC reads it: the key block is found after others."""
    leaf, files = good
    files.key_file.write_bytes(pem_chain(leaf) + leaf.private_key_pem.bytes())
    assert inspect_files(files).names() == ["localhost", "127.0.0.1"]


# Asks for the key's password on the terminal, as OpenSSL does without a callback, would hang:
# the child is given a terminal of its own (a pty) to make that hang certain.
ENCRYPTED_KEY_CHILD = """
import os, sys
from pathlib import Path
os.open(sys.argv[1], os.O_RDWR)  # a session leader without a terminal: this becomes its own
from osas.service.settings import TlsFiles
from osas.service.tls import CertificateError, inspect_files
try:
    inspect_files(TlsFiles(*(Path(name) for name in sys.argv[2:5])))
except CertificateError as exc:
    print(exc)
"""


def test_an_encrypted_key_is_refused_without_a_prompt(good):
    leaf, files = good
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    files.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    main, terminal = os.openpty()
    files_given = [str(files.cert_file), str(files.key_file), str(files.client_ca_file)]
    command = [sys.executable, "-c", ENCRYPTED_KEY_CHILD, os.ttyname(terminal), *files_given]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            start_new_session=True,
            timeout=60,
            check=True,
        )
    finally:
        os.close(main)
        os.close(terminal)
    assert done.stdout.strip() == (
        f"{files.key_file} holds no PEM private key (or one that needs a password)"
    )


def test_a_small_rsa_key_is_checked_not_judged(tmp_path):
    """OpenSSL's security level (which refuses a 1024-bit key) is no part of the check: the
    previous checks accepted it, and gRPC's BoringSSL serves it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505 - the point
    ca = trustme.CA().cert_pem.bytes()
    files = write(tmp_path, self_signed(key, extensions=[dns_san("localhost")]), pem_key(key), ca)
    assert inspect_files(files).names() == ["localhost"]


def test_without_memory_files_a_private_folder_is_used_and_removed(good, monkeypatch, tmp_path):
    _, files = good

    def unavailable(*_args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", unavailable, raising=False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert inspect_files(files).names() == ["localhost", "127.0.0.1"]
    files.key_file.write_bytes(trustme.CA().issue_cert("localhost").private_key_pem.bytes())
    assert "does not match" in refusal(files)
    assert list(scratch.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_checks_leave_no_file_open(good, authority):
    _, files = good
    descriptors = Path("/proc/self/fd")
    before = len(list(descriptors.iterdir()))
    inspect_files(files)
    files.key_file.write_bytes(authority.issue_cert("localhost").private_key_pem.bytes())
    for _ in range(10):
        refusal(files)
    assert len(list(descriptors.iterdir())) == before


# -- the certificates ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ca",
    ["key", b"", b"not a certificate\n", "armoured garbage"],
    ids=["a private key", "empty", "garbage", "armoured garbage"],
)
def test_a_client_ca_file_without_a_certificate_is_refused(good, ca):
    leaf, files = good
    if ca == "key":
        ca = leaf.private_key_pem.bytes()
    elif ca == "armoured garbage":
        ca = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
    files.client_ca_file.write_bytes(ca)
    assert refusal(files) == (
        f"{files.client_ca_file} holds no PEM certificate (the CA of the clients' certificates)"
    )


def test_a_certificate_file_that_does_not_parse_is_refused(good):
    leaf, files = good
    body = leaf.cert_chain_pems[0].bytes().splitlines()
    # Whole PEM armour, the DER inside cut short: refused now, not when a field is read.
    files.cert_file.write_bytes(b"\n".join([*body[:3], body[-1]]) + b"\n")
    assert refusal(files) == f"{files.cert_file} holds no PEM certificate"
    files.cert_file.write_bytes(leaf.private_key_pem.bytes())
    assert refusal(files) == f"{files.cert_file} holds no PEM certificate"


def test_a_client_ca_certificate_that_does_not_parse_is_refused(good):
    """Parsed whole at load, though osas reads none of its fields: a name whose value is no
    string (NULL) is refused now, not by gRPC at a handshake."""
    _, files = good
    pem = self_signed(ec.generate_private_key(ec.SECP256R1()))
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    organization = b"\x0c\x0aosas tests"  # UTF8String "osas tests", in issuer and subject
    assert der.count(organization) == 2
    broken = der.replace(organization, b"\x05\x0aosas tests")
    files.client_ca_file.write_bytes(
        b"-----BEGIN CERTIFICATE-----\n"
        + base64.encodebytes(broken)
        + b"-----END CERTIFICATE-----\n"
    )
    assert refusal(files) == (
        f"{files.client_ca_file} holds no PEM certificate (the CA of the clients' certificates)"
    )


def test_a_malformed_subject_alternative_name_is_refused_at_load(tmp_path, authority):
    key = ec.generate_private_key(ec.SECP256R1())
    broken = x509.UnrecognizedExtension(
        ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"\x30\x05\x87\x03\x01"
    )
    files = write(tmp_path, self_signed(key, extensions=[broken]), pem_key(key), b"")
    files.client_ca_file.write_bytes(authority.cert_pem.bytes())
    assert refusal(files) == f"{files.cert_file} holds no PEM certificate"


def dns_san(*names: str) -> x509.SubjectAlternativeName:
    return x509.SubjectAlternativeName([x509.DNSName(name) for name in names])


@pytest.mark.parametrize("years", [1, 40], ids=["UTCTime", "GeneralizedTime"])
def test_the_server_identity_is_what_cryptography_reads(tmp_path, authority, years):
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    key = ec.generate_private_key(ec.SECP256R1())
    names = x509.SubjectAlternativeName(
        [
            x509.DNSName("osas.kube-system.svc"),
            x509.DNSName("xn--bcher-kva.example"),  # IDNA, as dialled: never decoded
            x509.IPAddress(ipaddress.ip_address("10.0.0.7")),
            x509.IPAddress(ipaddress.ip_address("2001:db8:0:0::1")),
            x509.UniformResourceIdentifier("spiffe://cluster.local/ns/kube-system/sa/osas"),
        ]
    )
    pem = self_signed(
        key,
        extensions=[names],
        not_before=now - dt.timedelta(days=1),
        not_after=now + dt.timedelta(days=365 * years),
    )
    files = write(tmp_path, pem, pem_key(key), authority.cert_pem.bytes())
    identity = inspect_files(files, now)
    expected = x509.load_pem_x509_certificate(pem)
    assert identity.dns_names == ("osas.kube-system.svc", "xn--bcher-kva.example")
    assert identity.ip_addresses == ("10.0.0.7", "2001:db8::1")
    assert identity.not_before == expected.not_valid_before_utc
    assert identity.not_after == expected.not_valid_after_utc
    assert identity.not_before.tzinfo is dt.UTC
    assert identity.not_after.tzinfo is dt.UTC
    assert identity.covers("10.0.0.7")
    assert not identity.covers("bücher.example")  # SANs are compared as the client dials


def test_the_validity_dates_refuse_as_before(good, authority):
    leaf, files = good
    expected = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())
    before = expected.not_valid_before_utc - dt.timedelta(seconds=1)
    assert refusal_at(files, before) == (
        f"the certificate in {files.cert_file} is not valid before "
        f"{expected.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC"
    )
    after = expected.not_valid_after_utc + dt.timedelta(seconds=1)
    assert refusal_at(files, after) == (
        f"the certificate in {files.cert_file} expired on "
        f"{expected.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC"
    )


def refusal_at(files: TlsFiles, now: dt.datetime) -> str:
    with pytest.raises(CertificateError) as refused:
        inspect_files(files, now)
    return str(refused.value)


# -- the clients' identities --------------------------------------------------------------------


def test_client_identity_reads_names_as_cryptography_does(authority):
    cert = authority.issue_cert(
        "cluster-autoscaler.kube-system.svc",
        "xn--bcher-kva.example",
        "10.0.0.9",
        common_name="cluster-autoscaler",
    )
    pem = cert.cert_chain_pems[0].bytes()
    identity = client_identity(pem)
    expected = x509.load_pem_x509_certificate(pem)
    assert identity.common_name == "cluster-autoscaler"
    assert identity.dns_names == ("cluster-autoscaler.kube-system.svc", "xn--bcher-kva.example")
    assert identity.uris == ()
    assert identity.not_after == expected.not_valid_after_utc
    assert identity.not_after.tzinfo is dt.UTC
    assert identity.names() == [
        "dns:cluster-autoscaler.kube-system.svc",
        "dns:xn--bcher-kva.example",
        "cn:cluster-autoscaler",
    ]


def test_client_identity_reads_uris_as_written_and_the_first_common_name():
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "first"),
            x509.NameAttribute(NameOID.COMMON_NAME, "second"),
        ]
    )
    uris = [
        "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler",
        "https://example.test/a%20b",  # percent-encoded, kept so
    ]
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri) for uri in uris])
    pem = self_signed(key, extensions=[san], subject=subject)
    identity = client_identity(pem)
    assert identity.common_name == "first"
    assert identity.uris == tuple(uris)
    assert identity.dns_names == ()


def test_client_identity_of_a_certificate_without_names():
    pem = self_signed(ec.generate_private_key(ec.SECP256R1()))
    identity = client_identity(pem)
    assert (identity.common_name, identity.dns_names, identity.uris) == (None, (), ())
    assert identity.names() == []


# -- memory --------------------------------------------------------------------------------------


def test_osas_serve_does_not_load_cryptography():
    """cryptography's native module costs every osas serve process some 9 MiB."""
    script = (
        "import sys, osas.cli.entry; "
        "assert not any(m == 'cryptography' or m.startswith('cryptography.') "
        "for m in sys.modules), sorted(m for m in sys.modules if 'cryptography' in m)"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
