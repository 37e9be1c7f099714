"""The project's quota, known before CA asks (issue 21, problem 2).

osas against the simulated OpenStack over HTTP (unmodified openstacksdk): its ``/limits``
answers the project's limits and usage as Nova's does. osas reads them at start, every
``reconcile.quota_interval`` and after every quota refusal of Nova's; CA is told each group's
max size as what the quota can still hold; ``/metrics`` and ``/status`` show the headroom.
"""

from __future__ import annotations

import time

import anyio
import structlog
from fake_cloud import FakeCloud
from prometheus_client import generate_latest
from support import BIG, Provider, big_config, ca_client, cloud_for, ours, running

from osas.cli.status_table import render_status
from osas.cloud.errors import RequestRejected
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

LIMITS = "compute.limits.get"


async def max_size(ca, group: str = "big") -> int:
    await ca.refresh()
    return next(g.maxSize for g in await ca.node_groups() if g.id == group)


async def until(check, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await anyio.sleep(0.05)


async def test_a_quota_refusal_reads_the_quota_again_and_ca_is_told_the_new_max(tmp_path):
    """The quota lowered behind osas's back between two reads: Nova refuses the creates the
    old read allowed; osas reads the quota again at the next sync (not an hour later), and
    CA's max size for the group is what the project holds."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        sim.nova.quota.instances = 6
        config = big_config(tmp_path, reconcile=_reconcile(quota_interval="1h"))
        provider = Provider(config, cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                assert await max_size(ca) == 6
                reads = sim.calls[LIMITS]
                sim.nova.quota.instances = 2  # an operator lowers it
                await ca.increase("big", 4)
                await until(lambda: _settled(ca), "two made, two refused")
                failed = [i for i in await ca.nodes("big") if i.status.HasField("errorInfo")]
                assert [i.status.errorInfo.errorCode for i in failed] == ["QuotaExceeded"] * 2
                await ca.delete("big", [(i.id, i.id) for i in failed])
                await until(lambda: _max_is(ca, 2), "the new max")
                assert sim.calls[LIMITS] > reads
                assert len(ours(sim)) == 2
        finally:
            await provider.stop()


async def test_metrics_and_status_show_each_groups_headroom(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        sim.nova.quota.instances = 7
        sim.nova.quota.ram = 3 * 2048 + 1024  # big is m1.small: 1 vCPU, 2 GiB
        provider = Provider(big_config(tmp_path), cloud_for(sim))
        await provider.start()
        try:
            metrics = generate_latest(provider.app.registry).decode()  # what /metrics serves
            assert 'osas_quota_headroom{group="big",resource="ram_mib"} 3.0' in metrics
            assert 'osas_quota_headroom{group="big",resource="instances"} 7.0' in metrics
            assert 'osas_node_group_reported_max_size{group="big"} 3.0' in metrics
            (group,) = provider.app.status()["groups"]
            assert group["quota_headroom"] == {
                "servers": 3,
                "limited_by": "ram_mib",
                "instances": 7,
                "ram_mib": 3,
            }
            assert group["reported_max_size"] == 3
            screen = render_status(provider.app.status())  # what `osas status` prints
            assert "quota headroom: big 3 more (ram_mib)" in screen
        finally:
            await provider.stop()


class _LimitsForbidden(FakeCloud):
    """A cloud whose policy forbids reading /limits (the tests' fake of the port)."""

    async def get_quota(self, server_groups, *, volumes=False):
        del server_groups, volumes
        raise RequestRejected("Policy doesn't allow os_compute_api:limits to be performed.", 403)


async def test_a_quota_that_cannot_be_read_bounds_nothing_and_is_said_once(tmp_path):
    config = big_config(tmp_path, reconcile=_reconcile(quota_interval="0.1s"))
    with structlog.testing.capture_logs() as logs:
        async with (
            running(config, _LimitsForbidden()) as provider,
            ca_client(provider.address) as ca,
        ):
            assert await max_size(ca) == config.node_groups[0].max_size
            await anyio.sleep(0.5)  # several syncs, each trying again
    said = [e for e in logs if "quota cannot be read" in e["event"]]
    assert len(said) == 1
    assert "Policy" in said[0]["error"]


def _reconcile(**overrides: str) -> dict[str, object]:
    return {
        "interval": "0.1s",
        "full_resync_interval": "1s",
        "max_inventory_age": "1h",
        "retry_backoff": "0.01s",
        "hold_after_start": False,
        **overrides,
    }


async def _settled(ca) -> bool:
    instances = await ca.nodes("big")
    failed = sum(i.status.HasField("errorInfo") for i in instances)
    return failed == 2 and len(instances) == 4


async def _max_is(ca, expected: int) -> bool:
    return await max_size(ca) == expected


async def test_neutrons_ports_and_cinders_volumes_bound_the_groups_that_take_them(tmp_path):
    """Nova makes one port per network of each server, and a boot-from-volume group's server
    takes a volume of its size: osas reads Neutron's port quota and Cinder's limits over HTTP
    (unmodified openstacksdk) and bounds each group by them."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        sim.nova.quota.ports = 6
        sim.nova.quota.volumes = 10
        sim.nova.quota.gigabytes = 100
        disk = {**BIG, "id": "disk", "boot_volume": {"size": 40}}
        config = big_config(tmp_path, node_groups=[BIG, disk])
        provider = Provider(config, cloud_for(sim))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                assert await max_size(ca, "big") == 6
                assert await max_size(ca, "disk") == 2  # 100 GiB, 40 a server
                await ca.increase("disk", 2)
                await until(lambda: _running(ca, "disk", 2), "two servers on volumes")
                await provider.sync(full=False)
                await provider.app.reconciler.read_quota_once()
                assert await max_size(ca, "disk") == 2  # its target: no room for a third
                assert await max_size(ca, "big") == 4  # their two ports are gone
            (big, disk_group) = provider.app.status()["groups"]
            assert disk_group["quota_headroom"]["volume_gib"] == 0
            assert big["quota_headroom"]["ports"] == 4
        finally:
            await provider.stop()


async def _running(ca, group: str, count: int) -> bool:
    running = pb.InstanceStatus.instanceRunning
    return sum(i.status.instanceState == running for i in await ca.nodes(group)) == count
