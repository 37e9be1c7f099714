"""The built image, run as Kubernetes runs it (read-only root, not root, /tmp writable), with a
CA-shaped client over mTLS through the mapped port. The simulated OpenStack runs in a second
container from the same image that shares the osas container's network namespace, so all
traffic stays on loopback. `nox -s image` builds the image and runs this where a
Docker-compatible engine answers; everywhere else it is skipped."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.container

testcontainers = pytest.importorskip(
    "testcontainers", reason="testcontainers is installed by nox -s image"
)
docker = pytest.importorskip("docker", reason="the Docker SDK comes with testcontainers")

from support import SIM_WORKERS, wait_for  # noqa: E402
from testcontainers.core.container import DockerContainer  # noqa: E402

from osas.demo.certs import DemoAuthority  # noqa: E402
from osas.demo.client import ClientTls, connect  # noqa: E402
from osas.protocol import externalgrpc_pb2 as pb  # noqa: E402

IMAGE = os.environ.get("OSAS_IMAGE", "localhost/osas:dev")
WRITABLE = {"/tmp": ""}  # noqa: S108 - the container's own tmpfs, as the chart's emptyDir
SIM_PORT = 8774
RUNNING = pb.InstanceStatus.instanceRunning


@pytest.fixture(scope="module")
def engine():
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine to run containers
        pytest.skip(f"no Docker-compatible engine answers: {exc}")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{IMAGE} is not built (nox -s image builds it)")
    return client


def write_work(folder: Path) -> ClientTls:
    """Certificates and osas's configuration, readable by the image's user (65532)."""
    authority = DemoAuthority()
    server = authority.issue("localhost", "127.0.0.1")
    client = authority.issue("cluster-autoscaler.kube-system.svc")
    files = {"ca.crt": authority.cert_pem, "tls.crt": server.cert_pem, "tls.key": server.key_pem}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    config = {
        "cluster_name": "container",
        "listen": "0.0.0.0:8086",
        "health_listen": "127.0.0.1:8087",
        "metrics_listen": "0.0.0.0:9090",
        "tls": {
            "cert_file": "/work/tls.crt",
            "key_file": "/work/tls.key",
            "client_ca_file": "/work/ca.crt",
            "server_names": ["localhost"],
            "allowed_clients": ["dns:cluster-autoscaler.kube-system.svc"],
        },
        "openstack": {"cloud": "osas-sim"},
        "reconcile": {"interval": "1s", "full_resync_interval": "10s", "hold_after_start": False},
        "node_groups": [SIM_WORKERS],
    }
    (folder / "osas.yaml").write_text(yaml.safe_dump(config))
    folder.chmod(0o777)  # the simulator writes clouds.yaml here as 65532
    for path in folder.iterdir():
        path.chmod(0o644)
    return ClientTls(ca_pem=authority.cert_pem, cert_pem=client.cert_pem, key_pem=client.key_pem)


async def scale_up(address: str, tls: ClientTls) -> list[pb.Instance]:
    async with connect(address, tls) as ca:
        deadline = time.monotonic() + 60
        while True:  # UNAVAILABLE until osas's first sync with the simulator
            try:
                await ca.refresh()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)
        assert [g.id for g in await ca.node_groups()] == ["workers"]
        await ca.increase("workers", 2)
        assert await ca.target_size("workers") == 2
        while time.monotonic() < deadline + 60:
            instances = await ca.nodes("workers")
            if sum(i.status.instanceState == RUNNING for i in instances) == 2:
                return instances
            await asyncio.sleep(1)
        raise AssertionError("the servers never ran")


def test_the_image_serves_ca_over_mtls_through_the_mapped_port(engine, tmp_path):
    tls = write_work(tmp_path)
    sim = (
        DockerContainer(IMAGE)
        .with_command(f"sim --port {SIM_PORT} --clouds-yaml /work/clouds.yaml --build-seconds 1")
        .with_volume_mapping(str(tmp_path), "/work", "rw")
        .with_exposed_ports(8086, 9090)
        .with_kwargs(read_only=True, tmpfs=WRITABLE)
    )
    sim.start()
    osas = None
    try:
        wait_for("the simulator's clouds.yaml", (tmp_path / "clouds.yaml").exists)
        osas = (
            DockerContainer(IMAGE)
            .with_command("serve --config /work/osas.yaml")
            .with_env("OS_CLIENT_CONFIG_FILE", "/work/clouds.yaml")
            .with_volume_mapping(str(tmp_path), "/work", "ro")
            .with_kwargs(
                network_mode=f"container:{sim.get_wrapped_container().id}",
                read_only=True,
                tmpfs=WRITABLE,
            )
        )
        osas.start()
        host = sim.get_container_host_ip()
        grpc_port = sim.get_exposed_port(8086)
        metrics_port = sim.get_exposed_port(9090)
        instances = asyncio.run(scale_up(f"localhost:{grpc_port}", tls))
        assert all(i.id.startswith("openstack:///") for i in instances)

        def ready() -> bool:
            try:
                url = f"http://{host}:{metrics_port}/readyz"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    return answer.status == 200
            except OSError:
                return False

        wait_for("/readyz", ready)
        user = engine.containers.get(osas.get_wrapped_container().id).attrs["Config"]["User"]
        assert user == "65532:65532"
    finally:
        logs = b""
        if osas is not None:
            logs = b"".join(osas.get_logs())
            osas.stop()
        sim.stop()
        print(logs.decode(errors="replace")[-4000:])  # noqa: T201 - shown when the test fails
