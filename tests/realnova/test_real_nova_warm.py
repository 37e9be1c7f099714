"""A node group's warm pool against real Nova and real Keystone (``nox -s nova``; issue 36).

osas runs as ``osas serve`` runs it (its OpenStack adapter through clouds.yaml and Keystone, a
real grpc.aio server on 127.0.0.1, CA's calls through the CA-like client with CA's deadline)
with one group whose pool holds 2 servers kept SHUTOFF. Real Nova's fake virt driver has no
guest: a server it boots stays ACTIVE. The test plays the guest the pool's user data stands
for (docs/configuration.md, "Warm pools"): once a server carrying the warm mark is ACTIVE it
has "prepared" and powers itself off, which is an ``os-stop`` through the project's API; a
server without the warm mark (claimed, or a cold create) is left running, as a guest that
joins. A claim is then osas's own work on real Nova: the metadata replaced whole with ``PUT
/servers/{id}/metadata``, a real ``os-start``, the claim mark replaced away once ACTIVE.

osas's ``changes-since`` overlap is 1 s here (60 s by default, not a configuration key), as in
``test_real_nova_clock.py``, and complete listings come every 10 min (after the first, none
runs during a test): the claim's end, a metadata replace on a server that changes no more,
reaches the inventory through incremental listings whose window reaches back about a second,
not a minute, which leans on real Nova moving the server's ``updated`` with that replace.

After every step of a wait: no warm server in CA's view, never more than ``max_size`` nodes in
Nova, one server per request id. Each test has a cluster name of its own; the project is
emptied after each. A start that fails cannot be made on the fake driver (its power-on always
succeeds, and nothing in the lane can make it fail): that test is skipped; the simulator's
``tests/test_warm_claims.py`` covers it.

Skipped where the ``nova`` package is not installed (the main test venv)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("nova") is None:
    pytest.skip(
        "real-Nova lane: the nova package is not installed (run `nox -s nova`)",
        allow_module_level=True,
    )

import openstack.config
import openstack.connection
from clouds import delete_everything, project_servers
from realnova.cloud import CLOUD, IMAGE_NAME, NETWORK_NAME, REGION, NovaOptions, RealNovaProcess
from support import Provider, config_data, serving_places, write_config

from osas.config import OsasConfig, load_config
from osas.demo.client import CaClient
from osas.domain.servers import (
    META_CLAIMED,
    META_CLUSTER,
    META_GROUP,
    META_NODE_LABELS,
    META_NODE_TAINTS,
    META_REQUEST,
    META_WARM,
    META_WARM_STATE,
    TAG_CLUSTER_PREFIX,
)
from osas.engine.userdata import SecretFiles, warm_fingerprint
from osas.protocol import externalgrpc_pb2 as pb

pytestmark = pytest.mark.realnova

PAGE = 3  # Nova's [api] max_limit: a listing of more than 3 servers pages
GROUP = "warm"
MAX_SIZE = 3  # the pool (2) plus a node or two: few servers, real Nova is slow
USER_DATA = "#cloud-config\nruncmd:\n  - [sh, -c, 'echo preparing ${server_name}']\n"
LABELS = {"pool": "warm", "tier": "batch"}
NODE_LABELS = "pool=warm,tier=batch"  # osas-node-labels: sorted, comma-separated
NODE_TAINTS = "dedicated=batch:NoSchedule"
OVERLAP = 1.0  # osas's changes-since overlap in this module (60 s by default)
CREATING = pb.InstanceStatus.instanceCreating
RUNNING = pb.InstanceStatus.instanceRunning
GUEST_POLL = 0.3  # how often the guest looks at Nova
WAIT = 60.0  # the longest wait for a step (each takes a few seconds)


@pytest.fixture(scope="module")
def nova(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNovaProcess]:
    options = NovaOptions(hosts=1, max_limit=PAGE)
    with RealNovaProcess(options, workdir=tmp_path_factory.mktemp("realnova-warm")) as cloud:
        yield cloud


@pytest.fixture
def sdk_env(nova: RealNovaProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only our clouds.yaml: no OS_CLOUD, OS_COMPUTE_API_VERSION... from the caller's shell."""
    for name in list(os.environ):
        if name.startswith("OS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(nova.clouds_yaml))


def connect(nova: RealNovaProcess) -> openstack.connection.Connection:
    """The operator's openstacksdk connection to the osas project."""
    config = openstack.config.OpenStackConfig(
        config_files=[str(nova.clouds_yaml)], load_envvars=False
    )
    return openstack.connection.Connection(config=config.get_one(cloud=CLOUD))


@pytest.fixture
def clean(nova: RealNovaProcess, sdk_env: None) -> Iterator[RealNovaProcess]:
    """Real Nova, its project emptied after the test (osas stopped by then)."""
    try:
        yield nova
    finally:
        conn = connect(nova)
        try:
            delete_everything(conn)
        finally:
            conn.close()


@pytest.fixture
def short_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """osas's changes-since overlap at ``OVERLAP`` (see the module's docstring)."""
    engine_settings = OsasConfig.engine_settings

    def settings(config: OsasConfig) -> Any:
        found = engine_settings(config)
        reconcile = dataclasses.replace(found.reconcile, changes_since_overlap=OVERLAP)
        return dataclasses.replace(found, reconcile=reconcile)

    monkeypatch.setattr(OsasConfig, "engine_settings", settings)


def warm_config(tmp_path: Path) -> OsasConfig:
    """A cluster of its own, one group with a pool of 2 kept SHUTOFF."""
    data = config_data(
        cluster_name=f"warm-{uuid.uuid4().hex[:8]}",
        openstack={"cloud": CLOUD, "region_name": REGION, "api_timeout": "10s"},
        node_groups=[
            {
                "id": GROUP,
                "min_size": 0,
                "max_size": MAX_SIZE,
                "flavor": "m1.small",
                "image": IMAGE_NAME,
                "networks": [NETWORK_NAME],
                "user_data": USER_DATA,
                "labels": LABELS,
                "taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}],
                "warm_pool": {"size": 2, "state": "shutoff"},
            }
        ],
        queue={"capacity": 20, "workers": 2},
        reconcile={
            "interval": "0.5s",
            "full_resync_interval": "10m",
            "max_inventory_age": "1h",
            "retry_backoff": "0.1s",
            "delete_retry_after": "10s",
            "create_doubt_window": "20s",
            "hold_after_start": False,
        },
    )
    return load_config(write_config(tmp_path, data))


# -- what the test looks at ---------------------------------------------------------------------


class Nova:
    """This cluster's servers as the project's own API shows them (read in a thread: osas
    shares the test's event loop)."""

    def __init__(self, nova: RealNovaProcess, config: OsasConfig) -> None:
        self._conn = connect(nova)
        self._cluster = config.cluster_name

    async def servers(self) -> list[dict[str, Any]]:
        found = await asyncio.to_thread(project_servers, self._conn)
        return [s for s in found if (s.get("metadata") or {}).get(META_CLUSTER) == self._cluster]

    async def warm(self) -> list[dict[str, Any]]:
        return [s for s in await self.servers() if META_WARM in s["metadata"]]

    async def nodes(self) -> list[dict[str, Any]]:
        return [
            s
            for s in await self.servers()
            if META_WARM not in s["metadata"] and s.get("OS-EXT-STS:task_state") != "deleting"
        ]

    async def get(self, server_id: str) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            return self._conn.compute.get(f"/servers/{server_id}", microversion="2.52").json()[
                "server"
            ]

        return await asyncio.to_thread(read)

    def close(self) -> None:
        self._conn.close()


# -- the guest ------------------------------------------------------------------------------------


class Guest:
    """Every warm server's guest: once ACTIVE with the warm mark it has prepared and powers
    itself off (an ``os-stop``). ``limit``: how many servers in all it powers off (None: every
    one); the others go on "preparing" (ACTIVE) until it is raised. A server without the warm
    mark is never stopped: its guest joins. Nova is read in a thread of its own, with a
    connection of its own."""

    def __init__(self, nova: RealNovaProcess, cluster_name: str) -> None:
        self._conn = connect(nova)
        self._tag = f"{TAG_CLUSTER_PREFIX}{cluster_name}"
        self.limit: int | None = None
        self.stops: list[str] = []  # the server of each os-stop sent, in order

    @property
    def stopped(self) -> list[str]:
        """The servers whose guest powered off, in order."""
        return list(dict.fromkeys(self.stops))

    def _turn(self) -> None:
        for server in project_servers(self._conn):
            if (
                self._tag in server.get("tags", ())
                and META_WARM in (server.get("metadata") or {})
                and server["status"] == "ACTIVE"
                and server.get("OS-EXT-STS:task_state") is None
                and (self.limit is None or len(self.stopped) < self.limit)
            ):
                self._conn.compute.post(
                    f"/servers/{server['id']}/action", json={"os-stop": None}
                ).raise_for_status()
                self.stops.append(server["id"])

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self._turn)
            await asyncio.sleep(GUEST_POLL)

    def close(self) -> None:
        self._conn.close()


@asynccontextmanager
async def served_with_guest(
    nova: RealNovaProcess, config: OsasConfig
) -> AsyncIterator[tuple[Provider, CaClient, Guest, Nova]]:
    """osas serving ``config`` against real Nova, the guest playing meanwhile, and the test's
    own view of Nova."""
    guest = Guest(nova, config.cluster_name)
    view = Nova(nova, config)
    playing = asyncio.ensure_future(guest.run())
    try:
        async with serving_places(config, timeout=60) as (provider, ca):
            yield provider, ca, guest, view
    finally:
        playing.cancel()
        await asyncio.gather(playing, return_exceptions=True)
        guest.close()
        view.close()


# -- CA's view, the invariants, the pool ---------------------------------------------------------


def provider_id(server: dict[str, Any]) -> str:
    return f"openstack:///{server['id']}"


async def ca_view(ca: CaClient) -> dict[str, int]:
    """CA's loop: Refresh, then the group's instances (provider id -> state)."""
    await ca.refresh()
    return {i.id: i.status.instanceState for i in await ca.nodes(GROUP)}


async def check_invariants(ca: CaClient, view: Nova) -> None:
    """No warm server in CA's view (nor found in a group by NodeGroupForNode); never more
    than max_size nodes in Nova; one server per request. CA first, Nova after: a claim only
    ever turns a warm server into a node, so a server warm after CA answered was warm when
    CA answered."""
    before = await view.servers()
    groups = {
        provider_id(s): (await ca.group_for_node(s["name"], provider_id(s))).id for s in before
    }
    seen = set(await ca_view(ca))
    servers = await view.servers()
    for server in servers:
        if META_WARM in server["metadata"] and server["id"] in {s["id"] for s in before}:
            assert provider_id(server) not in seen, server
            assert groups[provider_id(server)] == "", server
    nodes = [s for s in servers if META_WARM not in s["metadata"]]
    assert len(nodes) <= MAX_SIZE, nodes
    requests = [s["metadata"].get(META_REQUEST) for s in servers]
    assert len(requests) == len(set(requests)), requests


async def until(
    ca: CaClient, view: Nova, check: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT
) -> Any:
    """Poll ``check`` (the invariants checked at every turn) until it answers something."""
    deadline = time.monotonic() + timeout
    while True:
        await check_invariants(ca, view)
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise AssertionError(msg)
        await asyncio.sleep(0.2)


def pool_status(provider: Provider) -> dict[str, Any]:
    (group,) = provider.app.status()["groups"]
    return group["warm_pool"]


def ready_in_pool(provider: Provider, view: Nova, count: int) -> Callable[[], Awaitable[Any]]:
    """osas counts ``count`` ready servers and Nova shows as many warm servers, all SHUTOFF
    and at rest: the servers."""

    async def check() -> list[dict[str, Any]] | None:
        if pool_status(provider).get("ready") != count:
            return None
        warm = await view.warm()
        at_rest = [
            s for s in warm if s["status"] == "SHUTOFF" and s.get("OS-EXT-STS:task_state") is None
        ]
        return at_rest if len(at_rest) == count == len(warm) else None

    return check


def sample(provider: Provider, name: str, **labels: str) -> float:
    return provider.app.registry.get_sample_value(name, {"group": GROUP, **labels}) or 0.0


def assert_warm(server: dict[str, Any], config: OsasConfig, fingerprint: str) -> None:
    metadata = server["metadata"]
    assert server["status"] == "SHUTOFF", server
    assert metadata[META_WARM] == fingerprint
    assert metadata[META_WARM_STATE] == "shutoff"
    assert metadata[META_CLUSTER] == config.cluster_name
    assert metadata[META_GROUP] == GROUP
    assert f"{TAG_CLUSTER_PREFIX}{config.cluster_name}" in server["tags"]
    assert META_CLAIMED not in metadata


def assert_node(server: dict[str, Any], config: OsasConfig) -> None:
    """A node of the group, its claim (if any) finished: what its guest joins with."""
    metadata = server["metadata"]
    assert server["status"] == "ACTIVE", server
    assert server.get("OS-EXT-STS:task_state") is None, server
    assert META_WARM not in metadata
    assert META_WARM_STATE not in metadata
    assert META_CLAIMED not in metadata
    assert metadata[META_CLUSTER] == config.cluster_name
    assert metadata[META_GROUP] == GROUP
    assert metadata[META_REQUEST]
    assert metadata[META_NODE_LABELS] == NODE_LABELS
    assert metadata[META_NODE_TAINTS] == NODE_TAINTS
    assert f"{TAG_CLUSTER_PREFIX}{config.cluster_name}" in server["tags"]


def fingerprint_of(provider: Provider) -> str:
    spec = provider.app.inventory.cluster.group(GROUP)
    assert spec is not None
    return warm_fingerprint(spec, SecretFiles())


# -- the tests ------------------------------------------------------------------------------------


async def test_the_pool_fills_with_shutoff_servers_out_of_cas_view(clean, short_overlap, tmp_path):
    config = warm_config(tmp_path)
    async with served_with_guest(clean, config) as (provider, ca, guest, view):
        warm = await until(ca, view, ready_in_pool(provider, view, 2), "a pool of 2 ready")
        fingerprint = fingerprint_of(provider)
        for server in warm:
            assert_warm(server, config, fingerprint)
        # Each went through its guest's poweroff; nothing else stopped them.
        assert sorted(guest.stopped) == sorted(s["id"] for s in warm)
        # Never a node: CA sees an empty group, and finds no group for them.
        assert await ca.target_size(GROUP) == 0
        assert await ca_view(ca) == {}
        for server in warm:
            assert (await ca.group_for_node(server["name"], provider_id(server))).id == ""
            assert (await ca.group_for_node(server["name"], "")).id == ""  # by name
        status = pool_status(provider)
        assert (status["wanted"], status["ready"], status["why_not"]) == (2, 2, None)
        assert status["by_status"] == {"SHUTOFF": 2}
        assert sample(provider, "osas_warm_refills_total") == 2
        assert sample(provider, "osas_warm_pool_ready") == 2
        # The pool stays as it is: no surplus, no recycling, no third server.
        await asyncio.sleep(2)
        assert sorted(s["id"] for s in await view.servers()) == sorted(s["id"] for s in warm)
        assert not sample(provider, "osas_warm_recycled_total", reason="surplus")


async def test_increase_size_claims_a_warm_server_starts_it_and_refills(
    clean, short_overlap, tmp_path
):
    config = warm_config(tmp_path)
    async with served_with_guest(clean, config) as (provider, ca, guest, view):
        warm = await until(ca, view, ready_in_pool(provider, view, 2), "a pool of 2 ready")
        warm_ids = {s["id"] for s in warm}
        refill_requests = {s["metadata"][META_REQUEST] for s in warm}
        reconciler = provider.app.reconciler
        complete_listings = reconciler.status.full_syncs
        incremental = reconciler.status.incremental_syncs

        await ca.increase(GROUP, 1)
        assert await ca.target_size(GROUP) == 1  # at once, as for a cold create

        # Followed closely: CA's view of the claimed server, and Nova's.
        seen_by_ca: list[int] = []
        claimed_in_nova: list[dict[str, Any]] = []

        async def started_and_finished() -> dict[str, Any] | None:
            view_now = await ca_view(ca)
            ours = [pid for pid in view_now if pid.removeprefix("openstack:///") in warm_ids]
            if not ours:
                return None
            (pid,) = ours
            if not seen_by_ca or seen_by_ca[-1] != view_now[pid]:
                seen_by_ca.append(view_now[pid])
            server = await view.get(pid.removeprefix("openstack:///"))
            if META_CLAIMED in server["metadata"]:
                claimed_in_nova.append(server)
                return None
            done = server["status"] == "ACTIVE" and view_now[pid] == RUNNING
            return server if done else None

        node = await until(ca, view, started_and_finished, "the claimed server started")
        assert node["id"] in warm_ids
        assert_node(node, config)
        # Replaced whole: the create's request id, not the refill's.
        assert node["metadata"][META_REQUEST] not in refill_requests
        assert seen_by_ca[0] == CREATING
        assert seen_by_ca[-1] == RUNNING
        # The claim mark, while it lasted: epoch seconds, no warm mark.
        for claimed in claimed_in_nova:
            assert META_WARM not in claimed["metadata"]
            assert claimed["updated"] <= node["updated"]
            assert abs(int(claimed["metadata"][META_CLAIMED]) - time.time()) < WAIT
        assert guest.stops.count(node["id"]) == 1  # its guest joined: not stopped again

        # osas's inventory saw the claim's end through incremental listings alone.
        async def finished_in_inventory() -> bool:
            server = provider.app.inventory.snapshot.get(node["id"])
            return server is not None and server.claimed_at is None and server.status == "ACTIVE"

        await until(ca, view, finished_in_inventory, "the claim's end in osas's inventory")
        assert reconciler.status.full_syncs == complete_listings
        assert reconciler.status.incremental_syncs > incremental

        # The pool refills: max 3 - target 1 = 2 again, the claimed server no longer in it.
        refilled = await until(ca, view, ready_in_pool(provider, view, 2), "the pool refilled")
        fingerprint = fingerprint_of(provider)
        for server in refilled:
            assert_warm(server, config, fingerprint)
        assert len({s["id"] for s in refilled} - warm_ids) == 1
        assert node["id"] not in {s["id"] for s in refilled}
        assert await ca_view(ca) == {provider_id(node): RUNNING}
        assert await ca.target_size(GROUP) == 1
        assert len(await view.servers()) == 3
        assert sample(provider, "osas_warm_claims_total", outcome="claimed") == 1
        assert sample(provider, "osas_warm_refills_total") == 3


async def test_a_start_that_fails_is_replaced_by_a_cold_create(clean):
    pytest.skip(
        "the fake virt driver's power-on always succeeds, and the lane has no way to make "
        "real Nova fail a start: covered on the simulator (tests/test_warm_claims.py)"
    )


async def test_with_one_ready_increase_size_2_claims_it_and_creates_one_cold(
    clean, short_overlap, tmp_path
):
    config = warm_config(tmp_path)
    async with served_with_guest(clean, config) as (provider, ca, guest, view):
        guest.limit = 1  # the second server's guest goes on preparing

        async def one_ready_one_preparing() -> list[dict[str, Any]] | None:
            status = pool_status(provider)
            if (status.get("ready"), status.get("preparing")) != (1, 1):
                return None
            warm = await view.warm()
            statuses = sorted(s["status"] for s in warm)
            return warm if statuses == ["ACTIVE", "SHUTOFF"] else None

        warm = await until(ca, view, one_ready_one_preparing, "one ready, one preparing")
        (ready,) = [s for s in warm if s["status"] == "SHUTOFF"]
        (preparing,) = [s for s in warm if s["status"] == "ACTIVE"]
        creates_before = sample(provider, "osas_warm_refills_total")
        assert creates_before == 2

        await ca.increase(GROUP, 2)
        assert await ca.target_size(GROUP) == 2

        async def two_running_nodes() -> list[dict[str, Any]] | None:
            states = await ca_view(ca)
            nodes = await view.nodes()
            finished = [s for s in nodes if META_CLAIMED not in s["metadata"]]
            return (
                nodes
                if list(states.values()) == [RUNNING, RUNNING]
                and len(finished) == 2
                and all(s["status"] == "ACTIVE" for s in nodes)
                else None
            )

        nodes = await until(ca, view, two_running_nodes, "a claimed node and a cold one")
        for node in nodes:
            assert_node(node, config)  # a cold create carries the same join keys
        by_id = {s["id"]: s for s in nodes}
        assert ready["id"] in by_id  # the ready one was claimed
        assert preparing["id"] not in by_id  # the preparing one was not
        (cold,) = [s for s in nodes if s["id"] != ready["id"]]
        assert cold["id"] not in {ready["id"], preparing["id"]}
        assert set(await ca_view(ca)) == {provider_id(s) for s in nodes}
        # Still warm, still out of CA's view.
        still = await view.get(preparing["id"])
        assert META_WARM in still["metadata"]
        assert (await ca.group_for_node(still["name"], provider_id(still))).id == ""
        assert sample(provider, "osas_warm_claims_total", outcome="claimed") == 1
        assert sample(provider, "osas_warm_refills_total") == creates_before  # none since

        # Its guest finishes: the pool holds it ready (max 3 - target 2 = 1), and no more.
        guest.limit = None
        (last,) = await until(ca, view, ready_in_pool(provider, view, 1), "the pool ready")
        assert last["id"] == preparing["id"]
        assert_warm(last, config, fingerprint_of(provider))
        assert len(await view.servers()) == MAX_SIZE
        assert await ca.target_size(GROUP) == 2
        assert not sample(provider, "osas_warm_recycled_total", reason="surplus")
