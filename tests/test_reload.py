"""Configuration reload: node groups added, changed or removed under a running osas, on a file
change or SIGHUP; a broken file changes nothing."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

import grpc
import yaml
from fake_cloud import FakeCloud
from support import (
    CLUSTER,
    Provider,
    assert_status_screen,
    ca_client,
    config_data,
    config_on,
    eventually,
    expect_status,
    osas_serve,
    read_events,
    write_config,
)

import osas.app
from osas.config import load_config, restart_only_changes
from osas.domain.servers import META_CLUSTER, META_GROUP, TAG_CLUSTER_PREFIX, Flavor
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc
from osas.sim.model import FakeNova

TAG = f"{TAG_CLUSTER_PREFIX}{CLUSTER}"
EXTRA = {
    "id": "extra",
    "min_size": 0,
    "max_size": 4,
    "flavor": "m1.small",
    "image": "ubuntu-24.04",
    "networks": ["cluster-net"],
}


def seed(nova: FakeNova, group: str, name: str) -> str:
    metadata = {META_CLUSTER: CLUSTER, META_GROUP: group}
    return nova.seed(name=name, metadata=metadata, tags=[TAG]).server_id


def groups(answer: list[pb.NodeGroup]) -> dict[str, tuple[int, int]]:
    return {g.id: (g.minSize, g.maxSize) for g in answer}


async def test_groups_added_changed_and_removed_show_after_the_next_refresh(tmp_path):
    nova = FakeNova()
    under = seed(nova, "extra", "already-there")  # a group not configured yet, running
    gpu = seed(nova, "gpu", "gpu-0")
    data = config_data()
    path = write_config(tmp_path, data)
    provider = Provider(load_config(path), FakeCloud(nova), config_path=path)
    await provider.start()
    try:
        async with ca_client(provider.address) as ca:
            assert groups(await ca.node_groups()) == {"workers": (1, 10), "gpu": (0, 3)}
            assert (await ca.group_for_node("already-there", f"openstack:///{under}")).id == ""

            data["node_groups"][0]["max_size"] = 7
            data["node_groups"] = [data["node_groups"][0], EXTRA]  # gpu removed, extra added
            write_config(tmp_path, data)
            assert await provider.app.reload_once() == "applied"
            await ca.refresh()
            assert groups(await ca.node_groups()) == {"workers": (1, 7), "extra": (0, 4)}
            extra = await ca.group_for_node("already-there", f"openstack:///{under}")
            assert (extra.id, extra.maxSize) == ("extra", 4)
            assert await ca.target_size("extra") == 1
            await expect_status(grpc.StatusCode.NOT_FOUND, ca.target_size("gpu"))
            await expect_status(grpc.StatusCode.FAILED_PRECONDITION, ca.increase("workers", 8))
            await ca.increase("extra", 1)  # the new group scales
            await eventually(lambda: len(nova.live_servers()) == 3, what="a server of extra")
        # The removed group's server is left alone.
        assert gpu in {s.server_id for s in nova.live_servers()}
        assert await provider.app.reload_once() == "unchanged"
    finally:
        await provider.stop()


def rejections(caplog) -> list[str]:
    """The reasons of the rejected reloads logged so far."""
    return [
        record.msg["reason"]
        for record in caplog.records
        if isinstance(record.msg, dict)
        and record.msg.get("event")
        == "configuration reload rejected; the configuration in force stays"
    ]


async def test_a_broken_file_changes_nothing(tmp_path, caplog, logs_at_debug):
    """Not YAML; min above max; and two that load as YAML and would change something unseen:
    a key given twice (the last `max_size` winning), a missing user data file (every create of
    the group failing). Each is rejected, logged, and changes nothing; fixed, the file applies."""
    (tmp_path / "template").write_text("#cloud-config\nhostname: ${server_name}\n")
    data = config_data()
    path = write_config(tmp_path, data)
    provider = Provider(load_config(path), FakeCloud(FakeNova()), config_path=path)
    await provider.start()
    try:
        async with ca_client(provider.address) as ca:
            before = groups(await ca.node_groups())
            path.write_text("node_groups: [\n  - id: workers\n    max_size: {\n")  # not YAML
            assert await provider.app.reload_once() == "rejected"
            data["node_groups"][0]["min_size"] = 99  # YAML, but min above max
            write_config(tmp_path, data)
            assert await provider.app.reload_once() == "rejected"
            data["node_groups"][0]["min_size"] = 1
            text = yaml.safe_dump(data).replace(
                "  max_size: 10\n", "  max_size: 10\n  max_size: 4\n"
            )
            path.write_text(text)
            assert await provider.app.reload_once() == "rejected"
            twice = [n for n, line in enumerate(text.splitlines(), 1) if "max_size: " in line][:2]
            del data["node_groups"][0]["user_data"]
            data["node_groups"][0]["user_data_file"] = str(tmp_path / "missing")
            data["node_groups"][0]["max_size"] = 4
            write_config(tmp_path, data)
            assert await provider.app.reload_once() == "rejected"
            await ca.refresh()
            assert groups(await ca.node_groups()) == before
            registry = provider.app.registry
            assert (
                registry.get_sample_value("osas_config_reloads_total", {"result": "rejected"}) == 4
            )
            assert (
                registry.get_sample_value("osas_config_reloads_total", {"result": "applied"}) == 0
            )
            data["node_groups"][0]["user_data_file"] = str(tmp_path / "template")
            write_config(tmp_path, data)
            assert await provider.app.reload_once() == "applied"
            await ca.refresh()
            assert groups(await ca.node_groups())["workers"] == (1, 4)
    finally:
        await provider.stop()
    assert rejections(caplog)[2:] == [
        (
            f"{path}: node_groups[0](workers).max_size: duplicate key at lines {twice[0]} and "
            f"{twice[1]} (YAML would keep the last and drop the others unseen); keep one"
        ),
        f"{path}: node_groups[0](workers).user_data_file: {tmp_path / 'missing'} does not exist",
    ]


async def test_a_restart_only_change_is_reported_not_applied(tmp_path):
    data = config_data()
    path = write_config(tmp_path, data)
    provider = Provider(load_config(path), FakeCloud(FakeNova()), config_path=path)
    await provider.start()
    try:
        data["queue"] = {"capacity": 7, "workers": 1}
        data["node_groups"][0]["max_size"] = 5
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "applied"
        assert provider.app.config.queue.capacity == 50  # as started
        assert provider.app.queue.capacity == 50
        assert provider.app.controller.cluster.group("workers").max_size == 5  # type: ignore[union-attr]
        assert restart_only_changes(provider.app.config, load_config(path)) == ["queue"]
    finally:
        await provider.stop()


async def test_the_watcher_picks_a_change_up_by_itself(tmp_path, monkeypatch):
    # It looks every 5 s; a tenth of a second here, so the test waits on the change alone.
    monkeypatch.setattr(osas.app, "_CONFIG_POLL_SECONDS", 0.1)
    data = config_data()
    path = write_config(tmp_path, data)
    provider = Provider(load_config(path), FakeCloud(FakeNova()), config_path=path)
    await provider.start()
    try:
        data["node_groups"][1]["max_size"] = 2
        write_config(tmp_path, data)

        def reloaded() -> bool:
            spec = provider.app.controller.cluster.group("gpu")
            return spec is not None and spec.max_size == 2

        await eventually(reloaded, timeout=15, what="the change picked up")
    finally:
        await provider.stop()


class HeldFlavorCloud(FakeCloud):
    """FakeCloud whose fetches of the flavors named in ``held`` wait for ``release``."""

    def __init__(self) -> None:
        super().__init__(FakeNova())
        self.held: set[str] = set()
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def get_flavor(self, name_or_id: str) -> Flavor | None:
        if name_or_id in self.held:
            self.waiting.set()
            await self.release.wait()
        return await super().get_flavor(name_or_id)


async def test_a_flavor_fetched_for_the_spec_a_reload_replaced_never_lands(tmp_path):
    """Invariant: a group's template is built from the flavor its spec in force names. A
    complete listing fetches every group's flavor after it lists; a reload that changes the
    flavor meanwhile fetches and applies its own, and the listing's fetch of the old flavor,
    answered later, must not take its place (under load it did: the template went on naming
    the old flavor until the next complete listing, 30 minutes by default)."""
    data = config_data()
    path = write_config(tmp_path, data)
    cloud = HeldFlavorCloud()
    provider = Provider(load_config(path), cloud, config_path=path)
    await provider.start()
    try:
        cloud.held.add("m1.medium")
        listing = asyncio.ensure_future(provider.sync(full=True))
        await asyncio.wait_for(cloud.waiting.wait(), timeout=10)
        data["node_groups"][0]["flavor"] = "m1.small"
        write_config(tmp_path, data)
        assert await provider.app.reload_once(force=True) == "applied"
        cloud.release.set()
        await listing
        flavor = provider.app.inventory.snapshot.flavor("workers")
        assert flavor is not None
        assert flavor.name == "m1.small"
        async with ca_client(provider.address) as ca:
            node = bytes((await ca.template("workers")).nodeBytes)
        assert b"m1.small" in node
        assert b"m1.medium" not in node
    finally:
        await provider.stop()


def test_sighup_reloads_osas_serve(tmp_path, sim):
    data = config_on(sim)
    path = write_config(tmp_path, data)
    with osas_serve(path) as process:
        events = read_events(process, "health SERVING", time.monotonic() + 20)
        port = next(e for e in events if e["event"] == "grpc listening")["port"]
        data["node_groups"][0]["max_size"] = 3
        path.write_text(yaml.safe_dump(data))
        process.send_signal(signal.SIGHUP)
        read_events(process, "configuration reloaded", time.monotonic() + 20)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            stub.Refresh(pb.RefreshRequest(), timeout=5)
            answer = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
        assert groups(list(answer.nodeGroups))["workers"] == (1, 3)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def status_screen(port: int) -> tuple[int, str]:
    """``osas status --url``, as an operator runs it; its exit code and screen."""
    command = [sys.executable, "-m", "osas", "status", "--url", f"http://127.0.0.1:{port}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    return result.returncode, result.stdout


async def test_a_rejected_reload_shows_on_the_status_screen_until_one_is_applied(tmp_path):
    data = config_data(metrics_listen="127.0.0.1:0")
    path = write_config(tmp_path, data)
    provider = Provider(load_config(path), FakeCloud(FakeNova()), config_path=path)
    await provider.start()
    assert provider.app.ops is not None
    port = provider.app.ops.port
    try:
        code, screen = await asyncio.to_thread(status_screen, port)
        assert code == 0
        assert screen.splitlines()[0] == f"cluster {CLUSTER} (config {path})"
        assert "REJECTED" not in screen

        data["node_groups"][0]["min_size"] = 99  # min above max
        write_config(tmp_path, data)
        begun = time.time()
        assert await provider.app.reload_once() == "rejected"
        document = provider.app.status()["config_reload"]
        assert document["result"] == "rejected"
        assert "min_size 99 is greater than max_size 10" in document["reason"]
        assert begun - 1 <= datetime.fromisoformat(document["at"]).timestamp() <= time.time()
        code, screen = await asyncio.to_thread(status_screen, port)
        assert code == 0  # still ready, on the configuration in force
        assert_status_screen("a rejected reload", screen)
        lines = screen.splitlines()
        at = lines.index(next(line for line in lines if "reload REJECTED" in line))
        assert re.fullmatch(
            r"configuration reload REJECTED \d+s ago \(\S+\); the configuration loaded "
            "before stays in force:",
            lines[at],
        )
        assert lines[at + 1].startswith("  ")
        assert "min_size 99 is greater than max_size 10" in "\n".join(lines[at + 1 :])
        # In force: the sizes osas started with, as the group's row shows them.
        assert next(line for line in lines if line.startswith("workers ")).split()[1] == "1"

        data["node_groups"][0]["min_size"] = 2
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "applied"
        assert provider.app.status()["config_reload"]["result"] == "applied"
        code, screen = await asyncio.to_thread(status_screen, port)
        assert "REJECTED" not in screen
        assert (
            next(line for line in screen.splitlines() if line.startswith("workers ")).split()[1]
            == "2"
        )
    finally:
        await provider.stop()
