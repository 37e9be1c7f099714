"""OpenStackCloud, unmodified openstacksdk, over real HTTP to the simulated OpenStack."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import keystoneauth1.exceptions as ks_exceptions
import openstack.exceptions as sdk_exceptions
import pytest
from keystoneauth1 import session as ks_session
from support import (
    CLUSTER,
    Provider,
    eventually,
    make_config,
    nodes,
    os_environment,
    provider_id,
    seed_ours,
    settings_for,
)

from osas.cloud.errors import (
    CloudConfigurationError,
    CloudUnavailable,
    CreateInDoubt,
    CreateNotSent,
    CredentialsRefused,
    QuotaExceeded,
    RequestRejected,
)
from osas.cloud.openstack import OpenStackCloud, _create_failure, _records_of_page, _translate
from osas.cloud.openstack_settings import OpenStackAuth, OpenStackSettings
from osas.cloud.port import CreateServerRequest
from osas.domain.ledger import DeleteOutcome
from osas.domain.limits import NodeInfo
from osas.domain.servers import (
    META_CLUSTER,
    META_GROUP,
    TAG_CLUSTER_PREFIX,
    ErrorClass,
    Fault,
    OwnershipMarks,
)
from osas.domain.specs import BootVolume
from osas.engine.deletes import ServerDeleter
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

TAG = f"{TAG_CLUSTER_PREFIX}{CLUSTER}"
MARKS = OwnershipMarks(CLUSTER)


@pytest.fixture
def sim():
    with SimulatedOpenStack(FakeNova()) as simulated:
        yield simulated


@pytest.fixture
async def cloud(sim):
    adapter = OpenStackCloud(settings_for(sim))
    yield adapter
    await adapter.close()


def request(name: str = "n1", **overrides) -> CreateServerRequest:
    request_id = uuid.uuid4().hex
    values = {
        "name": name,
        "flavor": "m1.small",
        "image": "ubuntu-24.04",
        "networks": ["cluster-net"],
        "metadata": MARKS.metadata("workers", request_id),
        "tags": MARKS.tags(request_id),
    }
    values.update(overrides)
    return CreateServerRequest(**values)


async def test_verify_negotiates_a_microversion_with_tags(cloud):
    described = await cloud.verify()
    assert "compute 2." in described


async def test_listing_filters_by_tag_across_pages(sim, cloud):
    ours = set(seed_ours(sim.nova, 2500))
    for index in range(30):
        sim.nova.seed(name=f"{CLUSTER}-workers-{index}")  # look-alike, untagged
    sim.calls.clear()
    listed = (await cloud.list_servers(TAG)).records
    assert [r.server_id for r in listed if r.server_id in ours] == [r.server_id for r in listed]
    assert {r.server_id for r in listed} == ours
    assert len(listed) == 2500
    assert sim.calls["compute.servers.list"] == 3  # pages of at most 1000


async def test_a_listing_carries_novas_clock_from_its_date_header(sim, cloud):
    """changes-since is compared with Nova's updated_at: the listing says what time it is by
    Nova's clock (the Date of its first answer), however far osas's clock is from it."""
    seed_ours(sim.nova, 3)
    sim.nova.clock_offset = -180.0  # Nova three minutes behind
    before = datetime.now(UTC)
    listing = await cloud.list_servers(TAG)
    after = datetime.now(UTC)
    assert listing.nova_time is not None
    behind = timedelta(seconds=180)
    # Whole seconds: the Date header has no fraction.
    assert before - behind - timedelta(seconds=1) <= listing.nova_time <= after - behind
    assert all(record.updated for record in listing.records)
    changes = await cloud.list_changes(listing.nova_time - timedelta(seconds=1))
    assert changes.nova_time is not None
    assert changes.nova_time >= listing.nova_time


async def test_create_carries_everything_nova_needs(sim, cloud):
    record = await cloud.create_server(
        request(
            user_data="#cloud-config\nhostname: n1\n",
            key_name="ops",
            security_groups=["default"],
            availability_zone="nova",
            server_group="workers-anti-affinity",
            boot_volume=BootVolume(40, None),
        )
    )
    server = sim.nova.get_server(record.server_id)
    assert server is not None
    assert MARKS.claim(record) is not None
    assert server.metadata[META_CLUSTER] == CLUSTER
    assert TAG in server.tags
    assert base64.b64decode(server.user_data or "").decode() == "#cloud-config\nhostname: n1\n"
    assert server.key_name == "ops"
    assert server.boot_volume_gib == 40
    assert server.server_group is not None
    assert server.networks


async def test_delete_of_a_missing_server_is_success(sim, cloud):
    [server_id] = seed_ours(sim.nova, 1)
    await cloud.delete_server(server_id)
    await cloud.delete_server(server_id)
    await cloud.delete_server(str(uuid.uuid4()))
    assert await cloud.get_server(server_id) is None


async def test_a_delete_goes_only_for_a_server_read_as_the_groups_right_before(sim, cloud):
    """The workers' delete through the real adapter: the read and the DELETE in one call, and
    no DELETE for a server that lost a mark, is in another group, or is gone."""
    nova = sim.nova
    kept, deleted, other_group = seed_ours(nova, 2) + seed_ours(nova, 1, group="big")
    del nova.get_server(kept).metadata[META_CLUSTER]  # by hand, no updated_at bumped
    deleter = ServerDeleter(cloud, MARKS, may_write=lambda: True)
    assert await deleter.delete_one(kept, "workers") is DeleteOutcome.NOT_OURS
    assert await deleter.delete_one(other_group, "workers") is DeleteOutcome.NOT_OURS
    assert await deleter.delete_one(deleted, "workers") is DeleteOutcome.SENT
    assert await deleter.delete_one(str(uuid.uuid4()), "workers") is DeleteOutcome.GONE
    # Not the writer any more: read, and never sent.
    standing_by = ServerDeleter(cloud, MARKS, may_write=lambda: False)
    assert await standing_by.delete_one(other_group, "big") is DeleteOutcome.FAILED
    assert [(a.server_id, a.read_metadata) for a in nova.deletes_asked] == [
        (deleted, {META_CLUSTER: CLUSTER, META_GROUP: "workers"})
    ]
    assert nova.get_server(kept) is not None
    assert nova.get_server(other_group) is not None


async def test_error_shapes_map_to_their_classes(sim, cloud):
    sim.nova.faults.quota_exceeded = 1
    with pytest.raises(QuotaExceeded) as quota:
        await cloud.create_server(request())
    assert quota.value.error_info().error_class is ErrorClass.OUT_OF_RESOURCES
    assert "Quota exceeded" in quota.value.error_info().message

    with pytest.raises(RequestRejected) as rejected:
        await cloud.create_server(request(flavor="no-such-flavor"))
    assert rejected.value.error_info().error_class is ErrorClass.OTHER

    sim.nova.faults.error_rate = 1.0
    with pytest.raises(CloudUnavailable):
        await cloud.list_servers(TAG)
    sim.nova.faults.error_rate = 0.0

    sim.nova.faults.no_valid_host = 1
    record = await cloud.create_server(request())
    await asyncio.sleep(0)
    listed = await cloud.get_server(record.server_id)
    assert listed is not None
    assert listed.status == "ERROR"
    assert listed.fault is not None
    assert "No valid host" in listed.fault.message


async def test_pinned_low_microversion_is_refused(sim, tmp_path, monkeypatch):
    # Through the OS_* variables: an auth block in osas's configuration ignores them.
    for name, value in os_environment(sim, OS_COMPUTE_API_VERSION="2.1").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OS_CLOUD", raising=False)
    adapter = OpenStackCloud(OpenStackSettings(backoff=0.01, backoff_max=0.05))
    try:
        with pytest.raises(CloudConfigurationError, match=r"pinned to 2\.1"):
            await adapter.verify()
    finally:
        await adapter.close()


async def test_nova_without_tag_support_is_refused():
    with SimulatedOpenStack(FakeNova(), max_microversion="2.25") as old:
        adapter = OpenStackCloud(settings_for(old))
        try:
            with pytest.raises(CloudConfigurationError, match=r"at least 2\.52"):
                await adapter.verify()
        finally:
            await adapter.close()


async def test_wrong_password_is_a_configuration_error(sim):
    settings = settings_for(sim)
    assert settings.auth is not None
    wrong = OpenStackAuth(**{**settings.auth.as_sdk_auth(), "password": "not-the-password"})
    adapter = OpenStackCloud(settings_for(sim, auth=wrong, attempts=1))
    try:
        with pytest.raises(CloudConfigurationError) as refused:
            await adapter.verify()
        assert "not-the-password" not in str(refused.value)
    finally:
        await adapter.close()


async def test_incremental_sync_sees_creates_updates_and_deletions(sim, tmp_path):
    config = make_config(tmp_path)
    [kept, doomed] = seed_ours(sim.nova, 2)
    provider = Provider(config, OpenStackCloud(settings_for(sim)))
    await provider.start()
    try:
        app = provider.app
        await app.controller.group_to_change("workers").increase_size(1)
        await eventually(lambda: len(sim.nova.live_servers()) == 3, what="server created")
        await provider.sync(full=False)
        created = next(s for s in sim.nova.live_servers() if s.server_id not in {kept, doomed})
        assert app.inventory.server(created.server_id) is not None
        sim.nova.activate(created.server_id)
        await provider.sync(full=False)
        assert app.inventory.server(created.server_id).status == "ACTIVE"
        await app.controller.group_to_change("workers").delete_nodes(
            nodes([("n", provider_id(doomed))])
        )
        await eventually(lambda: sim.nova.get_server(doomed) is None, what="deleted in Nova")
        sim.calls.clear()
        await provider.sync(full=False)
        assert app.inventory.server(doomed) is None
        assert app.controller.group("workers").target_size() == 2
        # One incremental listing, untagged: it shows the server DELETED. No look-up.
        assert sim.calls["compute.servers.list"] == 1
        assert sim.calls["compute.servers.get"] == 0
    finally:
        await provider.stop()


async def test_foreign_servers_are_never_listed_reported_or_deleted(sim, tmp_path):
    nova = sim.nova
    foreign = [
        nova.seed(name=f"{CLUSTER}-workers-a"),
        nova.seed(name=f"{CLUSTER}-workers-b", tags=[TAG]),
        nova.seed(name=f"{CLUSTER}-workers-c", metadata={META_CLUSTER: CLUSTER}, tags=[TAG]),
        nova.seed(
            name=f"{CLUSTER}-workers-d", metadata={META_CLUSTER: CLUSTER, META_GROUP: "workers"}
        ),
        nova.seed(
            name=f"{CLUSTER}-workers-e",
            metadata={META_CLUSTER: "other", META_GROUP: "workers"},
            tags=[TAG],
        ),
    ]
    [ours] = seed_ours(nova, 1)
    provider = Provider(make_config(tmp_path), OpenStackCloud(settings_for(sim)))
    await provider.start()
    try:
        controller = provider.app.controller
        assert [i.instance_id for i in controller.group("workers").nodes()] == [provider_id(ours)]
        for server in foreign:
            assert controller.node_answer(NodeInfo(server.name, "")) is None
            assert controller.node_answer(NodeInfo("n", provider_id(server.server_id))) is None
    finally:
        await provider.stop()
    assert all(nova.get_server(s.server_id) is not None for s in foreign)
    assert sim.calls["compute.servers.delete"] == 0


async def test_application_credentials_and_plain_os_variables(sim, monkeypatch):
    entry = sim.clouds_yaml_entry(application_credential=True)
    auth = OpenStackAuth(**entry["auth"])
    assert auth.auth_type == "v3applicationcredential"
    adapter = OpenStackCloud(settings_for(sim, auth=auth))
    try:
        assert "compute 2." in await adapter.verify()
    finally:
        await adapter.close()

    # Neither a cloud nor an auth block: OS_* variables, as every OpenStack tool reads them.
    for name, value in os_environment(sim, OS_REGION_NAME="RegionOne").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OS_CLOUD", raising=False)
    adapter = OpenStackCloud(OpenStackSettings())
    try:
        assert "compute 2." in await adapter.verify()
    finally:
        await adapter.close()


async def test_clouds_yaml_named_by_os_cloud(sim, tmp_path, monkeypatch):
    clouds = tmp_path / "clouds.yaml"
    sim.write_clouds_yaml(clouds, "osas-sim")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
    monkeypatch.setenv("OS_CLOUD", "osas-sim")
    adapter = OpenStackCloud(OpenStackSettings())
    try:
        assert "compute 2." in await adapter.verify()
        assert await adapter.get_flavor("m1.small") is not None
    finally:
        await adapter.close()


@pytest.mark.parametrize(
    ("status", "message", "error"),
    [
        (
            403,
            "Quota exceeded for cores: Requested 8, but already used 16 of 20 cores",
            QuotaExceeded,
        ),
        (413, "Quota exceeded for instances", QuotaExceeded),
        (403, "Maximum number of ports exceeded", QuotaExceeded),
        (403, "Quota exceeded, too many servers in group", QuotaExceeded),
        (403, "Policy does not allow os_compute_api:servers:create", RequestRejected),
        (400, "Invalid flavorRef provided.", RequestRejected),
        (500, "Unexpected API Error", CloudUnavailable),
        (503, "Service Unavailable", CloudUnavailable),
        (401, "The request you have made requires authentication.", CredentialsRefused),
    ],
)
def test_http_errors_translate_by_status_and_message(status, message, error):
    exc = sdk_exceptions.HttpException(message=message, details=message, http_status=status)
    translated = _translate(exc, ())
    assert type(translated) is error
    expected_class = ErrorClass.OUT_OF_RESOURCES if error is QuotaExceeded else ErrorClass.OTHER
    assert translated.error_info().error_class is expected_class


def test_translated_errors_never_carry_secrets():
    exc = sdk_exceptions.HttpException(
        message="bad request for password hunter2", details="hunter2 again", http_status=400
    )
    assert "hunter2" not in str(_translate(exc, ("hunter2",)))


# -- a create is sent once: its failures told apart ---------------------------------------------


@contextlib.contextmanager
def peer(behaviour: str) -> Iterator[int]:
    """A TCP peer on 127.0.0.1 that misbehaves as Nova's front end sometimes does, on a port of
    its own: "refuse" (nothing listens), "drop" (reads the request, closes without a word),
    "silent" (reads the request, never answers)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if behaviour == "refuse":
        listener.close()
        yield port
        return
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            if behaviour == "silent":
                stop.wait(5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        listener.close()
        thread.join(5)


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [("refuse", CreateNotSent), ("drop", CreateInDoubt), ("silent", CreateInDoubt)],
)
def test_transport_failures_of_a_create_are_told_apart(behaviour, expected):
    """Only a connection that could not be made proves the POST never left; a dropped
    connection or a timeout after sending may hide a server."""
    session = ks_session.Session()
    with peer(behaviour) as port, pytest.raises(ks_exceptions.ClientException) as caught:
        session.post(
            f"http://127.0.0.1:{port}/compute/v2.1/servers",
            json={"server": {}},
            timeout=0.5,
            connect_retries=0,
            authenticated=False,
        )
    assert type(_create_failure(caught.value, ())) is expected


@pytest.mark.parametrize(
    ("scheme", "behaviour", "what"),
    [
        ("http", "refuse", "connection refused: nothing listens at that address and port"),
        ("http", "drop", "the connection closed before an answer"),
        ("http", "silent", "it accepted the connection but sent no answer in time"),
        (
            "https",
            "drop",
            "the TLS handshake failed (a certificate osas does not trust: openstack.cacert)",
        ),
    ],
)
def test_transport_failures_are_said_in_osas_words(scheme, behaviour, what):
    """What is wrong and what to check, instead of urllib3's pool and socket errors nested
    four deep; the same words for a create, whatever it means for the ledger."""
    session = ks_session.Session()
    with peer(behaviour) as port:
        url = f"{scheme}://127.0.0.1:{port}/compute/v2.1/servers"
        with pytest.raises(ks_exceptions.ClientException) as caught:
            session.get(f"{url}?changes-since=now", timeout=0.5, authenticated=False)
    expected = (
        f"cannot reach {url}: {what}; check the address (auth_url, or the endpoint Keystone's "
        "catalog gives for the service) and that osas can reach it"
    )
    error = _translate(caught.value, ())
    assert (type(error), str(error)) == (CloudUnavailable, expected)
    assert str(_create_failure(caught.value, ())) == expected
    assert "HTTPConnectionPool" not in expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (403, QuotaExceeded),
        (400, RequestRejected),
        (404, RequestRejected),
        (500, CreateInDoubt),
        (502, CreateInDoubt),
        (503, CreateInDoubt),
        (504, CreateInDoubt),
    ],
)
def test_http_answers_to_a_create(status, expected):
    """A 4xx is a definite refusal; a 5xx may come after Nova stored the server."""
    message = "Quota exceeded for instances" if status == 403 else "something"
    exc = sdk_exceptions.HttpException(message=message, details=message, http_status=status)
    assert type(_create_failure(exc, ())) is expected


async def test_a_create_whose_names_cannot_be_looked_up_was_never_sent(sim, cloud):
    sim.nova.faults.error_rate = 1.0  # every call fails, the look-ups first
    with pytest.raises(CreateNotSent):
        await cloud.create_server(request())
    sim.nova.faults.error_rate = 0.0
    assert sim.calls["compute.servers.create"] == 0


def test_a_listing_page_with_unexpected_types_is_read_the_lenient_way():
    """Pages are decoded straight into the fields osas reads; a page whose fields do not have
    the types Nova documents (a proxy's rewrite, a future microversion) is still read."""
    server = {
        "id": "a",
        "name": "n",
        "status": "active",
        "metadata": {"osas-cluster": "c"},
        "tags": ["t"],
        "OS-EXT-STS:task_state": None,
        "fault": {"code": 500, "message": "m"},
        "created": "2026-11-27T00:00:00Z",
        "updated": "2026-11-27T00:00:01Z",
        "flavor": {"vcpus": 1},
    }
    link = {"rel": "next", "href": "http://nova/servers/detail?marker=a"}
    typed = json.dumps({"servers": [server], "servers_links": [link]}).encode()
    odd = json.dumps({"servers": [{**server, "metadata": {"count": 3}}]}).encode()
    (record,), following = _records_of_page(typed)
    assert following == link["href"]
    assert (record.status, record.fault, record.updated) == (
        "ACTIVE",
        Fault(500, "m"),
        "2026-11-27T00:00:01Z",
    )
    assert record.metadata == {"osas-cluster": "c"}
    (lenient,), nothing = _records_of_page(odd)
    assert (lenient.server_id, nothing) == ("a", None)
