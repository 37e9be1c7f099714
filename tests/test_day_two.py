"""Day two: what operators do to a running osas, and what happens around it, as inputs to the
lifecycle. One test per problem of the issue that asked for this, each against a real osas on
127.0.0.1 and the simulated OpenStack over HTTP: a reload lowering max_size, servers of an
earlier life, credentials refused, reloads reaching templates, a server deleted by hand, the
metrics port under load, Refresh storms, certificate rotation without ``tls.server_names``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import urllib.request
from datetime import timedelta

import grpc
import pytest
import structlog
from support import (
    BIG,
    CLUSTER,
    TAG,
    Provider,
    big_config,
    ca_client,
    cloud_for,
    config_data,
    eventually,
    expect_status,
    kept,
    ours,
    seed_earlier,
    write_config,
)

from osas.config import load_config
from osas.domain.ledger import MAX_SIZE_LOWERED, CreateState
from osas.domain.problems import Problem
from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

# -- 2: servers of an earlier life are reported, never deleted ----------------------------------


async def test_running_servers_sharing_a_request_id_are_reported_not_deleted(tmp_path):
    """Servers that share one request id, made by another tool, a copied template, an older
    osas or Nova's multi-create: osas did not send that request, so none of them is its to
    delete. Reported (log, metric, /status), counted in the target; CA's creates go on."""
    shared = 300
    request_id = "0123456789abcdef0123456789abcdef"
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        for index in range(shared):
            seed_earlier(sim.nova, "big", request_id, name=f"{CLUSTER}-big-copy-{index}")
        config = big_config(tmp_path, node_groups=[{**BIG, "max_size": shared + 10}])
        provider = Provider(config, cloud_for(sim))
        with structlog.testing.capture_logs() as logs:
            await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                assert await ca.target_size("big") == shared
                await ca.increase("big", 2)  # not held up behind hundreds of deletes
                await eventually(
                    lambda: len(ours(sim)) == shared + 2, timeout=10, what="two new servers"
                )
                await provider.sync(full=True)
                assert await ca.target_size("big") == shared + 2
                assert len(kept(await ca.nodes("big"))) == shared + 2
            status = provider.app.status()
            problems = provider.app.reconciler.problems.counts()
        finally:
            await provider.stop()
        deleted = [s for s in sim.nova.all_servers() if s.deleting_since is not None]
    assert deleted == []
    assert problems[("big", Problem.SHARED_REQUEST)] == shared
    assert status["problems"]["shared-request-id"] == shared
    assert [e["request_id"] for e in logs if e["event"] == "shared-request-kept"] == [request_id]


def seed_running(sim: SimulatedOpenStack, count: int, group: str = "big") -> set[str]:
    """Running servers of an earlier osas, each of its own request."""
    ids = set()
    for index in range(count):
        name = f"{CLUSTER}-{group}-{index}"
        ids.add(seed_earlier(sim.nova, group, f"{index:032x}", name=name).server_id)
    return ids


def sim_config(tmp_path, sim: SimulatedOpenStack, **overrides):
    """A configuration file for osas against ``sim``, reloadable: (data, path)."""
    values = {
        "openstack": {"auth": sim.clouds_yaml_entry()["auth"], "api_timeout": "5s"},
        "node_groups": [BIG],
        "queue": {"capacity": 50, "workers": 2},
        "reconcile": {
            "interval": "0.2s",
            "full_resync_interval": "1h",
            "max_inventory_age": "1h",
            "retry_backoff": "0.01s",
            "hold_after_start": False,  # a new cloud (support.config_data)
        },
    }
    data = config_data(**{**values, **overrides})
    return data, write_config(tmp_path, data)


# -- 1: lowering max_size by reload ---------------------------------------------------------------


async def test_lowering_max_size_by_reload_sends_no_create_beyond_it_and_deletes_nothing(
    tmp_path,
):
    """6 servers running, 8 creates just accepted, Nova slow; max_size 20 -> 3 by reload. The
    creates not yet sent are cancelled, reported to CA as failed (MaxSizeLowered, as CA
    expects of a create that will not happen); those in flight finish; no server is deleted;
    the group is reported above max_size for CA's scale-down."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        running = seed_running(sim, 6)
        data, path = sim_config(tmp_path, sim, node_groups=[{**BIG, "max_size": 20}])
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        ledger = provider.app.inventory.ledger
        try:
            async with ca_client(provider.address) as ca:
                sim.nova.faults.create_stall = 1.0  # each create takes a second in Nova
                await ca.increase("big", 8)
                await eventually(
                    lambda: any(c.state is CreateState.SENDING for c in ledger.creates()),
                    what="a create on its way",
                )
                data["node_groups"][0]["max_size"] = 3
                write_config(tmp_path, data)
                assert await provider.app.reload_once() == "applied"
                in_flight = {
                    c.request_id for c in ledger.creates() if c.state is not CreateState.FAILED
                }
                assert 1 <= len(in_flight) <= 2  # what the two workers hold
                instances = await ca.nodes("big")
                cancelled = [
                    i for i in instances if i.status.errorInfo.errorCode == MAX_SIZE_LOWERED
                ]
                assert len(cancelled) == 8 - len(in_flight)
                assert all(i.status.errorInfo.instanceErrorClass == 99 for i in cancelled)
                await expect_status(grpc.StatusCode.FAILED_PRECONDITION, ca.increase("big", 1))
                # CA's clean-up of failed creates, while the ones in flight finish.
                await ca.delete("big", [(i.id, i.id) for i in cancelled])
                sim.nova.faults.create_stall = 0.0
                await eventually(lambda: not list(ledger.creates()), timeout=15, what="settled")
                await provider.sync(full=True)
                servers = {s.server_id for s in ours(sim)}
                assert await ca.target_size("big") == len(servers)
        finally:
            await provider.stop()
        everything = [s for s in sim.nova.all_servers() if s.metadata.get(META_GROUP) == "big"]
    assert running <= servers  # no running server deleted
    assert all(s.deleting_since is None for s in everything)
    made = {s.metadata[META_REQUEST] for s in everything if s.server_id not in running}
    assert made == in_flight  # nothing POSTed after the reload but what was on its way
    assert len(servers) == 6 + len(in_flight)


# -- 4: reloads reach templates at once, and a group added back starts clean ----------------


async def test_a_reload_reaches_templates_at_once_and_a_group_added_back_starts_clean(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        data, path = sim_config(tmp_path, sim)
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                small = await ca.template("big")
                # A quota failure CA has not cleaned up yet.
                sim.nova.faults.quota_exceeded = 1
                await ca.increase("big", 1)
                await eventually(
                    lambda: bool(provider.app.inventory.ledger.failures_of("big")),
                    what="a failed create",
                )
                # The flavor changes and a group is added: both answer the template at once,
                # no complete listing needed (full_resync_interval is an hour here).
                extra = {**BIG, "id": "extra", "flavor": "m1.large"}
                data["node_groups"] = [{**BIG, "flavor": "m1.medium"}, extra]
                write_config(tmp_path, data)
                assert await provider.app.reload_once() == "applied"
                await ca.refresh()
                medium = await ca.template("big")
                large = await ca.template("extra")
                # Removed, then added back: its old failure does not back it off again.
                data["node_groups"] = [extra]
                write_config(tmp_path, data)
                assert await provider.app.reload_once() == "applied"
                await ca.refresh()
                await expect_status(grpc.StatusCode.NOT_FOUND, ca.nodes("big"))
                data["node_groups"] = [BIG, extra]
                write_config(tmp_path, data)
                assert await provider.app.reload_once() == "applied"
                await ca.refresh()
                failures = [i for i in await ca.nodes("big") if i.status.HasField("errorInfo")]
        finally:
            await provider.stop()
    assert small.nodeBytes != medium.nodeBytes
    assert b"m1.medium" in medium.nodeBytes
    assert b"m1.large" in large.nodeBytes
    assert failures == []


# -- 5: a server deleted behind osas's back ------------------------------------------------------


async def test_a_server_deleted_by_hand_leaves_cas_view_within_one_incremental_sync(tmp_path):
    """Someone deletes a server in Horizon. One incremental sync later (about 10 s at the
    defaults) NodeGroupNodes no longer lists it and TargetSize no longer counts it: CA stops
    counting capacity that is gone. The sync's cost is one untagged changes-since listing of
    what changed in the project, whatever else the project holds."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05, delete_seconds=0.0)) as sim:
        ids = sorted(seed_running(sim, 5))
        for index in range(300):  # a project shared with much else
            sim.nova.seed(name=f"other-{index}", metadata={META_CLUSTER: "other"})
        _, path = sim_config(tmp_path, sim)
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                assert await ca.target_size("big") == 5
                sim.nova.delete_server(ids[0])  # by hand, not through osas
                sim.calls.clear()
                sim.history.clear()
                await provider.sync(full=False)
                listed = [e for e in sim.history if e.operation == "compute.servers.list"]
                calls = dict(sim.calls)
                target = await ca.target_size("big")
                instances = {i.id for i in await ca.nodes("big")}
        finally:
            await provider.stop()
    assert target == 4
    assert f"openstack:///{ids[0]}" not in instances
    assert len(instances) == 4
    assert calls == {"compute.servers.list": 1}  # one listing, no GET per server
    assert "changes-since" in listed[0].target
    assert "tags" not in listed[0].target


async def test_a_mark_removed_by_hand_never_loops_ca(tmp_path):
    """Issue 20, problem 3: `openstack server unset --property osas-cluster` (Nova's metadata
    DELETE leaves updated_at alone, so no changes-since shows it). DeleteNodes of that server
    answered OK, the worker then refused to delete it, and the server came back into CA's
    view: CA asked again every loop. Now DeleteNodes reads the server before answering and
    refuses with the reason; the server leaves CA's view and is never deleted; asked again,
    the same refusal. Another server unmarked by hand (a metadata key deleted, or its cluster
    tag removed, which takes it out of the tagged listing) leaves CA's view at the next
    complete listing, which reads every server's marks again; DeleteNodes of it is refused
    with the reason too."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05, delete_seconds=0.0)) as sim:
        sim.nova.clock_offset = -3600.0  # made an hour ago: no changes-since overlaps them
        ids = sorted(seed_running(sim, 4))
        sim.nova.clock_offset = 0.0
        _, path = sim_config(tmp_path, sim)
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                assert await ca.target_size("big") == 4
                unmarked, unlisted, untagged = ids[0], ids[1], ids[2]
                sim.nova.delete_metadata_key(unmarked, META_CLUSTER)
                sim.nova.delete_metadata_key(unlisted, META_GROUP)
                with sim.nova.lock:  # DELETE /servers/{id}/tags/{tag}: updated_at unchanged
                    sim.nova.find_server(untagged).tags.discard(TAG)
                await provider.sync(full=False)  # nothing for changes-since to show
                assert f"openstack:///{unmarked}" in {i.id for i in await ca.nodes("big")}
                node = [(f"n-{unmarked[:6]}", f"openstack:///{unmarked}")]
                for _ in range(2):  # CA's loop asking again gets the reason again
                    details = await expect_status(
                        grpc.StatusCode.FAILED_PRECONDITION, ca.delete("big", node)
                    )
                    assert unmarked in details
                    assert "ownership marks" in details
                assert f"openstack:///{unmarked}" not in {i.id for i in await ca.nodes("big")}
                assert await ca.target_size("big") == 3
                await provider.sync(full=True)
                shown = {i.id for i in await ca.nodes("big")}
                assert f"openstack:///{unlisted}" not in shown
                assert f"openstack:///{untagged}" not in shown
                assert await ca.target_size("big") == 1
                node = [(f"n-{untagged[:6]}", f"openstack:///{untagged}")]
                details = await expect_status(
                    grpc.StatusCode.FAILED_PRECONDITION, ca.delete("big", node)
                )
                assert "ownership marks" in details
                status = provider.app.status()
        finally:
            await provider.stop()
        deleted = [s.server_id for s in sim.nova.all_servers() if s.deleting_since is not None]
    assert deleted == []
    assert sim.calls.get("compute.servers.delete", 0) == 0
    assert status["groups"][0]["target_size"] == 1


# -- 3: credentials: an expired or revoked token costs one authentication, never a failure ----


def failures(instances) -> list[str]:
    return [i.status.errorInfo.errorCode for i in instances if i.status.HasField("errorInfo")]


async def test_tokens_revoked_with_creates_in_flight_cost_one_authentication_and_no_failure(
    tmp_path,
):
    """Keystone revokes every token while 8 creates are on their way to Nova, twice. Every
    thread refused with the old token waits for one new one; each create refused 401 (Nova did
    nothing) is sent again with it. CA sees no failure. Keystone also refuses a token issued
    within the second of the revocation, so the first new token may be refused too: then one
    more, a second later, and the credentials are never taken for refused."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        _, path = sim_config(tmp_path, sim, queue={"capacity": 50, "workers": 8})
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        issued = []
        try:
            async with ca_client(provider.address) as ca:
                sim.nova.faults.latency = 0.3  # creates are on the wire when the tokens go
                with structlog.testing.capture_logs() as logs:
                    for wanted in (8, 16):
                        await ca.increase("big", 8)
                        await asyncio.sleep(0.1)
                        before = sim.calls["identity.tokens.create"]
                        sim.identity.revoke_all()
                        await eventually(
                            lambda wanted=wanted: len(ours(sim)) == wanted,
                            timeout=20,
                            what="servers",
                        )
                        issued.append(sim.calls["identity.tokens.create"] - before)
                seen = failures(await ca.nodes("big"))
                target = await ca.target_size("big")
        finally:
            await provider.stop()
    assert seen == []
    assert target == 16
    # One authentication for all the threads each time; two if the first fell within the
    # second of the revocation.
    assert all(n in {1, 2} for n in issued), issued
    assert not [e for e in logs if e["event"].startswith("OpenStack refuses osas's credentials")]


@pytest.mark.long
async def test_tokens_refused_soon_after_issue_fail_no_create(tmp_path):
    """Tokens refused 3 s after issue while keystoneauth still thinks them valid (a revocation
    seen through keystonemiddleware's cache): every call that meets one authenticates again
    once, and goes through."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        _, path = sim_config(tmp_path, sim, queue={"capacity": 60, "workers": 8})
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        sim.identity.refuse_after = timedelta(seconds=3)
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                sim.nova.faults.latency = 0.2
                for _ in range(5):
                    await ca.increase("big", 10)
                    await asyncio.sleep(1.5)
                await eventually(lambda: len(ours(sim)) == 50, timeout=40, what="50 servers")
                seen = failures(await ca.nodes("big"))
        finally:
            await provider.stop()
    assert seen == []


async def test_credentials_that_stay_refused_are_said_once_and_fail_no_create(tmp_path):
    """A credential that stays refused is an operator's error: creates wait, CA sees none
    failed, /readyz says why, a metric says so, one log line; once fixed, the creates go."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        _, path = sim_config(tmp_path, sim, metrics_listen="127.0.0.1:0")
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        app = provider.app
        try:
            async with ca_client(provider.address) as ca:
                with structlog.testing.capture_logs() as logs:
                    sim.identity.refuse_credentials = True
                    sim.identity.revoke_all()
                    await ca.increase("big", 3)
                    await eventually(
                        lambda: app.readiness() is not None, timeout=10, what="not ready"
                    )
                    for _ in range(3):
                        with contextlib.suppress(Exception):
                            await provider.sync(full=False)
                    await asyncio.sleep(1)
                    reason = app.readiness()
                    cloud, region = app.places[0].place.key
                    metric = app.registry.get_sample_value(
                        "osas_credentials_refused", {"cloud": cloud, "region": region}
                    )
                    while_refused = await ca.nodes("big")
                    made_while_refused = len(ours(sim))
                    sim.identity.refuse_credentials = False
                    await eventually(lambda: len(ours(sim)) == 3, timeout=40, what="3 servers")
                    await eventually(lambda: app.readiness() is None, timeout=10, what="ready")
        finally:
            await provider.stop()
    assert made_while_refused == 0
    assert failures(while_refused) == []
    assert len(while_refused) == 3  # creating, no error: CA waits for them
    assert reason is not None
    assert reason.startswith("OpenStack refuses osas's credentials")
    assert metric == 1.0
    said = [e for e in logs if e["event"].startswith("OpenStack refuses osas's credentials")]
    assert len(said) == 1
    assert any(e["event"] == "OpenStack accepts osas's credentials again" for e in logs)


# -- 6: nothing on the metrics port can fail liveness or hold CA's calls up --------------------


def probe(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1.0) as answer:
        return int(answer.status)


@pytest.mark.long
async def test_idle_slow_and_busy_metrics_clients_never_fail_healthz_or_hold_ca_up(tmp_path):
    """200 idle connections and 64 that send half a request line, then 50 clients polling
    /status and /metrics: every /healthz probe is answered within a second (before, the
    connection cap reset all 40 of 40, and the documented liveness probe restarted osas), and
    CA's calls go on being answered."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        seed_running(sim, 2000)
        _, path = sim_config(
            tmp_path, sim, metrics_listen="127.0.0.1:0", node_groups=[{**BIG, "max_size": 5000}]
        )
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        assert provider.app.ops is not None
        port = provider.app.ops.port
        idle, slow = [], []
        stop = threading.Event()

        def poll(target: str) -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    probe(port, target)

        pollers = [
            threading.Thread(target=poll, args=(target,), daemon=True)
            for target in ("/status", "/metrics") * 25
        ]
        try:
            idle += [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
            for _ in range(64):
                client = socket.create_connection(("127.0.0.1", port))
                client.sendall(b"GET /metr")
                slow.append(client)
            for thread in pollers:
                thread.start()
            healthz = [await asyncio.to_thread(probe, port, "/healthz") for _ in range(40)]
            async with ca_client(provider.address) as ca:
                targets = [await ca.target_size("big") for _ in range(50)]
        finally:
            stop.set()
            for client in idle + slow:
                client.close()
            for thread in pollers:
                thread.join(5)
            await provider.stop()
    assert healthz == [200] * 40
    assert targets == [2000] * 50


# -- 7: Refresh storms -------------------------------------------------------------------------


async def test_refresh_faster_than_the_interval_costs_one_extra_listing_per_interval(tmp_path):
    """CA calls Refresh before each loop; several CAs, or a short --scan-interval, call it
    much faster. Before, 3,000 Refresh calls in 30 s made 1,546 Nova listings."""
    interval, seconds = 0.5, 3.0
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        seed_running(sim, 5)
        _, path = sim_config(
            tmp_path,
            sim,
            reconcile={
                "interval": f"{interval}s",
                "full_resync_interval": "1h",
                "max_inventory_age": "1h",
                "hold_after_start": False,
            },
        )
        provider = Provider(load_config(path), cloud_for(sim), config_path=path)
        await provider.start()
        status = provider.app.reconciler.status
        try:
            async with ca_client(provider.address) as ca:
                before = status.full_syncs + status.incremental_syncs
                listings = sim.calls["compute.servers.list"]
                deadline = asyncio.get_running_loop().time() + seconds
                refreshes = 0
                while asyncio.get_running_loop().time() < deadline:
                    await ca.refresh()
                    refreshes += 1
                syncs = status.full_syncs + status.incremental_syncs - before
                listed = sim.calls["compute.servers.list"] - listings
        finally:
            await provider.stop()
    assert refreshes > 300
    most = 2 * int(seconds / interval) + 2  # one regular and one extra per interval
    assert 1 <= syncs <= most, syncs
    assert listed <= most
