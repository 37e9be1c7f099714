"""The built image, run the way the chart's pod runs it, against ``osas sim``.

``nox -s image`` builds the image and runs this module as root in a network and mount
namespace of its own (``unshare --net --mount``): only loopback exists, so the chart's
``0.0.0.0`` listeners are reachable from nothing but this test. The pod comes from the chart's
own rendering (helm-python-sdk): the Deployment's args, environment, volume mounts, security
context and ``/tmp`` emptyDir, the ConfigMap's osas.yaml, the Secrets' files; podrun.py runs it
as a runtime would (read-only root, uid and gid 65532, no capability). Then: SERVING on the
health port, a scale-up over mTLS dialled as the Cluster Autoscaler dials it (the Service's
name, a client certificate for CA's identity), the chart's ``helm test`` pod from the same
image, what the process may and may not do, and SIGTERM, exit 0.

The image's size, layer count, start and stop times are written to ``OSAS_IMAGE_REPORT``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from podrun import image_config, pod_of, run, run_pod, tool
from support import SIM_WORKERS, wait_for

import osas
from osas.demo.certs import DemoAuthority
from osas.demo.client import ClientTls, connect
from osas.protocol import externalgrpc_pb2 as pb

IMAGE = os.environ.get("OSAS_IMAGE", "")
pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(not IMAGE, reason="nox -s image builds the image and runs this"),
]

NAMESPACE = "kube-system"
SERVICE_HOST = f"osas.{NAMESPACE}.svc"
HOSTS = f"127.0.0.1 localhost {SERVICE_HOST}\n"
CLIENT_NAME = f"cluster-autoscaler.{NAMESPACE}.svc"
SIM_PORT = 8774
RUNNING = pb.InstanceStatus.instanceRunning
VALUES = {
    "image": {"repository": IMAGE.rsplit(":", 1)[0], "tag": IMAGE.rsplit(":", 1)[-1]},
    # One pod and no leader election: this namespace has no Kubernetes API, so a replica that
    # waited for the Lease would stand by forever (the chart refuses election off with more).
    "replicaCount": 1,
    "tls": {
        "certManager": {"enabled": False},
        "existingSecret": "osas-tls",
        "clientSecret": "osas-client",
    },
    "config": {
        "cluster_name": "image-lane",
        "openstack": {"cloud": "osas-sim"},
        "reconcile": {"interval": "1s", "full_resync_interval": "30s", "hold_after_start": False},
        "leader_election": {"enabled": False},
        "node_groups": [SIM_WORKERS],
    },
}
# What the image must not hold, and what its process must not be able to do.
CHECK = """
import importlib.util, json, os, sys
present = [m for m in ("pip", "setuptools", "wheel", "trustme", "pytest", "hypothesis")
           if importlib.util.find_spec(m)]
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "extra_modules": present,
    "shell": os.path.exists("/bin/sh"), "cap_eff": status["CapEff"].strip(),
    "cap_bnd": status["CapBnd"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "python": sys.version.split()[0], "root_writable": os.access("/", os.W_OK),
    "tmp_writable": os.access("/tmp", os.W_OK),
}))
"""


@pytest.fixture(scope="module")
def pod_network(tmp_path_factory):
    """This namespace's loopback up, and the Service's name resolving to it as the cluster's
    DNS resolves it for CA (the mount namespace is this test's: the host keeps its file)."""
    run("ip", "link", "set", "lo", "up")
    interfaces = run("ip", "-o", "link").splitlines()
    assert [line.split(":")[1].strip() for line in interfaces] == ["lo"], "not an empty netns"
    hosts = tmp_path_factory.mktemp("net") / "hosts"
    hosts.write_text(HOSTS)
    run("mount", "--bind", str(hosts), "/etc/hosts")


@pytest.fixture
def chart_objects(tmp_path):
    pytest.importorskip("helm_python", reason="nox -s image installs the chart's tools")
    sys.path.insert(0, str(Path(__file__).parent.parent / "chart"))
    from chartkit import chart_copy, documents, render_files  # noqa: PLC0415

    chart = chart_copy(tmp_path / "chart")
    return documents(render_files(chart, VALUES, name="osas", namespace=NAMESPACE))


@pytest.fixture
def simulator(tmp_path):
    """``osas sim`` on this namespace's loopback, its clouds.yaml in a folder of its own."""
    folder = tmp_path / "openstack"
    folder.mkdir()
    command = [sys.executable, "-m", "osas", "sim", "--port", str(SIM_PORT)]
    command += ["--clouds-yaml", str(folder / "clouds.yaml"), "--build-seconds", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for("the simulator's clouds.yaml", (folder / "clouds.yaml").exists)
        yield folder / "clouds.yaml"
    finally:
        process.terminate()
        process.wait(10)


def health(port: int) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.RpcError as error:
            return error.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


async def scale_up(tls: ClientTls) -> list[pb.Instance]:
    """As CA: its address (the Service's name), its client certificate, its 5 s deadline."""
    async with connect(f"{SERVICE_HOST}:8086", tls) as ca:
        await ca.refresh()
        assert [g.id for g in await ca.node_groups()] == ["workers"]
        await ca.increase("workers", 2)
        assert await ca.target_size("workers") == 2
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            instances = await ca.nodes("workers")
            if sum(i.status.instanceState == RUNNING for i in instances) == 2:
                return instances
            await asyncio.sleep(0.5)
    raise AssertionError("the servers never ran")


def test_the_image_runs_as_the_charts_pod(pod_network, chart_objects, simulator, tmp_path):
    report: dict[str, Any] = {
        "image": IMAGE,
        "layers": len(image_config(IMAGE)["rootfs"]["diff_ids"]),
        "size": run("buildah", "images", "--format", "{{.Size}}", IMAGE).strip(),
    }
    authority = DemoAuthority()
    server = authority.issue(SERVICE_HOST, f"{SERVICE_HOST}.cluster.local")
    client = authority.issue(CLIENT_NAME)
    secrets = {
        "osas-tls": {"tls.crt": server.cert_pem, "tls.key": server.key_pem},
        "osas-client": {"tls.crt": client.cert_pem, "tls.key": client.key_pem},
        "osas-openstack": {"clouds.yaml": simulator.read_bytes()},
    }
    for files in (secrets["osas-tls"], secrets["osas-client"]):
        files["ca.crt"] = authority.cert_pem
    osas = pod_of(chart_objects, "Deployment", "osas", secrets)
    log, test_log, check_log = (tmp_path / f"{name}.log" for name in ("osas", "test", "check"))
    try:
        with run_pod(IMAGE, osas, tmp_path / "osas", hosts=HOSTS, log=log) as pod:
            wait_for("SERVING", lambda: health(8087) == "SERVING" or pod.process.poll() is not None)
            assert pod.process.poll() is None, log.read_text()[-3000:]
            report["start_seconds"] = round(time.monotonic() - pod.started, 2)
            tls = ClientTls(authority.cert_pem, client.cert_pem, client.key_pem)
            instances = asyncio.run(scale_up(tls))
            assert all(i.id.startswith("openstack:///") for i in instances)
            helm_test = pod_of(chart_objects, "Pod", "osas-test", secrets)
            with run_pod(IMAGE, helm_test, tmp_path / "test", hosts=HOSTS, log=test_log) as test:
                assert test.process.wait(120) == 0, test_log.read_text()
            checks = osas.with_command("python3", "-c", CHECK)
            with run_pod(IMAGE, checks, tmp_path / "check", hosts=HOSTS, log=check_log) as check:
                assert check.process.wait(60) == 0, check_log.read_text()
            sent = time.monotonic()
            pod.process.send_signal(signal.SIGTERM)
            assert pod.process.wait(30) == 0, log.read_text()[-3000:]
            report["stop_seconds"] = round(time.monotonic() - sent, 2)
    finally:
        if "OSAS_IMAGE_REPORT" in os.environ:
            Path(os.environ["OSAS_IMAGE_REPORT"]).write_text(json.dumps(report, indent=1))
    assert test_log.read_text().splitlines() == [
        f"health of {SERVICE_HOST}:8086: SERVING",
        "node group workers: min 0, max 5",
    ]
    inside = json.loads(check_log.read_text())
    assert inside["python"].startswith("3.13.")
    assert inside == {
        **inside,
        "uid": 65532,
        "gid": 65532,
        "groups": [65532],
        "extra_modules": [],
        "shell": False,
        "cap_eff": "0000000000000000",
        "cap_bnd": "0000000000000000",
        "no_new_privs": "1",
        "root_writable": False,
        "tmp_writable": True,
    }
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[-1]["event"] == "grpc stopped", events[-3:]


def test_the_image_is_labelled_with_osas_version_the_commit_and_its_date():
    """What docs/install.md's command and nox -s image give the labels, not the Containerfile's
    stand-ins (0.0.0.dev0, unknown, 1970)."""
    labels = image_config(IMAGE)["config"]["Labels"]
    root = Path(__file__).parent.parent.parent
    commit = run(tool("git"), "-C", str(root), "log", "-1", "--format=%H %cI").split()
    assert {
        name: labels[f"org.opencontainers.image.{name}"]
        for name in ("version", "revision", "created")
    } == {
        "version": osas.__version__,
        "revision": commit[0],
        "created": commit[1],
    }
