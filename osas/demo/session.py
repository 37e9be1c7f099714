"""The demo: a simulated OpenStack, osas with fresh mTLS certificates, and a CA-like session
that scales a group up, runs into the project's quota, cleans up and scales down; then a second
group in another region of the cloud, whose Nova fails for a while: the first group scales on
meanwhile, and the second scales again once its region is back; last, in a third region, a
warm scale-up (a server claimed from the group's warm pool and started) beside a cold one (a
server built), and the pool refilling."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any, TextIO

import anyio
import grpc
import yaml
from prometheus_client import CollectorRegistry

from osas.app import App, openstack_clouds
from osas.config import load_config
from osas.demo.certs import DemoAuthority
from osas.demo.client import CA_TIMEOUT, CaClient, ClientTls, connect
from osas.domain.servers import META_WARM
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.guest import JOINED_LINE
from osas.sim.model import FakeNova
from osas.sim.region import SimRegion

GROUP = "workers"
REGION = "RegionOne"  # the simulator's first region, where GROUP lives
# The second place: a group in another region of the same cloud (one Keystone, its own Nova).
SECOND_GROUP = "workers-two"
SECOND_REGION = "RegionTwo"
# Short, so that the failing region's listing is past it well within the outage: the
# healthy region's keeps CA's Refresh succeeding all the same.
MAX_INVENTORY_AGE = 4.0
RECONCILE_SECONDS = 1.0  # how often osas lists Nova (reconcile.interval)
RUNNING = pb.InstanceStatus.instanceRunning
STATE_NAMES = {
    pb.InstanceStatus.instanceRunning: "running",
    pb.InstanceStatus.instanceCreating: "creating",
    pb.InstanceStatus.instanceDeleting: "deleting",
}
# CA's loop runs every 10 s; the demo runs it faster so that it ends in seconds.
LOOP_SECONDS = 0.5
STEP_TIMEOUT = 60.0
# The third place: a group with a warm pool beside one without, in a region whose Nova is timed
# so that a start is much quicker than a build, and the demo stays short.
WARM_REGION = "RegionThree"
WARM_GROUP = "workers-warm"
COLD_GROUP = "workers-cold"
POOL_SIZE = 2
BUILD_SECONDS = 3.0  # a server's build, in WARM_REGION
START_SECONDS = 0.5  # os-start of a shut off server, in WARM_REGION
PREPARE_SECONDS = 1.0  # a warm guest's preparation (images pulled) before it powers off
# CA's loop while it waits for the two nodes: faster, so that the times read are close.
RACE_LOOP_SECONDS = 0.1

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


Check = Callable[[list[pb.Instance]], bool]


class Demo:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.monotonic()
        self.ops_url = ""  # osas's metrics port (/status, /readyz), once it serves
        self.refreshes = 0  # CA's Refresh calls answered OK

    def say(self, text: str) -> None:
        self.out.write(f"[{time.monotonic() - self.started:5.1f}s] {text}\n")
        self.out.flush()

    async def refresh(self, ca: CaClient) -> None:
        """CA's Refresh, which must succeed: an error aborts CA's whole loop (FACTS.md)."""
        try:
            await ca.refresh()
        except grpc.aio.AioRpcError as exc:
            raise DemoFailed(
                f"Refresh failed, which aborts CA's loop: {exc.code().name}: {exc.details()}"
            ) from exc
        self.refreshes += 1

    async def until(
        self, ca: CaClient, what: str, check: Check, group: str = GROUP
    ) -> list[pb.Instance]:
        """Run CA loops (Refresh, then Nodes) until ``check`` holds, reporting each change."""
        return (await self.until_each(ca, what, {group: check}))[group]

    async def until_each(
        self, ca: CaClient, what: str, checks: Mapping[str, Check]
    ) -> dict[str, list[pb.Instance]]:
        """Run CA loops (Refresh, then Nodes of each group) until every group's check holds,
        reporting each change."""
        last: dict[str, str] = {}
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:
            await self.refresh(ca)
            found = {group: await ca.nodes(group) for group in checks}
            for group, instances in found.items():
                summary = describe(instances)
                if summary != last.get(group):
                    self.say(f"    {group}: {summary}")
                    last[group] = summary
            if all(check(found[group]) for group, check in checks.items()):
                return found
            if time.monotonic() > deadline:
                raise DemoFailed(f"gave up waiting for {what}")
            await anyio.sleep(LOOP_SECONDS)

    async def until_status(
        self,
        ca: CaClient,
        what: str,
        check: Callable[[dict[str, Any]], bool],
        report: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Run CA loops until osas's ``/status`` document is as ``check`` wants; that document.
        Each document read is given to ``report``, if any."""
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:
            await self.refresh(ca)
            status = await self.read_status()
            if report is not None:
                report(status)
            if check(status):
                return status
            if time.monotonic() > deadline:
                raise DemoFailed(f"gave up waiting for {what}")
            await anyio.sleep(LOOP_SECONDS)

    async def time_to_running(
        self,
        ca: CaClient,
        groups: Sequence[str],
        report: Callable[[dict[str, Any]], None],
    ) -> dict[str, float]:
        """Each group's IncreaseSize by one, all at the same moment; then CA's loops, at a
        quicker pace, until each group has one running node: the seconds each took, from the
        calls to the first loop that saw the node running. ``report`` is given the ``/status``
        document at each loop."""
        started = time.monotonic()
        async with anyio.create_task_group() as calls:
            for group in groups:
                calls.start_soon(ca.increase, group, 1)
        took: dict[str, float] = {}
        last: dict[str, str] = {}
        deadline = started + STEP_TIMEOUT
        while True:
            await self.refresh(ca)
            report(await self.read_status())
            for group in groups:
                instances = await ca.nodes(group)
                summary = describe(instances)
                if summary != last.get(group):
                    self.say(f"    {group}: {summary}")
                    last[group] = summary
                if group not in took and in_state(RUNNING, 1)(instances):
                    took[group] = time.monotonic() - started
            if len(took) == len(groups):
                return took
            if time.monotonic() > deadline:
                raise DemoFailed(f"gave up waiting for a running node in each of {groups}")
            await anyio.sleep(RACE_LOOP_SECONDS)

    async def get(self, path: str) -> tuple[int, str]:
        """An operator's GET on osas's metrics port: the HTTP status and the body."""
        url = f"{self.ops_url}{path}"

        def fetch() -> tuple[int, str]:
            try:
                # The URL is made here, http://127.0.0.1:<port>.
                with urllib.request.urlopen(url, timeout=CA_TIMEOUT) as answer:  # noqa: S310
                    return int(answer.status), answer.read().decode()
            except urllib.error.HTTPError as exc:  # /readyz says why not ready with a 503
                return exc.code, exc.read().decode()

        # In a thread: osas answers the port from this very event loop.
        return await anyio.to_thread.run_sync(fetch)

    async def read_status(self) -> dict[str, Any]:
        code, body = await self.get("/status")
        if code != HTTPStatus.OK:
            raise DemoFailed(f"/status answered {code}: {body.strip()}")
        document: dict[str, Any] = json.loads(body)
        return document


class Changes:
    """Says each change of what ``make`` makes of the ``/status`` document it is given."""

    def __init__(self, demo: Demo, make: Callable[[Mapping[str, Any]], str]) -> None:
        self.demo = demo
        self.make = make
        self.said = ""

    def __call__(self, status: Mapping[str, Any]) -> None:
        line = self.make(status)
        if line != self.said:
            self.demo.say(f"    {line}")
            self.said = line


def describe(instances: list[pb.Instance]) -> str:
    counts = Counter(STATE_NAMES.get(i.status.instanceState, "unknown") for i in instances)
    errors = sum(1 for i in instances if i.status.HasField("errorInfo"))
    parts = [f"{count} {state}" for state, count in sorted(counts.items())]
    if errors:
        parts.append(f"{errors} with error info")
    return ", ".join(parts) or "no instances"


def in_state(state: int, count: int) -> Check:
    def check(instances: list[pb.Instance]) -> bool:
        return sum(1 for i in instances if i.status.instanceState == state) == count

    return check


def with_errors(count: int) -> Check:
    def check(instances: list[pb.Instance]) -> bool:
        return sum(1 for i in instances if i.status.HasField("errorInfo")) == count

    return check


def entry_of(status: Mapping[str, Any], section: str, key: str, value: str) -> dict[str, Any]:
    """The entry of a ``/status`` list (``places``, ``groups``) whose ``key`` is ``value``."""
    for entry in status[section]:
        if entry[key] == value:
            found: dict[str, Any] = entry
            return found
    raise DemoFailed(f"/status names no {section} entry with {key} {value}")


def place_in(status: Mapping[str, Any], region: str) -> dict[str, Any]:
    return entry_of(status, "places", "region", region)


def group_in(status: Mapping[str, Any], group_id: str) -> dict[str, Any]:
    return entry_of(status, "groups", "id", group_id)


def describe_place(place: Mapping[str, Any]) -> str:
    """One place of ``/status`` in a line, as ``osas status`` says it."""
    syncs = place["syncs"]
    where = f"{place['cloud']}, region {place['region']} ({', '.join(place['groups'])})"
    listed = f"listing {place['inventory_age_seconds']}s old"
    if syncs["failing_for_seconds"] is None:
        return f"{where}: syncing, {listed}; failed syncs so far: {syncs['failures']}"
    return (
        f"{where}: OpenStack FAILING for {syncs['failing_for_seconds']}s "
        f"(failed syncs in a row: {syncs['consecutive_failures']}), {listed} "
        f"(max_inventory_age {MAX_INVENTORY_AGE:g}s); last error: {syncs['last_error']}"
    )


def write_certs(folder: Path) -> ClientTls:
    authority = DemoAuthority()
    server = authority.issue("localhost", "127.0.0.1")
    client = authority.issue("cluster-autoscaler.kube-system.svc")
    (folder / "ca.crt").write_bytes(authority.cert_pem)
    (folder / "tls.crt").write_bytes(server.cert_pem)
    (folder / "tls.key").write_bytes(server.key_pem)
    return ClientTls(ca_pem=authority.cert_pem, cert_pem=client.cert_pem, key_pem=client.key_pem)


def node_group(group_id: str, max_size: int) -> dict[str, Any]:
    return {
        "id": group_id,
        "min_size": 0,
        "max_size": max_size,
        "flavor": "m1.medium",
        "image": "ubuntu-24.04",
        "networks": ["cluster-net"],
        "labels": {"pool": group_id},
        "user_data": "#cloud-config\nhostname: ${server_name}\n",
    }


def in_region(group: dict[str, Any], region: str) -> dict[str, Any]:
    """The group in another region of the same cloud: the same clouds.yaml entry and
    credentials."""
    return {**group, "openstack": {"region_name": region}}


def write_osas_config(folder: Path) -> Path:
    second = in_region(node_group(SECOND_GROUP, 4), SECOND_REGION)
    # Kept shut off: the guest (user data) prepares once, powers itself off; a claim starts it.
    warm = {**node_group(WARM_GROUP, 4), "warm_pool": {"size": POOL_SIZE, "state": "shutoff"}}
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
        "openstack": {"cloud": "osas-sim", "region_name": REGION},
        "reconcile": {
            "interval": f"{RECONCILE_SECONDS:g}s",
            "full_resync_interval": "10s",
            "max_inventory_age": f"{MAX_INVENTORY_AGE:g}s",
            "retry_backoff": "0.2s",
            # The demo made the simulated cloud a moment ago: no earlier osas has a create
            # on its way there, so scale-ups need not wait after the start.
            "hold_after_start": False,
        },
        "shutdown_grace": "5s",
        "node_groups": [
            node_group(GROUP, 6),
            second,
            in_region(warm, WARM_REGION),
            in_region(node_group(COLD_GROUP, 4), WARM_REGION),
        ],
    }
    path = folder / "osas.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


async def play(
    demo: Demo, ca: CaClient, sim: SimulatedOpenStack, second: SimRegion, third: SimRegion
) -> None:
    await demo.refresh(ca)
    groups = await ca.node_groups()
    demo.say("[4/11] CA's first loop: Refresh, NodeGroups")
    # Where each group lives is osas's to say: its /status names the cloud and region.
    status = await demo.read_status()
    for group in groups:
        entry = group_in(status, group.id)
        demo.say(
            f"    node group {group.id}: min {group.minSize}, max {group.maxSize} "
            f"(in {entry['cloud']}, region {entry['region']}, says /status)"
        )

    demo.say(f"[5/11] scale up: NodeGroupIncreaseSize({GROUP}, +3)")
    await ca.increase(GROUP, 3)
    demo.say(f"    target size is {await ca.target_size(GROUP)} as the call returns")
    await demo.until(ca, "3 running servers", in_state(RUNNING, 3))

    demo.say("[6/11] the project runs out of quota; scale up by 2 more")
    sim.nova.faults.max_servers = 3
    await ca.increase(GROUP, 2)
    instances = await demo.until(ca, "the failed creates", with_errors(2))
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

    demo.say("[7/11] scale down: NodeGroupDeleteNodes with two of the nodes")
    running = [
        i.id for i in instances if i.status.instanceState == pb.InstanceStatus.instanceRunning
    ]
    await ca.delete(GROUP, [("node", provider_id) for provider_id in running[:2]])
    demo.say(f"    target size is {await ca.target_size(GROUP)} as the call returns")
    await demo.until(ca, "one server left", lambda found: len(found) == 1)
    left = len(sim.nova.live_servers())
    demo.say(f"    servers left in Nova: {left}")

    await play_two_places(demo, ca, sim, second)
    await play_warm(demo, ca, third)


def servers_in_nova(sim: SimulatedOpenStack, second: SimRegion) -> str:
    return (
        f"servers in Nova: {REGION} {len(sim.nova.live_servers())}, "
        f"{SECOND_REGION} {len(second.nova.live_servers())}"
    )


def failing_and_stale(region: str) -> Callable[[dict[str, Any]], bool]:
    """Whether ``/status`` says the region's syncs fail and its listing is older than
    max_inventory_age."""

    def check(status: dict[str, Any]) -> bool:
        place = place_in(status, region)
        age = place["inventory_age_seconds"]
        down = place["syncs"]["failing_for_seconds"] is not None
        return down and age is not None and age > MAX_INVENTORY_AGE

    return check


async def play_two_places(
    demo: Demo, ca: CaClient, sim: SimulatedOpenStack, second: SimRegion
) -> None:
    """A cluster in two places: the second fails for a while, the first scales on."""
    demo.say(
        f"[8/11] a second place: {SECOND_GROUP} lives in {SECOND_REGION} (a Nova of its own "
        f"behind the same Keystone); NodeGroupIncreaseSize({SECOND_GROUP}, +1)"
    )
    await ca.increase(SECOND_GROUP, 1)
    await demo.until(ca, f"a running server in {SECOND_REGION}", in_state(RUNNING, 1), SECOND_GROUP)
    demo.say(f"    {servers_in_nova(sim, second)}")
    await play_outage(demo, ca, second)
    await play_recovery(demo, ca, sim, second)


async def play_outage(demo: Demo, ca: CaClient, second: SimRegion) -> None:
    """The second region fails: its group's scale-up is refused, the first group scales."""
    demo.say(f"[9/11] {SECOND_REGION} fails: its Nova answers 503 to every call")
    second.nova.faults.error_rate = 1.0
    refreshes_before = demo.refreshes
    status = await demo.until_status(
        ca, f"{SECOND_REGION} failing past max_inventory_age", failing_and_stale(SECOND_REGION)
    )
    demo.say(f"    /status: {describe_place(place_in(status, SECOND_REGION))}")
    demo.say(f"    /status: {describe_place(place_in(status, REGION))}")
    code, reason = await demo.get("/readyz")
    if code != HTTPStatus.OK:
        raise DemoFailed(f"/readyz answered {code} with one place failing: {reason.strip()}")
    demo.say(f"    /readyz: {code} {reason.strip()}: one place with a fresh listing is enough")
    kept = await ca.nodes(SECOND_GROUP)
    if not in_state(RUNNING, 1)(kept):
        raise DemoFailed(f"{SECOND_GROUP} lost sight of its server: {describe(kept)}")
    demo.say(f"    {SECOND_GROUP} answers from {SECOND_REGION}'s last listing: {describe(kept)}")
    demo.say(f"    pending pods: NodeGroupIncreaseSize({SECOND_GROUP}, +1)")
    try:
        await ca.increase(SECOND_GROUP, 1)
    except grpc.aio.AioRpcError as exc:
        if exc.code() is not grpc.StatusCode.UNAVAILABLE:
            raise DemoFailed(f"a scale-up in {SECOND_REGION} refused with {exc.code()}") from exc
        demo.say(f"    refused, {exc.code().name}: {exc.details()}")
    else:
        raise DemoFailed(f"a scale-up in {SECOND_REGION} was taken while it failed")
    demo.say(
        f"    a create sent there would sit in doubt, unseen by CA; CA backs {SECOND_GROUP} "
        f"off and scales another group: NodeGroupIncreaseSize({GROUP}, +2)"
    )
    await ca.increase(GROUP, 2)
    await demo.until_each(
        ca,
        f"{GROUP} scaling in {REGION} while {SECOND_REGION} fails",
        {GROUP: in_state(RUNNING, 3), SECOND_GROUP: in_state(RUNNING, 1)},
    )
    demo.say(f"    {GROUP} scaled to 3 running in {REGION} while {SECOND_REGION} failed")
    demo.say(
        f"    CA's Refresh answered OK in all {demo.refreshes - refreshes_before} of its loops "
        f"while {SECOND_REGION} failed"
    )


async def play_recovery(
    demo: Demo, ca: CaClient, sim: SimulatedOpenStack, second: SimRegion
) -> None:
    """The second region answers again, and its group scales on."""
    demo.say(f"[10/11] {SECOND_REGION} recovers: its Nova answers again")
    second.nova.faults.error_rate = 0.0
    status = await demo.until_status(
        ca,
        f"{SECOND_REGION} syncing again",
        lambda status: place_in(status, SECOND_REGION)["syncs"]["failing_for_seconds"] is None,
    )
    demo.say(f"    /status: {describe_place(place_in(status, SECOND_REGION))}")
    demo.say(f"    NodeGroupIncreaseSize({SECOND_GROUP}, +2)")
    await ca.increase(SECOND_GROUP, 2)
    await demo.until(
        ca, f"3 running servers in {SECOND_REGION}", in_state(RUNNING, 3), SECOND_GROUP
    )
    servers = servers_in_nova(sim, second)
    demo.say(f"    {SECOND_REGION} recovered and {SECOND_GROUP} scaled on; {servers}")


def describe_pool(status: Mapping[str, Any]) -> str:
    """The warm pool of WARM_GROUP in ``/status``, in a line."""
    pool = group_in(status, WARM_GROUP)["warm_pool"]
    if "wanted" not in pool:
        return f"/status: warm pool of {WARM_GROUP}: not judged yet"
    line = (
        f"/status: warm pool of {WARM_GROUP}: {pool['ready']} ready of {pool['wanted']} wanted, "
        f"{pool['preparing']} preparing, {pool['refilling']} refilling"
    )
    return line + (f"; not filling: {pool['why_not']}" if pool["why_not"] else "")


def pool_full(status: Mapping[str, Any]) -> bool:
    pool = group_in(status, WARM_GROUP)["warm_pool"]
    return bool(pool.get("ready") == POOL_SIZE == pool.get("wanted"))


def ready_in_pool(region: SimRegion) -> set[str]:
    """Ids of WARM_REGION's servers waiting in a pool, prepared and shut off."""
    return {
        server.server_id
        for server in region.nova.live_servers()
        if META_WARM in server.metadata and server.status == "SHUTOFF"
    }


async def play_warm(demo: Demo, ca: CaClient, third: SimRegion) -> None:
    """A warm scale-up beside a cold one, at the same moment; then the pool refills."""
    demo.say(
        f"[11/11] warm and cold side by side in {WARM_REGION}: {WARM_GROUP} keeps a warm pool "
        f"of {POOL_SIZE} (shut off), {COLD_GROUP} has none"
    )
    demo.say(
        f"    {WARM_REGION}'s Nova: build {BUILD_SECONDS:g} s, start {START_SECONDS:g} s, "
        f"a warm guest's preparation {PREPARE_SECONDS:g} s (simulated); "
        f"osas lists Nova every {RECONCILE_SECONDS:g} s (reconcile.interval)"
    )
    changes = Changes(demo, describe_pool)
    status = await demo.until_status(ca, f"{WARM_GROUP}'s pool full", pool_full, changes)
    pool = group_in(status, WARM_GROUP)["warm_pool"]
    by_status = ", ".join(f"{count} {name}" for name, count in sorted(pool["by_status"].items()))
    demo.say(
        f"    the pool filled in the background since osas started ({by_status}): each server "
        "built, prepared by its guest, powered off; none is in CA's view"
    )
    pooled = ready_in_pool(third)
    demo.say(
        f"    pending pods: NodeGroupIncreaseSize({WARM_GROUP}, +1) and "
        f"NodeGroupIncreaseSize({COLD_GROUP}, +1) at the same moment; the pool refills "
        "behind the claim"
    )
    took = await demo.time_to_running(ca, [WARM_GROUP, COLD_GROUP], changes)
    nodes = await ca.nodes(WARM_GROUP)
    server_id = nodes[0].id.removeprefix("openstack:///") if len(nodes) == 1 else ""
    if server_id not in pooled:
        raise DemoFailed(f"{WARM_GROUP}'s node is not one of its pool's servers: {nodes}")
    joined = JOINED_LINE in third.nova.console_lines(server_id)
    demo.say(
        f"    {WARM_GROUP}: node running {took[WARM_GROUP]:.1f} s after the call: claimed "
        f"from the pool (server {server_id}), metadata replaced, started"
        + (f"; its console says {JOINED_LINE}" if joined else "")
    )
    demo.say(
        f"    {COLD_GROUP}: node running {took[COLD_GROUP]:.1f} s after the call: "
        "created and built from the image"
    )
    gained = took[COLD_GROUP] - took[WARM_GROUP]
    demo.say(f"    the warm scale-up ran {gained:.1f} s sooner ({WARM_REGION}'s timings above)")
    await demo.until_status(ca, f"{WARM_GROUP}'s pool refilled", pool_full, changes)
    servers = third.nova.live_servers()
    warm_ones = sum(1 for server in servers if META_WARM in server.metadata)
    demo.say(
        f"    {WARM_GROUP}'s pool is full again: {len(ready_in_pool(third))} ready; "
        f"servers in {WARM_REGION}'s Nova: {len(servers)} "
        f"({len(servers) - warm_ones} nodes, {warm_ones} in the pool)"
    )


async def show_status(demo: Demo) -> None:
    """What an operator sees: ``osas status``, run as the operator runs it, reading /status
    over HTTP from the metrics port."""
    url = demo.ops_url
    demo.say(f"osas status --url {url} (also /metrics, /healthz, /readyz there):")
    command = [sys.executable, "-m", "osas", "status", "--url", url]
    # Ready or not (exit 0 or 1), the table is what the operator reads.
    shown = await anyio.run_process(command, check=False)
    demo.out.write("\n" + shown.stdout.decode() + "\n")


def warm_region_nova() -> FakeNova:
    nova = FakeNova(build_seconds=BUILD_SECONDS)
    nova.start_seconds = START_SECONDS
    nova.warm_prepare_seconds = PREPARE_SECONDS
    return nova


def request_counts(calls: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(calls.items()))


async def run_demo(out: TextIO = sys.stdout) -> int:
    demo = Demo(out)
    out.write("osas demo: a Cluster Autoscaler session against a simulated OpenStack\n\n")
    with tempfile.TemporaryDirectory(prefix="osas-demo-") as tmp:
        folder = Path(tmp)
        sim = SimulatedOpenStack(FakeNova(build_seconds=1.5), region=REGION)
        second = sim.add_region(SECOND_REGION, FakeNova(build_seconds=1.5))
        third = sim.add_region(WARM_REGION, warm_region_nova())
        sim.start()
        try:
            clouds_yaml = folder / "clouds.yaml"
            sim.write_clouds_yaml(clouds_yaml, "osas-sim")
            os.environ["OS_CLIENT_CONFIG_FILE"] = str(clouds_yaml)
            demo.say(f"[1/11] simulated OpenStack: keystone at {sim.auth_url}")
            demo.say(
                f"    regions {REGION}, {SECOND_REGION} and {WARM_REGION}, "
                "each with a Nova of its own"
            )
            demo.say(f"    clouds.yaml entry 'osas-sim' in {clouds_yaml}")
            tls = write_certs(folder)
            demo.say("[2/11] fresh certificates: a CA, osas's for localhost, one for CA")
            config = load_config(write_osas_config(folder))
            registry = CollectorRegistry()  # the app's and the cloud adapter's, as in serve
            app = App(config, openstack_clouds(config, registry), registry=registry)
            failed: DemoFailed | None = None
            async with anyio.create_task_group() as group:
                group.start_soon(app.run)
                with anyio.fail_after(STEP_TIMEOUT):
                    await app.serving.wait()
                port = app.server.port
                assert app.ops is not None  # noqa: S101 - the demo's configuration sets metrics_listen
                demo.ops_url = f"http://127.0.0.1:{app.ops.port}"
                demo.say(
                    f"[3/11] osas serving on localhost:{port} (mTLS), "
                    f"health on 127.0.0.1:{app.server.health_port}"
                )
                try:
                    async with connect(f"localhost:{port}", tls) as ca:
                        await play(demo, ca, sim, second, third)
                    await show_status(demo)
                except DemoFailed as exc:
                    # Raised past the task group, it would reach main() wrapped in a group.
                    failed = exc
                finally:
                    app.stop()
            if failed is not None:
                raise failed
            demo.say(f"done; OpenStack requests in {REGION}: {request_counts(sim.calls)}")
            demo.say(f"    in {SECOND_REGION}: {request_counts(second.calls)}")
            demo.say(f"    in {WARM_REGION}: {request_counts(third.calls)}")
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
