"""The simulated OpenStack, driven by unmodified openstacksdk over real HTTP on 127.0.0.1.

These tests pin what osas's OpenStack adapter relies on: Keystone discovery and the catalog,
microversion negotiation (and the trap of a pinned 2.1 that silently drops tag filters),
creates with everything a node needs, Nova's pagination and changes-since semantics, Nova's
error shapes as openstacksdk raises them, and the control API other processes use.
"""

from __future__ import annotations

import base64
import email.utils
import json
import stat
import threading
import time
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import keystoneauth1.exceptions
import openstack
import openstack.config
import openstack.connection
import openstack.exceptions
import pytest
import yaml
from fake_cloud import FakeCloud
from openstack.warnings import RemovedInSDK60Warning
from support import sdk_connection

from osas.cloud.errors import CreateInDoubt, QuotaExceeded
from osas.cloud.port import CreateServerRequest
from osas.sim import (
    APP_CREDENTIAL_ID,
    APP_CREDENTIAL_SECRET,
    SimulatedOpenStack,
    run_sim,
)
from osas.sim.model import FakeNova
from osas.sim.routing import timestamp

TAG = "osas-cluster=prod"

# openstacksdk 4.22 warns on its own internals in plain use: about InfluxDB on every connect
# (its loader hands CloudRegion a dict of None values, which reads as configured), about
# Resource._compute_attributes on every resource it builds, and about the service_type it passes
# itself when naming requests for logs. Only those three are silenced; a deprecation in how
# these tests call the SDK still fails them.
SDK_OWN_WARNINGS = [
    pytest.mark.filterwarnings(
        "ignore:Support for InfluxDB:openstack.warnings.RemovedInSDK60Warning"
    ),
    pytest.mark.filterwarnings(
        "ignore:The _compute_attributes method:openstack.warnings.RemovedInSDK50Warning"
    ),
    pytest.mark.filterwarnings(
        "ignore:The 'service_type' parameter is unnecesary:openstack.warnings.RemovedInSDK50Warning"
    ),
]
pytestmark = SDK_OWN_WARNINGS


@pytest.fixture
def sim():
    with SimulatedOpenStack(FakeNova(build_seconds=0.0)) as simulated:
        yield simulated


def find_image(conn, name: str):
    # Image.find calls the base find with ignore_missing=True whatever it is given, and so
    # raises the SDK's own "ignore_missing is deprecated" warning; only that call is excused.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The ignore_missing parameter", RemovedInSDK60Warning)
        return conn.image.find_image(name, ignore_missing=False)


def boot_args(conn, name: str = "n1", **extra) -> dict:
    network = conn.network.find_network("cluster-net", ignore_missing=False)
    return {
        "name": name,
        "flavor_id": conn.compute.find_flavor("m1.small", ignore_missing=False).id,
        "image_id": find_image(conn, "ubuntu-24.04").id,
        "networks": [{"uuid": network.id}],
        **extra,
    }


def control(sim: SimulatedOpenStack, method: str, path: str, body=None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
        f"{sim.base_url}{path}", data=data, method=method
    )
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read() or b"{}")


# -- Keystone ---------------------------------------------------------------------------------


def test_password_token_and_catalog_discovery(sim, conn):
    access = conn.session.auth.get_access(conn.session)
    assert access.project_name == "k8s"
    assert access.user_domain_name == "Default"
    assert {"member", "reader"} <= set(access.role_names)
    assert conn.compute.get_endpoint() == f"{sim.base_url}/compute/v2.1"
    for service, path in (
        ("compute", "/compute/v2.1"),
        ("image", "/image"),
        ("network", "/network"),
        ("block-storage", f"/volume/v3/{sim.project_id}"),
        ("volumev3", f"/volume/v3/{sim.project_id}"),
    ):
        for interface in ("public", "internal", "admin"):
            url = access.service_catalog.url_for(
                service_type=service, interface=interface, region_name="RegionOne"
            )
            assert url == f"{sim.base_url}{path}"
    assert sim.calls["identity.tokens.create"] == 1


def test_application_credential_is_scoped_by_itself(sim):
    app = openstack.connect(
        auth_type="v3applicationcredential",
        auth_url=sim.auth_url,
        application_credential_id=APP_CREDENTIAL_ID,
        application_credential_secret=APP_CREDENTIAL_SECRET,
        region_name="RegionOne",
    )
    try:
        sim.nova.seed(name="seen", tags=[TAG])
        assert [s.name for s in app.compute.servers(details=True, tags=TAG)] == ["seen"]
        assert app.session.auth.get_access(app.session).project_name == "k8s"
    finally:
        app.close()


def test_wrong_credentials_get_401(sim):
    bad = sdk_connection(sim, password="not-the-password")
    try:
        # authorize() turns keystoneauth's Unauthorized into an SDKException with its text.
        with pytest.raises(openstack.exceptions.SDKException, match=r"HTTP 401"):
            bad.authorize()
        with pytest.raises(keystoneauth1.exceptions.Unauthorized) as refused:
            bad.session.get_token()
        assert refused.value.http_status == 401
    finally:
        bad.close()
    wrong_secret = openstack.connect(
        auth_type="v3applicationcredential",
        auth_url=sim.auth_url,
        application_credential_id=APP_CREDENTIAL_ID,
        application_credential_secret="nope",
        region_name="RegionOne",
    )
    try:
        with pytest.raises(openstack.exceptions.SDKException, match="HTTP 401"):
            wrong_secret.authorize()
    finally:
        wrong_secret.close()


def test_every_api_call_needs_a_token(sim):
    for path in ("/compute/v2.1/servers", "/image/v2/images", "/network/v2.0/networks"):
        status, body = control(sim, "GET", path)
        assert status == 401
        assert body["error"]["title"] == "Unauthorized"


def test_a_revocation_refuses_tokens_issued_within_its_second_as_keystone_does(sim):
    """Keystone compares issue times in whole seconds: after a revocation, a token issued in
    the same second is refused too; one issued in a later second is good."""

    def issue() -> str:
        body = {
            "auth": {
                "identity": {
                    "methods": ["application_credential"],
                    "application_credential": {
                        "id": APP_CREDENTIAL_ID,
                        "secret": APP_CREDENTIAL_SECRET,
                    },
                }
            }
        }
        request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
            f"{sim.base_url}/identity/v3/auth/tokens", data=json.dumps(body).encode()
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            assert response.status == 201
            return str(response.headers["X-Subject-Token"])

    old = issue()
    # Revoke early in a second, so that the next token is issued within it.
    time.sleep(1.0 - datetime.now(UTC).microsecond / 1e6 + 0.05)
    sim.identity.revoke_all()
    same_second = issue()
    assert sim.identity.token(old) is None
    assert sim.identity.token(same_second) is None
    time.sleep(1.0 - datetime.now(UTC).microsecond / 1e6 + 0.05)
    assert sim.identity.token(issue()) is not None


# -- Nova microversions -----------------------------------------------------------------------


def test_sdk_negotiates_a_microversion_with_tags(sim, conn):
    endpoint = conn.compute.get_endpoint_data()
    assert endpoint.min_microversion == (2, 1)
    assert endpoint.max_microversion == (2, 100)
    negotiated = openstack.utils.maximum_supported_microversion(conn.compute, "2.100")
    assert negotiated == "2.100"
    response = conn.compute.get("/servers", microversion="2.60")
    assert response.headers["OpenStack-API-Version"] == "compute 2.60"
    assert response.headers["X-OpenStack-Nova-API-Version"] == "2.60"
    assert "OpenStack-API-Version" in response.headers["Vary"]
    # No header at all is Nova's minimum, not its maximum.
    assert conn.compute.get("/servers").headers["X-OpenStack-Nova-API-Version"] == "2.1"
    too_new = conn.compute.get("/servers", microversion="2.101")
    assert too_new.status_code == 406


def test_pinned_low_microversion_silently_ignores_tag_filters(sim):
    ours = sim.nova.seed(name="ours", tags=[TAG])
    foreign = sim.nova.seed(name="foreign")
    pinned = sdk_connection(sim, compute_api_version="2.1")
    try:
        assert pinned.compute.default_microversion == "2.1"
        listed = {s.id for s in pinned.compute.servers(details=True, tags=TAG)}
        # The trap: Nova drops the filter it does not know at 2.1 and answers every server.
        assert listed == {ours.server_id, foreign.server_id}
        # At 2.1 server bodies carry no tags at all, so nothing can be checked client-side.
        raw = pinned.compute.get("/servers/detail").json()["servers"]
        assert all("tags" not in server for server in raw)
    finally:
        pinned.close()
    current = sdk_connection(sim)
    try:
        assert [s.id for s in current.compute.servers(details=True, tags=TAG)] == [ours.server_id]
    finally:
        current.close()


def test_tags_on_create_need_2_52(sim, conn):
    network = conn.network.find_network("cluster-net", ignore_missing=False)
    body = {
        "server": {
            "name": "old",
            "flavorRef": "f-small",
            "imageRef": find_image(conn, "ubuntu-24.04").id,
            "networks": [{"uuid": network.id}],
            "tags": [TAG],
        }
    }
    refused = conn.compute.post("/servers", json=body, microversion="2.51")
    assert refused.status_code == 400
    assert (
        "Additional properties are not allowed ('tags' was unexpected)"
        in (refused.json()["badRequest"]["message"])
    )
    accepted = conn.compute.post("/servers", json=body, microversion="2.52")
    assert accepted.status_code == 202
    assert sim.nova.get_server(accepted.json()["server"]["id"]).tags == {TAG}


# -- servers ----------------------------------------------------------------------------------


def test_create_get_list_delete_with_everything_a_node_needs(sim, conn):
    group = conn.compute.find_server_group("workers-anti-affinity", ignore_missing=False)
    image = find_image(conn, "ubuntu-24.04")
    user_data = base64.b64encode(b"#cloud-config\nhostname: n1\n").decode()
    created = conn.compute.create_server(
        **boot_args(conn),
        metadata={"osas-cluster": "prod", "osas-node-group": "workers"},
        tags=[TAG, "osas-request=r1"],
        user_data=user_data,
        key_name="ops",
        security_groups=[{"name": "default"}],
        availability_zone="nova",
        scheduler_hints={"group": group.id},
        config_drive=True,
        block_device_mapping=[
            {
                "boot_index": 0,
                "uuid": image.id,
                "source_type": "image",
                "destination_type": "volume",
                "volume_size": 40,
                "delete_on_termination": True,
            }
        ],
    )
    assert created.admin_password
    model = sim.nova.get_server(created.id)
    assert model.user_data == user_data
    assert model.boot_volume_gib == 40
    assert model.server_group == group.id
    assert model.key_name == "ops"

    server = conn.compute.get_server(created.id)
    assert server.status == "ACTIVE"
    assert server.metadata == {"osas-cluster": "prod", "osas-node-group": "workers"}
    assert sorted(server.tags) == sorted([TAG, "osas-request=r1"])
    assert server.flavor.original_name == "m1.small"
    assert server.flavor.vcpus == 1
    assert not server.image  # booted from volume: Nova shows "" for the image
    assert server.attached_volumes
    assert "cluster-net" in server.addresses
    assert server.key_name == "ops"
    assert server.availability_zone == "nova"
    assert server.security_groups == [{"name": "default"}]
    assert server.task_state is None
    assert server.vm_state == "active"
    assert server.power_state == 1
    assert server.fault is None
    assert conn.compute.get_server(created.id).server_groups == [group.id]
    assert created.id in conn.compute.get_server_group(group.id).member_ids

    assert [s.id for s in conn.compute.servers(details=True, tags=TAG)] == [created.id]
    assert [s.name for s in conn.compute.servers(details=False, name="^n")] == ["n1"]
    conn.compute.delete_server(created.id)
    with pytest.raises(openstack.exceptions.NotFoundException):
        conn.compute.get_server(created.id)
    assert list(conn.compute.servers(details=True, tags=TAG)) == []
    with pytest.raises(openstack.exceptions.NotFoundException):
        conn.compute.delete_server(created.id, ignore_missing=False)


def test_every_delete_is_kept_with_what_the_read_before_it_showed(sim, conn):
    """What the fault schedules' "deleted only when read as ours" rests on: each DELETE the
    API takes is recorded with the marks the last GET of that server showed (None unread),
    however they changed since."""
    nova = sim.nova
    read_first = nova.seed(name="a", metadata={"osas-cluster": "c"}, tags=["t"])
    unread = nova.seed(name="b", metadata={"osas-cluster": "c"})
    conn.compute.get_server(read_first.server_id)
    nova.delete_metadata_key(read_first.server_id, "osas-cluster")  # after the read
    conn.compute.delete_server(read_first.server_id)
    conn.compute.delete_server(unread.server_id)
    nova.delete_server(nova.seed(name="c").server_id)  # by hand: not the API's
    asked = {a.server_id: (a.read_metadata, a.read_tags) for a in nova.deletes_asked}
    assert asked == {
        read_first.server_id: ({"osas-cluster": "c"}, frozenset({"t"})),
        unread.server_id: (None, None),
    }


def test_a_port_attaches_once(sim, conn):
    network = conn.network.find_network("cluster-net", ignore_missing=False)
    port = sim.add_port(network.id, name="n1-port")
    first = conn.compute.create_server(**boot_args(conn, networks=[{"port": port.port_id}]))
    assert conn.network.get_port(port.port_id).device_id == first.id
    assert "cluster-net" in conn.compute.get_server(first.id).addresses
    with pytest.raises(openstack.exceptions.ConflictException, match="still in use"):
        conn.compute.create_server(**boot_args(conn, "n2", networks=[{"port": port.port_id}]))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"user_data": "not base64!"}, "is not a 'base64'"),
        ({"user_data": base64.b64encode(b"x" * 50_000).decode()}, "is too long"),
        ({"key_name": "nobody"}, "Invalid key_name provided."),
        ({"flavor_id": "no-such-flavor"}, "Invalid flavorRef provided."),
        ({"image_id": "5a4c2b1e-0000-4000-8000-000000000000"}, "could not be found"),
        ({"networks": [{"uuid": "5a4c2b1e-0000-4000-8000-000000000000"}]}, "Network"),
        ({"security_groups": [{"name": "nope"}]}, "Security group nope not found"),
        ({"availability_zone": "elsewhere"}, "availability zone is not available"),
        ({"tags": ["a/b"]}, "does not match"),
    ],
)
def test_invalid_creates_are_400(sim, conn, extra, message):
    with pytest.raises(openstack.exceptions.BadRequestException) as refused:
        conn.compute.create_server(**{**boot_args(conn), **extra})
    assert message in refused.value.details
    assert sim.nova.live_servers() == []


@pytest.mark.long
def test_paginated_tag_listing_returns_every_server_once(sim, conn):
    for index in range(2500):
        sim.nova.seed(name=f"prod-workers-{index}", tags=[TAG])
    for index in range(30):
        sim.nova.seed(name=f"prod-workers-x{index}")  # look-alike, not ours
    sim.calls.clear()
    sim.history.clear()
    listed = [s.id for s in conn.compute.servers(details=True, tags=TAG, limit=1000)]
    assert len(listed) == 2500
    assert len(set(listed)) == 2500
    assert set(listed) == {s.server_id for s in sim.nova.live_servers() if TAG in s.tags}
    pages = [e for e in sim.history if e.operation == "compute.servers.list"]
    # Three pages of at most 1000, each following Nova's servers_links; with a limit, the
    # SDK then asks once more after the short last page, and gets an empty one.
    assert len(pages) == 4
    assert sim.calls["compute.servers.list"] == 4
    assert "marker" not in pages[0].target
    assert all("marker=" in e.target and "limit=1000" in e.target for e in pages[1:])
    assert f"marker={listed[-1]}" in pages[3].target


def test_pages_follow_nova_links_alone_without_a_limit():
    with SimulatedOpenStack(FakeNova(), max_limit=100) as small:
        for index in range(250):
            small.nova.seed(name=f"w{index}", tags=[TAG])
        conn = sdk_connection(small)
        try:
            listed = [s.id for s in conn.compute.servers(details=False, tags=TAG)]
        finally:
            conn.close()
        assert len(set(listed)) == len(listed) == 250
        assert small.calls["compute.servers.list"] == 3  # capped at max_limit, then the links


def test_tag_filters_have_novas_semantics(sim, conn):
    both = sim.nova.seed(name="both", tags=["x", "y"]).server_id
    only_x = sim.nova.seed(name="only-x", tags=["x"]).server_id
    only_z = sim.nova.seed(name="only-z", tags=["z"]).server_id

    def listed(**filters) -> set[str]:
        return {s.id for s in conn.compute.servers(details=True, **filters)}

    assert listed(tags="x,y") == {both}  # every tag
    assert listed(any_tags="y,z") == {both, only_z}  # one of them
    assert listed(not_tags="x,y") == {only_x, only_z}  # not all of them
    assert listed(not_any_tags="y,z") == {only_x}  # none of them
    assert listed(tags="x", not_any_tags="y") == {only_x}
    assert listed(name="^only-") == {only_x, only_z}  # a regular expression, as Nova's
    assert listed(status="active") == {both, only_x, only_z}


def test_query_parameters_follow_the_microversion(sim, conn):
    sim.nova.seed(name="old", tags=[TAG])
    time.sleep(0.01)
    cut = datetime.now(UTC)
    time.sleep(0.01)
    sim.nova.seed(name="new", tags=[TAG])
    before = {"changes-before": cut.isoformat()}

    def names(microversion: str, **query) -> list[str]:
        response = conn.compute.get("/servers/detail", params=query, microversion=microversion)
        assert response.status_code == 200, response.text
        return sorted(server["name"] for server in response.json()["servers"])

    assert names("2.65", **before) == ["new", "old"]  # changes-before unknown: ignored
    assert names("2.66", **before) == ["old"]
    assert names("2.74", color="blue") == ["new", "old"]  # unknown: ignored
    strict = conn.compute.get("/servers/detail?color=blue", microversion="2.75")
    assert strict.status_code == 400
    assert "'color' was unexpected" in strict.json()["badRequest"]["message"]
    backwards = conn.compute.get(
        "/servers/detail",
        params={"changes-since": datetime.now(UTC).isoformat(), **before},
        microversion="2.66",
    )
    assert backwards.status_code == 400


def test_unknown_marker_is_400(sim, conn):
    response = conn.compute.get("/servers/detail?marker=no-such-server", microversion="2.60")
    assert response.status_code == 400
    assert response.json()["badRequest"]["message"] == "marker [no-such-server] not found"


def test_changes_since_includes_deleted_servers_except_with_a_tag_filter(sim, conn):
    kept = sim.nova.seed(name="kept", tags=[TAG])
    doomed = sim.nova.seed(name="doomed", tags=[TAG])
    since = datetime.now(UTC) - timedelta(seconds=1)
    conn.compute.delete_server(doomed.server_id)

    changed = {s.id: s for s in conn.compute.servers(details=True, changes_since=since.isoformat())}
    assert changed[doomed.server_id].status == "DELETED"
    assert changed[doomed.server_id].tags == []  # hard-deleted with the instance
    assert kept.server_id in changed
    tagged = [s.id for s in conn.compute.servers(details=True, tags=TAG, changes_since=since)]
    assert tagged == [kept.server_id]
    assert doomed.server_id not in {s.id for s in conn.compute.servers(details=True)}
    later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    assert list(conn.compute.servers(details=True, changes_since=later)) == []


def test_a_server_deleted_while_scheduling_leaves_no_deleted_row_only_with_the_fault(slow_sim):
    """Real Nova deletes only the build request of a server it still schedules: no instance
    was ever made, so ``changes-since`` shows no DELETED row for it (seen in the real-Nova
    lane). ``deletes_while_scheduling_vanish``, set through the control API, does the same;
    by default a server deleted in BUILD is deleted as one with a host (a DELETED row), and
    with the fault a server past scheduling still is."""
    sim = slow_sim
    conn = sdk_connection(sim)
    try:
        since = datetime.now(UTC) - timedelta(seconds=1)

        def boot(name: str) -> str:
            server = conn.compute.get_server(conn.compute.create_server(**boot_args(conn, name)))
            assert (server.status, server.task_state) == ("BUILD", "scheduling")
            return str(server.id)

        def changed() -> dict[str, str]:
            listed = conn.compute.servers(details=True, changes_since=since.isoformat())
            return {server.id: server.status for server in listed}

        plain = boot("plain")
        conn.compute.delete_server(plain)
        assert changed()[plain] == "DELETED"  # the default: a DELETED row

        status, faults = control(
            sim, "POST", "/_sim/faults", {"deletes_while_scheduling_vanish": True}
        )
        assert (status, faults["faults"]["deletes_while_scheduling_vanish"]) == (200, True)
        vanishing = boot("vanishing")
        built = boot("built")
        assert control(sim, "POST", "/_sim/activate", {"id": built})[0] == 200
        conn.compute.delete_server(vanishing)
        conn.compute.delete_server(built)
        with pytest.raises(openstack.exceptions.NotFoundException):
            conn.compute.get_server(vanishing)
        rows = changed()
        assert vanishing not in rows  # no row at all, DELETED or other
        assert rows[built] == "DELETED"  # past scheduling: deleted as before
        assert rows[plain] == "DELETED"
    finally:
        conn.close()


def test_no_valid_host_leaves_an_error_server_with_its_tags(sim, conn):
    sim.nova.faults.no_valid_host = 1
    created = conn.compute.create_server(**boot_args(conn), tags=[TAG])
    server = conn.compute.get_server(created.id)
    assert server.status == "ERROR"
    assert server.fault["code"] == 500
    assert server.fault["message"].startswith("No valid host was found.")
    assert "created" in server.fault
    assert server.tags == [TAG]


# -- Nova's refusals as openstacksdk raises them ----------------------------------------------


def test_quota_refusals_are_forbidden_with_novas_message(sim, conn):
    sim.nova.quota.instances = 1
    conn.compute.create_server(**boot_args(conn, "first"))
    with pytest.raises(openstack.exceptions.ForbiddenException) as refused:
        conn.compute.create_server(**boot_args(conn, "second"))
    assert refused.value.status_code == 403
    assert "Quota exceeded for instances: Requested 1, but already used 1 of 1 instances" in (
        refused.value.details
    )

    sim.nova.quota.instances = None
    sim.nova.quota.cores = 2
    with pytest.raises(openstack.exceptions.ForbiddenException, match="Quota exceeded for cores"):
        conn.compute.create_server(**boot_args(conn, "big", flavor_id="f-medium"))

    sim.nova.quota.cores = None
    sim.nova.quota.server_group_members = 2
    group = conn.compute.find_server_group("workers-anti-affinity", ignore_missing=False)
    for name in ("g1", "g2"):
        conn.compute.create_server(**boot_args(conn, name), scheduler_hints={"group": group.id})
    with pytest.raises(openstack.exceptions.ForbiddenException) as members:
        conn.compute.create_server(**boot_args(conn, "g3"), scheduler_hints={"group": group.id})
    assert "Quota exceeded, too many servers in group" in members.value.details

    limits = conn.compute.get_limits().absolute
    assert limits.server_group_members == 2
    assert limits.instances_used == 3
    quota = conn.compute.get_quota_set(conn.current_project_id, usage=True)
    assert quota.instances == -1  # unlimited again
    assert quota.usage["instances"] == 3


def test_injected_5xx_and_lost_create_answers(sim, conn):
    conn.compute.get_endpoint_data()  # discover before the cloud starts failing
    sim.nova.faults.error_rate = 1.0
    with pytest.raises(openstack.exceptions.HttpException) as unavailable:
        list(conn.compute.servers())
    assert unavailable.value.status_code == 503
    sim.nova.faults.error_rate = 0.0

    sim.nova.faults.lost_create_responses = 1
    with pytest.raises(openstack.exceptions.HttpException) as lost:
        conn.compute.create_server(**boot_args(conn, "lost"), tags=["osas-request=r9"])
    assert lost.value.status_code == 502
    # The server exists all the same; only a look-up by its request tag finds it.
    found = list(conn.compute.servers(details=True, tags="osas-request=r9"))
    assert [s.name for s in found] == ["lost"]


def test_error_rate_is_repeatable():
    def failures() -> list[int]:
        with SimulatedOpenStack(FakeNova()) as simulated:
            simulated.nova.faults.error_rate = 0.5
            conn = sdk_connection(simulated)
            try:
                conn.compute.get_endpoint_data()
                statuses = [conn.compute.get("/servers").status_code for _ in range(20)]
            finally:
                conn.close()
        return [index for index, status in enumerate(statuses) if status == 503]

    first = failures()
    assert 0 < len(first) < 20
    assert failures() == first


# -- Nova under load: behaviours real Nova shows and osas must survive -------------------------


def wait_until(predicate, what: str, timeout: float = 10.0):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def named(sim: SimulatedOpenStack, name: str) -> list:
    return [s for s in sim.nova.live_servers() if s.name == name]


def test_a_stalled_create_is_stored_after_the_client_gave_up(sim, conn):
    args = boot_args(conn, "stalled")
    impatient = sdk_connection(sim, api_timeout=0.4)
    try:
        impatient.compute.get_endpoint_data()  # authenticate and discover before the stall
        sim.nova.faults.create_stall = 1.5
        with pytest.raises(keystoneauth1.exceptions.ConnectTimeout):
            impatient.compute.create_server(**args)
    finally:
        impatient.close()
    # The stall holds no lock: Nova answers other calls meanwhile, without the server yet.
    assert [s.name for s in conn.compute.servers()] == []
    listed = wait_until(lambda: list(conn.compute.servers(details=True)), "the stored server")
    assert [s.name for s in listed] == ["stalled"]
    assert sim.calls["compute.servers.create"] == 1  # one POST, stored late


def test_quota_recheck_fails_every_concurrent_create(sim, conn):
    sim.nova.quota.instances = 1
    sim.nova.faults.quota_recheck_seconds = 1.0
    body = {"server": {**create_body(conn), "tags": [TAG]}}
    clients = [sdk_connection(sim) for _ in range(3)]
    try:
        for client in clients:
            client.compute.get_endpoint_data()
        barrier = threading.Barrier(3)

        def create(client) -> int:
            barrier.wait()
            return client.compute.post("/servers", json=body, microversion="2.100").status_code

        with ThreadPoolExecutor(3) as pool:
            statuses = list(pool.map(create, clients))
    finally:
        for client in clients:
            client.close()
    # Nova's API counted none of the others (still scheduling): it accepted all three.
    assert statuses == [202, 202, 202]
    first = next(iter(conn.compute.servers(details=True, tags=TAG)))
    assert (first.status, first.task_state) == ("BUILD", "scheduling")

    def all_failed() -> list:
        servers = list(conn.compute.servers(details=True, tags=TAG))
        return servers if [s.status for s in servers] == ["ERROR"] * 3 else []

    for server in wait_until(all_failed, "the re-check to fail all three"):
        assert server.task_state is None
        assert server.fault["code"] == 413
        # Nova's re-check uses deltas of zero, so its message reports the limit as the usage.
        assert server.fault["message"] == (
            "Quota exceeded for instances: Requested 1, but already used 1 of 1 instances"
        )
    # ERROR servers hold the quota until deleted: the API's own check now refuses at once.
    with pytest.raises(openstack.exceptions.ForbiddenException, match="Quota exceeded"):
        conn.compute.create_server(**boot_args(conn, "fourth"))
    assert conn.compute.get_limits().absolute.instances_used == 3


def test_quota_recheck_lets_a_create_with_room_through(sim, conn):
    sim.nova.quota.instances = 1
    sim.nova.faults.quota_recheck_seconds = 0.8
    created = conn.compute.create_server(**boot_args(conn))
    server = conn.compute.get_server(created.id)
    assert (server.status, server.task_state) == ("BUILD", "scheduling")
    active = wait_until(
        lambda: conn.compute.get_server(created.id).status == "ACTIVE", "the server to build"
    )
    assert active
    assert conn.compute.get_server(created.id).fault is None


def create_body(conn) -> dict:
    args = boot_args(conn)
    return {
        "name": args["name"],
        "flavorRef": args["flavor_id"],
        "imageRef": args["image_id"],
        "networks": args["networks"],
    }


def test_server_metadata_api_has_novas_semantics(sim, conn):
    server = sim.nova.seed(name="meta", metadata={"a": "1"})
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    with sim.nova.lock:
        server.updated_at = long_ago
    since = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()

    def changed() -> list[str]:
        return [s.id for s in conn.compute.servers(details=True, changes_since=since)]

    assert changed() == []
    base = f"/servers/{server.server_id}/metadata"
    assert conn.compute.get(base).json() == {"metadata": {"a": "1"}}

    # openstack server set --property: POST merges, and bumps updated (changes-since sees it).
    conn.compute.set_server_metadata(server.server_id, b="2")
    assert conn.compute.get_server_metadata(server.server_id).metadata == {"a": "1", "b": "2"}
    assert changed() == [server.server_id]
    assert conn.compute.get_server(server.server_id).updated_at != timestamp(long_ago)
    assert sim.calls["compute.servers.metadata.set"] == 1

    # openstack server unset --property: DELETE one key, updated left alone.
    with sim.nova.lock:
        server.updated_at = long_ago
    conn.compute.delete_server_metadata(server.server_id, ["a"])
    assert conn.compute.get(base).json() == {"metadata": {"b": "2"}}
    assert changed() == []
    assert sim.calls["compute.servers.metadata.delete"] == 1
    missing = conn.compute.delete(f"{base}/a")
    assert missing.status_code == 404
    assert missing.json()["itemNotFound"]["message"] == "Metadata item was not found"

    # One key: GET and PUT, the body naming exactly the URL's key.
    assert conn.compute.get(f"{base}/b").json() == {"meta": {"b": "2"}}
    assert conn.compute.get(f"{base}/zz").status_code == 404
    put = conn.compute.put(f"{base}/c", json={"meta": {"c": "3"}})
    assert (put.status_code, put.json()) == (200, {"meta": {"c": "3"}})
    mismatch = conn.compute.put(f"{base}/c", json={"meta": {"d": "4"}})
    assert mismatch.status_code == 400
    assert mismatch.json()["badRequest"]["message"] == "Request body and URI mismatch"
    assert conn.compute.put(f"{base}/c", json={"meta": {"c": "3", "e": "5"}}).status_code == 400

    # PUT on the collection replaces everything.
    replaced = conn.compute.put(base, json={"metadata": {"x": "9"}})
    assert (replaced.status_code, replaced.json()) == (200, {"metadata": {"x": "9"}})
    assert sim.nova.find_server(server.server_id).metadata == {"x": "9"}

    # Nova's schema and quota.
    for bad in ({"metadata": {"k" * 256: "v"}}, {"metadata": {"k": "v" * 256}}, {"meta": {}}):
        assert conn.compute.post(base, json=bad).status_code == 400
    sim.nova.quota.metadata_items = 2
    over = conn.compute.post(base, json={"metadata": {"y": "1", "z": "2"}})
    assert over.status_code == 403
    assert over.json() == {
        "forbidden": {"code": 403, "message": "Maximum number of metadata items exceeds 2"}
    }
    # Only a stable server with no task running takes changes.
    sim.nova.build_seconds = None  # BUILD until activated
    sim.nova.delete_seconds = 60.0
    building = sim.nova.seed(name="building", status="BUILD")
    deleting = sim.nova.seed(name="deleting")
    conn.compute.delete_server(deleting.server_id)
    for busy, state in ((building, "vm_state building"), (deleting, "task_state deleting")):
        path = f"/servers/{busy.server_id}/metadata"
        refused = conn.compute.post(path, json={"metadata": {"k": "v"}})
        assert refused.status_code == 409
        assert f"while it is in {state}" in refused.json()["conflictingRequest"]["message"]
    gone = conn.compute.get("/servers/5a4c2b1e-0000-4000-8000-000000000000/metadata")
    assert gone.status_code == 404


def test_paged_listing_repeats_a_server_while_builds_are_in_flight(sim, conn):
    for index in range(5):
        sim.nova.seed(name=f"w{index}", tags=[TAG])
    everyone = {s.server_id for s in sim.nova.live_servers()}

    def page(query: str) -> list[str]:
        response = conn.compute.get(f"/servers/detail?{query}", microversion="2.100")
        return [server["id"] for server in response.json()["servers"]]

    order = page("")
    marker = page("limit=2")[-1]
    assert marker == order[1]
    sim.nova.faults.repeated_pages = 1
    assert page(f"limit=2&marker={marker}") == order[1:3]  # starts with the marker again
    assert sim.nova.faults.repeated_pages == 0  # one page served that way
    assert page(f"limit=2&marker={marker}") == order[2:4]

    sim.nova.faults.repeated_pages = 2
    listed = [s.id for s in conn.compute.servers(details=True, tags=TAG, limit=2)]
    assert len(listed) > len(set(listed))  # a server listed twice
    assert set(listed) == everyone

    # With a page of one, the repeat is the marker again: openstacksdk gives up.
    sim.nova.faults.repeated_pages = 1
    with pytest.raises(openstack.exceptions.SDKException, match="Endless pagination loop"):
        list(conn.compute.servers(details=True, tags=TAG, limit=1))


def test_ports_exceeded_is_403_with_novas_body(sim, conn):
    sim.nova.faults.ports_exceeded = 1
    refused = conn.compute.post(
        "/servers", json={"server": create_body(conn)}, microversion="2.100"
    )
    assert refused.status_code == 403
    assert refused.json() == {
        "forbidden": {"code": 403, "message": "Maximum number of ports exceeded"}
    }
    assert sim.nova.live_servers() == []
    conn.compute.create_server(**boot_args(conn))  # a counter: the next create goes through
    assert len(sim.nova.live_servers()) == 1


def test_keystoneauth_resends_a_create_whose_503_was_lost(sim, conn):
    """The hazard osas must avoid: status_code_retries resends a POST Nova already stored."""
    args = boot_args(conn, "resent")
    retrying = sdk_connection(sim, status_code_retries=2, status_code_retry_delay=0.01)
    try:
        retrying.compute.get_endpoint_data()
        sim.nova.faults.lost_create_status = 503
        sim.nova.faults.lost_create_responses = 2
        retrying.compute.create_server(**args)  # succeeds, on the third POST
    finally:
        retrying.close()
    assert sim.calls["compute.servers.create"] == 3
    assert len(named(sim, "resent")) == 3  # one create, three servers


def test_keystoneauth_resends_a_create_whose_connection_dropped(sim, conn):
    args = boot_args(conn, "dropped")
    sim.nova.faults.dropped_create_connections = 1
    with pytest.raises(keystoneauth1.exceptions.ConnectFailure, match="without response"):
        conn.compute.create_server(**args)
    assert len(named(sim, "dropped")) == 1  # stored all the same
    assert [e.status for e in sim.history if e.operation == "compute.servers.create"] == [0]

    retrying = sdk_connection(sim, connect_retries=2, connect_retry_delay=0.01)
    try:
        retrying.compute.get_endpoint_data()
        sim.nova.faults.dropped_create_connections = 2
        retrying.compute.create_server(**args)  # succeeds, on the third POST
    finally:
        retrying.close()
    assert sim.calls["compute.servers.create"] == 4
    assert len(named(sim, "dropped")) == 4  # 1 + three from one retried create


def test_delete_window_is_set_through_the_control_api(sim, conn):
    status, timings = control(sim, "POST", "/_sim/nova", {"delete_seconds": 0.8})
    nova = {"build_seconds": 0.0, "delete_seconds": 0.8, "clock_offset": 0.0}
    assert status == 200
    assert {name: timings["nova"][name] for name in nova} == nova  # and the action timings
    assert control(sim, "GET", "/_sim/nova")[1]["nova"]["delete_seconds"] == 0.8
    for bad in ({"delete_seconds": -1}, {"build_seconds": "slow"}, {"shutdown_seconds": 1}):
        assert control(sim, "POST", "/_sim/nova", bad)[0] == 400
    assert control(sim, "POST", "/_sim/nova", {"build_seconds": None})[0] == 200
    assert sim.nova.build_seconds is None

    doomed = sim.nova.seed(name="doomed")
    conn.compute.delete_server(doomed.server_id)
    deleting = conn.compute.get_server(doomed.server_id)
    assert (deleting.status, deleting.task_state) == ("ACTIVE", "deleting")

    def gone() -> bool:
        try:
            conn.compute.get_server(doomed.server_id)
        except openstack.exceptions.NotFoundException:
            return True
        return False

    assert wait_until(gone, "the delete to finish")


def test_control_api_sets_every_new_fault(sim):
    new = {
        "create_stall": 0.5,
        "quota_recheck_seconds": 1,
        "repeated_pages": 2,
        "ports_exceeded": 1,
        "lost_create_status": 503,
        "dropped_create_connections": 3,
        "deletes_while_scheduling_vanish": True,
    }
    status, faults = control(sim, "POST", "/_sim/faults", new)
    assert status == 200
    assert {name: faults["faults"][name] for name in new} == new
    for bad in (
        {"repeated_pages": 1.5},
        {"ports_exceeded": True},
        {"lost_create_status": 200},
        {"lost_create_status": 503.0},
        {"create_stall": -0.1},
        {"create_stall": "slow"},
        {"deletes_while_scheduling_vanish": 1},
        {"deletes_while_scheduling_vanish": "yes"},
    ):
        assert control(sim, "POST", "/_sim/faults", bad)[0] == 400, bad
    not_finite = b'{"create_stall": Infinity}'
    request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
        f"{sim.base_url}/_sim/faults", data=not_finite, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310
    with refused.value:
        assert refused.value.code == 400
    assert sim.nova.faults.create_stall == 0.5


async def test_fake_cloud_shows_the_same_faults_in_process():
    nova = FakeNova(build_seconds=0.0)
    cloud = FakeCloud(nova)
    request = CreateServerRequest(
        name="n", flavor="m1.small", image="img", networks=["net"], metadata={}, tags=[TAG]
    )
    nova.faults.dropped_create_connections = 1
    with pytest.raises(CreateInDoubt, match="connection dropped"):
        await cloud.create_server(request)
    nova.faults.lost_create_responses = 1
    nova.faults.lost_create_status = 503
    with pytest.raises(CreateInDoubt, match="503"):
        await cloud.create_server(request)
    assert len(nova.live_servers()) == 2  # both stored all the same
    nova.faults.ports_exceeded = 1
    with pytest.raises(QuotaExceeded, match="Maximum number of ports exceeded"):
        await cloud.create_server(request)
    nova.faults.create_stall = 0.2
    started = time.monotonic()
    await cloud.create_server(request)
    assert time.monotonic() - started >= 0.2
    assert len(nova.live_servers()) == 3


# -- quotas on other services: Neutron's ports, Cinder's volumes and gigabytes -----------------


def boot_from_volume(conn, name: str, size: int) -> dict:
    image = find_image(conn, "ubuntu-24.04")
    mapping = {
        "boot_index": 0,
        "uuid": image.id,
        "source_type": "image",
        "destination_type": "volume",
        "volume_size": size,
        "delete_on_termination": True,
    }
    return boot_args(conn, name, block_device_mapping=[mapping])


def test_neutron_quota_details_count_the_ports_of_servers_and_the_registry(sim, conn):
    project = conn.current_project_id
    sim.nova.quota.ports = 5
    conn.compute.create_server(**boot_args(conn))  # one network: one port
    details = conn.network.get_quota(project, details=True)
    assert details.ports == {"limit": 5, "used": 1, "reserved": 0}
    assert details.networks == {"limit": -1, "used": 1, "reserved": 0}

    network = conn.network.find_network("cluster-net", ignore_missing=False)
    sim.add_port(network.id, name="spare")
    sim.nova.faults.no_valid_host = 1
    conn.compute.create_server(**boot_args(conn, "nowhere"))  # ERROR: it holds no port
    raw = conn.network.get(f"/quotas/{project}/details.json").json()
    assert raw["quota"]["port"] == {"limit": 5, "used": 2, "reserved": 0}
    sim.nova.quota.ports = None
    assert conn.network.get_quota(project, details=True).ports["limit"] == -1

    with pytest.raises(openstack.exceptions.ForbiddenException, match="Only admin"):
        conn.network.get_quota("another-project", details=True)


def test_port_quota_refuses_creates_with_novas_messages(sim, conn):
    network = conn.network.find_network("cluster-net", ignore_missing=False)
    sim.nova.quota.ports = 2
    conn.compute.create_server(**boot_args(conn, "first"))
    spare = sim.add_port(network.id, name="spare")  # two ports in use, none left
    refused = conn.compute.post(
        "/servers", json={"server": create_body(conn)}, microversion="2.100"
    )
    assert refused.status_code == 403
    assert refused.json() == {
        "forbidden": {"code": 403, "message": "Maximum number of ports exceeded"}
    }
    # A create naming an existing port needs no new one.
    conn.compute.create_server(**boot_args(conn, "second", networks=[{"port": spare.port_id}]))
    assert sim.nova.usage()["ports"] == 2

    sim.nova.quota.ports = 1  # lowered below what is in use: Nova says so
    with pytest.raises(openstack.exceptions.ForbiddenException) as over:
        conn.compute.create_server(**boot_args(conn, "third"))
    assert "The number of defined ports: 2 is over the limit: 1" in over.value.details
    assert sorted(s.name for s in sim.nova.live_servers()) == ["first", "second"]


def test_cinder_limits_count_the_boot_volumes(sim, conn):
    sim.nova.quota.volumes = 3
    sim.nova.quota.gigabytes = 100
    conn.compute.create_server(**boot_from_volume(conn, "bfv", 40))
    conn.compute.create_server(**boot_args(conn, "image-backed"))
    absolute = conn.block_storage.get_limits().absolute
    assert (absolute.max_total_volumes, absolute.total_volumes_used) == (3, 1)
    assert (absolute.max_total_volume_gigabytes, absolute.total_gigabytes_used) == (100, 40)
    assert (absolute.max_total_snapshots, absolute.total_snapshots_used) == (-1, 0)
    sim.nova.quota.volumes = None
    assert conn.block_storage.get_limits().absolute.max_total_volumes == -1
    assert sim.calls["volume.limits.get"] == 2


def test_boot_from_volume_over_cinders_quota_ends_error_after_it_was_accepted(sim, conn):
    sim.nova.quota.volumes = 1
    conn.compute.create_server(**boot_from_volume(conn, "holds-the-volume", 40))
    created = conn.compute.create_server(**boot_from_volume(conn, "one-too-many", 20))
    server = conn.compute.get_server(created.id)
    assert (server.status, server.task_state) == ("ERROR", None)
    assert server.fault["code"] == 500
    assert server.fault["message"] == (
        f"Build of instance {created.id} aborted: VolumeLimitExceeded: Maximum number of "
        "volumes allowed (1) exceeded for quota 'volumes'."
    )
    absolute = conn.block_storage.get_limits().absolute
    assert (absolute.total_volumes_used, absolute.total_gigabytes_used) == (1, 40)
    assert sim.nova.usage()["ports"] == 1  # the aborted build freed its port

    sim.nova.quota.volumes = None
    sim.nova.quota.gigabytes = 50
    created = conn.compute.create_server(**boot_from_volume(conn, "too-big", 20))
    server = conn.compute.get_server(created.id)
    assert server.status == "ERROR"
    assert server.fault["message"] == (
        f"Build of instance {created.id} aborted: VolumeSizeExceedsAvailableQuota: Requested "
        "volume or snapshot exceeds allowed gigabytes quota. Requested 20G, quota is 50G and "
        "40G has been consumed."
    )
    assert conn.compute.create_server(**boot_from_volume(conn, "fits", 10)).id


def test_cinders_quota_is_checked_when_the_build_leaves_scheduling(sim, conn):
    sim.nova.quota.volumes = 1
    sim.nova.faults.quota_recheck_seconds = 0.5
    first = conn.compute.create_server(**boot_from_volume(conn, "first", 10))
    second = conn.compute.create_server(**boot_from_volume(conn, "second", 10))
    # Nova's API does not ask Cinder: both are accepted and scheduling, no volume made yet.
    assert conn.block_storage.get_limits().absolute.total_volumes_used == 0

    def settled() -> bool:
        return "BUILD" not in {conn.compute.get_server(s.id).status for s in (first, second)}

    assert wait_until(settled, "both builds to leave scheduling")
    assert conn.compute.get_server(first.id).status == "ACTIVE"
    failed = conn.compute.get_server(second.id)
    assert failed.status == "ERROR"
    assert "exceeded for quota 'volumes'" in failed.fault["message"]
    assert conn.block_storage.get_limits().absolute.total_volumes_used == 1


def test_control_api_sets_the_quotas_of_other_services(sim):
    status, quota = control(sim, "POST", "/_sim/quota", {"ports": 3, "volumes": 2, "gigabytes": 80})
    assert status == 200
    assert {name: quota["quota"][name] for name in ("ports", "volumes", "gigabytes")} == {
        "ports": 3,
        "volumes": 2,
        "gigabytes": 80,
    }
    assert (sim.nova.quota.ports, sim.nova.quota.volumes, sim.nova.quota.gigabytes) == (3, 2, 80)
    for bad in ({"ports": -1}, {"volumes": 1.5}, {"gigabytes": "lots"}, {"ports": True}):
        assert control(sim, "POST", "/_sim/quota", bad)[0] == 400, bad
    assert control(sim, "POST", "/_sim/quota", {"ports": None})[0] == 200
    assert sim.nova.quota.ports is None


# -- names resolved with openstacksdk's find_* ------------------------------------------------


def test_resources_are_found_by_name(sim, conn):
    assert conn.compute.find_flavor("m1.small", ignore_missing=False).id == "f-small"
    gpu = conn.compute.find_flavor("g1.xlarge", ignore_missing=False, get_extra_specs=True)
    assert gpu.extra_specs == {"resources:VGPU": "1"}
    image = find_image(conn, "ubuntu-24.04")
    assert image.id in {i.image_id for i in sim.images()}
    network = conn.network.find_network("cluster-net", ignore_missing=False)
    assert network.id in {n.network_id for n in sim.networks()}
    assert conn.network.find_security_group("default", ignore_missing=False).name == "default"
    group = conn.compute.find_server_group("workers-anti-affinity", ignore_missing=False)
    assert group.policy == "anti-affinity"
    assert conn.compute.find_keypair("ops", ignore_missing=False).name == "ops"
    extra = sim.add_image("debian-13")
    assert find_image(conn, "debian-13").id == extra.image_id
    with pytest.raises(openstack.exceptions.NotFoundException):
        conn.compute.find_flavor("m9.huge", ignore_missing=False)
    assert [z.name for z in conn.compute.availability_zones()] == ["nova"]


def test_glance_pages_with_its_next_link(sim, conn):
    for index in range(30):
        sim.add_image(f"extra-{index}")
    sim.calls.clear()
    names = [image.name for image in conn.image.images(limit=10)]
    assert len(names) == len(set(names)) == 31
    # Pages of 10, 10, 10 and 1 through Glance's "next", then the SDK's probe after a short page.
    assert sim.calls["image.images.list"] == 5


# -- the control API --------------------------------------------------------------------------


@pytest.fixture
def slow_sim():
    """Servers stay in BUILD until activated, as FakeNova leaves them by default."""
    with SimulatedOpenStack() as simulated:
        yield simulated


def test_control_api_seeds_breaks_and_counts(slow_sim):
    sim = slow_sim
    conn = sdk_connection(sim)
    try:
        control_api_round(sim, conn)
    finally:
        conn.close()


def test_control_api_lists_its_endpoints_at_its_root(slow_sim):
    """``GET /_sim/`` (or ``/_sim``) answers the list of the control endpoints, each served:
    a GET answers, and a path only POST or DELETE take answers 405, not 404."""
    for root in ("/_sim/", "/_sim"):
        status, index = control(slow_sim, "GET", root)
        assert status == 200, root
    endpoints = index["endpoints"]
    assert all(set(e) == {"method", "path", "does"} and e["does"] for e in endpoints)
    listed = {(e["method"], e["path"]) for e in endpoints}
    assert {("GET", "/_sim/"), ("POST", "/_sim/faults"), ("POST", "/_sim/calls/reset")} <= listed
    gets = {path for method, path in listed if method == "GET"}
    for _, path in listed:
        status, _ = control(slow_sim, "GET", path.replace("{server_id}", "no-such-server"))
        assert status == (200 if path in gets else 405), path
    assert control(slow_sim, "GET", "/_sim/nothing-here")[0] == 404


def control_api_round(sim, conn):
    status, seeded = control(
        sim, "POST", "/_sim/servers", {"name": "w", "tags": [TAG], "count": 3, "status": "BUILD"}
    )
    assert status == 201
    assert [s["name"] for s in seeded["servers"]] == ["w-1", "w-2", "w-3"]
    assert len(list(conn.compute.servers(details=True, tags=TAG))) == 3

    status, activated = control(sim, "POST", "/_sim/activate", {})
    assert status == 200
    assert len(activated["activated"]) == 3

    status, faults = control(sim, "POST", "/_sim/faults", {"quota_exceeded": 1, "latency": 0})
    assert status == 200
    assert faults["faults"]["quota_exceeded"] == 1
    with pytest.raises(openstack.exceptions.ForbiddenException):
        conn.compute.create_server(**boot_args(conn))
    assert control(sim, "POST", "/_sim/faults", {"nonsense": 1})[0] == 400
    assert control(sim, "POST", "/_sim/faults", {"error_rate": "high"})[0] == 400

    status, calls = control(sim, "GET", "/_sim/calls")
    assert calls["calls"]["compute.servers.create"] == 1
    assert calls["calls"]["compute.servers.list"] == 1
    assert control(sim, "POST", "/_sim/calls/reset")[0] == 204
    assert control(sim, "GET", "/_sim/calls")[1] == {"calls": {}, "throttled": {}}

    status, listed = control(sim, "GET", "/_sim/servers")
    assert {s["status"] for s in listed["servers"]} == {"ACTIVE"}
    doomed = listed["servers"][0]["id"]
    assert control(sim, "DELETE", f"/_sim/servers/{doomed}")[0] == 204
    assert len(control(sim, "GET", "/_sim/servers")[1]["servers"]) == 2
    assert len(control(sim, "GET", "/_sim/servers?deleted=true")[1]["servers"]) == 3


def test_run_sim_serves_until_stopped_and_writes_clouds_yaml(tmp_path, capsys, monkeypatch):
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text(yaml.safe_dump({"clouds": {"other": {"region_name": "X"}}}))
    stop = threading.Event()
    runner = threading.Thread(
        target=run_sim, args=(0, clouds, 0.0, stop), kwargs={"delete_seconds": 1.5}, daemon=True
    )
    runner.start()
    try:
        for _ in range(200):
            out = capsys.readouterr().out
            if out:
                break
            stop.wait(0.02)
        assert out.startswith("osas sim: keystone at http://127.0.0.1:")
        auth_url = out.splitlines()[0].split(" at ", 1)[1].strip()
        # What a newcomer needs to write osas's configuration: the cloud and what it offers.
        assert f"cloud name: osas-sim (written to {clouds}" in out
        for offered in ("m1.small", "ubuntu-24.04", "cluster-net", "workers-anti-affinity"):
            assert offered in out
        document = yaml.safe_load(clouds.read_text())
        assert document["clouds"]["other"] == {"region_name": "X"}
        entry = document["clouds"]["osas-sim"]
        assert entry["auth"]["auth_url"] == auth_url
        assert entry["identity_api_version"] == 3
        assert stat.S_IMODE(clouds.stat().st_mode) == 0o600
        base_url = auth_url.removesuffix("/identity/v3")
        with urllib.request.urlopen(f"{base_url}/_sim/nova", timeout=10) as response:  # noqa: S310
            served = json.loads(response.read())["nova"]
        asked = {"build_seconds": 0.0, "delete_seconds": 1.5, "clock_offset": 0.0}
        assert {name: served[name] for name in asked} == asked  # besides the action timings
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
        cloud = openstack.connect(cloud="osas-sim")
        try:
            assert list(cloud.compute.servers()) == []
        finally:
            cloud.close()
    finally:
        stop.set()
        runner.join(timeout=10)
    assert not runner.is_alive()


def test_flavor_listing_pages_like_nova():
    """A full page of flavors links the next one, as Nova does (found by the real-Nova lane:
    with pages of 3, openstacksdk's find_flavor missed the fourth flavor)."""
    with SimulatedOpenStack(FakeNova(), max_limit=3) as sim:
        conn = sdk_connection(sim)
        try:
            names = [flavor.name for flavor in conn.compute.flavors()]
            assert sorted(names) == ["g1.xlarge", "m1.large", "m1.medium", "m1.small"]
            assert sim.calls["compute.flavors.list"] == 2  # 3 + 1
            assert conn.compute.find_flavor("m1.small", ignore_missing=False).name == "m1.small"
        finally:
            conn.close()


def test_novas_clock_is_set_through_the_control_api_and_dates_every_answer(sim, conn):
    """Nova's clock off the real one (negative: behind): its answers' Date and the updated
    it stamps follow it; changes-since is judged by it."""
    assert control(sim, "POST", "/_sim/nova", {"clock_offset": -180})[0] == 200
    assert sim.nova.clock_offset == -180
    for bad in ({"clock_offset": 2 * 86_400}, {"clock_offset": "late"}):
        assert control(sim, "POST", "/_sim/nova", bad)[0] == 400
    before = datetime.now(UTC)
    response = conn.compute.get("/servers", microversion="2.100")
    dated = email.utils.parsedate_to_datetime(response.headers["Date"])
    assert abs((dated - (before - timedelta(seconds=180))).total_seconds()) < 2
    touched = sim.nova.seed(name="touched")
    assert abs((touched.updated_at - (before - timedelta(seconds=180))).total_seconds()) < 2
    # A changes-since taken from osas's own clock, three minutes ahead of Nova's, sees nothing.
    ahead = before.strftime("%Y-%m-%dT%H:%M:%SZ")
    listed = conn.compute.get(f"/servers/detail?changes-since={ahead}", microversion="2.100")
    assert listed.json()["servers"] == []


def test_novas_clock_jumping_does_not_stall_builds_or_deletes():
    """Builds and deletes finish by Nova's events, not by its clock: a clock sent back ten
    minutes neither holds a build nor a delete for ten minutes."""
    nova = FakeNova(build_seconds=0.05, delete_seconds=0.05)
    server = nova.create_server(
        CreateServerRequest(
            name="s", flavor="m1.small", image="i", networks=(), metadata={}, tags=()
        )
    )
    nova.clock_offset = -600.0
    time.sleep(0.1)
    assert nova.find_server(server.server_id).status == "ACTIVE"
    nova.clock_offset = 600.0
    nova.delete_server(server.server_id)
    nova.clock_offset = 0.0
    time.sleep(0.1)
    assert nova.find_server(server.server_id).status == "DELETED"


# -- several places: regions behind one Keystone, and clouds with their own -------------------


def test_a_second_region_is_its_own_nova_behind_the_same_keystone(sim):
    """A token from the one Keystone is good in both regions; each region's Nova has its own
    servers, images and networks (other ids), and its catalogue endpoints carry its path."""
    two = sim.add_region("RegionTwo")
    one_conn, two_conn = sdk_connection(sim), sdk_connection(sim, region_name="RegionTwo")
    try:
        assert two_conn.compute.get_endpoint().startswith(f"{sim.base_url}/regions/RegionTwo/")
        assert one_conn.compute.get_endpoint() == f"{sim.base_url}/compute/v2.1"
        made = two_conn.compute.create_server(**boot_args(two_conn, "in-two"))
        assert two.nova.get_server(made.id) is not None
        assert sim.nova.get_server(made.id) is None
        assert [s.id for s in two_conn.compute.servers()] == [made.id]
        assert list(one_conn.compute.servers()) == []
        assert find_image(one_conn, "ubuntu-24.04").id != find_image(two_conn, "ubuntu-24.04").id
        assert sim.calls["compute.servers.create"] == 0
        assert two.calls["compute.servers.create"] == 1
    finally:
        one_conn.close()
        two_conn.close()


def test_a_regions_faults_clock_and_pages_are_its_own(sim):
    """Region two failing every call, rate limited and hours ahead leaves region one as it was;
    region two's pages link within region two."""
    two = sim.add_region("RegionTwo")
    for index in range(5):
        two.nova.seed(name=f"w{index}", tags=[TAG])
    one_conn, two_conn = sdk_connection(sim), sdk_connection(sim, region_name="RegionTwo")
    try:
        listed = [s.id for s in two_conn.compute.servers(details=True, tags=TAG, limit=2)]
        assert len(listed) == 5
        pages = [e.target for e in sim.history if e.operation == "compute.servers.list"]
        assert all(target.startswith("/regions/RegionTwo/compute/") for target in pages)
        assert (
            control(sim, "POST", "/regions/RegionTwo/_sim/nova", {"clock_offset": 3 * 3600})[0]
            == 200
        )
        assert sim.nova.clock_offset == 0
        request = urllib.request.Request(f"{sim.base_url}/regions/RegionTwo/compute/")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            two_date = email.utils.parsedate_to_datetime(answer.headers["Date"])
        with urllib.request.urlopen(f"{sim.base_url}/compute/", timeout=10) as answer:  # noqa: S310
            one_date = email.utils.parsedate_to_datetime(answer.headers["Date"])
        assert 3 * 3600 - 60 < (two_date - one_date).total_seconds() < 3 * 3600 + 60
        two.nova.faults.error_rate = 1.0
        with pytest.raises(openstack.exceptions.HttpException) as refused:
            list(two_conn.compute.servers())
        assert refused.value.status_code == 503
        assert list(one_conn.compute.servers()) == []
        two.nova.faults.error_rate = 0.0
        two.nova.faults.request_rate = 0.001
        two.rate_limited("compute.servers.list")  # the one request its burst allows
        with pytest.raises(openstack.exceptions.HttpException) as throttled:
            list(two_conn.compute.servers())
        assert throttled.value.status_code == 429
        assert list(one_conn.compute.servers()) == []
        assert two.throttled["compute.servers.list"] >= 1
        assert sim.throttled["compute.servers.list"] == 0
    finally:
        one_conn.close()
        two_conn.close()


def test_a_second_cloud_has_its_own_keystone_and_refuses_the_firsts_tokens(sim, tmp_path):
    """Two simulators are two clouds: one clouds.yaml names both, each entry reaches its own
    Nova, and a token from one Keystone is refused by the other's services."""
    with SimulatedOpenStack(FakeNova(), region="Burst") as other:
        clouds = tmp_path / "clouds.yaml"
        sim.write_clouds_yaml(clouds, "private")
        other.write_clouds_yaml(clouds, "public")
        document = yaml.safe_load(clouds.read_text())["clouds"]
        assert document["public"]["region_name"] == "Burst"
        assert document["private"]["auth"]["auth_url"] == sim.auth_url
        loader = openstack.config.OpenStackConfig(config_files=[str(clouds)])
        private = openstack.connection.Connection(config=loader.get_one(cloud="private"))
        public = openstack.connection.Connection(config=loader.get_one(cloud="public"))
        try:
            public.compute.create_server(**boot_args(public, "burst-1"))
            assert len(other.nova.live_servers()) == 1
            assert sim.nova.live_servers() == []
            token = private.session.get_token()
            request = urllib.request.Request(  # noqa: S310 - loopback
                f"{other.base_url}/compute/v2.1/servers", headers={"X-Auth-Token": token}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)  # noqa: S310
            with refused.value as error:  # its socket closed with it
                assert error.code == 401
        finally:
            private.close()
            public.close()


def test_a_region_is_added_once_and_named_as_a_path_segment(sim):
    sim.add_region("RegionTwo")
    with pytest.raises(ValueError, match="there already"):
        sim.add_region("RegionTwo")
    with pytest.raises(ValueError, match="path segment"):
        sim.add_region("a/b")
    assert set(sim.regions) == {"RegionOne", "RegionTwo"}
