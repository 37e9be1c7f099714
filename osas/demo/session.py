"""The demo: a simulated OpenStack, osas with fresh mTLS certificates, and a CA-like session
that scales a group up, runs into the project's quota, cleans up and scales down."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TextIO

import anyio
import yaml
from prometheus_client import CollectorRegistry

from osas.app import App, openstack_clouds
from osas.config import load_config
from osas.demo.certs import DemoAuthority
from osas.demo.client import CaClient, ClientTls, connect
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

GROUP = "workers"
RUNNING = pb.InstanceStatus.instanceRunning
STATE_NAMES = {
    pb.InstanceStatus.instanceRunning: "running",
    pb.InstanceStatus.instanceCreating: "creating",
    pb.InstanceStatus.instanceDeleting: "deleting",
}
# CA's loop runs every 10 s; the demo runs it faster so that it ends in seconds.
LOOP_SECONDS = 0.5
STEP_TIMEOUT = 60.0

CA_CLOUD_CONFIG = """\
# The Helm chart renders this in the Secret osas-ca-cloud-config (docs/install.md); CA runs with
# --cloud-provider=externalgrpc --cloud-config=/etc/osas-ca/config/cloud-config.yaml
address: osas.kube-system.svc:8086   # a DNS name in osas's server certificate
cert: /etc/osas-ca/tls/tls.crt       # CA's client certificate, signed by osas's client_ca_file
key: /etc/osas-ca/tls/tls.key
cacert: /etc/osas-ca/tls/ca.crt      # the CA that signed osas's server certificate
grpc_timeout: 5s
"""


class DemoFailed(Exception):
    """A step did not reach the state it waits for."""


class Demo:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        self.out.write(f"[{time.monotonic() - self.started:5.1f}s] {text}\n")
        self.out.flush()

    async def until(
        self, ca: CaClient, what: str, check: Callable[[list[pb.Instance]], bool]
    ) -> list[pb.Instance]:
        """Run CA loops (Refresh, then Nodes) until ``check`` holds, reporting each change."""
        last = ""
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:
            await ca.refresh()
            instances = await ca.nodes(GROUP)
            summary = describe(instances)
            if summary != last:
                self.say(f"    {GROUP}: {summary}")
                last = summary
            if check(instances):
                return instances
            if time.monotonic() > deadline:
                raise DemoFailed(f"gave up waiting for {what}")
            await anyio.sleep(LOOP_SECONDS)


def describe(instances: list[pb.Instance]) -> str:
    counts = Counter(STATE_NAMES.get(i.status.instanceState, "unknown") for i in instances)
    errors = sum(1 for i in instances if i.status.HasField("errorInfo"))
    parts = [f"{count} {state}" for state, count in sorted(counts.items())]
    if errors:
        parts.append(f"{errors} with error info")
    return ", ".join(parts) or "no instances"


def in_state(state: int, count: int) -> Callable[[list[pb.Instance]], bool]:
    def check(instances: list[pb.Instance]) -> bool:
        return sum(1 for i in instances if i.status.instanceState == state) == count

    return check


def write_certs(folder: Path) -> ClientTls:
    authority = DemoAuthority()
    server = authority.issue("localhost", "127.0.0.1")
    client = authority.issue("cluster-autoscaler.kube-system.svc")
    (folder / "ca.crt").write_bytes(authority.cert_pem)
    (folder / "tls.crt").write_bytes(server.cert_pem)
    (folder / "tls.key").write_bytes(server.key_pem)
    return ClientTls(ca_pem=authority.cert_pem, cert_pem=client.cert_pem, key_pem=client.key_pem)


def write_osas_config(folder: Path) -> Path:
    config = {
        "cluster_name": "demo",
        "listen": "127.0.0.1:0",
        "health_listen": "127.0.0.1:0",
        "metrics_listen": "127.0.0.1:0",
        "tls": {
            "cert_file": str(folder / "tls.crt"),
            "key_file": str(folder / "tls.key"),
            "client_ca_file": str(folder / "ca.crt"),
        },
        "openstack": {"cloud": "osas-sim"},
        "reconcile": {
            "interval": "1s",
            "full_resync_interval": "10s",
            "retry_backoff": "0.2s",
            # The demo made the simulated cloud a moment ago: no earlier osas has a create
            # on its way there, so scale-ups need not wait after the start.
            "hold_after_start": False,
        },
        "shutdown_grace": "5s",
        "node_groups": [
            {
                "id": GROUP,
                "min_size": 0,
                "max_size": 6,
                "flavor": "m1.medium",
                "image": "ubuntu-24.04",
                "networks": ["cluster-net"],
                "labels": {"pool": GROUP},
                "user_data": "#cloud-config\nhostname: ${server_name}\n",
            }
        ],
    }
    path = folder / "osas.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


async def play(demo: Demo, ca: CaClient, sim: SimulatedOpenStack) -> None:
    await ca.refresh()
    groups = await ca.node_groups()
    demo.say("[4/7] CA's first loop: Refresh, NodeGroups")
    for group in groups:
        demo.say(f"    node group {group.id}: min {group.minSize}, max {group.maxSize}")

    demo.say("[5/7] scale up: NodeGroupIncreaseSize(workers, +3)")
    await ca.increase(GROUP, 3)
    demo.say(f"    target size is {await ca.target_size(GROUP)} as the call returns")
    await demo.until(ca, "3 running servers", in_state(RUNNING, 3))

    demo.say("[6/7] the project runs out of quota; scale up by 2 more")
    sim.nova.faults.max_servers = 3
    await ca.increase(GROUP, 2)

    def two_errors(instances: list[pb.Instance]) -> bool:
        return sum(1 for i in instances if i.status.HasField("errorInfo")) == 2  # noqa: PLR2004

    instances = await demo.until(ca, "the failed creates", two_errors)
    failed = [i for i in instances if i.status.HasField("errorInfo")]
    info = failed[0].status.errorInfo
    demo.say(
        f"    errorCode={info.errorCode} class={info.instanceErrorClass} "
        f"(1 = out of resources: CA backs the group off)"
    )
    demo.say(f"    errorMessage={info.errorMessage!r}")
    demo.say("    CA deletes the failed instances with fake nodes (name = provider id = id)")
    await ca.delete_fake(GROUP, [i.id for i in failed], "create-error")
    demo.say(f"    target size back to {await ca.target_size(GROUP)}")
    sim.nova.faults.max_servers = None

    demo.say("[7/7] scale down: NodeGroupDeleteNodes with two of the nodes")
    running = [
        i.id for i in instances if i.status.instanceState == pb.InstanceStatus.instanceRunning
    ]
    await ca.delete(GROUP, [("node", provider_id) for provider_id in running[:2]])
    demo.say(f"    target size is {await ca.target_size(GROUP)} as the call returns")
    await demo.until(ca, "one server left", lambda found: len(found) == 1)
    left = len(sim.nova.live_servers())
    demo.say(f"    servers left in Nova: {left}")


async def show_status(demo: Demo, app: App) -> None:
    """What an operator sees: ``osas status``, run as the operator runs it, reading /status
    over HTTP from the metrics port."""
    assert app.ops is not None  # noqa: S101 - the demo's configuration sets metrics_listen
    url = f"http://127.0.0.1:{app.ops.port}"
    demo.say(f"osas status --url {url} (also /metrics, /healthz, /readyz there):")
    command = [sys.executable, "-m", "osas", "status", "--url", url]
    # Ready or not (exit 0 or 1), the table is what the operator reads.
    shown = await anyio.run_process(command, check=False)
    demo.out.write("\n" + shown.stdout.decode() + "\n")


async def run_demo(out: TextIO = sys.stdout) -> int:
    demo = Demo(out)
    out.write("osas demo: a Cluster Autoscaler session against a simulated OpenStack\n\n")
    with tempfile.TemporaryDirectory(prefix="osas-demo-") as tmp:
        folder = Path(tmp)
        sim = SimulatedOpenStack(FakeNova(build_seconds=1.5))
        sim.start()
        try:
            clouds_yaml = folder / "clouds.yaml"
            sim.write_clouds_yaml(clouds_yaml, "osas-sim")
            os.environ["OS_CLIENT_CONFIG_FILE"] = str(clouds_yaml)
            demo.say(f"[1/7] simulated OpenStack: keystone at {sim.auth_url}")
            demo.say(f"    clouds.yaml entry 'osas-sim' in {clouds_yaml}")
            tls = write_certs(folder)
            demo.say("[2/7] fresh certificates: a CA, osas's for localhost, one for CA")
            config = load_config(write_osas_config(folder))
            registry = CollectorRegistry()  # the app's and the cloud adapter's, as in serve
            app = App(config, openstack_clouds(config, registry), registry=registry)
            async with anyio.create_task_group() as group:
                group.start_soon(app.run)
                with anyio.fail_after(STEP_TIMEOUT):
                    await app.serving.wait()
                port = app.server.port
                demo.say(
                    f"[3/7] osas serving on localhost:{port} (mTLS), "
                    f"health on 127.0.0.1:{app.server.health_port}"
                )
                try:
                    async with connect(f"localhost:{port}", tls) as ca:
                        await play(demo, ca, sim)
                    await show_status(demo, app)
                finally:
                    app.stop()
            calls = ", ".join(f"{name} {count}" for name, count in sorted(sim.calls.items()))
            demo.say(f"done; OpenStack requests: {calls}")
        finally:
            sim.stop()
    out.write(f"\nCA's cloud-config for a real deployment:\n\n{CA_CLOUD_CONFIG}")
    return 0


def main(out: TextIO = sys.stdout) -> int:
    runner: Callable[[], Awaitable[int]] = lambda: run_demo(out)  # noqa: E731
    try:
        return anyio.run(runner)
    except DemoFailed as exc:
        out.write(f"\nosas demo failed: {exc}\n")
        return 1
