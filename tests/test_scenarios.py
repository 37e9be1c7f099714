"""The scenarios that matter, written once and run against two clouds: the simulated OpenStack
(every run) and real Nova from the pinned ``nova`` wheel (``nox -s nova``; skipped where the
``nova`` package is not installed).

Each scenario drives a real osas over gRPC as CA does, osas reaches the cloud through its
clouds.yaml entry, and every check of what happened in the cloud goes through the project's
own API. Each scenario uses a cluster name of its own, so leftovers of one cannot be taken for
another's servers; the project is emptied after each. Listings page at 3 servers in both clouds.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from clouds import (
    NOVA_AVAILABLE,
    RESEND_DELETE_AFTER,
    ScenarioCloud,
    connect,
    delete_everything,
    delete_unless_deleting,
    describe_servers,
    project_servers,
    running_cloud,
    settings_for,
)
from support import Provider, config_data, expect_status, kept, write_config

from osas.cloud.openstack import OpenStackCloud
from osas.config import OsasConfig, load_config
from osas.demo.client import CaClient
from osas.demo.client import connect as ca_connect
from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST, TAG_CLUSTER_PREFIX
from osas.protocol import externalgrpc_pb2 as pb

OUT_OF_RESOURCES = 1
_names = itertools.count()

CLOUDS = [
    pytest.param("sim", id="sim"),
    pytest.param(
        "nova",
        id="nova",
        marks=[
            pytest.mark.realnova,
            pytest.mark.skipif(not NOVA_AVAILABLE, reason="real Nova: run `nox -s nova`"),
        ],
    ),
]


@pytest.fixture(scope="module", params=CLOUDS)
def cloud(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[ScenarioCloud]:
    with running_cloud(request.param, tmp_path_factory.mktemp(request.param)) as running:
        yield running


@pytest.fixture
def clean(cloud: ScenarioCloud) -> Iterator[ScenarioCloud]:
    """The cloud, emptied and with its quota restored after the scenario."""
    try:
        yield cloud
    finally:
        cloud.set_instance_quota(None)
        cloud.set_ram_quota(None)
        delete_everything(connect(cloud))


def scenario_config(
    cloud: ScenarioCloud,
    tmp_path: Path,
    *,
    reconcile: Mapping[str, str] | None = None,
    more_groups: tuple[Mapping[str, Any], ...] = (),
    **group: Any,
) -> OsasConfig:
    """osas's configuration for one scenario: a cluster name of its own, one group
    ``workers`` (``group`` overrides its keys; ``more_groups`` override them for more groups),
    quick syncs (``reconcile`` overrides those)."""
    cluster = f"scn{next(_names)}-{uuid.uuid4().hex[:6]}"
    spec = {
        "id": "workers",
        "min_size": 0,
        "max_size": 6,
        "flavor": cloud.flavor,
        "image": cloud.image,
        "networks": [cloud.network],
        **group,
    }
    data = config_data(
        cluster_name=cluster,
        openstack={"cloud": cloud.cloud_name, "api_timeout": "10s"},
        node_groups=[spec, *({**spec, **more} for more in more_groups)],
        queue={"capacity": 50, "workers": 3},
        reconcile={
            "interval": "0.3s",
            "full_resync_interval": "2s",
            "max_inventory_age": "1h",
            "retry_backoff": "0.05s",
            "delete_retry_after": "5s",
            "create_doubt_window": "20s",
            "hold_after_start": False,
            **(reconcile or {}),
        },
    )
    return load_config(write_config(tmp_path, data))


@asynccontextmanager
async def osas_on(
    cloud: ScenarioCloud, config: OsasConfig
) -> AsyncIterator[tuple[Provider, CaClient]]:
    provider = Provider(config, OpenStackCloud(settings_for(cloud)))
    await provider.start(wait_serving=False)
    await provider.wait_serving(timeout=60)
    try:
        async with ca_connect(provider.address, None) as ca:
            yield provider, ca
    finally:
        await provider.stop()


def ours(cloud: ScenarioCloud, config: OsasConfig) -> list[dict[str, Any]]:
    """The project's servers that carry this scenario's cluster marks."""
    return [
        s
        for s in project_servers(connect(cloud))
        if (s.get("metadata") or {}).get(META_CLUSTER) == config.cluster_name
    ]


async def until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise AssertionError(msg)
        await asyncio.sleep(0.2)


def error_codes(instances) -> list[str]:
    """The error codes CA would see: one for each instance reported with error info."""
    return [i.status.errorInfo.errorCode for i in instances if i.status.HasField("errorInfo")]


async def ca_cleans_up(ca: CaClient, group: str = "workers") -> None:
    """CA's deleteCreatedNodesWithErrors: its fake nodes for instances with error info."""
    failed = [i.id for i in await ca.nodes(group) if i.status.HasField("errorInfo")]
    if failed:
        await ca.delete(group, [(i, i) for i in failed])


# -- the scenarios --------------------------------------------------------------------------------


async def test_a_ca_session(clean, tmp_path):
    """Scale up, running, NodeGroupForNode, template, delete, decrease."""
    cloud = clean
    config = scenario_config(cloud, tmp_path)
    async with osas_on(cloud, config) as (provider, ca):
        await ca.refresh()
        assert [g.id for g in await ca.node_groups()] == ["workers"]
        await ca.increase("workers", 2)
        assert await ca.target_size("workers") == 2

        async def two_running() -> bool:
            await ca.refresh()
            instances = await ca.nodes("workers")
            states = [i.status.instanceState for i in kept(instances)]
            return states == [pb.InstanceStatus.instanceRunning] * 2

        await until(two_running, 60, "two running instances")
        servers = ours(cloud, config)
        assert len(servers) == 2
        for server in servers:
            assert server["metadata"][META_GROUP] == "workers"
            group = await ca.group_for_node(server["name"], f"openstack:///{server['id']}")
            assert group.id == "workers"
            assert (await ca.group_for_node(server["name"], "")).id == "workers"  # by name
        template = await ca.template("workers")
        assert template.nodeBytes

        doomed = servers[0]["id"]
        await ca.delete("workers", [(servers[0]["name"], f"openstack:///{doomed}")])
        assert await ca.target_size("workers") == 1
        await until(lambda: len(ours(cloud, config)) == 1, 60, "the server deleted")

        # A create Nova refuses (quota) leaves a failure CA can take back with a decrease.
        cloud.set_instance_quota(len(project_servers(connect(cloud))))
        await ca.increase("workers", 1)
        await until(lambda: provider.app.inventory.ledger.failures_of("workers"), 30, "a failure")
        await ca.decrease("workers", -1)
        assert await ca.target_size("workers") == 1
        await expect_status(grpc.StatusCode.FAILED_PRECONDITION, ca.decrease("workers", -1))
        assert len(ours(cloud, config)) == 1


async def test_look_alike_servers_are_never_touched(clean, tmp_path):
    cloud = clean
    config = scenario_config(cloud, tmp_path)
    conn = connect(cloud)
    tag = f"{TAG_CLUSTER_PREFIX}{config.cluster_name}"
    look_alikes = [
        # our tag, another cluster's metadata
        ({META_CLUSTER: "other", META_GROUP: "workers"}, [tag]),
        # our metadata, no tag
        ({META_CLUSTER: config.cluster_name, META_GROUP: "workers"}, []),
        # our tag, no group
        ({META_CLUSTER: config.cluster_name}, [tag]),
    ]
    made = []
    for index, (metadata, tags) in enumerate(look_alikes):
        server = conn.compute.post(
            "/servers",
            json={
                "server": {
                    "name": f"{config.cluster_name}-workers-{index}",
                    "flavorRef": conn.compute.find_flavor(cloud.flavor).id,
                    "imageRef": conn.image.find_image(cloud.image).id,
                    "networks": [{"uuid": conn.network.find_network(cloud.network).id}],
                    "metadata": metadata,
                    "tags": tags,
                }
            },
            microversion="2.52",
        ).json()["server"]
        made.append(server["id"])
    async with osas_on(cloud, config) as (_, ca):
        assert await ca.target_size("workers") == 0
        assert list(await ca.nodes("workers")) == []
        for index, server_id in enumerate(made):
            pid = f"openstack:///{server_id}"
            assert (await ca.group_for_node(f"{config.cluster_name}-workers-{index}", pid)).id == ""
            await expect_status(grpc.StatusCode.NOT_FOUND, ca.delete("workers", [(pid, pid)]))
    # Each by id: a paged listing of real Nova can skip a server while builds are in flight.
    for server_id, (metadata, tags) in zip(made, look_alikes, strict=True):
        server = conn.compute.get(f"/servers/{server_id}", microversion="2.52").json()["server"]
        assert server["status"] != "DELETED"
        assert server["OS-EXT-STS:task_state"] != "deleting"
        assert server["metadata"] == metadata
        assert server["tags"] == tags


@pytest.mark.parametrize(
    "quota_interval", ["60s", "0s"], ids=["osas-reads-the-quota", "nova-refuses"]
)
async def test_quota_refusal_is_reported_and_cleaned_up(clean, tmp_path, quota_interval):
    """No room at all: osas, having read the quota, fails the create at once without a
    POST; or, not reading it, Nova refuses it (403, its own words). CA sees the same."""
    cloud = clean
    config = scenario_config(cloud, tmp_path, reconcile={"quota_interval": quota_interval})
    cloud.set_instance_quota(0)
    async with osas_on(cloud, config) as (provider, ca):
        await ca.increase("workers", 1)
        await until(lambda: provider.app.inventory.ledger.failures_of("workers"), 30, "refusal")
        (instance,) = await ca.nodes("workers")
        assert instance.id.startswith("osas://workers/")
        assert instance.status.instanceState == pb.InstanceStatus.instanceCreating
        error = instance.status.errorInfo
        assert (error.errorCode, error.instanceErrorClass) == ("QuotaExceeded", OUT_OF_RESOURCES)
        await ca_cleans_up(ca)
        assert await ca.target_size("workers") == 0
        assert list(await ca.nodes("workers")) == []
    assert ours(cloud, config) == []


async def test_ca_sees_the_quota_headroom_and_no_create_is_sent_beyond_it(clean, tmp_path):
    """Issue 21, problem 2: the quota was discovered by failing. Two groups; the project's
    quota holds 3 more of the big flavor and 10 of the small one. CA sees that as the big
    group's max size; asked for 5 anyway (a CA that planned before it saw), osas sends 3 and
    fails 2 at once as out of resources, without a POST; the small group scales in the same
    loop, within what is left. Nova refuses nothing."""
    cloud = clean
    small = {"id": "small", "min_size": 0, "max_size": 20, "flavor": "m1.small"}
    config = scenario_config(
        cloud,
        tmp_path,
        reconcile={"quota_interval": "0.5s"},
        more_groups=(small,),
        id="big",
        max_size=10,
        flavor="m1.large",  # 4 vCPUs, 8 GiB; m1.small: 1 vCPU, 2 GiB
    )
    absolute = connect(cloud).compute.get("/limits").json()["limits"]["absolute"]
    cloud.set_instance_quota(absolute["totalInstancesUsed"] + 10)
    cloud.set_ram_quota(absolute["totalRAMUsed"] + 3 * 8192 + 4096)
    async with osas_on(cloud, config) as (provider, ca):

        async def max_sizes() -> dict[str, int]:
            await ca.refresh()
            return {g.id: g.maxSize for g in await ca.node_groups()}

        await until(lambda: max_sizes_are(max_sizes(), {"big": 3, "small": 10}), 30, "the headroom")
        await ca.increase("big", 5)
        failed = error_codes(await ca.nodes("big"))
        assert failed == ["QuotaExceeded", "QuotaExceeded"]
        assert {i.status.errorInfo.instanceErrorClass for i in await ca.nodes("big")} <= {
            0,
            OUT_OF_RESOURCES,
        }
        # The same loop: what is left is the small group's (3 big took 24 of 28 GiB).
        assert (await max_sizes())["small"] == 2
        await ca.increase("small", 2)
        await until(lambda: len(ours(cloud, config)) == 5, 60, "five servers")
        await ca_cleans_up(ca, "big")

        def made() -> Counter[str | None]:
            return Counter((s.get("metadata") or {}).get(META_GROUP) for s in ours(cloud, config))

        # Real Nova's listing once left out the 3 servers of "big" it had just shown (their
        # move from the API's build requests into a cell, under a paged listing); osas deletes
        # none, so they must show again, and no sixth must ever come.
        await until(lambda: made() == {"big": 3, "small": 2}, 30, "3 big and 2 small")
        assert all(s["status"] != "ERROR" for s in ours(cloud, config))
        refused = provider.app.inventory.ledger.failures_of("small")
        assert not refused


async def max_sizes_are(sizes, expected: dict[str, int]) -> bool:
    return await sizes == expected


async def test_quota_race_errors_are_reported_and_cleaned_up(clean, tmp_path):
    """Room for one, three creates at once: Nova refuses some at once (403) and may turn others
    into ERROR servers after its quota re-check (413 fault). Every failure is out of
    resources, at most one server runs, and CA's clean-up leaves nothing behind."""
    cloud = clean
    # osas reads no quota here: it would send one create only, and Nova's race is the point.
    config = scenario_config(cloud, tmp_path, reconcile={"quota_interval": "0s"})
    cloud.set_instance_quota(1)
    if cloud.kind == "sim":
        cloud.sim.nova.faults.quota_recheck_seconds = 0.5  # type: ignore[attr-defined]
    async with osas_on(cloud, config) as (provider, ca):
        await ca.increase("workers", 3)

        async def all_told() -> bool:
            await ca.refresh()
            instances = list(await ca.nodes("workers"))
            errors = [i for i in instances if i.status.HasField("errorInfo")]
            running = [
                i for i in instances if i.status.instanceState == pb.InstanceStatus.instanceRunning
            ]
            return len(errors) + len(running) == 3

        await until(all_told, 60, "every create to run or fail")
        instances = list(await ca.nodes("workers"))
        errors = [i.status.errorInfo for i in instances if i.status.HasField("errorInfo")]
        assert errors
        assert {(e.errorCode, e.instanceErrorClass) for e in errors} == {
            ("QuotaExceeded", OUT_OF_RESOURCES)
        }
        assert len(kept(instances)) <= 1
        await ca_cleans_up(ca)
        await until(lambda: len(ours(cloud, config)) == len(kept(instances)), 60, "clean-up")
        await provider.sync(full=True)
        assert await ca.target_size("workers") == len(ours(cloud, config)) <= 1
    if cloud.kind == "sim":
        cloud.sim.nova.faults.quota_recheck_seconds = 0.0  # type: ignore[attr-defined]


async def test_no_valid_host_is_out_of_resources(clean, tmp_path):
    cloud = clean
    with cloud.no_valid_host() as flavor:
        config = scenario_config(cloud, tmp_path, flavor=flavor)
        async with osas_on(cloud, config) as (_provider, ca):
            await ca.increase("workers", 1)

            async def failed() -> bool:
                await ca.refresh()
                return any(i.status.HasField("errorInfo") for i in await ca.nodes("workers"))

            await until(failed, 60, "NoValidHost")
            (instance,) = await ca.nodes("workers")
            assert instance.id.startswith("openstack:///")  # an ERROR server, tags kept
            error = instance.status.errorInfo
            assert (error.errorCode, error.instanceErrorClass) == ("NoValidHost", OUT_OF_RESOURCES)
            await ca_cleans_up(ca)
            assert await ca.target_size("workers") == 0
            await until(lambda: ours(cloud, config) == [], 60, "the ERROR server deleted")


async def test_kill_mid_scale_up_then_restart(clean, tmp_path):
    """osas killed (no graceful shutdown) while creating: the next process loses nothing and
    duplicates nothing; CA's next loops bring the group to what it asked for."""
    cloud = clean
    config = scenario_config(cloud, tmp_path)
    first = Provider(config, OpenStackCloud(settings_for(cloud)))
    await first.start(wait_serving=False)
    await first.wait_serving(timeout=60)
    async with ca_connect(first.address, None) as ca:
        await ca.increase("workers", 4)
        await until(lambda: len(ours(cloud, config)) >= 1, 60, "a first server")
    assert first._task is not None
    first._task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first._task
    await asyncio.sleep(2)  # creates already sent land in Nova meanwhile
    before = {s["id"] for s in ours(cloud, config)}

    async with osas_on(cloud, config) as (provider, ca):
        assert await ca.target_size("workers") == len(before)
        deadline = time.monotonic() + 90
        while True:
            await ca.refresh()
            await ca_cleans_up(ca)
            target = await ca.target_size("workers")
            if target < 4:
                await ca.increase("workers", 4 - target)
            running = kept(await ca.nodes("workers"))
            if target == 4 and len(running) == 4 and len(ours(cloud, config)) == 4:
                break
            assert time.monotonic() < deadline, "did not converge on 4"
            await asyncio.sleep(0.5)
        await provider.sync(full=True)
        assert await ca.target_size("workers") == 4
    servers = ours(cloud, config)
    assert before <= {s["id"] for s in servers}
    requests = Counter(s["metadata"][META_REQUEST] for s in servers)
    assert max(requests.values()) == 1


async def test_paging_at_a_page_size_of_three(clean, tmp_path):
    cloud = clean
    config = scenario_config(cloud, tmp_path, max_size=7)
    async with osas_on(cloud, config) as (provider, ca):
        await ca.increase("workers", 7)
        await until(lambda: len(ours(cloud, config)) == 7, 90, "seven servers")
        await provider.sync(full=True)
        instances = list(await ca.nodes("workers"))
        assert len(instances) == 7
        assert len({i.id for i in instances}) == 7
        assert await ca.target_size("workers") == 7


async def test_a_server_deleted_behind_osas_back(clean, tmp_path):
    cloud = clean
    config = scenario_config(cloud, tmp_path)
    async with osas_on(cloud, config) as (provider, ca):
        await ca.increase("workers", 2)
        await until(lambda: len(ours(cloud, config)) == 2, 60, "two servers")
        await provider.sync(full=True)
        victim = ours(cloud, config)[0]["id"]
        connect(cloud).compute.delete_server(victim)
        await until(lambda: len(ours(cloud, config)) == 1, 60, "the server gone from Nova")
        await provider.sync(full=True)
        assert await ca.target_size("workers") == 1
        assert f"openstack:///{victim}" not in [i.id for i in await ca.nodes("workers")]


async def test_a_server_deleted_behind_osas_back_leaves_within_one_incremental_sync(
    clean, tmp_path
):
    """One of osas's servers deleted directly through the project's API: one incremental sync
    later NodeGroupNodes no longer lists it and NodeGroupTargetSize no longer counts it. The
    incremental sync's listing carries no tag filter (changes-since): Nova drops a deleted
    server's tags, so a tag filter would hide exactly this deletion. osas syncs only when told
    to here (hour-long intervals, no Refresh), so no complete listing can have seen it first."""
    cloud = clean
    config = scenario_config(
        cloud,
        tmp_path,
        reconcile={
            "interval": "1h",
            "full_resync_interval": "1h",
            "max_inventory_age": "2h",
            "hold_after_start": False,
        },
    )
    async with osas_on(cloud, config) as (provider, ca):
        await ca.increase("workers", 2)
        # ACTIVE first: a server deleted while still `scheduling` may go with its build request
        # and leave no DELETED row for changes-since (seen once in the real-Nova lane).
        await until(
            lambda: [s["status"] for s in ours(cloud, config)] == ["ACTIVE", "ACTIVE"],
            60,
            "two ACTIVE servers",
        )
        await provider.sync(full=True)
        victim = ours(cloud, config)[0]["id"]
        assert f"openstack:///{victim}" in [i.id for i in await ca.nodes("workers")]
        connect(cloud).compute.delete_server(victim)
        seen: list[str] = []  # what Nova showed last, for the message if it never goes
        resend_at = [time.monotonic() + RESEND_DELETE_AFTER]

        def gone() -> bool:
            # Gone as Nova shows it to a listing of changes (what an incremental sync reads):
            # out of the project's listing, and DELETED since the last complete listing.
            conn = connect(cloud)
            listed = {s["id"]: s for s in project_servers(conn)}
            if victim in listed:
                seen[:] = describe_servers([listed[victim]])
                # Real Nova can answer 204 and keep the server (delete_everything): again.
                if time.monotonic() > resend_at[0]:
                    delete_unless_deleting(conn, [listed[victim]], again=True)
                    resend_at[0] = time.monotonic() + RESEND_DELETE_AFTER
                return False
            since = "/servers/detail?changes-since=2000-01-01T00:00:00Z"
            changes = conn.compute.get(since, microversion="2.52").json()["servers"]
            statuses = [s["status"] for s in changes if s["id"] == victim]
            seen[:] = [f"not listed; changes-since shows it as {statuses} among {len(changes)}"]
            return "DELETED" in statuses

        try:
            await until(gone, 60, "the server gone from Nova")  # deleting first, then DELETED
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen: {seen}") from None
        before = [i.id for i in await ca.nodes("workers")]
        assert f"openstack:///{victim}" in before  # nothing has synced since
        status = provider.app.reconciler.status
        syncs = (status.full_syncs, status.incremental_syncs)
        await provider.app.reconciler.reconcile_once(full=False)
        assert (status.full_syncs, status.incremental_syncs) == (syncs[0], syncs[1] + 1)
        instances = [i.id for i in await ca.nodes("workers")]
        assert f"openstack:///{victim}" not in instances
        assert len(instances) == 1
        assert await ca.target_size("workers") == 1


# -- Keystone: tokens revoked, tokens expiring ----------------------------------------------------

REAUTHENTICATED = "OpenStack refused the token; authenticated again"  # osas's log lines
CREDENTIALS_REFUSED = "OpenStack refuses osas's credentials"


async def test_tokens_revoked_with_creates_in_flight_fail_no_create(clean, tmp_path):
    """Keystone revokes every token of osas's user while five creates are on their way. Each
    request refused 401 did nothing, so osas authenticates again and sends it again: CA sees no
    failed create, every create ends as a server, the target holds.

    Keystone also refuses tokens issued within the second of the revocation (it keeps whole
    seconds), so the token osas gets at once may meet a second 401: osas then authenticates
    once more a second later, and never takes its credentials for refused."""
    cloud = clean
    config = scenario_config(cloud, tmp_path)
    if cloud.kind == "sim":
        # Real Nova takes a few tenths of a second a create; the simulator microseconds.
        cloud.sim.nova.faults.create_stall = 0.3  # type: ignore[attr-defined]
    seen: list[str] = []
    try:
        with structlog.testing.capture_logs() as logs:
            async with osas_on(cloud, config) as (provider, ca):
                await ca.increase("workers", 5)
                await asyncio.sleep(0.1)  # the first creates are on the wire, the rest queued
                await asyncio.to_thread(cloud.revoke_tokens)

                async def five_running() -> bool:
                    # Through CA alone: right after a revocation Keystone refuses even tokens
                    # issued within the same second (it keeps whole seconds), and the
                    # scenario's own openstacksdk calls would meet that too.
                    await ca.refresh()
                    instances = list(await ca.nodes("workers"))
                    seen.extend(error_codes(instances))
                    running = [
                        i
                        for i in kept(instances)
                        if i.status.instanceState == pb.InstanceStatus.instanceRunning
                    ]
                    return len(running) == 5

                await until(five_running, 90, "five running instances")
                assert await ca.target_size("workers") == 5
                assert provider.app.inventory.ledger.failures_of("workers") == []
    finally:
        if cloud.kind == "sim":
            cloud.sim.nova.faults.create_stall = 0.0  # type: ignore[attr-defined]
    assert seen == []
    assert len(ours(cloud, config)) == 5
    assert any(e["event"] == REAUTHENTICATED for e in logs)  # the revocation reached osas
    assert not [e for e in logs if e["event"].startswith(CREDENTIALS_REFUSED)]


TOKEN_LIFETIME = 3  # seconds


@pytest.mark.long
async def test_tokens_expiring_every_few_seconds_fail_nothing(clean, tmp_path):
    """Keystone's tokens live 3 s: osas keeps working across several expiries, a scale-up and
    a scale-down spanning more than the lifetime. keystoneauth renews a token close to its
    expiry before sending a request (within 120 s of it, so here before every request), and
    nothing is reported failed."""
    cloud = clean
    cloud.set_token_lifetime(TOKEN_LIFETIME)
    seen: list[str] = []
    try:
        conn = connect(cloud)
        access = conn.session.auth.get_access(conn.session)
        assert access.expires - access.issued <= timedelta(seconds=TOKEN_LIFETIME)
        config = scenario_config(cloud, tmp_path)
        async with osas_on(cloud, config) as (provider, ca):

            async def look() -> list[pb.Instance]:
                await ca.refresh()
                instances = list(await ca.nodes("workers"))
                seen.extend(error_codes(instances))
                return instances

            async def lasting(since: float) -> None:
                """CA's loop (Refresh, NodeGroupNodes) until a phase begun at ``since`` has
                outlived a token issued as it began (Keystone keeps whole seconds)."""
                while time.monotonic() - since < TOKEN_LIFETIME + 1:
                    await look()
                    await asyncio.sleep(0.5)

            scale_up = time.monotonic()
            await ca.increase("workers", 3)

            async def three_running() -> bool:
                states = [i.status.instanceState for i in kept(await look())]
                return states == [pb.InstanceStatus.instanceRunning] * 3

            await until(three_running, 90, "three running instances")
            await lasting(scale_up)
            scale_down = time.monotonic()
            servers = ours(cloud, config)
            await ca.delete(
                "workers", [(s["name"], f"openstack:///{s['id']}") for s in servers[:2]]
            )
            await until(lambda: len(ours(cloud, config)) == 1, 60, "two servers deleted")
            await lasting(scale_down)
            assert await ca.target_size("workers") == 1
            assert len(kept(await look())) == 1
            assert provider.app.reconciler.status.credentials_refused is None
    finally:
        cloud.set_token_lifetime(None)
    assert seen == []


def check_config(folder: Path) -> subprocess.CompletedProcess[str]:
    """`osas check-config` on the scenario configuration written in ``folder``."""
    return subprocess.run(
        [sys.executable, "-m", "osas", "check-config", "--config", str(folder / "osas.yaml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_check_config(clean, tmp_path):
    """`osas check-config` resolves every name a group uses in the cloud."""
    cloud = clean
    for name, flavor, code, expected in (
        ("good", cloud.flavor, 0, "all resources found"),
        ("bad", "no-such-flavor", 1, "NOT FOUND"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        scenario_config(cloud, folder, flavor=flavor)
        result = check_config(folder)
        assert result.returncode == code, result.stdout + result.stderr
        assert expected in result.stdout


def test_check_config_prints_each_groups_quota_headroom(clean, tmp_path):
    """`osas check-config` says how many more servers of each group the project can hold,
    and which resource bounds it, from the cloud's own /limits."""
    cloud = clean
    used = connect(cloud).compute.get("/limits").json()["limits"]["absolute"]["totalInstancesUsed"]
    cloud.set_instance_quota(used + 4)
    scenario_config(cloud, tmp_path)
    result = check_config(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["workers", "6", "4", "instances"] in rows, result.stdout
