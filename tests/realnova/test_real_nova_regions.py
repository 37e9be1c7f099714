"""Node groups in two regions of one real cloud (``nox -s nova``; issue 35): one real Keystone,
two real Novas, osas serving a group in each through one clouds.yaml entry.

The first region is the lane's usual launcher (``RealNovaProcess``: real Keystone in a child
of its own, Nova from the pinned wheel's functional fixtures in another). The second is a
second launcher process that joins that Keystone (``RealNovaProcess`` with ``keystone_url``):
Nova, Placement, the fixtures' fake Glance and Neutron and their facades of its own, its
compute, image, network and identity endpoints registered in the same catalog under region
``RegionTwo``, tokens checked with the same Keystone. osas reads the catalog as in production,
and runs as ``osas serve`` does: one cloud adapter and engine per place, a real grpc.aio
server on 127.0.0.1, CA's calls through the CA-like client (CA's 5 s deadline on each).

What is looked at in the cloud goes through the project's own API, region by region. Each test
has a cluster name of its own; both regions are emptied after each. Each region's image and
flavors have ids of their own, so a name resolved in the wrong region would be refused; the
network keeps one id in both (the fixtures' fake Neutron builds every port on it).

Skipped where the ``nova`` package is not installed (the main test venv)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("nova") is None:
    pytest.skip(
        "real-Nova lane: the nova package is not installed (run `nox -s nova`)",
        allow_module_level=True,
    )

import grpc
import openstack.config
import openstack.connection
import yaml
from clouds import delete_everything, project_servers
from realnova.cloud import (
    CLOUD,
    DEFAULT_QUOTAS,
    IMAGE_NAME,
    NETWORK_NAME,
    REGION,
    SECOND_REGION,
    NovaOptions,
    RealNovaProcess,
)
from support import Provider, config_data, engine_of, serving_places, write_config

from osas.app import PlaceEngine, openstack_cloud
from osas.check import EXIT_CLOUD, EXIT_OK, Report, check_config
from osas.config import OsasConfig, load_config, places_of
from osas.demo.client import CaClient
from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST, TAG_CLUSTER_PREFIX
from osas.protocol import externalgrpc_pb2 as pb

pytestmark = pytest.mark.realnova

PAGE = 3  # Nova's [api] max_limit in both regions: every listing of more than 3 servers pages
RUNNING = pb.InstanceStatus.instanceRunning
NORTH, SOUTH = "north", "south"  # the node groups: RegionOne's, RegionTwo's


@dataclass
class TwoRegions:
    one: RealNovaProcess  # RegionOne, and the cloud's Keystone
    two: RealNovaProcess  # RegionTwo, in the same Keystone's catalog
    clouds_yaml: Path  # the launcher's entries, each listing both regions

    def connect(self, region: str) -> openstack.connection.Connection:
        """The operator's openstacksdk connection to the osas project in ``region``."""
        config = openstack.config.OpenStackConfig(
            config_files=[str(self.clouds_yaml)], load_envvars=False
        )
        return openstack.connection.Connection(
            config=config.get_one(cloud=CLOUD, region_name=region)
        )


def listing_regions(source: Path, target: Path, regions: list[str]) -> Path:
    """``source``'s clouds, each listing ``regions``: openstacksdk lets a connection choose
    only a region its cloud's entry lists (``region_name`` alone lists one)."""
    document = yaml.safe_load(source.read_text())
    for entry in document["clouds"].values():
        entry["regions"] = list(regions)
    target.write_text(yaml.safe_dump(document, sort_keys=False))
    target.chmod(0o600)
    return target


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoRegions]:
    workdir = tmp_path_factory.mktemp("realnova-regions")
    options = NovaOptions(hosts=1, max_limit=PAGE)
    with RealNovaProcess(options, workdir=workdir / "one") as one:
        joining = RealNovaProcess(
            options,
            workdir=workdir / "two",
            region=SECOND_REGION,
            keystone_url=one.keystone_url,
        )
        with joining as two:
            clouds_yaml = listing_regions(
                one.clouds_yaml, workdir / "clouds.yaml", [REGION, SECOND_REGION]
            )
            yield TwoRegions(one, two, clouds_yaml)


@pytest.fixture
def sdk_env(regions: TwoRegions, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the two-region clouds.yaml: no OS_CLOUD... from the caller's shell."""
    for name in list(os.environ):
        if name.startswith("OS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(regions.clouds_yaml))


@pytest.fixture
def clean(regions: TwoRegions, sdk_env: None) -> Iterator[TwoRegions]:
    """Both regions, emptied after the test (osas stopped by then)."""
    try:
        yield regions
    finally:
        for region in (REGION, SECOND_REGION):
            conn = regions.connect(region)
            try:
                delete_everything(conn)
            finally:
                conn.close()


def two_region_config(
    tmp_path: Path, *, attempts: int | None = None, **reconcile: str
) -> OsasConfig:
    """A cluster of its own: ``north`` in RegionOne (the top-level block's place), ``south`` in
    RegionTwo (its own block names the region alone: same cloud, same credentials).
    ``attempts``: the top-level block's, for each place apart."""
    group = {
        "min_size": 0,
        "max_size": 4,
        "flavor": "m1.small",
        "image": IMAGE_NAME,
        "networks": [NETWORK_NAME],
    }
    data = config_data(
        cluster_name=f"rgn-{uuid.uuid4().hex[:8]}",
        openstack={
            "cloud": CLOUD,
            "region_name": REGION,
            "api_timeout": "5s",
            **({} if attempts is None else {"attempts": attempts}),
        },
        node_groups=[
            {"id": NORTH, **group},
            {"id": SOUTH, **group, "openstack": {"region_name": SECOND_REGION}},
        ],
        queue={"capacity": 20, "workers": 2},
        reconcile={
            "interval": "0.5s",
            "full_resync_interval": "3s",
            "max_inventory_age": "1h",
            "retry_backoff": "0.1s",
            "delete_retry_after": "10s",
            "create_doubt_window": "20s",
            "hold_after_start": False,
            **reconcile,
        },
    )
    return load_config(write_config(tmp_path, data))


def serving(config: OsasConfig) -> AbstractAsyncContextManager[tuple[Provider, CaClient]]:
    """osas as ``osas serve`` runs it against the two regions (real Nova starts slowly)."""
    return serving_places(config, timeout=60)


async def until(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise AssertionError(msg)
        await asyncio.sleep(0.3)


async def ca_view(ca: CaClient, group: str) -> dict[str, int]:
    """CA's loop: Refresh, then the group's instances (provider id -> state)."""
    await ca.refresh()
    return {i.id: i.status.instanceState for i in await ca.nodes(group)}


def running(ca: CaClient, group: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        states = list((await ca_view(ca, group)).values())
        return states == [RUNNING] * count

    return check


async def ours(regions: TwoRegions, region: str, config: OsasConfig) -> list[dict[str, Any]]:
    """The servers of ``region``'s Nova that carry this cluster's marks (listed in a thread:
    osas shares the test's event loop)."""

    def listing() -> list[dict[str, Any]]:
        conn = regions.connect(region)
        try:
            return project_servers(conn)
        finally:
            conn.close()

    servers = await asyncio.to_thread(listing)
    return [
        s for s in servers if (s.get("metadata") or {}).get(META_CLUSTER) == config.cluster_name
    ]


def provider_ids(servers: list[dict[str, Any]]) -> set[str]:
    return {f"openstack:///{s['id']}" for s in servers}


def assert_in_its_region(servers: list[dict[str, Any]], group: str, config: OsasConfig) -> None:
    """Built, and marked as osas's creates mark them."""
    for server in servers:
        assert server["status"] == "ACTIVE", server
        assert server["metadata"][META_GROUP] == group
        assert f"{TAG_CLUSTER_PREFIX}{config.cluster_name}" in server["tags"]


async def test_each_group_scales_in_its_own_region(clean, tmp_path):
    regions = clean
    config = two_region_config(tmp_path)
    async with serving(config) as (provider, ca):
        assert [str(e.place) for e in provider.app.places] == [
            f"{CLOUD}, region {REGION}",
            f"{CLOUD}, region {SECOND_REGION}",
        ]
        assert {g.id for g in await ca.node_groups()} == {NORTH, SOUTH}
        await ca.increase(SOUTH, 2)
        await ca.increase(NORTH, 1)
        assert (await ca.target_size(SOUTH), await ca.target_size(NORTH)) == (2, 1)
        await until(running(ca, SOUTH, 2), 90, "two south instances running")
        await until(running(ca, NORTH, 1), 30, "one north instance running")

        # Each group's servers are in its own region's Nova, and only there.
        north, south = (
            await ours(regions, REGION, config),
            await ours(regions, SECOND_REGION, config),
        )
        assert [s["metadata"][META_GROUP] for s in north] == [NORTH]
        assert sorted(s["metadata"][META_GROUP] for s in south) == [SOUTH, SOUTH]
        assert_in_its_region(north, NORTH, config)
        assert_in_its_region(south, SOUTH, config)
        # Built from each region's own image (the same name, another id).
        assert {s["image"]["id"] for s in north} == {regions.one.info["image_id"]}
        assert {s["image"]["id"] for s in south} == {regions.two.info["image_id"]}

        # CA's view of each group is its region's servers; every node is found in its group.
        assert set(await ca_view(ca, SOUTH)) == provider_ids(south)
        assert set(await ca_view(ca, NORTH)) == provider_ids(north)
        for group, servers in ((NORTH, north), (SOUTH, south)):
            for server in servers:
                found = await ca.group_for_node(server["name"], f"openstack:///{server['id']}")
                assert found.id == group
                assert (await ca.group_for_node(server["name"], "")).id == group  # by name
        assert SECOND_REGION.encode() in (await ca.template(SOUTH)).nodeBytes

        # Scale down: the delete goes to RegionTwo's Nova; RegionOne's server stays.
        gone, kept = south
        await ca.delete(SOUTH, [(gone["name"], f"openstack:///{gone['id']}")])
        assert await ca.target_size(SOUTH) == 1

        async def deleted() -> bool:
            left = [s["id"] for s in await ours(regions, SECOND_REGION, config)]
            view = set(await ca_view(ca, SOUTH))
            return left == [kept["id"]] and view == provider_ids([kept])

        # Gone from RegionTwo's Nova, then from CA's view (at osas's next listing).
        await until(deleted, 60, "the south server deleted in RegionTwo")
        assert [s["id"] for s in await ours(regions, REGION, config)] == [north[0]["id"]]
        await ca.delete(NORTH, [(north[0]["name"], f"openstack:///{north[0]['id']}")])

        async def north_empty() -> bool:
            return not await ours(regions, REGION, config) and not await ca_view(ca, NORTH)

        await until(north_empty, 60, "the north server deleted in RegionOne")
        assert [s["id"] for s in await ours(regions, SECOND_REGION, config)] == [kept["id"]]


async def failed_as_said(ca: CaClient, engine: PlaceEngine) -> None:
    """Until the hanging region's listing is given up (2 attempts of 5 s each, CA's loop
    going on meanwhile); then osas says why, where it says what fails."""

    async def failed() -> str | None:
        await ca.refresh()
        return engine.reconciler.status.last_error

    failure = await until(failed, 40, f"{engine.place}'s listing failed")
    assert "accepted the connection but sent no answer in time" in failure
    stale = engine.controller.staleness()
    assert stale is not None
    assert "OpenStack unreachable?" in stale
    assert failure in stale


async def south_as_last_listed_with_a_create_in_doubt(ca: CaClient, listed: str) -> None:
    """The south group while RegionTwo hangs: the instance it last listed, and the create
    whose POST got no answer, creating with no error info (CA does not back off)."""
    view = {i.id: i.status for i in await ca.nodes(SOUTH)}
    assert view.pop(listed).instanceState == RUNNING
    [(placeholder, status)] = view.items()
    assert placeholder.startswith(f"osas://{SOUTH}/")
    assert status.instanceState == pb.InstanceStatus.instanceCreating
    assert not status.HasField("errorInfo")
    assert await ca.target_size(SOUTH) == 2


async def test_a_region_that_stops_answering_holds_up_nothing_in_the_other(clean, tmp_path):
    """RegionTwo's Nova stops answering (its process stopped: connections taken, never
    answered; the shared Keystone answers on). RegionOne's group scales up and down, CA's
    calls answer within CA's deadline and Refresh succeeds, also once RegionTwo's inventory
    is past its age and its listing has failed; RegionTwo's group answers from its last
    listing. A create CA asks of RegionTwo meanwhile is in doubt (its POST got no answer):
    Nova carries it out once it answers again, and osas keeps that server, no second one.
    Then RegionTwo's group is fresh again and scales."""
    regions = clean
    config = two_region_config(
        tmp_path, attempts=2, max_inventory_age="4s", create_doubt_window="60s"
    )
    async with serving(config) as (provider, ca):
        await ca.increase(SOUTH, 1)
        await until(running(ca, SOUTH, 1), 60, "a south instance running")
        [(first_south, _)] = (await ca_view(ca, SOUTH)).items()
        south_engine = engine_of(provider, SECOND_REGION)
        regions.two.freeze()
        try:
            await ca.increase(SOUTH, 1)  # its POST will hang
            await ca.increase(NORTH, 2)
            await until(running(ca, NORTH, 2), 60, "two north instances while RegionTwo hangs")
            north = await ours(regions, REGION, config)
            assert len(north) == 2
            assert_in_its_region(north, NORTH, config)

            await failed_as_said(ca, south_engine)
            await ca.refresh()  # one fresh place is enough for CA's loop
            await south_as_last_listed_with_a_create_in_doubt(ca, first_south)
            # Past its age, RegionTwo's group refuses scale-ups (CA backs it off).
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await ca.increase(SOUTH, 1)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            assert await ca.target_size(SOUTH) == 2
            gone = north[0]
            await ca.delete(NORTH, [(gone["name"], f"openstack:///{gone['id']}")])

            async def north_deleted() -> bool:
                left = [s["id"] for s in await ours(regions, REGION, config)]
                view = set(await ca_view(ca, NORTH))
                return left == [north[1]["id"]] and view == provider_ids([north[1]])

            # Gone from RegionOne's Nova, then from CA's view (at osas's next listing).
            await until(north_deleted, 60, "the north server deleted while RegionTwo hangs")
            assert south_engine.controller.staleness() is not None  # still hanging
        finally:
            regions.two.thaw()

        async def south_fresh() -> bool:
            await ca.refresh()
            return south_engine.controller.staleness() is None

        await until(south_fresh, 60, "RegionTwo fresh again")
        # The create sent into the hang: carried out late by Nova, kept by osas.
        await until(running(ca, SOUTH, 2), 60, "the create sent into the hang running")
        south = await ours(regions, SECOND_REGION, config)
        assert len(south) == 2
        assert len({s["metadata"][META_REQUEST] for s in south}) == 2
        assert set(await ca_view(ca, SOUTH)) == provider_ids(south)
        # And the group scales as before.
        await ca.increase(SOUTH, 1)
        await until(running(ca, SOUTH, 3), 60, "RegionTwo's group scaling again")
        south = await ours(regions, SECOND_REGION, config)
        assert len(south) == 3
        assert_in_its_region(south, SOUTH, config)
        assert set(await ca_view(ca, SOUTH)) == provider_ids(south)
        assert [s["id"] for s in await ours(regions, REGION, config)] == [north[1]["id"]]


async def checked(config: OsasConfig) -> tuple[int, str, list[str]]:
    """check-config's exit code, output and problems (as tests/test_places.py runs it)."""
    out = io.StringIO()
    report = Report(out)
    clouds = [(place, openstack_cloud(config, place=place)) for place in places_of(config)]
    code = await check_config(config, clouds, report)
    return code, out.getvalue(), report.problems


async def test_check_config_checks_each_region_against_its_own_nova(
    regions, sdk_env, tmp_path, monkeypatch
):
    config = two_region_config(tmp_path)
    regions.two.set_quota(instances=3)  # RegionTwo's quota, not RegionOne's
    try:
        code, said, problems = await checked(config)
    finally:
        regions.two.set_quota(instances=DEFAULT_QUOTAS["instances"])
    assert code == EXIT_OK, said
    assert problems == []
    assert f"place: {CLOUD}, region {REGION} (node groups: {NORTH})" in said
    assert f"place: {CLOUD}, region {SECOND_REGION} (node groups: {SOUTH})" in said
    # Each name resolved in its own region: the image's and flavor's ids are that region's.
    for nova in (regions.one, regions.two):
        assert f"ok ({nova.info['image_id']})" in said
        assert f"ok ({nova.info['flavors']['m1.small']})" in said
        assert f"{nova.base_url}/compute/v2.1" in said  # each Nova described itself
    assert said.count("all resources found") == 2
    # The quota rows: max size, headroom, what limits it; RegionTwo's own instance quota.
    assert re.search(rf"^{NORTH} +4 +50 +instances", said, re.MULTILINE), said
    assert re.search(rf"^{SOUTH} +4 +3 +instances", said, re.MULTILINE), said

    # The launcher's own clouds.yaml names RegionOne alone, as a cloud's downloaded file does:
    # openstacksdk refuses RegionTwo before anything is sent, and check-config says so.
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(regions.one.clouds_yaml))
    code, said, problems = await checked(config)
    assert code == EXIT_CLOUD, said
    [problem] = problems
    assert f"region {SECOND_REGION}: the cloud cannot be used" in problem
    assert f"Region {SECOND_REGION} is not a valid region name for cloud {CLOUD}" in problem
    assert "all resources found" in said  # RegionOne's, checked all the same
