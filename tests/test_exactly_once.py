"""Exactly once: never a server beyond what CA asked for, whatever Nova's timing.

osas against the simulated OpenStack over HTTP, with unmodified openstacksdk, in the failure
modes an operator meets with a slow or flaky Nova: a create Nova stores after the client gave
up, keystoneauth resending a POST by itself, a failed create turning up after CA cleaned it up,
placeholders after a restart, Nova's quota re-check, quota in every form.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
import yaml
from support import (
    Provider,
    big_config,
    ca_client,
    ca_loop_until,
    cloud_for,
    config_data,
    eventually,
    expect_status,
    kept,
    osas_serve,
    ours,
    read_events,
    seed_ours,
    write_config,
)

from osas.cloud.openstack import OpenStackCloud
from osas.cloud.openstack_settings import OpenStackSettings
from osas.domain.ledger import IN_DOUBT_CODE
from osas.domain.servers import META_REQUEST
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import CLOUD_NAME, SimulatedOpenStack
from osas.sim.kubernetes import KubeStandIn
from osas.sim.model import FakeNova

OUT_OF_RESOURCES, OTHER = 1, 99


def requests_made(sim: SimulatedOpenStack, group: str = "big") -> Counter[str]:
    """Live servers per create request id: more than 1 anywhere is a kept duplicate."""
    return Counter(s.metadata.get(META_REQUEST, "") for s in ours(sim, group))


def group(max_size: int, min_size: int = 0) -> dict:
    return {
        "id": "big",
        "min_size": min_size,
        "max_size": max_size,
        "flavor": "m1.small",
        "image": "ubuntu-24.04",
        "networks": ["cluster-net"],
    }


async def test_create_outliving_the_client_timeout_is_never_sent_again(tmp_path):
    """Nova stores each create after the client's timeout: every create is in doubt, none is
    POSTed again, and each request ends with exactly one server, within max_size."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        seed_ours(sim.nova, 1, group="big")
        config = big_config(tmp_path, node_groups=[group(max_size=5)])
        provider = Provider(config, cloud_for(sim, api_timeout=0.5))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                sim.nova.faults.create_stall = 1.0
                await ca.increase("big", 4)
                assert await ca.target_size("big") == 5
                await eventually(
                    lambda: len(ours(sim)) == 5, timeout=10, what="the stalled creates stored"
                )
                sim.nova.faults.create_stall = 0.0
                await asyncio.sleep(1.0)  # time for any resend to land
                for _ in range(3):
                    await provider.sync(full=True)
                assert sim.calls["compute.servers.create"] == 4  # one POST per request
                assert len(ours(sim)) == 5
                assert max(requests_made(sim).values()) == 1
                assert await ca.target_size("big") == 5
                assert len(kept(await ca.nodes("big"))) == 5
        finally:
            await provider.stop()


def clouds_yaml_with_retries(sim: SimulatedOpenStack, path: Path) -> None:
    """A clouds.yaml as some operators write it: keystoneauth resends on connection errors
    and on 503."""
    sim.write_clouds_yaml(path)
    document = yaml.safe_load(path.read_text())
    document["clouds"][CLOUD_NAME] |= {"connect_retries": 3, "status_code_retries": 3}
    path.write_text(yaml.safe_dump(document))


@pytest.mark.parametrize("fault", ["lost_create_responses", "dropped_create_connections"])
async def test_keystoneauth_never_resends_a_create(tmp_path, monkeypatch, fault):
    """clouds.yaml asks keystoneauth to resend after a dropped connection or a 503: a create
    is still sent once, and makes one server."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        clouds = tmp_path / "clouds.yaml"
        clouds_yaml_with_retries(sim, clouds)
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
        config = big_config(tmp_path)
        cloud = OpenStackCloud(OpenStackSettings(cloud=CLOUD_NAME, api_timeout=2.0))
        provider = Provider(config, cloud)
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                sim.nova.faults.lost_create_status = 503
                setattr(sim.nova.faults, fault, 2)  # every resend would be stored too
                await ca.increase("big", 1)
                await eventually(lambda: len(ours(sim)) >= 1, timeout=10, what="the server stored")
                await asyncio.sleep(0.5)
                await provider.sync(full=True)
                assert sim.calls["compute.servers.create"] == 1
                assert len(ours(sim)) == 1
                assert await ca.target_size("big") == 1
                # The lost answer left the create in doubt; the listing settled it.
                assert [i.id for i in kept(await ca.nodes("big"))] == [
                    f"openstack:///{ours(sim)[0].server_id}"
                ]
        finally:
            await provider.stop()


@pytest.mark.long
async def test_a_create_given_up_in_doubt_never_comes_back(tmp_path):
    """A create outlives its doubt window: it is reported failed (class 99, its own code), CA
    cleans it up and asks again; when the first server finally appears it is deleted as an
    orphan, never adopted. max_size 2 holds throughout."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        seed_ours(sim.nova, 1, group="big")
        config = big_config(
            tmp_path,
            node_groups=[group(max_size=2)],
            reconcile={
                "interval": "0.1s",
                "full_resync_interval": "1s",
                "max_inventory_age": "1h",
                "retry_backoff": "0.01s",
                "create_doubt_window": "1s",
                "hold_after_start": False,
            },
            openstack={"api_timeout": "0.3s"},
        )
        provider = Provider(config, cloud_for(sim, api_timeout=0.3))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                sim.nova.faults.create_stall = 3.0
                await ca.increase("big", 1)
                await eventually(
                    lambda: sim.calls["compute.servers.create"] == 1, timeout=5, what="the POST"
                )
                sim.nova.faults.create_stall = 0.0

                def failed():
                    return [i for i in instances if i.status.HasField("errorInfo")]

                instances: list[pb.Instance] = []
                deadline = time.monotonic() + 10
                while not failed():
                    assert time.monotonic() < deadline, "the create was never given up"
                    await ca.refresh()
                    instances = list(await ca.nodes("big"))
                    # In doubt: creating, no error, under its placeholder id.
                    assert all(
                        i.status.instanceState == pb.InstanceStatus.instanceCreating
                        for i in instances
                        if i.id.startswith("osas://")
                    )
                    await asyncio.sleep(0.05)
                (gave_up,) = failed()
                error = gave_up.status.errorInfo
                assert (error.errorCode, error.instanceErrorClass) == (IN_DOUBT_CODE, OTHER)
                assert gave_up.id.startswith("osas://big/")
                # CA: clean up, ask again, until two servers run.
                await ca_loop_until(ca, 2, sim, time.monotonic() + 20)
                # The stalled create lands meanwhile: an orphan, deleted.
                await eventually(
                    lambda: sim.calls["compute.servers.delete"] >= 1, timeout=10, what="orphan"
                )
                await asyncio.sleep(0.3)
                await provider.sync(full=True)
                assert len(ours(sim)) == 2
                assert await ca.target_size("big") == 2
                late = gave_up.id.rpartition("/")[2]
                assert late not in requests_made(sim)
        finally:
            await provider.stop()


async def test_placeholders_of_a_previous_process_are_cleaned_up_harmlessly(tmp_path):
    """CA's instance cache outlives an osas restart: its DeleteNodes of the old process's
    placeholders succeeds, changes nothing, and a server of that request, should one turn up
    later, is deleted."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        config = big_config(tmp_path)
        first = Provider(config, cloud_for(sim))
        await first.start()
        async with ca_client(first.address) as ca:
            sim.nova.faults.quota_exceeded = 1
            await ca.increase("big", 1)
            await eventually(
                lambda: first.app.inventory.ledger.failures_of("big") != [], timeout=5, what="403"
            )
            (placeholder,) = [i.id for i in await ca.nodes("big")]
        await first.stop()

        second = Provider(config, cloud_for(sim))
        await second.start()
        try:
            async with ca_client(second.address) as ca:
                assert await ca.target_size("big") == 0
                await ca.delete("big", [(placeholder, placeholder)])  # no error
                await ca.delete("big", [(placeholder, placeholder)])  # and again
                assert await ca.target_size("big") == 0
                assert list(await ca.nodes("big")) == []
                # Another group's placeholder, or a foreign server, is still refused.
                other = placeholder.replace("osas://big/", "osas://gpu/")
                await expect_status(
                    grpc.StatusCode.INVALID_ARGUMENT, ca.delete("big", [(other, other)])
                )
                stranger = "openstack:///0b7c7d4e-5a1f-4c3b-9d2e-8f6a1b2c3d4e"
                await expect_status(
                    grpc.StatusCode.NOT_FOUND, ca.delete("big", [(stranger, stranger)])
                )
        finally:
            await second.stop()


async def test_nova_quota_recheck_errors_are_out_of_resources_and_cleaned_up(tmp_path):
    """Room for one server, three creates at once: Nova accepts all three, then its quota
    re-check turns each into an ERROR server with a 413 "Quota exceeded" fault. CA sees three
    creating instances with OutOfResources errors and deletes them; their quota comes back."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        sim.nova.quota.instances = 1
        sim.nova.faults.quota_recheck_seconds = 0.3
        # osas reads no quota here: it would send one create only, and Nova's race is the point.
        reconcile = {
            "interval": "0.2s",
            "full_resync_interval": "1s",
            "max_inventory_age": "1h",
            "retry_backoff": "0.01s",
            "delete_retry_after": "0.5s",
            "create_doubt_window": "3s",
            "hold_after_start": False,
            "quota_interval": "0s",
        }
        config = big_config(tmp_path, queue={"capacity": 10, "workers": 3}, reconcile=reconcile)
        provider = Provider(config, cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                await ca.increase("big", 3)
                await eventually(
                    lambda: [s.status for s in ours(sim)] == ["ERROR"] * 3,
                    timeout=10,
                    what="three ERROR",
                )
                await provider.sync(full=True)
                instances = list(await ca.nodes("big"))
                assert len(instances) == 3
                for instance in instances:
                    assert instance.status.instanceState == pb.InstanceStatus.instanceCreating
                    error = instance.status.errorInfo
                    assert error.errorCode == "QuotaExceeded"
                    assert error.instanceErrorClass == OUT_OF_RESOURCES
                    assert "Quota exceeded" in error.errorMessage
                assert {s.fault.code for s in ours(sim)} == {413}
                await ca.delete("big", [(i.id, i.id) for i in instances])  # below min is fine
                assert await ca.target_size("big") == 0
                await eventually(
                    lambda: not ours(sim), timeout=10, what="the ERROR servers deleted"
                )
        finally:
            await provider.stop()


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("ports_exceeded", "Maximum number of ports exceeded"),
        ("quota_exceeded", "Quota exceeded for instances"),
    ],
)
async def test_quota_in_every_form_is_out_of_resources(tmp_path, fault, message):
    with SimulatedOpenStack(FakeNova()) as sim:
        provider = Provider(big_config(tmp_path), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                setattr(sim.nova.faults, fault, 1)
                await ca.increase("big", 1)
                await eventually(
                    lambda: provider.app.inventory.ledger.failures_of("big") != [],
                    timeout=5,
                    what="refusal",
                )
                (instance,) = await ca.nodes("big")
                error = instance.status.errorInfo
                assert (error.errorCode, error.instanceErrorClass) == (
                    "QuotaExceeded",
                    OUT_OF_RESOURCES,
                )
                assert message in error.errorMessage
        finally:
            await provider.stop()


# -- SIGTERM ------------------------------------------------------------------------------------


def serve_config(tmp_path: Path, sim: SimulatedOpenStack, grace: float) -> Path:
    data = config_data(
        openstack={"cloud": CLOUD_NAME, "api_timeout": "30s"},
        node_groups=[group(max_size=200)],
        queue={"capacity": 200, "workers": 4},
        shutdown_grace=f"{grace}s",
        reconcile={
            "interval": "1s",
            "full_resync_interval": "1h",
            "max_inventory_age": "1h",
            "hold_after_start": False,
        },
    )
    return write_config(tmp_path, data)


@pytest.mark.long
def test_sigterm_sends_every_accepted_delete_and_exits_within_its_grace(tmp_path):
    """40 creates and 40 deletes queued, Nova slow, creates stuck in Nova for a minute: on
    SIGTERM every accepted delete reaches Nova, unsent creates are dropped with one warning
    that counts them, and the process exits within shutdown_grace whatever openstacksdk is
    doing."""
    grace = 6.0
    with SimulatedOpenStack(FakeNova()) as sim:
        doomed = set(seed_ours(sim.nova, 40, group="big"))
        clouds = tmp_path / "clouds.yaml"
        sim.write_clouds_yaml(clouds)
        env = {**os.environ, "OS_CLIENT_CONFIG_FILE": str(clouds)}
        with osas_serve(serve_config(tmp_path, sim, grace), env=env) as process:
            events = read_events(process, "health SERVING", time.monotonic() + 30)
            port = next(e for e in events if e["event"] == "grpc listening")["port"]
            sim.nova.faults.latency = 0.05
            sim.nova.faults.create_stall = 60.0  # creates in flight hang in Nova
            asyncio.run(scale(f"127.0.0.1:{port}", doomed))
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=grace + 10)
            took = time.monotonic() - started
            events = [*events, *read_events_until_eof(process)]
        deleted = {s.server_id for s in sim.nova.all_servers() if s.deleting_since is not None}
        assert deleted == doomed  # no accepted delete lost
        assert took < grace + 1.0, f"exit took {took:.1f}s, grace {grace}s"
        dropped = [e for e in events if e["event"].startswith("queued creates dropped")]
        assert len(dropped) == 1
        assert dropped[0]["level"] == "warning"
        assert dropped[0]["groups"]["big"] == dropped[0]["dropped"] >= 30
        assert sim.calls["compute.servers.create"] + dropped[0]["dropped"] == 40


async def scale(address: str, doomed: set[str]) -> None:
    async with ca_client(address) as ca:
        await ca.increase("big", 40)
        await ca.delete("big", [(f"n{i}", f"openstack:///{s}") for i, s in enumerate(doomed)])
        assert await ca.target_size("big") == 40


def read_events_until_eof(process: subprocess.Popen[str]) -> list[dict]:
    """Every line osas wrote on stderr after the signal: each one a JSON event."""
    assert process.stderr is not None
    events = []
    for line in process.stderr.read().splitlines():
        if line.strip():
            try:
                events.append(json.loads(line))
            except ValueError:
                pytest.fail(f"not a JSON log line on stderr: {line!r}")
    return events


async def test_a_complete_listing_that_misses_servers_takes_nothing_away(tmp_path):
    """Real Nova's paged listings can miss a server while builds are in flight (found by the
    real-Nova lane). A complete listing that leaves servers out must not shrink the target (CA
    would ask for one too many) nor give up a create whose server it missed (its server would
    be deleted as an orphan): a GET confirms every absence first."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.1), max_limit=3) as sim:
        # Servers of an earlier osas, untouched for an hour: only the complete listing sees them.
        sim.nova.clock = lambda: datetime.now(UTC) - timedelta(hours=1)
        seed_ours(sim.nova, 6, group="big")
        sim.nova.clock = lambda: datetime.now(UTC)
        provider = Provider(big_config(tmp_path), cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                assert await ca.target_size("big") == 6
                await ca.increase("big", 1)  # a create answered, perhaps missed by a listing
                await eventually(lambda: len(ours(sim)) == 7, timeout=10, what="seven servers")
                for _ in range(3):
                    sim.nova.faults.skipped_servers = 3  # pages that each miss a server
                    await provider.sync(full=True)
                    assert sim.nova.faults.skipped_servers < 3  # the listing did miss some
                    assert await ca.target_size("big") == 7
                    assert len(kept(await ca.nodes("big"))) == 7
                assert sim.calls["compute.servers.delete"] == 0
                assert len(ours(sim)) == 7
                # A server really deleted behind osas's back still goes.
                sim.nova.delete_server(ours(sim)[0].server_id)
                await eventually(lambda: len(ours(sim)) == 6, timeout=10, what="deleted")
                await provider.sync(full=True)
                assert await ca.target_size("big") == 6
        finally:
            await provider.stop()


async def test_a_scale_up_right_after_a_scale_down_never_takes_nova_beyond_max_size(tmp_path):
    """Invariant: Nova never holds more servers of a group than max_size that it is not
    deleting. Under a Lease, CA's DeleteNodes is answered once the promise is recorded and
    lowers the target at once, so an IncreaseSize right after it takes the room; Nova's API is
    slow to take the DELETE (a second), not the create: the create waits until Nova has taken
    the DELETE, and never lands first."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim, KubeStandIn() as kube:
        seed_ours(sim.nova, 3, group="big")
        election = {
            "enabled": True,
            "kubeconfig": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
            "lease_namespace": "kube-system",
        }
        config = big_config(tmp_path, node_groups=[group(max_size=3)], leader_election=election)
        provider = Provider(config, cloud_for(sim))
        await provider.start()
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                standing = [s for s in ours(sim) if s.deleting_since is None]
                peak = max(peak, len(standing))
                await asyncio.sleep(0.005)

        try:
            async with ca_client(provider.address) as ca:
                await eventually(provider.app.leadership.may_write, what="elected")
                await provider.sync()
                watcher = asyncio.ensure_future(watch())
                sim.nova.faults.delete_stall = 1.0
                (first, *_) = await ca.nodes("big")
                await ca.delete("big", [("node-0", first.id)])
                await ca.increase("big", 1)
                assert await ca.target_size("big") == 3
                await eventually(
                    lambda: (
                        len([s for s in ours(sim) if s.deleting_since is None]) == 3
                        and len(requests_made(sim)) == 2
                    ),  # the seeded ones' "" and the new one
                    what="the named server deleted, its replacement made",
                    timeout=10,
                )
                watcher.cancel()
                assert peak == 3
        finally:
            await provider.stop()
