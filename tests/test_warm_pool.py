"""Warm pools, issue 36: servers prepared for a node group and waiting to be claimed.

osas against the simulated OpenStack over HTTP with unmodified openstacksdk, on a real gRPC
server on 127.0.0.1. A warm server carries this cluster's marks, its group's and the warm mark
(``osas-warm``): until it is claimed (the mark taken off) it is no node of the group, so it is
never in TargetSize, NodeGroupNodes or NodeGroupForNode, never counted as an error, orphan or
stray, never deleted as one; /status and the metrics show each group's pool apart.
"""

from __future__ import annotations

import grpc
import pytest
from support import (
    BIG,
    CLUSTER,
    TAG,
    Provider,
    big_config,
    ca_client,
    cloud_for,
    expect_status,
    seed_ours,
)

from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST, META_WARM, WarmServer
from osas.domain.specs import NodeGroupSpec, WarmPoolSpec, WarmState
from osas.domain.warm import PREPARED_MARKER, WarmPool, plan_pool, prepare_overdue
from osas.engine.userdata import SecretFiles, warm_fingerprint
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova, FakeServer

# Group "big" with a pool that wants none: the servers seeded in it, prepared from what the
# group says now, are kept as they are (neither claimed, nor recycled, nor added to).
WARM_BIG = {**BIG, "user_data": "#cloud-config\n", "warm_pool": {"size": 0}}


def fingerprint(provider: Provider) -> str:
    """What the pool of group "big" is prepared from now."""
    spec = provider.app.inventory.cluster.group("big")
    assert spec is not None
    return warm_fingerprint(spec, SecretFiles())


def seed_warm(
    nova: FakeNova, provider: Provider, count: int, *, status: str = "SHUTOFF", start: int = 0
) -> list[FakeServer]:
    """Servers prepared for group "big" and waiting in its pool."""
    prepared_from = fingerprint(provider)
    return [
        nova.seed(
            name=f"{CLUSTER}-big-warm-{index}",
            metadata={
                META_CLUSTER: CLUSTER,
                META_GROUP: "big",
                META_REQUEST: f"{index:032x}",
                META_WARM: prepared_from,
            },
            tags=[TAG],
            status=status,
        )
        for index in range(start, start + count)
    ]


@pytest.fixture
async def served(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        provider = Provider(big_config(tmp_path, node_groups=[WARM_BIG]), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                yield sim, provider, ca
        finally:
            await provider.stop()


async def test_warm_servers_are_never_in_cas_view_nor_counted_nor_touched(served):
    """Invariant: no warm server visible to CA, none counted, none touched."""
    sim, provider, ca = served
    running = seed_ours(sim.nova, 2, group="big")
    warm = seed_warm(sim.nova, provider, 2)
    warm += seed_warm(sim.nova, provider, 1, status="SHELVED_OFFLOADED", start=2)
    for full in (True, False, True):
        await provider.sync(full=full)
        assert await ca.target_size("big") == 2
        assert sorted(i.id for i in await ca.nodes("big")) == sorted(
            f"openstack:///{server_id}" for server_id in running
        )
        for server in warm:
            assert (await ca.group_for_node("n", f"openstack:///{server.server_id}")).id == ""
            assert (await ca.group_for_node(server.name, "")).id == ""
    # CA cannot name one to delete: it is no node of the group.
    details = await expect_status(
        grpc.StatusCode.NOT_FOUND,
        ca.delete("big", [("n", f"openstack:///{warm[0].server_id}")]),
    )
    assert warm[0].server_id in details
    status = provider.app.status()
    (group,) = status["groups"]
    pool = group["warm_pool"]
    assert pool["servers"] == 3
    assert pool["by_status"] == {"SHUTOFF": 2, "SHELVED_OFFLOADED": 1}
    assert pool["state"] == "shutoff"
    assert sum(group["servers"].values()) == 2
    assert status["problems"] == dict.fromkeys(status["problems"], 0)
    registry = provider.app.registry
    metric = "osas_warm_pool_servers"
    assert registry.get_sample_value(metric, {"group": "big", "status": "SHUTOFF"}) == 2
    live = {s.server_id for s in sim.nova.live_servers()}
    assert {s.server_id for s in warm} <= live
    assert not sim.nova.deletes_asked
    assert sim.calls["compute.servers.metadata.set"] == 0


async def test_a_claimed_server_leaves_the_pool_and_becomes_a_node_of_its_group(served):
    """The warm mark taken off (as a claim does, with the whole metadata replaced: Nova bumps
    ``updated``) at once makes the server the group's in the next incremental listing; a warm
    server deleted by hand leaves the pool."""
    sim, provider, ca = served
    claimed, deleted, kept = seed_warm(sim.nova, provider, 3)
    await provider.sync()
    assert provider.app.status()["groups"][0]["warm_pool"]["servers"] == 3
    marks = {key: value for key, value in claimed.metadata.items() if key != META_WARM}
    sim.nova.set_metadata(claimed.server_id, marks, replace=True)
    sim.nova.delete_server(deleted.server_id)
    await provider.sync(full=False)
    assert await ca.target_size("big") == 1
    assert [i.id for i in await ca.nodes("big")] == [f"openstack:///{claimed.server_id}"]
    pool = provider.app.inventory.warm
    assert [s.server_id for s in pool.of_group("big")] == [kept.server_id]
    await provider.sync(full=True)  # the complete listing agrees
    assert [s.server_id for s in pool.of_group("big")] == [kept.server_id]
    assert await ca.target_size("big") == 1


async def test_a_look_alike_warm_server_of_another_cluster_is_no_ones(served):
    sim, provider, _ = served
    other = sim.nova.seed(
        name="other-big-warm",
        metadata={META_CLUSTER: "other", META_GROUP: "big", META_WARM: "x"},
        tags=[TAG],
        status="SHUTOFF",
    )
    untagged = sim.nova.seed(
        name=f"{CLUSTER}-big-untagged",
        metadata={META_CLUSTER: CLUSTER, META_GROUP: "big", META_WARM: "x"},
        status="SHUTOFF",
    )
    await provider.sync()
    await provider.sync(full=False)
    assert len(provider.app.inventory.warm) == 0
    live = {s.server_id for s in sim.nova.live_servers()}
    assert {other.server_id, untagged.server_id} <= live


# -- the pool's decisions, pure -----------------------------------------------------------------


def _spec(**pool: object) -> NodeGroupSpec:
    return NodeGroupSpec(
        "big", 0, 5, "m1.small", "img", ("net",), user_data="x", warm_pool=WarmPoolSpec(**pool)
    )


def _warm(index: int, status: str = "SHUTOFF", **fields: object) -> WarmServer:
    values: dict[str, object] = {
        "server_id": f"s{index}",
        "name": f"n{index}",
        "group_id": "big",
        "status": status,
        "task_state": None,
        "prepared_from": "fp",
        "created": 1000.0 + index,
        **fields,
    }
    return WarmServer(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["paused", "suspended", "shelved_offloaded"])
def test_a_running_server_of_a_pool_osas_settles_is_judged_by_its_console(state):
    """ACTIVE in such a pool is a guest preparing or one prepared and waiting: it is watched,
    never recycled on age alone; past prepare_timeout a console without the marker says its
    preparation hung, one with it says it waits to be settled."""
    spec = _spec(state=WarmState(state), prepare_timeout=600.0)
    assert spec.warm_pool is not None
    late, early = _warm(0, "ACTIVE", created=0.0), _warm(1, "ACTIVE", created=900.0)
    plan = plan_pool(spec, [late, early], "fp", 0, 1000.0)
    assert not plan.recycle
    assert {s.server_id for s in plan.watch} == {"s0", "s1"}
    hung, prepared = "booting\nimages pulled\n", f"images pulled\n{PREPARED_MARKER}\n"
    assert prepare_overdue(spec.warm_pool, late, hung, 1000.0)
    assert not prepare_overdue(spec.warm_pool, late, prepared, 1000.0)
    assert not prepare_overdue(spec.warm_pool, early, hung, 1000.0)  # still in time
    assert not prepare_overdue(spec.warm_pool, _warm(2, "ACTIVE", created=None), hung, 1000.0)


def test_a_pool_is_judged_server_by_server():
    servers = [
        _warm(0),  # ready
        _warm(1, prepared_from="old"),  # stale
        _warm(2, created=0.0),  # older than max_age
        _warm(3, "ERROR"),  # failed
        _warm(4, "ACTIVE", created=9000.0),  # still preparing, in time
        _warm(5, "ACTIVE", created=100.0),  # still preparing, too long
        _warm(6, "BUILD", created=9000.0),  # building
    ]
    plan = plan_pool(_spec(max_age=9000.0, prepare_timeout=8000.0), servers, "fp", 0, 9100.0)
    assert [s.server_id for s in plan.ready] == ["s0"]
    assert {s.server_id for s in plan.preparing} == {"s4", "s6"}
    assert {(s.server_id, r.value) for s, r in plan.recycle} == {
        ("s1", "stale"),
        ("s2", "aged"),
        ("s3", "failed"),
        ("s5", "prepare-timeout"),
    }
    assert plan.wanted == 5  # max_size 5 - target 0, no size given
    assert plan.missing == 5 - 3


def test_a_pool_holds_no_more_than_the_group_can_still_grow_by():
    ready = [_warm(index) for index in range(3)]
    plan = plan_pool(_spec(size=3), ready, "fp", 4, 2000.0)  # max 5, target 4: room for 1
    assert plan.wanted == 1
    assert plan.missing == 0
    assert [(s.server_id, r.value) for s, r in plan.recycle] == [
        ("s2", "surplus"),
        ("s1", "surplus"),
    ]
    # Creates queued will claim ready servers first: none of those is surplus.
    plan = plan_pool(_spec(size=3), ready, "fp", 4, 2000.0, claims_coming=2)
    assert [s.server_id for s, _ in plan.recycle] == []


def test_a_group_without_a_pool_has_every_warm_server_recycled():
    spec = NodeGroupSpec("big", 0, 5, "m1.small", "img", ("net",))
    plan = plan_pool(spec, [_warm(0)], "", 0, 2000.0)
    assert [(s.server_id, r.value) for s, r in plan.recycle] == [("s0", "unconfigured")]


def test_only_ready_servers_of_the_current_preparation_are_claimable_once():
    pool = WarmPool()
    pool.replace([_warm(0), _warm(1, prepared_from="old"), _warm(2, "BUILD"), _warm(3)])
    pool.use("big", "fp", WarmState.SHUTOFF)
    assert pool.claimable("big") == 2
    taken = pool.take("big")
    assert taken is not None
    assert taken.server_id == "s0"  # the oldest first
    assert pool.claimable("big") == 1
    pool.release("s0")
    assert pool.claimable("big") == 2
    pool.use("big", "fp", WarmState.SUSPENDED)  # the group now keeps its pool suspended
    assert pool.claimable("big") == 0
