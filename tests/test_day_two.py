"""Day two: what operators do to a running osas, and what happens around it, as inputs to the
lifecycle. One test per problem of the issue that asked for this, each against a real osas on
127.0.0.1 and the simulated OpenStack over HTTP: a reload lowering max_size, servers of an
earlier life, credentials refused, reloads reaching templates, a server deleted by hand, the
metrics port under load, Refresh storms, certificate rotation without ``tls.server_names``.
"""

from __future__ import annotations

import grpc
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
    write_config,
)

from osas.config import load_config
from osas.domain.ledger import MAX_SIZE_LOWERED, CreateState
from osas.domain.problems import Problem
from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST, TAG_REQUEST_PREFIX
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
            sim.nova.seed(
                name=f"{CLUSTER}-big-copy-{index}",
                metadata={META_CLUSTER: CLUSTER, META_GROUP: "big", META_REQUEST: request_id},
                tags=[TAG, f"{TAG_REQUEST_PREFIX}{request_id}"],
            )
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
        request_id = f"{index:032x}"
        ids.add(
            sim.nova.seed(
                name=f"{CLUSTER}-{group}-{index}",
                metadata={META_CLUSTER: CLUSTER, META_GROUP: group, META_REQUEST: request_id},
                tags=[TAG, f"{TAG_REQUEST_PREFIX}{request_id}"],
            ).server_id
        )
    return ids


def sim_config(tmp_path, sim: SimulatedOpenStack, **overrides):
    """A configuration file for osas against ``sim``, reloadable: (data, path)."""
    values = {
        "cloud_backend": "openstack",
        "openstack": {"auth": sim.clouds_yaml_entry()["auth"], "api_timeout": "5s"},
        "node_groups": [BIG],
        "queue": {"capacity": 50, "workers": 2},
        "reconcile": {
            "interval": "0.2s",
            "full_resync_interval": "1h",
            "max_inventory_age": "1h",
            "retry_backoff": "0.01s",
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
