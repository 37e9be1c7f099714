"""Smoke tests against real Nova (``nox -s nova``): unmodified openstacksdk through clouds.yaml,
then osas's own OpenStack adapter. Nova runs in a child process started from the pinned wheel's
functional-test fixtures, real Keystone in another (see ``realnova/cloud.py``); everything stays
on 127.0.0.1.

Skipped where the ``nova`` package is not installed (the main test venv)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

if importlib.util.find_spec("nova") is None:
    pytest.skip(
        "real-Nova lane: the nova package is not installed (run `nox -s nova`)",
        allow_module_level=True,
    )

import anyio
import openstack
import openstack.config
import openstack.connection
import openstack.exceptions
import requests
from openstack import utils as sdk_utils
from realnova.cloud import (
    ADMIN_CLOUD,
    APPCRED_CLOUD,
    CLOUD,
    IMAGE_NAME,
    NETWORK_NAME,
    NovaOptions,
    RealNovaProcess,
)

pytestmark = pytest.mark.realnova

T = TypeVar("T")
PAGE = 3  # Nova's [api] max_limit in this module: every listing of more than 3 servers pages
SDK_SERVER_MICROVERSION = "2.100"  # openstacksdk's ceiling for servers


@pytest.fixture(scope="module")
def nova(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNovaProcess]:
    options = NovaOptions(hosts=2, max_limit=PAGE)
    with RealNovaProcess(options, workdir=tmp_path_factory.mktemp("realnova")) as cloud:
        yield cloud


@pytest.fixture
def sdk_env(nova: RealNovaProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only our clouds.yaml: no OS_CLOUD, OS_COMPUTE_API_VERSION... from the caller's shell."""
    for name in list(os.environ):
        if name.startswith("OS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(nova.clouds_yaml))


def connect(nova: RealNovaProcess, cloud: str = CLOUD) -> openstack.connection.Connection:
    config = openstack.config.OpenStackConfig(
        config_files=[str(nova.clouds_yaml)], load_envvars=False
    )
    return openstack.connection.Connection(config=config.get_one(cloud=cloud))


@pytest.fixture
def conn(nova: RealNovaProcess) -> Iterator[openstack.connection.Connection]:
    connection = connect(nova)
    yield connection
    connection.close()


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def unique_tag() -> str:
    return f"osas-cluster={uuid.uuid4().hex[:10]}"


def boot(
    conn: openstack.connection.Connection, nova: RealNovaProcess, tag: str, name: str, **extra: Any
) -> Any:
    return conn.compute.create_server(
        name=name,
        flavor_id=nova.info["flavors"]["m1.small"],
        image_id=nova.info["image_id"],
        networks=[{"uuid": nova.info["network_id"]}],
        metadata={"osas-node-group": "workers"},
        tags=[tag],
        **extra,
    )


def active(conn: openstack.connection.Connection, server_id: str) -> Any:
    def check() -> Any:
        server = conn.compute.get_server(server_id)
        assert server.status != "ERROR", server.fault
        return server if server.status == "ACTIVE" else None

    return wait_for(check, f"server {server_id} ACTIVE")


def purge(conn: openstack.connection.Connection, tag: str) -> None:
    for server in list(conn.compute.servers(tags=tag)):
        conn.compute.delete_server(server.id, ignore_missing=True)


# -- openstacksdk -------------------------------------------------------------------------------


def test_discovery_and_catalog(nova, conn):
    compute = conn.compute.get_endpoint_data()
    assert compute.url.rstrip("/") == f"{nova.base_url}/compute/v2.1"
    assert compute.min_microversion == (2, 1)
    assert compute.max_microversion >= (2, 100)
    assert conn.image.get_endpoint().rstrip("/") == f"{nova.base_url}/image/v2"
    assert conn.network.get_endpoint().rstrip("/") == f"{nova.base_url}/network/v2.0"
    assert conn.endpoint_for("identity").rstrip("/") == nova.auth_url  # Keystone's own port
    assert conn.current_project_id == nova.project_id
    # What osas resolves by name, under the names its configs use.
    assert conn.image.find_image(IMAGE_NAME).id == nova.info["image_id"]
    assert conn.network.find_network(NETWORK_NAME).id == nova.info["network_id"]
    flavors = {f.name: f for f in conn.compute.flavors()}
    assert {"m1.small", "m1.medium", "m1.large", "g1.xlarge"} <= set(flavors)
    assert (flavors["m1.small"].vcpus, flavors["m1.small"].ram) == (1, 2048)


def test_every_token_is_checked_with_keystone(nova):
    """keystonemiddleware in nova-api's pipeline and in front of the facades, as in
    production, but without its cache of validated tokens: a token Keystone has revoked is
    refused at once."""
    servers = f"{nova.base_url}/compute/v2.1/servers"
    images = f"{nova.base_url}/image/v2/images"
    anonymous = requests.get(servers, timeout=30)
    assert anonymous.status_code == 401
    keystone = nova.auth_url.removesuffix("/v3")
    assert anonymous.headers["WWW-Authenticate"] == f'Keystone uri="{keystone}"'
    assert requests.get(images, timeout=30).status_code == 401
    own = connect(nova)
    try:
        token = {"X-Auth-Token": own.session.get_token()}
    finally:
        own.close()
    assert requests.get(servers, headers=token, timeout=30).status_code == 200
    assert requests.get(images, headers=token, timeout=30).status_code == 200
    revoked = requests.delete(
        f"{nova.auth_url}/auth/tokens",
        headers={**token, "X-Subject-Token": token["X-Auth-Token"]},
        timeout=30,
    )
    assert revoked.status_code == 204
    assert requests.get(servers, headers=token, timeout=30).status_code == 401
    assert requests.get(images, headers=token, timeout=30).status_code == 401


def test_microversion_negotiated_at_least_2_52(conn):
    negotiated = sdk_utils.maximum_supported_microversion(conn.compute, SDK_SERVER_MICROVERSION)
    assert negotiated == SDK_SERVER_MICROVERSION
    assert sdk_utils.supports_microversion(conn.compute, "2.52")


def test_application_credential_and_bad_password(nova):
    appcred = connect(nova, APPCRED_CLOUD)
    try:
        assert appcred.current_project_id == nova.project_id
        assert list(appcred.compute.servers(tags=unique_tag())) == []
    finally:
        appcred.close()
    config = openstack.config.OpenStackConfig(
        config_files=[str(nova.clouds_yaml)], load_envvars=False
    )
    region = config.get_one(cloud=CLOUD, auth={"password": "wrong"})
    bad = openstack.connection.Connection(config=region)
    try:
        with pytest.raises(openstack.exceptions.SDKException, match=r"HTTP 401"):
            bad.authorize()
    finally:
        bad.close()


def test_create_with_metadata_and_tags_then_filter(nova, conn):
    tag, other = unique_tag(), unique_tag()
    server = boot(conn, nova, tag, "smoke-tags-1")
    assert server.id
    look_alike = boot(conn, nova, other, "smoke-tags-2")
    try:
        built = active(conn, server.id)
        assert built.tags == [tag]
        assert built.metadata == {"osas-node-group": "workers"}
        listed = list(conn.compute.servers(tags=tag))
        assert [s.id for s in listed] == [server.id]
        assert listed[0].tags == [tag]
        assert look_alike.id not in {s.id for s in conn.compute.servers(tags=tag)}
    finally:
        purge(conn, tag)
        purge(conn, other)


def test_changes_since(nova, conn):
    tag = unique_tag()
    before = (datetime.now(UTC) - timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    server = boot(conn, nova, tag, "smoke-changes")
    try:
        active(conn, server.id)
        since = [s.id for s in conn.compute.servers(tags=tag, changes_since=before)]
        assert since == [server.id]
        later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert list(conn.compute.servers(tags=tag, changes_since=later)) == []
    finally:
        purge(conn, tag)
    wait_for(lambda: conn.compute.find_server(server.id) is None, "the delete")
    # Without a tag filter, changes-since also returns the deleted server (its tags gone).
    deleted = [s for s in conn.compute.servers(changes_since=before) if s.id == server.id]
    assert [s.status for s in deleted] == ["DELETED"]
    assert not deleted[0].tags


def test_delete_goes_through_deleting_then_404(nova, conn):
    tag = unique_tag()
    server = boot(conn, nova, tag, "smoke-delete")
    active(conn, server.id)
    conn.compute.delete_server(server.id)
    first = conn.compute.get_server(server.id)  # at once: Nova is still deleting
    assert (first.status, first.task_state) == ("ACTIVE", "deleting")
    wait_for(lambda: conn.compute.find_server(server.id) is None, "404 after the delete")
    with pytest.raises(openstack.exceptions.NotFoundException):
        conn.compute.get_server(server.id)


def test_quota_refused_with_403(nova):
    project = nova.add_project("quota403")
    nova.set_quota(project["project_id"], instances=1)
    tenant = connect(nova, project["cloud"])
    tag = unique_tag()
    try:
        assert tenant.current_project_id == project["project_id"]
        first = boot(tenant, nova, tag, "smoke-quota-1")
        # Nova counts instances in the cell database, where the conductor puts them after the
        # API answered: a second create sent at once passes the API's check, and then the
        # conductor's re-check fails both (ERROR, fault 413). Wait until the first is counted.
        active(tenant, first.id)
        with pytest.raises(openstack.exceptions.ForbiddenException) as refused:
            boot(tenant, nova, tag, "smoke-quota-2")
        assert refused.value.status_code == 403
        assert "quota exceeded" in str(refused.value).lower()
        assert [s.id for s in tenant.compute.servers(tags=tag)] == [first.id]
    finally:
        purge(tenant, tag)
        tenant.close()


def test_paging_at_max_limit_3(nova, conn):
    tag = unique_tag()
    servers = [boot(conn, nova, tag, f"smoke-page-{i}") for i in range(5)]
    try:
        for server in servers:
            active(conn, server.id)
        # Nova caps each page at [api] max_limit and links the next one.
        response = conn.compute.get("/servers/detail", params={"tags": tag, "limit": 10})
        body = response.json()
        assert len(body["servers"]) == PAGE
        links = [link["href"] for link in body.get("servers_links", []) if link["rel"] == "next"]
        assert len(links) == 1
        assert links[0].startswith(f"{nova.base_url}/compute/v2.1/servers/detail?")
        seen = [s["id"] for s in body["servers"]]
        second = conn.compute.get(links[0]).json()
        seen += [s["id"] for s in second["servers"]]
        assert sorted(seen) == sorted(s.id for s in servers)
        # openstacksdk's paginator with limit=3 sees the same five.
        paged = list(conn.compute.servers(tags=tag, limit=PAGE))
        assert sorted(s.id for s in paged) == sorted(s.id for s in servers)
    finally:
        purge(conn, tag)


def test_admin_cloud_sees_both_compute_hosts(nova):
    admin = connect(nova, ADMIN_CLOUD)
    try:
        hypervisors = admin.compute.get("/os-hypervisors").json()["hypervisors"]  # admin only
        assert len(hypervisors) == 2
    finally:
        admin.close()


# -- osas's own adapter ---------------------------------------------------------------------------


async def wait_async(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.2)


@pytest.fixture
async def osas_cloud(nova, sdk_env):
    from osas.cloud.openstack import OpenStackCloud  # noqa: PLC0415
    from osas.cloud.openstack_settings import OpenStackSettings  # noqa: PLC0415

    cloud = OpenStackCloud(OpenStackSettings(cloud=CLOUD, attempts=2, backoff=0.1))
    yield cloud
    await cloud.close()


def osas_request(tag: str, name: str, flavor: str = "m1.small") -> Any:
    from osas.cloud.port import CreateServerRequest  # noqa: PLC0415

    return CreateServerRequest(
        name=name,
        flavor=flavor,
        image=IMAGE_NAME,
        networks=[NETWORK_NAME],
        metadata={"osas-node-group": "workers"},
        tags=[tag],
        user_data="#cloud-config\n{}\n",
    )


async def test_osas_adapter_lifecycle(nova, osas_cloud):
    cloud = osas_cloud
    described = await cloud.verify()
    assert described.startswith("compute 2.")
    assert nova.base_url in described
    flavor = await cloud.get_flavor("m1.small")
    assert flavor is not None
    assert (flavor.vcpus, flavor.ram_mib) == (1, 2048)

    tag = unique_tag()
    assert (await cloud.list_servers(tag)).records == []
    records = [await cloud.create_server(osas_request(tag, f"osas-node-{i}")) for i in range(4)]
    assert all(r.status == "BUILD" for r in records)
    ids = {r.server_id for r in records}

    async def all_active() -> Any:
        listed = (await cloud.list_servers(tag)).records  # 4 servers: 2 pages at max_limit 3
        return listed if {s.server_id for s in listed if s.status == "ACTIVE"} == ids else None

    listed = await wait_async(all_active, "four ACTIVE servers")
    assert len(listed) == 4
    assert all(s.tags == frozenset({tag}) for s in listed)
    assert all(s.metadata == {"osas-node-group": "workers"} for s in listed)

    one = await cloud.get_server(records[0].server_id)
    assert one is not None
    assert one.status == "ACTIVE"
    assert one.tags == frozenset({tag})

    for record in records:
        await cloud.delete_server(record.server_id)
    await cloud.delete_server(records[0].server_id)  # already going: still success

    async def all_gone() -> bool:
        return all([await cloud.get_server(r.server_id) is None for r in records])

    await wait_async(all_gone, "the deletes")
    assert (await cloud.list_servers(tag)).records == []


async def test_osas_adapter_no_valid_host_and_error_state(nova, osas_cloud):
    cloud = osas_cloud
    tag = unique_tag()
    # g1.xlarge asks Placement for a VGPU no fake compute has.
    record = await cloud.create_server(osas_request(tag, "osas-gpu", flavor="g1.xlarge"))

    async def errored() -> Any:
        server = await cloud.get_server(record.server_id)
        return server if server is not None and server.status == "ERROR" else None

    server = await wait_async(errored, "NoValidHost")
    assert server.fault is not None
    assert server.fault.code == 500
    assert "No valid host was found" in server.fault.message

    healthy = await cloud.create_server(osas_request(tag, "osas-reset"))

    async def is_active() -> Any:
        found = await cloud.get_server(healthy.server_id)
        return found if found is not None and found.status == "ACTIVE" else None

    await wait_async(is_active, "ACTIVE")
    nova.reset_state(healthy.server_id, "error")
    reset = await cloud.get_server(healthy.server_id)
    assert reset is not None
    assert reset.status == "ERROR"
    for server_id in (record.server_id, healthy.server_id):
        await cloud.delete_server(server_id)


async def test_osas_adapter_quota_refusal(nova, sdk_env):
    from osas.cloud.errors import QuotaExceeded  # noqa: PLC0415
    from osas.cloud.openstack import OpenStackCloud  # noqa: PLC0415
    from osas.cloud.openstack_settings import OpenStackSettings  # noqa: PLC0415

    project = nova.add_project("osasquota")
    nova.set_quota(project["project_id"], cores=1)
    cloud = OpenStackCloud(OpenStackSettings(cloud=project["cloud"], attempts=2, backoff=0.1))
    tag = unique_tag()
    try:
        first = await cloud.create_server(osas_request(tag, "osas-quota-1"))

        async def counted() -> Any:
            found = await cloud.get_server(first.server_id)
            return found if found is not None and found.status == "ACTIVE" else None

        await wait_async(counted, "the first server ACTIVE")  # see test_quota_refused_with_403
        with pytest.raises(QuotaExceeded):
            await cloud.create_server(osas_request(tag, "osas-quota-2"))
        await cloud.delete_server(first.server_id)
    finally:
        await cloud.close()


async def test_osas_adapter_reads_the_projects_quota(nova, sdk_env):
    """Real Nova's /limits at the negotiated microversion: limits and usage of instances,
    cores and RAM, and the server group member quota with the group's members."""
    from osas.cloud.openstack import OpenStackCloud  # noqa: PLC0415
    from osas.cloud.openstack_settings import OpenStackSettings  # noqa: PLC0415
    from osas.cloud.port import CreateServerRequest  # noqa: PLC0415
    from osas.domain.quota import Allowance  # noqa: PLC0415

    project = nova.add_project("osaslimits")
    nova.set_quota(project["project_id"], instances=5, cores=6, ram=8192, server_group_members=3)
    conn = openstack.connect(cloud=project["cloud"])
    group = conn.compute.create_server_group(name="osas-grp", policy="soft-anti-affinity")
    cloud = OpenStackCloud(OpenStackSettings(cloud=project["cloud"], attempts=2, backoff=0.1))
    try:
        before = await cloud.get_quota(["osas-grp"])
        # This lane's Neutron is Nova's own test fixture, which has no quota API: the port
        # quota is left unread (and bounds nothing), as on a cloud whose policy refuses it.
        assert set(before.unread) == {"ports"}
        assert dataclasses.replace(before, unread={}) == limits_of((0, 0, 0), 0)
        request = CreateServerRequest(
            name="osas-limits-1",
            flavor="m1.small",
            image=IMAGE_NAME,
            networks=[NETWORK_NAME],
            metadata={},
            tags=[unique_tag()],
            server_group="osas-grp",
        )
        server = await cloud.create_server(request)

        # The group lists its member at once; /limits counts the server only once it is
        # scheduled (Nova counts instances in its cell databases, not build requests).
        first = await cloud.get_quota(["osas-grp", "no-such-group"])
        assert first.server_group_members == {"osas-grp": Allowance(3, 1)}
        assert first.instances.used in {0, 1}

        async def counted() -> Any:
            quota = await cloud.get_quota(["osas-grp"])
            return quota if quota.instances.used == 1 else None

        quota = await wait_async(counted, "the server counted in /limits")
        assert dataclasses.replace(quota, unread={}) == limits_of((1, 1, 2048), 1)
        assert quota.server_group_members == {"osas-grp": Allowance(3, 1)}
        await cloud.delete_server(server.server_id)
    finally:
        conn.compute.delete_server_group(group)
        await cloud.close()


def limits_of(used: tuple[int, int, int], members: int) -> Any:
    """The quota the test sets (5 instances, 6 cores, 8 GiB, 3 members), with what is used."""
    from osas.domain.quota import Allowance, ProjectQuota  # noqa: PLC0415

    return ProjectQuota(
        Allowance(5, used[0]),
        Allowance(6, used[1]),
        Allowance(8192, used[2]),
        {"osas-grp": Allowance(3, members)},
    )
