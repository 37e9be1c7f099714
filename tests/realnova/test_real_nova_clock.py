"""Nova's clock and Nova's ``changes-since``, against real Nova and real Keystone (``nox -s
nova``; issue 20): the Date header osas takes ``changes-since`` from, a change reaching the
inventory in one incremental sync whatever osas's own clock says, and the ownership marks
removed by hand, which real Nova's ``changes-since`` cannot show (a metadata-key DELETE and
tag edits leave ``updated`` as it was) and only a complete listing sees.

osas runs in process here: its OpenStack adapter (through clouds.yaml and Keystone, as in
production), an ``Inventory`` and a ``Reconciler`` whose syncs the tests make one at a time.
Nothing consumes its task queue: whatever osas ordered, no server is deleted but by the test.
Servers are booted through openstacksdk with a cluster's marks, as an osas create leaves them.

Skipped where the ``nova`` package is not installed (the main test venv)."""

from __future__ import annotations

import email.utils
import importlib.util
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

if importlib.util.find_spec("nova") is None:
    pytest.skip(
        "real-Nova lane: the nova package is not installed (run `nox -s nova`)",
        allow_module_level=True,
    )

import openstack
import openstack.config
import openstack.connection
import structlog
from realnova.cloud import (
    CLOUD,
    IMAGE_NAME,
    NETWORK_NAME,
    SCHEDULING_DELAY_HINT,
    NovaOptions,
    RealNovaProcess,
)
from support import config_data, write_config

from osas.cloud.openstack import OpenStackCloud
from osas.cloud.openstack_settings import OpenStackSettings
from osas.config import load_config
from osas.domain.errors import PreconditionFailed
from osas.domain.inventory import Inventory
from osas.domain.servers import META_CLUSTER, META_GROUP, TAG_CLUSTER_PREFIX
from osas.domain.sizing import plan_delete
from osas.domain.specs import ClusterSpec
from osas.engine.queue import TaskQueue
from osas.engine.reconciler import Reconciler

pytestmark = pytest.mark.realnova

T = TypeVar("T")
PAGE = 3  # Nova's [api] max_limit: every listing of more than 3 servers pages
SKEW = 420.0  # osas's clock this far from Nova's made the old code miss every change
SLACK = 3.0  # Date's whole seconds, the round trip, a loaded machine
QUIET = 3.0  # seconds of Nova's clock between a server's last update and the edit under test
SCHEDULING_HOLD = 5.0  # seconds Nova's conductor holds a server in scheduling, when asked
DISAGREE = "Nova's clock and osas's disagree; osas takes changes-since from Nova's clock"


@pytest.fixture(scope="module")
def nova(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNovaProcess]:
    options = NovaOptions(hosts=1, max_limit=PAGE)
    with RealNovaProcess(options, workdir=tmp_path_factory.mktemp("realnova")) as cloud:
        yield cloud


@pytest.fixture
def sdk_env(nova: RealNovaProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only our clouds.yaml: no OS_CLOUD, OS_COMPUTE_API_VERSION... from the caller's shell."""
    for name in list(os.environ):
        if name.startswith("OS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(nova.clouds_yaml))


@pytest.fixture
def conn(nova: RealNovaProcess) -> Iterator[openstack.connection.Connection]:
    """The operator's own openstacksdk connection: what edits servers "by hand"."""
    config = openstack.config.OpenStackConfig(
        config_files=[str(nova.clouds_yaml)], load_envvars=False
    )
    connection = openstack.connection.Connection(config=config.get_one(cloud=CLOUD))
    yield connection
    connection.close()


@pytest.fixture
async def osas_cloud(nova, sdk_env):
    cloud = OpenStackCloud(OpenStackSettings(cloud=CLOUD, attempts=2, backoff=0.1))
    yield cloud
    await cloud.close()


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def nova_time(response: Any) -> datetime:
    return email.utils.parsedate_to_datetime(response.headers["Date"])


def nova_now(conn: openstack.connection.Connection) -> datetime:
    """Nova's clock: the Date header of one of its answers (whole seconds, UTC)."""
    return nova_time(conn.compute.get("/servers", params={"limit": 1}))


def iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def changed_since(conn: openstack.connection.Connection, since: datetime) -> set[str]:
    """Ids in real Nova's own ``changes-since`` listing of the project, without a tag filter
    (the one osas's incremental sync makes), every page followed."""
    ids: set[str] = set()
    url: str | None = "/servers/detail"
    params: dict[str, str] | None = {"changes-since": iso(since)}
    while url is not None:
        body = conn.compute.get(url, params=params).json()
        ids.update(server["id"] for server in body["servers"])
        links = body.get("servers_links", ())
        url = next((link["href"] for link in links if link.get("rel") == "next"), None)
        params = None  # the next link carries the query
    return ids


@dataclass
class Osas:
    """osas in process: its adapter, an inventory, a reconciler synced by hand."""

    cluster: ClusterSpec
    inventory: Inventory
    reconciler: Reconciler

    @property
    def tag(self) -> str:
        return f"{TAG_CLUSTER_PREFIX}{self.cluster.cluster_name}"

    def provider_id(self, server_id: str) -> str:
        return self.cluster.provider_ids.format(server_id)


def osas_on(
    cloud: OpenStackCloud,
    tmp_path: Path,
    *,
    wall_clock: Callable[[], datetime] | None = None,
    overlap: float | None = None,
) -> Osas:
    """A cluster of its own (its marks tell its servers from other tests'), two groups
    ``workers`` and ``spare``; ``overlap`` replaces ``reconcile.changes_since_overlap``."""
    group = {"min_size": 0, "max_size": 5, "flavor": "m1.small", "image": IMAGE_NAME}
    data = config_data(
        cluster_name=f"clock-{uuid.uuid4().hex[:8]}",
        openstack={"cloud": CLOUD},
        node_groups=[
            {"id": "workers", "networks": [NETWORK_NAME], **group},
            {"id": "spare", "networks": [NETWORK_NAME], **group},
        ],
    )
    config = load_config(write_config(tmp_path, data))
    settings = config.engine_settings()
    if overlap is not None:
        reconcile = replace(settings.reconcile, changes_since_overlap=overlap)
        settings = replace(settings, reconcile=reconcile)
    cluster = config.cluster_spec()
    inventory = Inventory(cluster, config.ledger_settings())
    clocks = {} if wall_clock is None else {"wall_clock": wall_clock}
    reconciler = Reconciler(cloud, inventory, TaskQueue(10), settings, **clocks)
    return Osas(cluster, inventory, reconciler)


@dataclass
class Operator:
    """Someone with the project's credentials: boots servers and edits them by hand."""

    nova: RealNovaProcess
    conn: openstack.connection.Connection
    made: list[str] = field(default_factory=list)

    def boot(self, osas: Osas, name: str, *, scheduling_delay: float = 0.0) -> str:
        """A server with the cluster's marks in group ``workers``, as osas's creates leave
        it; ``scheduling_delay``: seconds Nova's conductor waits before scheduling it."""
        # Only when asked: every other create is sent as osas sends its own.
        hints = {"scheduler_hints": {SCHEDULING_DELAY_HINT: str(scheduling_delay)}}
        server = self.conn.compute.create_server(
            name=name,
            flavor_id=self.nova.info["flavors"]["m1.small"],
            image_id=self.nova.info["image_id"],
            networks=[{"uuid": self.nova.info["network_id"]}],
            metadata={META_CLUSTER: osas.cluster.cluster_name, META_GROUP: "workers"},
            tags=[osas.tag],
            **(hints if scheduling_delay else {}),
        )
        self.made.append(server.id)
        return str(server.id)


@pytest.fixture
def operator(nova, conn) -> Iterator[Operator]:
    """The servers a test boots are deleted after it (by the test, never by osas)."""
    hand = Operator(nova, conn)
    yield hand
    for server_id in hand.made:
        conn.compute.delete_server(server_id, ignore_missing=True)


def active(conn: openstack.connection.Connection, server_id: str) -> Any:
    """The server once ACTIVE with no task (metadata and tag edits get 409 in BUILD)."""

    def check() -> Any:
        server = conn.compute.get_server(server_id)
        assert server.status != "ERROR", server.fault
        return server if server.status == "ACTIVE" and not server.task_state else None

    return wait_for(check, f"server {server_id} ACTIVE")


def updated(server: Any) -> datetime:
    return datetime.fromisoformat(server.updated_at)


# -- the Date header --------------------------------------------------------------------------


def assert_nova_time(when: datetime | None, before: datetime, after: datetime) -> None:
    assert when is not None  # the Date header of the listing's first answer
    assert when.utcoffset() == timedelta(0)
    assert when.microsecond == 0  # Date has whole seconds
    # Same host, same clock: within the round trip, the whole seconds, a loaded machine.
    lowest = before - timedelta(seconds=SLACK)
    assert lowest <= when <= after + timedelta(seconds=SLACK), (before, when, after)


async def test_listings_carry_novas_date(nova, conn, osas_cloud):
    """Every listing osas makes carries Nova's clock (its answer's Date header): present,
    UTC, whole seconds, and on this host within seconds of the test's own clock."""
    before = datetime.now(UTC)
    tagged = await osas_cloud.list_servers(f"{TAG_CLUSTER_PREFIX}{uuid.uuid4().hex[:10]}")
    changes = await osas_cloud.list_changes(before - timedelta(minutes=5))
    pages = [p async for p in osas_cloud.list_server_pages(None, changes_since=before)]
    after = datetime.now(UTC)
    assert tagged.records == []
    assert_nova_time(tagged.nova_time, before, after)
    assert_nova_time(changes.nova_time, before, after)
    assert pages
    for page in pages:
        assert_nova_time(page.nova_time, before, after)
    # What the front HTTP server sends: the same clock a plain GET shows.
    raw = nova_now(conn)
    assert abs((raw - tagged.nova_time).total_seconds()) <= SLACK


# -- changes-since with osas's clock off by minutes ------------------------------------------


@pytest.mark.parametrize("osas_ahead", [SKEW, -SKEW], ids=["osas-ahead", "osas-behind"])
async def test_one_incremental_sync_sees_changes_whatever_osas_clock(
    operator, osas_cloud, tmp_path, osas_ahead
):
    """osas's wall clock 7 minutes ahead of Nova's (or behind): a metadata key set by hand
    (which bumps ``updated``) and a server deleted by hand both reach the inventory in one
    incremental sync. Taken from osas's clock, changes-since ahead of Nova's hid every change
    until the next complete listing."""

    def skewed() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=osas_ahead)

    conn = operator.conn
    osas = osas_on(osas_cloud, tmp_path, wall_clock=skewed)
    moved, victim = (operator.boot(osas, f"clock-{i}") for i in range(2))
    for server_id in (moved, victim):
        active(conn, server_id)
    inventory, status = osas.inventory, osas.reconciler.status
    with structlog.testing.capture_logs() as logs:
        await osas.reconciler.reconcile_once(full=True)
        assert {inventory.server(s).group_id for s in (moved, victim)} == {"workers"}

        conn.compute.set_server_metadata(moved, **{META_GROUP: "spare"})  # bumps updated
        conn.compute.delete_server(victim)
        wait_for(lambda: conn.compute.find_server(victim) is None, "the delete")
        assert inventory.server(victim) is not None  # nothing has synced since

        orders = await osas.reconciler.reconcile_once(full=False)
    assert (status.full_syncs, status.incremental_syncs, status.clock_jumps) == (1, 1, 0)
    assert inventory.server(victim) is None
    shown = inventory.server(moved)
    assert shown is not None
    assert shown.group_id == "spare"
    assert orders.deletes == ()
    # Nova minus osas, from the Date of Nova's answers.
    assert status.nova_clock_offset is not None
    assert abs(status.nova_clock_offset + osas_ahead) <= SLACK, status.nova_clock_offset
    warned = [e for e in logs if e["event"] == DISAGREE]
    assert len(warned) == 1  # said once, however many syncs saw it
    assert abs(warned[0]["nova_minus_osas_seconds"] + osas_ahead) <= SLACK


# -- ownership marks removed by hand ----------------------------------------------------------


def delete_cluster_metadata(conn: openstack.connection.Connection, osas: Osas, sid: str) -> None:
    conn.compute.delete_server_metadata(sid, [META_CLUSTER])
    assert META_CLUSTER not in conn.compute.get_server(sid).metadata


def remove_cluster_tag(conn: openstack.connection.Connection, osas: Osas, sid: str) -> None:
    conn.compute.remove_tag_from_server(sid, osas.tag)  # DELETE /servers/{id}/tags/{tag}
    assert osas.tag not in conn.compute.get_server(sid).tags
    assert sid not in {s.id for s in conn.compute.servers(tags=osas.tag)}


@pytest.mark.parametrize(
    "edit",
    [delete_cluster_metadata, remove_cluster_tag],
    ids=["metadata-key-deleted", "cluster-tag-removed"],
)
async def test_a_mark_removed_by_hand_is_seen_by_the_complete_listing(
    operator, osas_cloud, tmp_path, edit
):
    """The ``osas-cluster`` metadata key deleted, or the cluster tag removed, through the
    project's API: real Nova leaves ``updated`` as it was, so its ``changes-since`` listing
    does not return the server and an incremental sync keeps it. The next complete listing
    reads every server's details again: the server leaves the inventory, the ledger says it
    lost its marks, and a DeleteNodes naming it is refused. Nothing deletes it.

    ``changes_since_overlap`` is 1 s here (60 s by default): the incremental listing then
    asks only about what changed after the complete one, as for a server not touched for a
    minute (within the overlap the server would be listed, and leave at once)."""
    conn = operator.conn
    osas = osas_on(osas_cloud, tmp_path, overlap=1.0)
    edited, kept = (operator.boot(osas, f"marks-{i}") for i in range(2))
    was = {server_id: updated(active(conn, server_id)) for server_id in (edited, kept)}
    last = max(was.values())
    # Nova's clock well past the servers' last update: changes-since from now on shows only
    # what changes from now on.
    wait_for(lambda: nova_now(conn) >= last + timedelta(seconds=QUIET), "Nova's clock")
    inventory, ledger = osas.inventory, osas.inventory.ledger
    await osas.reconciler.reconcile_once(full=True)
    assert inventory.server(edited) is not None

    before_edit = nova_now(conn)
    edit(conn, osas, edited)
    after = conn.compute.get_server(edited)
    assert after.status == "ACTIVE"
    assert updated(after) == was[edited] < before_edit  # not bumped
    # Real Nova's changes-since (inclusive, whole seconds) does not return it...
    assert edited not in changed_since(conn, before_edit)
    # ...though it returns the server for a time at or before its `updated`.
    assert edited in changed_since(conn, updated(after))

    orders = await osas.reconciler.reconcile_once(full=False)
    assert osas.reconciler.status.incremental_syncs == 1
    assert inventory.server(edited) is not None  # changes-since cannot show the edit
    assert not ledger.lost_marks(osas.provider_id(edited))
    assert orders.deletes == ()

    orders = await osas.reconciler.reconcile_once(full=True)
    assert osas.reconciler.status.full_syncs == 2
    assert inventory.server(edited) is None
    assert ledger.lost_marks(osas.provider_id(edited))
    assert inventory.server(kept) is not None
    assert not ledger.lost_marks(osas.provider_id(kept))
    assert orders.deletes == ()
    node = [(after.name, osas.provider_id(edited))]
    with pytest.raises(PreconditionFailed, match="ownership marks"):
        plan_delete(osas.cluster, inventory, "workers", node)
    # Still in Nova, running, with no delete on its way.
    final = conn.compute.get_server(edited)
    assert (final.status, final.task_state) == ("ACTIVE", None)


# -- a server deleted while Nova still schedules it --------------------------------------------


async def test_a_server_deleted_while_scheduling_leaves_the_inventory_in_one_sync(
    operator, osas_cloud, tmp_path
):
    """Issue 31, problem 6: a server deleted while Nova still schedules it leaves no row at
    all for ``changes-since`` (only its build request is deleted; no instance was ever made in
    a cell), so an incremental sync never saw it go and it stayed in CA's view until the next
    complete listing. Each incremental sync reads the servers still building again (a tagged
    ``status=BUILD`` listing, which shows a server still scheduling, then a GET for one it no
    longer shows): it leaves within one, and the one still scheduling stays.

    Nova's scheduler is made slow for these two servers (``SCHEDULING_DELAY_HINT``) so that
    the delete lands while it schedules, whatever the machine's load."""
    conn = operator.conn
    osas = osas_on(osas_cloud, tmp_path)
    since = nova_now(conn) - timedelta(seconds=SLACK)
    doomed = operator.boot(osas, "scheduling-0", scheduling_delay=SCHEDULING_HOLD)
    kept = operator.boot(osas, "scheduling-1", scheduling_delay=SCHEDULING_HOLD)
    await osas.reconciler.reconcile_once(full=True)
    for server_id in (doomed, kept):
        shown = osas.inventory.server(server_id)
        assert shown is not None
        assert (shown.status, shown.task_state) == ("BUILD", "scheduling")
    conn.compute.delete_server(doomed)
    wait_for(lambda: conn.compute.find_server(doomed) is None, "the delete")
    # What this test is about: real Nova's own changes-since has no row for it at all.
    assert doomed not in changed_since(conn, since)
    assert conn.compute.get_server(kept).task_state == "scheduling"  # still
    building = await osas_cloud.list_building(osas.tag)
    assert [record.server_id for record in building.records] == [kept]
    await osas.reconciler.reconcile_once(full=False)
    assert osas.inventory.server(doomed) is None
    still = osas.inventory.server(kept)
    assert still is not None
    assert still.status == "BUILD"
    # Its scheduling over (so no conductor thread still waits when Nova stops), it builds.
    active(conn, kept)
    await osas.reconciler.reconcile_once(full=False)
    running = osas.inventory.server(kept)
    assert running is not None
    assert running.status == "ACTIVE"
