"""The engine against the in-memory cloud: idempotent creates, restarts, syncs and faults."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
import structlog
from fake_cloud import FakeCloud
from support import CLUSTER, Provider, eventually, make_config, nodes, provider_id, running

from osas.cloud.errors import CloudUnavailable
from osas.cloud.port import ServerListing
from osas.domain.errors import NotReady, PreconditionFailed
from osas.domain.inventory import InstanceState
from osas.domain.limits import NodeInfo
from osas.domain.servers import META_CLUSTER, META_GROUP, TAG_CLUSTER_PREFIX, ServerRecord
from osas.sim.model import SCHEDULING, FakeNova

TAG = f"{TAG_CLUSTER_PREFIX}{CLUSTER}"


def ours(nova: FakeNova, group: str = "workers", name: str = "n") -> str:
    server = nova.seed(name=name, metadata={META_CLUSTER: CLUSTER, META_GROUP: group}, tags=[TAG])
    return server.server_id


async def test_lost_create_answer_does_not_duplicate(tmp_path):
    nova = FakeNova()
    nova.faults.lost_create_responses = 2  # Nova made the server, the answer never arrived
    async with running(make_config(tmp_path), FakeCloud(nova)) as provider:
        controller = provider.app.controller
        await controller.group_to_change("workers").increase_size(2)
        await eventually(lambda: not provider.app.queue.in_hand_count(), what="creates done")
        await provider.sync()
        assert len(nova.live_servers()) == 2
        assert nova.calls["servers.create"] == 2  # looked up by request tag, never re-sent
        assert controller.group("workers").target_size() == 2
        assert not provider.app.inventory.ledger.failures_of("workers")


async def test_restart_mid_scale_up_loses_nothing_and_duplicates_nothing(tmp_path):
    nova = FakeNova()
    nova.faults.latency = 0.2
    config = make_config(tmp_path, queue={"capacity": 50, "workers": 1})
    first = Provider(config, FakeCloud(nova))
    await first.start()
    await first.app.controller.group_to_change("workers").increase_size(4)
    await eventually(lambda: len(nova.live_servers()) == 2, what="two of four created")
    await first.stop()  # killed mid scale-up: queued creates are dropped, never half-made
    made = {s.server_id for s in nova.live_servers()}
    assert 2 <= len(made) <= 3  # an in-flight create may complete during the shutdown

    nova.faults.latency = 0.0
    async with running(config, FakeCloud(nova)) as second:
        controller = second.app.controller
        assert controller.group("workers").target_size() == len(made)
        ids = {i.instance_id for i in controller.group("workers").nodes()}
        assert ids == {provider_id(s) for s in made}
        # CA sees the target short of what it asked and asks again: the rest is created once.
        await controller.group_to_change("workers").increase_size(4 - len(made))
        await eventually(lambda: len(nova.live_servers()) == 4, what="four servers")
        await second.sync()
        assert controller.group("workers").target_size() == 4
        assert len({s.name for s in nova.live_servers()}) == 4


async def test_incremental_sync_sees_changes_and_our_deletions(tmp_path):
    nova = FakeNova()
    kept = ours(nova, name="kept")
    async with running(make_config(tmp_path), FakeCloud(nova)) as provider:
        app = provider.app
        added = ours(nova, name="added")
        calls_before = nova.calls["servers.list"]
        await provider.sync(full=False)
        assert nova.calls["servers.list"] == calls_before + 1
        assert app.inventory.server(added) is not None
        nova.activate()
        await app.controller.group_to_change("workers").delete_nodes(
            nodes([("kept", provider_id(kept))])
        )
        await eventually(
            lambda: app.inventory.server(kept) is not None and not nova.get_server(kept)
        )
        await provider.sync(full=False)
        # Tag filters hide deleted servers; osas asks for the ones it deletes by id.
        assert app.inventory.server(kept) is None
        assert app.inventory.ledger.deleting_ids() == []
        assert app.controller.group("workers").target_size() == 1


async def test_servers_deleted_behind_our_back_vanish_at_the_next_incremental_sync(tmp_path):
    nova = FakeNova()
    gone = ours(nova, name="gone")
    ours(nova, name="stays")
    async with running(make_config(tmp_path), FakeCloud(nova)) as provider:
        nova.delete_server(gone)
        await provider.sync(full=False)  # untagged changes-since shows it DELETED
        assert provider.app.inventory.server(gone) is None
        assert provider.app.controller.group("workers").target_size() == 1


def building(nova: FakeNova, name: str) -> str:
    """One of ours in BUILD, still scheduling, as a create leaves it."""
    server = nova.seed(
        name=name, metadata={META_CLUSTER: CLUSTER, META_GROUP: "workers"}, tags=[TAG]
    )
    server.status, server.task_state = "BUILD", SCHEDULING
    return server.server_id


async def quiet(provider: Provider, nova: FakeNova) -> None:
    """Nova's clock an hour on, and one incremental sync: from here ``changes-since`` shows
    only what Nova stamps later (the overlap no longer brings back the seeded servers), so
    only the reads of building servers can see a server vanish."""
    nova.clock_offset = 3600.0
    await provider.sync(full=False)


async def test_a_server_deleted_while_scheduling_vanishes_at_the_next_incremental_sync(tmp_path):
    """Issue 31, problem 6: real Nova leaves no DELETED row for a server deleted while it
    still schedules it, so ``changes-since`` never shows it go, and it stayed in CA's view
    until the next complete listing. Each incremental sync reads the servers still building
    again: one tagged BUILD listing, a GET only for one it no longer shows; none of either
    when nothing builds."""
    nova = FakeNova()  # BUILD until activated
    nova.faults.deletes_while_scheduling_vanish = True
    doomed = building(nova, "doomed")
    kept = building(nova, "kept")
    async with running(make_config(tmp_path), FakeCloud(nova)) as provider:
        app = provider.app
        view = app.controller.group("workers")
        assert view.target_size() == 2
        await quiet(provider, nova)

        def calls() -> tuple[int, int]:
            return nova.calls["servers.list"], nova.calls["servers.get"]

        lists, gets = calls()
        await provider.sync(full=False)
        assert calls() == (lists + 2, gets)  # changes-since, BUILD: both shown, no GET
        assert nova.delete_server(doomed)  # by hand, while Nova schedules it
        assert nova.find_server(doomed) is None  # no row left for changes-since
        lists, gets = calls()
        await provider.sync(full=False)
        assert calls() == (lists + 2, gets + 1)  # one GET: the one the BUILD listing left out
        assert app.inventory.server(doomed) is None
        assert provider_id(doomed) not in {i.instance_id for i in view.nodes()}
        assert view.target_size() == 1
        assert app.inventory.server(kept) is not None
        assert nova.calls["servers.delete"] == 1  # the hand's: osas deleted nothing
        nova.activate()
        await provider.sync(full=False)  # changes-since shows it ACTIVE
        assert [i.state for i in view.nodes()] == [InstanceState.RUNNING]
        lists, gets = calls()
        await provider.sync(full=False)
        assert calls() == (lists + 1, gets)  # nothing builds: changes-since alone


@dataclass
class UnreadableBuilds(FakeCloud):
    """The reads of building servers refused as a 5xx would be, when a test says so."""

    refuse_listing: bool = False
    refuse_gets: set[str] = field(default_factory=set)

    async def list_building(self, tag: str) -> ServerListing:
        if self.refuse_listing:
            raise CloudUnavailable("503 Service Unavailable (injected)")
        return await super().list_building(tag)

    async def get_server(self, server_id: str) -> ServerRecord | None:
        if server_id in self.refuse_gets:
            raise CloudUnavailable("503 Service Unavailable (injected)")
        return await super().get_server(server_id)


async def test_building_servers_that_cannot_be_read_again_fail_no_sync(tmp_path):
    """A read of building servers that fails (the BUILD listing, or one server's GET) never
    fails the sync: what it could not read is kept as it was and read again by the next
    sync; the rest is settled. Said once while it lasts, and once when it works again."""
    nova = FakeNova()
    nova.faults.deletes_while_scheduling_vanish = True
    first, second = building(nova, "first"), building(nova, "second")
    cloud = UnreadableBuilds(nova)
    async with running(make_config(tmp_path), cloud) as provider:
        app = provider.app
        await quiet(provider, nova)
        nova.delete_server(first)
        nova.delete_server(second)
        with structlog.testing.capture_logs() as logs:
            cloud.refuse_listing = True
            await provider.sync(full=False)
            await provider.sync(full=False)
            assert app.inventory.server(first) is not None
            assert app.inventory.server(second) is not None
            cloud.refuse_listing, cloud.refuse_gets = False, {first}
            await provider.sync(full=False)  # the BUILD listing works; one GET fails
            assert app.inventory.server(first) is not None
            assert app.inventory.server(second) is None
            cloud.refuse_gets = set()
            await provider.sync(full=False)
            assert app.inventory.server(first) is None
        assert app.controller.group("workers").target_size() == 0
        status = app.reconciler.status
        assert (status.consecutive_failures, status.failures, status.last_error) == (0, 0, None)
        said = [e for e in logs if "still building" in e["event"]]
        levels = [e["log_level"] for e in said if e["log_level"] != "debug"]
        assert levels == ["warning", "info"], said
        assert said[0]["error"] == "503 Service Unavailable (injected)"


async def test_a_building_server_that_lost_a_mark_leaves_cas_view_and_is_never_deleted(
    tmp_path,
):
    """A building server read again without one of the cluster's marks (the metadata mark,
    still listed by its tag; or the tag, so only a GET finds it) is no longer ours: it
    leaves CA's view at that sync and is never deleted."""
    nova = FakeNova()
    unmarked, untagged = building(nova, "unmarked"), building(nova, "untagged")
    async with running(make_config(tmp_path), FakeCloud(nova)) as provider:
        app = provider.app
        await quiet(provider, nova)
        # In the model's own rows: Nova bumps no updated_at for either edit.
        del nova.get_server(unmarked).metadata[META_GROUP]
        nova.get_server(untagged).tags.discard(TAG)
        await provider.sync(full=False)
        assert app.inventory.server(unmarked) is None
        assert app.inventory.server(untagged) is None
        assert app.controller.group("workers").target_size() == 0
        assert nova.calls["servers.delete"] == 0
        assert {s.server_id for s in nova.live_servers()} == {unmarked, untagged}


async def test_foreign_servers_are_never_reported_or_deleted(tmp_path):
    nova = FakeNova()
    look_alikes = [
        nova.seed(name=f"{CLUSTER}-workers-x", tags=[TAG]),  # tag, no metadata
        nova.seed(name=f"{CLUSTER}-workers-y", metadata={META_CLUSTER: CLUSTER}, tags=[TAG]),
        nova.seed(
            name=f"{CLUSTER}-workers-z", metadata={META_CLUSTER: CLUSTER, META_GROUP: "workers"}
        ),  # metadata, no tag
        nova.seed(
            name=f"{CLUSTER}-workers-w",
            metadata={META_CLUSTER: "prod", META_GROUP: "workers"},
            tags=[TAG],
        ),  # our tag, another cluster's metadata
    ]
    async with running(make_config(tmp_path), FakeCloud(nova)) as provider:
        controller = provider.app.controller
        assert controller.group("workers").target_size() == 0
        assert controller.group("workers").nodes() == []
        for server in look_alikes:
            assert (
                controller.node_answer(NodeInfo(server.name, provider_id(server.server_id))) is None
            )
            assert controller.node_answer(NodeInfo(server.name, "")) is None
    assert len(nova.live_servers()) == len(look_alikes)
    assert nova.calls["servers.delete"] == 0


async def test_delete_refused_when_marks_changed_since_the_sync(tmp_path):
    """A server whose mark changed by hand since the last listing: DeleteNodes is refused
    with the reason (never OK, then a silent refusal that CA would ask again for ever), the
    server leaves CA's view, and is not deleted."""
    nova = FakeNova()
    server_id = ours(nova, name="a")
    ours(nova, name="b")
    async with running(make_config(tmp_path), FakeCloud(nova)) as provider:
        nova.get_server(server_id).metadata[META_CLUSTER] = "someone-else"
        group = provider.app.controller.group_to_change("workers")
        with pytest.raises(PreconditionFailed, match="ownership marks"):
            await group.delete_nodes(nodes([("a", provider_id(server_id))]))
        assert nova.get_server(server_id) is not None
        assert nova.calls["servers.delete"] == 0
        view = provider.app.controller.group("workers")
        assert provider_id(server_id) not in {i.instance_id for i in view.nodes()}
        assert view.target_size() == 1
        # CA asking again gets the reason again, not an OK.
        with pytest.raises(PreconditionFailed, match="ownership marks"):
            await group.delete_nodes(nodes([("a", provider_id(server_id))]))


async def test_failed_sync_keeps_inventory_and_refresh_fails_when_stale(tmp_path):
    nova = FakeNova()
    ours(nova)
    reconcile = {
        "interval": "1h",
        "full_resync_interval": "1h",
        "max_inventory_age": "2h",
        "retry_backoff": 0.01,
        "hold_after_start": False,
    }
    async with running(make_config(tmp_path, reconcile=reconcile), FakeCloud(nova)) as provider:
        app = provider.app
        nova.faults.error_rate = 1.0
        with pytest.raises(Exception, match="503"):
            await provider.sync()
        assert app.controller.group("workers").target_size() == 1  # last good state still served
        app.controller.refresh()  # young enough: CA carries on
        app.inventory.snapshot.listed_at -= 3 * 3600  # three hours without a good sync
        with pytest.raises(NotReady, match="old"):
            app.controller.refresh()
        nova.faults.error_rate = 0.0
        await provider.sync()
        app.controller.refresh()


async def sync_despite_faults(provider: Provider) -> None:
    for _ in range(50):
        try:
            await provider.sync()
        except CloudUnavailable:
            continue
        return
    msg = "no sync got through"
    raise AssertionError(msg)


async def test_faulty_cloud_scale_up_then_down_converges(tmp_path):
    nova = FakeNova()
    nova.faults.error_rate = 0.3
    nova.faults.latency = 0.005
    cloud = FakeCloud(nova, seed=7)
    reconcile = {
        "interval": "1h",
        "full_resync_interval": "1h",
        "max_inventory_age": "2h",
        "retry_backoff": 0.01,
        "hold_after_start": False,
        "delete_retry_after": 0.05,
        "create_doubt_window": 0.2,
    }
    config = make_config(
        tmp_path,
        queue={"capacity": 100, "workers": 4},
        reconcile=reconcile,
        openstack={"api_timeout": 0.1},
    )
    async with running(config, cloud) as provider:
        app = provider.app
        for _ in range(3):
            await app.controller.group_to_change("workers").increase_size(3)
        await eventually(lambda: not app.queue.in_hand_count(), what="creates sent")
        # A 5xx leaves a create in doubt: never sent again, reported failed once the window
        # has passed without its server showing up; CA deletes those.
        await asyncio.sleep(0.3)
        await sync_despite_faults(provider)
        failed = [i for i in app.controller.group("workers").nodes() if i.error is not None]
        if failed:
            await app.controller.group_to_change("workers").delete_nodes(
                nodes([(i.instance_id, i.instance_id) for i in failed])
            )
        await sync_despite_faults(provider)
        live = {s.server_id for s in nova.live_servers()}
        assert app.controller.group("workers").target_size() == len(live)
        assert len({s.name for s in nova.live_servers()}) == len(live)  # no duplicate
        running_ids = [
            i.instance_id
            for i in app.controller.group("workers").nodes()
            if i.state != InstanceState.DELETING
        ]
        # A DeleteNodes that Nova's 5xx kept from reaching it is refused, and CA asks again.
        for pid in running_ids[1:]:
            for _ in range(100):
                try:
                    await app.controller.group_to_change("workers").delete_nodes(
                        nodes([("n", pid)])
                    )
                except CloudUnavailable:
                    continue
                break
        assert app.controller.group("workers").target_size() == 1
        for _ in range(200):
            if len(nova.live_servers()) == 1:
                break
            await sync_despite_faults(provider)
            await asyncio.sleep(0.05)
        assert len(nova.live_servers()) == 1
        nova.faults.error_rate = 0.0
        await provider.sync()
        assert app.controller.group("workers").target_size() == 1
        assert app.inventory.ledger.deleting_ids() == []


async def test_a_delete_that_cannot_reach_nova_is_refused_and_the_server_stays(tmp_path):
    """DeleteNodes answers OK only once Nova took the DELETE: when it cannot, CA is told
    (UNAVAILABLE), the server stays counted, and osas sends nothing later on its own (CA
    untainted the node; deleting it behind CA's back would surprise its pods)."""
    nova = FakeNova()
    doomed = ours(nova, name="doomed")
    ours(nova, name="kept")
    reconcile = {
        "interval": "1h",
        "full_resync_interval": "1h",
        "max_inventory_age": "2h",
        "retry_backoff": 0.01,
        "hold_after_start": False,
        "delete_retry_after": 0.01,
    }
    config = make_config(tmp_path, reconcile=reconcile)
    async with running(config, FakeCloud(nova)) as provider:
        app = provider.app
        nova.faults.error_rate = 1.0  # every call fails
        with pytest.raises(CloudUnavailable, match="could not read"):
            await app.controller.group_to_change("workers").delete_nodes(
                nodes([("doomed", provider_id(doomed))])
            )
        assert app.controller.group("workers").target_size() == 2
        assert app.inventory.ledger.deleting_ids() == []
        nova.faults.error_rate = 0.0
        await asyncio.sleep(0.02)
        await provider.sync()
        assert nova.get_server(doomed) is not None
        assert nova.calls["servers.delete"] == 0
        # Asked again with Nova answering: deleted before the answer.
        await app.controller.group_to_change("workers").delete_nodes(
            nodes([("doomed", provider_id(doomed))])
        )
        assert nova.calls["servers.delete"] == 1
        assert app.controller.group("workers").target_size() == 1
