"""What the real Cluster Autoscaler does that operators meet (FACTS.md section 6), played against
the real gRPC server, osas's OpenStack adapter and the simulated OpenStack over HTTP: a group
whose servers never join, and a timed-out scale-up CA tries to revert."""

from __future__ import annotations

import asyncio
import json

import grpc
import structlog
from support import (
    API_TIMEOUT,
    Provider,
    ca_client,
    eventually,
    expect_status,
    ours,
    provider_id,
    seed_ours,
)
from test_operations import fetch, ops_port, scrape, start, value

from osas.cli.status_table import render_status
from osas.demo.client import CA_TIMEOUT, CaClient
from osas.domain.problems import FAKE_NODE_REASON
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim.model import FakeNova
from osas.sim.server import SimulatedOpenStack

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
DELETED = "osas_servers_deleted_before_joining_total"
PROBLEM = "osas_group_problems"
DETECTED = "osas_group_problems_detected_total"
KIND = "deleted-before-joining"
ADVICE = "servers deleted before they joined: check the image and user data"


async def now_rendered(port: int) -> None:
    """Past the metrics port's rendering cache (one rendering per 0.2 s), so that the next
    /metrics or /status shows what the calls so far did."""
    await asyncio.sleep(0.25)


async def ask_about_fake_node(ca: CaClient, instance_id: str) -> str:
    """NodeGroupForNode about one of CA's fake nodes, as CA asks before deleting it."""
    node = pb.ExternalGrpcNode(
        name=instance_id, providerID=instance_id, annotations={FAKE_NODE_REASON: "unregistered"}
    )
    answer = await ca.stub.NodeGroupForNode(
        pb.NodeGroupForNodeRequest(node=node), timeout=CA_TIMEOUT
    )
    return answer.nodeGroup.id


async def next_server(ca: CaClient, provider: Provider, sim: SimulatedOpenStack) -> str:
    """CA asks for one more server of "big"; osas makes it and lists it. Its id."""
    before = {s.server_id for s in ours(sim)}
    await ca.increase("big", 1)
    await eventually(lambda: len(ours(sim)) == len(before) + 1, what="a new server")
    [new] = [s.server_id for s in ours(sim) if s.server_id not in before]
    await provider.sync(full=False)
    return new


async def never_joins(
    ca: CaClient, provider: Provider, sim: SimulatedOpenStack, old: str
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """One round of CA 1.36 with a broken image: a new server that never joins, deleted with
    CA's fake node past max-node-provision-time. /metrics afterwards."""
    new = await next_server(ca, provider, sim)
    # Every loop: NodeGroupForNode about each Node (the old one joined long ago), then about
    # the fake node of the server that did not.
    assert (await ca.group_for_node("node-old", provider_id(old))).id == "big"
    assert await ask_about_fake_node(ca, provider_id(new)) == "big"
    await ca.delete_fake("big", [provider_id(new)], "unregistered")
    # CA repeats a DeleteNodes whose answer it missed: counted once.
    await ca.delete_fake("big", [provider_id(new)], "unregistered")
    await eventually(lambda: len(ours(sim)) == 1, what="the server deleted")
    assert provider.app.ops is not None
    await now_rendered(provider.app.ops.port)
    return await scrape(provider.app.ops.port)


async def test_servers_deleted_before_they_join_are_a_problem_of_their_group(tmp_path):
    """CA 1.36 with a broken image: each new server is deleted as unregistered after
    max-node-provision-time and another asked for, again and again. The third makes the
    group's problem (a log line, metrics, a line of the status screen); a server created
    since that joins ends it."""
    fast = {"interval": "0.2s", "full_resync_interval": "1s", "hold_after_start": False}
    nova = FakeNova(build_seconds=0.1)
    with SimulatedOpenStack(nova) as sim:
        with sim.lock:
            nova.clock_offset = -3600.0  # a Node that joined an hour ago
            [old] = seed_ours(nova, 1, group="big")
            nova.clock_offset = 0.0
        with structlog.testing.capture_logs() as logs:
            provider = await start(tmp_path, sim, reconcile=fast)
            port = ops_port(provider)
            try:
                async with ca_client(provider.address) as ca:
                    for round_ in range(1, 4):
                        samples = await never_joins(ca, provider, sim, old)
                        assert value(samples, DELETED, group="big") == round_
                        holds = 1 if round_ == 3 else 0
                        assert value(samples, PROBLEM, group="big", problem=KIND) == holds
                    assert await ca.target_size("big") == 1

                    await now_rendered(port)
                    status, text = await fetch(port, "/status")
                    assert status == 200
                    [found] = json.loads(text)["group_problems"]
                    assert (found["group"], found["problem"], found["servers"]) == ("big", KIND, 3)
                    assert found["advice"] == ADVICE
                    screen = render_status(json.loads(text))
                    assert f"node group big: {ADVICE} (3 in the last 2h)" in screen
                    # One access line per deletion says so; CA's repeats say nothing more.
                    counted = [e["never_registered"] for e in logs if "never_registered" in e]
                    assert counted == [1, 1, 1]
                    [told] = [e for e in logs if e["event"] == "node group problem"]
                    assert (told["group"], told["problem"], told["servers"]) == ("big", KIND, 3)
                    assert told["advice"] == ADVICE

                    # The image is fixed: the next server joins, and CA asks about its Node.
                    fixed = await next_server(ca, provider, sim)
                    assert (await ca.group_for_node("node-new", provider_id(fixed))).id == "big"
                    await now_rendered(port)
                    samples = await scrape(port)
                    assert value(samples, PROBLEM, group="big", problem=KIND) == 0
                    assert value(samples, DETECTED, group="big", problem=KIND) == 1
                    _, text = await fetch(port, "/status")
                    assert json.loads(text)["group_problems"] == []
                    assert ADVICE not in render_status(json.loads(text))
                over = [e for e in logs if e["event"] == "node group problem over"]
                assert [(e["group"], e["detail"]) for e in over] == [
                    ("big", f"server {fixed} joined")
                ]
            finally:
                await provider.stop()


async def test_deleting_a_scaled_down_node_or_a_failed_create_is_no_join_problem(tmp_path):
    """Only CA's fake nodes for unregistered instances count: a scale-down's Nodes and the
    fake nodes of failed creates do not."""
    nova = FakeNova(build_seconds=0.1)
    with SimulatedOpenStack(nova) as sim:
        provider = await start(tmp_path, sim)
        port = ops_port(provider)
        try:
            async with ca_client(provider.address) as ca:
                await ca.increase("big", 3)
                await eventually(lambda: len(ours(sim)) == 3, what="three servers")
                await provider.sync(full=False)
                doomed = [s.server_id for s in ours(sim)]
                await ca.delete(
                    "big", [(f"node-{i}", provider_id(s)) for i, s in enumerate(doomed)]
                )
                sim.nova.faults.quota_exceeded = 3
                await ca.increase("big", 3)
                await eventually(
                    lambda: len(provider.app.inventory.ledger.failures_of("big")) == 3,
                    what="three failed creates",
                )
                failed = [i.id for i in await ca.nodes("big") if i.status.HasField("errorInfo")]
                await ca.delete_fake("big", failed, "create-error")
                assert await ca.target_size("big") == 0
                await now_rendered(port)
                samples = await scrape(port)
                assert value(samples, DELETED, group="big") == 0
                assert value(samples, PROBLEM, group="big", problem=KIND) == 0
        finally:
            await provider.stop()


async def test_a_timed_out_merged_scale_up_is_not_reverted_and_its_missing_server_goes(tmp_path):
    """CA 1.36 merges two scale-ups (+1, then +2) into one request; one server never comes
    up. At the timeout CA asks DecreaseTargetSize(-Increase): -3, the whole merged request.
    Every create became a server, so osas refuses (as AWS and GCE do) and changes nothing;
    CA logs FailedToRevertScaleUp and then deletes the missing server with DeleteNodes."""
    nova = FakeNova(build_seconds=None)  # a build finishes on activate()
    with SimulatedOpenStack(nova) as sim:
        provider = await start(tmp_path, sim)
        try:
            async with ca_client(provider.address) as ca:
                await ca.increase("big", 1)
                await ca.increase("big", 2)
                assert await ca.target_size("big") == 3
                await eventually(lambda: len(ours(sim)) == 3, what="three servers")
                *up, missing = sorted(ours(sim), key=lambda s: s.created_at)
                with sim.lock:
                    for server in up:
                        nova.activate(server.server_id)
                await provider.sync()
                before = {s.server_id: s.status for s in ours(sim)}
                assert sorted(before.values()) == ["ACTIVE", "ACTIVE", "BUILD"]

                for delta in (-3, -2, -1):
                    details = await expect_status(FAILED_PRECONDITION, ca.decrease("big", delta))
                    assert details == (
                        "attempt to delete existing nodes: node group 'big' has only 0 "
                        f"unfulfilled creates to cancel, asked for {-delta}; "
                        "DecreaseTargetSize never deletes servers"
                    )
                    assert await ca.target_size("big") == 3
                    assert {s.server_id: s.status for s in ours(sim)} == before

                # About 10 s later: CA's fake node for the unregistered instance.
                await ca.delete_fake("big", [provider_id(missing.server_id)], "unregistered")
                assert await ca.target_size("big") == 2
                await eventually(
                    lambda: {s.server_id for s in ours(sim)} == {s.server_id for s in up},
                    timeout=API_TIMEOUT * 5,
                    what="the missing server deleted",
                )
                await provider.sync()
                assert await ca.target_size("big") == 2
        finally:
            await provider.stop()
