"""What an operator sees of a running osas: /metrics moving with a CA session against the
simulated OpenStack, /healthz and /readyz through an outage, servers that need a person, the
access line of each call, and ``osas status``. Everything over real HTTP and gRPC on loopback."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support import (
    API_TIMEOUT,
    CLUSTER,
    STATUS_SCREENS,
    TAG,
    Provider,
    assert_status_screen,
    big_config,
    ca_client,
    config_data,
    config_on,
    expect_status,
    free_port,
    osas_serve,
    ours,
    read_events,
    settings_for,
    write_config,
)

from osas.cli.status_table import render_status
from osas.cloud.metrics import CloudMetrics
from osas.cloud.openstack import OpenStackCloud
from osas.config import ConfigError, load_config
from osas.domain.servers import META_CLUSTER, META_GROUP, Fault
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc
from osas.service.gate import REQUEST_ID_KEY
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(port: int, path: str) -> tuple[int, str]:
    """One plain HTTP GET, as kubelet or Prometheus makes it (blocking: call it in a thread)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


async def fetch(port: int, path: str) -> tuple[int, str]:
    # In a thread: the server answering is this very event loop.
    return await asyncio.to_thread(get, port, path)


async def scrape(port: int) -> Samples:
    status, text = await fetch(port, "/metrics")
    assert status == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "info": ("_info",)}


async def exposed_names(port: int) -> set[str]:
    """Every series name /metrics announces, also of families that have no sample yet."""
    _, text = await fetch(port, "/metrics")
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
    return names


# The place the adapter reaches, as the cloud metrics label it.
AT_SIM = {"cloud": "sim", "region": "RegionOne"}
# The place the engine's metrics label, where the configuration names none: the OS_*
# environment's cloud, in its default region.
AT_PLACE = {"cloud": "environment", "region": ""}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def until(
    port: int, check: Callable[[Samples], bool], what: str, timeout: float = 20.0
) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = await scrape(port)
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise AssertionError(msg)
        await asyncio.sleep(0.1)


async def start(tmp_path, sim: SimulatedOpenStack, *, wait: bool = True, **overrides) -> Provider:
    """osas against the simulator over HTTP, its OpenStack requests counted in the app's
    registry, metrics on a free loopback port."""
    registry = CollectorRegistry()
    cloud = OpenStackCloud(
        settings_for(sim, api_timeout=API_TIMEOUT),
        metrics=CloudMetrics(registry).at(*AT_SIM.values()),
    )
    config = big_config(tmp_path, metrics_listen="127.0.0.1:0", **overrides)
    provider = Provider(config, cloud, registry=registry)
    await provider.start(wait_serving=wait)
    return provider


def ops_port(provider: Provider) -> int:
    assert provider.app.ops is not None
    return provider.app.ops.port


def check_fresh(first: Samples) -> None:
    """What a freshly synced osas with nothing to do shows."""
    assert value(first, "osas_ready") == 1
    assert value(first, "osas_node_group_max_size", group="big") == 60
    assert value(first, "osas_node_group_target_size", group="big") == 0
    assert ("osas_creates_total", frozenset({("group", "big"), ("result", "created")})) in first
    assert value(first, "osas_queue_capacity", **AT_PLACE) == 200
    assert value(first, "osas_inventory_age_seconds", **AT_PLACE) >= 0
    assert value(first, "osas_reconcile_duration_seconds_count", **AT_PLACE, kind="full") >= 1
    build = next(key for key in first if key[0] == "osas_build_info")
    assert {"version", "python", "grpcio", "openstacksdk"} <= dict(build[1]).keys()


async def test_metrics_follow_a_scale_up_a_quota_failure_and_a_scale_down(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.2)) as sim:
        provider = await start(tmp_path, sim)
        port = ops_port(provider)
        try:
            async with ca_client(provider.address) as ca:
                check_fresh(await scrape(port))

                # Scale-up: three creates, each one POST, three servers running.
                await ca.increase("big", 3)
                up = await until(
                    port,
                    lambda m: value(m, "osas_inventory_servers", group="big", state="running") == 3,
                    "3 running servers",
                )
                assert value(up, "osas_creates_requested_total", group="big") == 3
                assert value(up, "osas_creates_total", group="big", result="created") == 3
                assert value(up, "osas_node_group_target_size", group="big") == 3
                assert (
                    value(
                        up,
                        "osas_openstack_requests_total",
                        **AT_SIM,
                        service="compute",
                        operation="create_server",
                        status="ok",
                    )
                    == 3
                )
                assert (
                    value(
                        up,
                        "osas_openstack_request_duration_seconds_count",
                        **AT_SIM,
                        service="compute",
                        operation="create_server",
                    )
                    == 3
                )
                assert value(
                    up,
                    "osas_grpc_server_handled_total",
                    method="NodeGroupIncreaseSize",
                    code="OK",
                ) == value(up, "osas_grpc_server_started_total", method="NodeGroupIncreaseSize")

                # The project's quota refuses the next two creates: class 1, QuotaExceeded.
                sim.nova.faults.quota_exceeded = 2
                await ca.increase("big", 2)
                quota = await until(
                    port,
                    lambda m: value(m, "osas_creates_in_hand", group="big", state="failed") == 2,
                    "2 failed creates",
                )
                assert value(quota, "osas_creates_total", group="big", result="failed") == 2
                assert (
                    value(
                        quota,
                        "osas_create_failures_total",
                        group="big",
                        error_class="1",
                        code="QuotaExceeded",
                    )
                    == 2
                )
                assert (
                    value(
                        quota,
                        "osas_openstack_requests_total",
                        **AT_SIM,
                        service="compute",
                        operation="create_server",
                        status="quota",
                    )
                    == 2
                )
                instances = await ca.nodes("big")
                failed = [i.id for i in instances if i.status.HasField("errorInfo")]
                await ca.delete("big", [(i, i) for i in failed])  # CA's clean-up
                # Rendered at most five times a second: a scrape may be that far behind.
                cleaned = await until(
                    port,
                    lambda m: value(m, "osas_creates_in_hand", group="big", state="failed") == 0,
                    "the failures cleaned up",
                )
                assert value(cleaned, "osas_node_group_target_size", group="big") == 3

                # A refusal is counted by its code.
                await expect_status(grpc.StatusCode.FAILED_PRECONDITION, ca.increase("big", 100))
                await until(
                    port,
                    lambda m: (
                        value(
                            m,
                            "osas_grpc_server_handled_total",
                            method="NodeGroupIncreaseSize",
                            code="FAILED_PRECONDITION",
                        )
                        == 1
                    ),
                    "the refusal counted",
                )

                # Scale-down: two servers deleted, one left.
                running = [i.id for i in instances if i.id.startswith("openstack:///")]
                await ca.delete("big", [("node", pid) for pid in running[:2]])
                down = await until(
                    port,
                    lambda m: (
                        value(m, "osas_ledger_events_total", group="big", event="server-deleted")
                        == 2
                    ),
                    "2 servers deleted",
                )
                assert value(down, "osas_delete_orders_total", group="big", reason="requested") == 2
                assert value(down, "osas_inventory_servers", group="big", state="running") == 1
                assert value(down, "osas_inventory_servers", group="big", state="deleting") == 0
                assert value(down, "osas_node_group_target_size", group="big") == 1
                assert value(down, "osas_workers_busy", **AT_PLACE) == 0
                assert value(down, "osas_queue_depth", **AT_PLACE, kind="delete") == 0
                assert len(ours(sim)) == 1
        finally:
            await provider.stop()


async def test_healthz_answers_through_an_outage_and_readyz_follows_the_inventory(tmp_path):
    sim = SimulatedOpenStack(FakeNova(build_seconds=0.2), port=free_port())
    sim.start()
    settings = settings_for(sim, api_timeout=API_TIMEOUT)
    sim.stop()  # nothing listens there: OpenStack is unreachable when osas starts
    registry = CollectorRegistry()
    config = big_config(
        tmp_path,
        metrics_listen="127.0.0.1:0",
        reconcile={
            "interval": "0.2s",
            "full_resync_interval": "1s",
            "max_inventory_age": "1s",
            "retry_backoff": "0.01s",
            "create_doubt_window": f"{API_TIMEOUT + 1}s",
            "hold_after_start": False,
        },
    )
    provider = Provider(config, OpenStackCloud(settings), registry=registry)
    await provider.start(wait_serving=False)
    try:
        while provider.app.ops is None or not provider.app.ops.port:
            await asyncio.sleep(0.01)
        port = ops_port(provider)
        await asyncio.sleep(0.3)  # a few failed first syncs
        assert await fetch(port, "/healthz") == (200, "ok\n")
        status, text = await fetch(port, "/readyz")
        assert status == 503
        assert text.startswith("not ready: first sync with OpenStack not done yet: ")
        assert value(await scrape(port), "osas_ready") == 0

        sim.start()  # OpenStack is back
        await provider.wait_serving(timeout=30)
        assert await fetch(port, "/healthz") == (200, "ok\n")
        assert await fetch(port, "/readyz") == (200, "ready\n")

        sim.nova.faults.error_rate = 1.0  # every sync fails from now on
        deadline = time.monotonic() + 20
        while (status := (await fetch(port, "/readyz"))[0]) == 200:
            assert time.monotonic() < deadline, "/readyz never turned 503"
            await asyncio.sleep(0.1)
        status, text = await fetch(port, "/readyz")
        assert status == 503
        assert "old (limit 1s)" in text
        assert await fetch(port, "/healthz") == (200, "ok\n")
        samples = await scrape(port)
        assert value(samples, "osas_ready") == 0
        assert value(samples, "osas_inventory_age_seconds", **AT_PLACE) > 1
        failures = value(samples, "osas_reconcile_failures_total", **AT_PLACE, kind="incremental")
        failures += value(samples, "osas_reconcile_failures_total", **AT_PLACE, kind="full")
        assert failures >= 1
        # After the first sync too, the outage's length and cause, on the screen and in /status.
        document = json.loads((await fetch(port, "/status"))[1])
        assert document["syncs"]["consecutive_failures"] >= 1
        assert document["syncs"]["failing_for_seconds"] > 0
        assert value(samples, "osas_reconcile_failing_seconds", **AT_PLACE) > 0
        screen = render_status(document)
        assert len([line for line in screen.splitlines() if "OpenStack FAILING for" in line]) == 1
        assert screen.count(document["syncs"]["last_error"]) == 1  # said once, not twice
        assert (await fetch(port, "/nope"))[0] == 404
    finally:
        sim.nova.faults.error_rate = 0.0
        await provider.stop()
        sim.stop()


async def status_until(
    port: int, check: Callable[[dict[str, Any]], bool], timeout: float = 5.0
) -> dict[str, Any]:
    """/status once ``check`` holds of it, or the last one after ``timeout``: it is rendered
    at most every 0.2 s, so the first after a change may be older than the change."""
    deadline = time.monotonic() + timeout
    while True:
        status = json.loads((await fetch(port, "/status"))[1])
        if check(status) or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.05)


def osas_status(url: str) -> subprocess.CompletedProcess[str]:
    """``osas status --url``, as an operator runs it (blocking: call it in a thread)."""
    command = [sys.executable, "-m", "osas", "status", "--url", url]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def test_an_outage_at_start_shows_its_cause_in_status_readyz_and_metrics(tmp_path):
    sim = SimulatedOpenStack(FakeNova(build_seconds=0.2), port=free_port())
    sim.start()
    settings = settings_for(sim, api_timeout=API_TIMEOUT)
    identity = sim.clouds_yaml_entry()["auth"]["auth_url"]
    sim.stop()  # nothing listens there: OpenStack is unreachable when osas starts
    registry = CollectorRegistry()
    config = big_config(tmp_path, metrics_listen="127.0.0.1:0")
    path = tmp_path / "osas.yaml"  # where big_config wrote it
    provider = Provider(config, OpenStackCloud(settings), registry=registry, config_path=path)
    await provider.start(wait_serving=False)
    try:
        while provider.app.ops is None or not provider.app.ops.port:
            await asyncio.sleep(0.01)
        port = ops_port(provider)
        while provider.app.reconciler.status.failures < 3:
            await asyncio.sleep(0.01)
        cause = f"cannot reach {identity}: connection refused: nothing listens at that address"
        syncs = json.loads((await fetch(port, "/status"))[1])["syncs"]
        assert syncs["failures"] >= 3
        assert syncs["consecutive_failures"] == syncs["failures"]
        assert syncs["failing_for_seconds"] > 0
        assert syncs["last_error"].startswith(cause)
        status, text = await fetch(port, "/readyz")
        assert status == 503
        assert "attempt(s) failed), the last: " in text
        assert cause in text
        samples = await scrape(port)
        assert value(samples, "osas_reconcile_failures_total", **AT_PLACE, kind="full") >= 3
        assert value(samples, "osas_reconcile_failing_seconds", **AT_PLACE) > 0
        result = await asyncio.to_thread(osas_status, f"http://127.0.0.1:{port}")
        assert result.returncode == 1, result.stderr
        assert_status_screen("an unreachable cloud", result.stdout)
        lines = result.stdout.splitlines()
        assert lines[0] == f"cluster {CLUSTER} (config {path})"
        assert cause in lines[1]  # said once, where osas says why it is not ready

        sim.start()  # OpenStack is back: the outage is over, and said to be
        await provider.wait_serving(timeout=30)
        syncs = (await status_until(port, lambda s: s["syncs"]["consecutive_failures"] == 0))[
            "syncs"
        ]
        assert (syncs["consecutive_failures"], syncs["failing_for_seconds"]) == (0, None)
        assert syncs["last_error"] is None
        assert value(await scrape(port), "osas_reconcile_failing_seconds", **AT_PLACE) == 0
        result = await asyncio.to_thread(osas_status, f"http://127.0.0.1:{port}")
        assert result.returncode == 0, result.stderr
        assert "FAILING" not in result.stdout
    finally:
        await provider.stop()
        sim.stop()


def seed_problems(nova: FakeNova) -> dict[str, str]:
    """An ERROR server of a configured group and a server of a group not configured, both
    carrying this cluster's marks."""
    marks = {META_CLUSTER: CLUSTER}
    error = nova.seed(
        name=f"{CLUSTER}-big-err",
        metadata={**marks, META_GROUP: "big"},
        tags=[TAG],
        status="ERROR",
        fault=Fault(500, "No valid host was found. There are not enough hosts available."),
    )
    stray = nova.seed(
        name=f"{CLUSTER}-retired-0", metadata={**marks, META_GROUP: "retired"}, tags=[TAG]
    )
    return {"error": error.server_id, "unconfigured": stray.server_id}


CHART_FILES = Path(__file__).parent.parent / "charts" / "osas" / "files"


def assert_dashboards_use_real_metrics(exposed: set[str]) -> None:
    """Every osas metric the shipped alert rules and dashboard query is one osas exposes."""
    rules = yaml.safe_load((CHART_FILES / "prometheus-rules.yaml").read_text(encoding="utf-8"))
    assert rules["groups"][0]["rules"]
    dashboard = json.loads((CHART_FILES / "grafana-dashboard.json").read_text(encoding="utf-8"))
    queries = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    queries += [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())
    ]
    queries += [
        variable["definition"]
        for variable in dashboard["templating"]["list"]
        if "definition" in variable
    ]
    used = {name for query in queries for name in re.findall(r"\bosas_[a-z_]+", query)}
    assert len(used) > 15
    assert used <= exposed, used - exposed


async def test_servers_needing_a_person_show_in_metrics_and_status_and_are_left_alone(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.2)) as sim:
        seeded = seed_problems(sim.nova)
        provider = await start(tmp_path, sim)
        port = ops_port(provider)
        try:
            samples = await scrape(port)
            assert value(samples, "osas_server_problems", group="big", problem="error") == 1
            assert (
                value(
                    samples,
                    "osas_server_problems",
                    group="retired",
                    problem="unconfigured-group",
                )
                == 1
            )
            assert value(samples, "osas_server_problems_detected_total", problem="error") == 1
            assert value(samples, "osas_inventory_servers", group="big", state="error") == 1
            status, text = await fetch(port, "/status")
            assert status == 200
            document = json.loads(text)
            assert document["problems"]["error"] == 1
            assert document["problems"]["unconfigured-group"] == 1
            (group,) = document["groups"]
            assert group["failures"][0]["code"] == "NoValidHost"
            assert group["failures"][0]["class"] == 1
            await provider.sync()
            await provider.sync(full=False)
            assert_dashboards_use_real_metrics(await exposed_names(port))
            live = {server.server_id for server in sim.nova.live_servers()}
            assert set(seeded.values()) <= live  # reported, never deleted
            again = await scrape(port)
            assert value(again, "osas_server_problems_detected_total", problem="error") == 1
        finally:
            await provider.stop()


@pytest.mark.long
async def test_stuck_builds_and_deletes_show_in_metrics_until_they_finish(tmp_path):
    fast = {
        "interval": "0.2s",
        "full_resync_interval": "1s",
        "max_inventory_age": "1h",
        "retry_backoff": "0.01s",
        "create_doubt_window": f"{API_TIMEOUT + 1}s",
        "stuck_build_after": "0.5s",
        "stuck_delete_after": "0.5s",
        "hold_after_start": False,
    }
    nova = FakeNova(build_seconds=None, delete_seconds=2.0)  # builds finish on activate()
    with SimulatedOpenStack(nova) as sim:
        provider = await start(tmp_path, sim, reconcile=fast)
        port = ops_port(provider)

        def stuck(problem: str) -> Callable[[Samples], bool]:
            return lambda m: value(m, "osas_server_problems", group="big", problem=problem) == 1

        def over(problem: str) -> Callable[[Samples], bool]:
            return lambda m: value(m, "osas_server_problems", group="big", problem=problem) == 0

        try:
            async with ca_client(provider.address) as ca:
                await ca.increase("big", 1)
                await until(port, stuck("build-stuck"), "a stuck build")
                (building,) = ours(sim)
                document = json.loads((await fetch(port, "/status"))[1])
                (listed,) = document["problem_servers"]
                assert document["problem_servers_not_shown"] == 0
                assert listed["age_seconds"] >= 0
                assert listed["for_seconds"] >= 0
                assert {k: v for k, v in listed.items() if not k.endswith("_seconds")} == {
                    "problem": "build-stuck",
                    "group": "big",
                    "id": building.server_id,
                    "name": building.name,
                    "reason": "in BUILD longer than reconcile.stuck_build_after (0.5s)",
                }
                result = await asyncio.to_thread(osas_status, f"http://127.0.0.1:{port}")
                assert_status_screen("a stuck server", result.stdout)
                assert f"big/{building.name} (id {building.server_id}, " in result.stdout
                with sim.lock:
                    sim.nova.activate()
                running = await until(port, over("build-stuck"), "the build to finish")
                assert value(running, "osas_inventory_servers", group="big", state="running") == 1
                (server,) = ours(sim)
                await ca.delete("big", [("node", f"openstack:///{server.server_id}")])
                await until(port, stuck("delete-stuck"), "a delete that takes its time")
                (listed,) = json.loads((await fetch(port, "/status"))[1])["problem_servers"]
                assert (listed["problem"], listed["id"]) == ("delete-stuck", server.server_id)
                assert listed["reason"] == (
                    "being deleted longer than reconcile.stuck_delete_after (0.5s)"
                )
                done = await until(port, over("delete-stuck"), "the delete to finish")
            detected = "osas_server_problems_detected_total"
            assert value(done, detected, problem="build-stuck") == 1
            assert value(done, detected, problem="delete-stuck") == 1
            assert not ours(sim)
        finally:
            await provider.stop()


async def test_osas_status_prints_one_screen_from_a_running_osas(tmp_path):
    with SimulatedOpenStack(FakeNova(build_seconds=0.2)) as sim:
        seeded = seed_problems(sim.nova)
        provider = await start(tmp_path, sim)
        port = ops_port(provider)
        try:
            async with ca_client(provider.address) as ca:
                sim.nova.faults.quota_exceeded = 1
                await ca.increase("big", 1)
                await until(
                    port,
                    lambda m: value(m, "osas_creates_in_hand", group="big", state="failed") == 1,
                    "the failed create",
                )
            # Found through the configuration, as an operator on the host would.
            listen = f"0.0.0.0:{port}"
            config = write_config(tmp_path, config_data(metrics_listen=listen), "ops.yaml")
            command = [sys.executable, "-m", "osas", "status", "--config", str(config)]
            result = await asyncio.to_thread(
                subprocess.run, command, capture_output=True, text=True, timeout=60, check=False
            )
            assert result.returncode == 0, result.stderr
            out = result.stdout
            # Whose screen it is comes first: the cluster, and the file osas was started with.
            assert out.splitlines()[0] == f"cluster {CLUSTER}"
            assert out.splitlines()[1].endswith(": ready")
            row = next(line for line in out.splitlines() if line.startswith("big "))
            # GROUP MIN TARGET MAX RUNNING BUILDING ERROR QUEUED SENT IN-DOUBT FAILED DELETING
            assert row.split() == ["big", "0", "2", "60", "0", "0", "1", "0", "0", "0", "1", "0"]
            assert "1 x QuotaExceeded (class 1)" in out
            assert "1 x NoValidHost (class 1)" in out
            assert "error 1, build-stuck 0, delete-stuck 0, unconfigured-group 1" in out
            # Each server needing a person, by id and name, with its age and the reason.
            error_line = f"  error big/{CLUSTER}-big-err (id {seeded['error']}, "
            (line,) = [line for line in out.splitlines() if line.startswith(error_line)]
            assert re.search(r"\d+s old, for \d+s\): NoValidHost: No valid host was found", line)
            stray = f"  unconfigured-group retired/{CLUSTER}-retired-0 (id {seeded['unconfigured']}"
            assert any(line.startswith(stray) for line in out.splitlines())
            assert "node group 'retired'" in out
            assert "certificate reloads refused: 0" in out

            command = [sys.executable, "-m", "osas", "status", "--url", "http://127.0.0.1:1"]
            result = await asyncio.to_thread(
                subprocess.run, command, capture_output=True, text=True, timeout=60, check=False
            )
            assert result.returncode == 3
            assert "nothing listens at 127.0.0.1:1: is osas running" in result.stderr
        finally:
            await provider.stop()


async def test_many_servers_needing_a_person_are_capped_with_how_many_more(tmp_path):
    """50 listed by /status, 10 on the screen, and the rest counted: a removed group with
    hundreds of servers must not bury the screen."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.2)) as sim:
        marks = {META_CLUSTER: CLUSTER, META_GROUP: "retired"}
        names = [f"{CLUSTER}-retired-{index:02}" for index in range(53)]
        for name in names:
            sim.nova.seed(name=name, metadata=marks, tags=[TAG])
        provider = await start(tmp_path, sim)
        port = ops_port(provider)
        try:
            document = json.loads((await fetch(port, "/status"))[1])
            assert document["problems"]["unconfigured-group"] == 53
            listed = document["problem_servers"]
            assert len(listed) == 50
            assert document["problem_servers_not_shown"] == 3
            assert {server["name"] for server in listed} < set(names)
            result = await asyncio.to_thread(osas_status, f"http://127.0.0.1:{port}")
            lines = result.stdout.splitlines()
            at = lines.index(next(line for line in lines if line.startswith("servers needing")))
            shown = lines[at + 1 : at + 11]
            assert all(line.startswith("  unconfigured-group retired/") for line in shown)
            assert lines[at + 11] == "  and 43 more"
        finally:
            await provider.stop()


def test_one_access_line_per_mutating_call_and_none_for_reads(tmp_path, sim):
    config = write_config(tmp_path, config_on(sim))
    with osas_serve(str(config)) as process:
        events = read_events(process, "health SERVING", time.monotonic() + 20)
        listening = next(e for e in events if e["event"] == "grpc listening")
        with grpc.insecure_channel(f"127.0.0.1:{listening['port']}") as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            # Reads as CA makes them every loop: counted, never logged at info.
            stub.Refresh(pb.RefreshRequest(), timeout=5)
            stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
            stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="workers"), timeout=5)
            stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="workers"), timeout=5)
            node = pb.ExternalGrpcNode(name="n1", providerID=f"openstack:///{uuid.uuid4()}")
            _, read = stub.NodeGroupForNode.with_call(
                pb.NodeGroupForNodeRequest(node=node), timeout=5
            )
            with pytest.raises(grpc.RpcError) as defaults:  # UNIMPLEMENTED: "keep your defaults"
                stub.NodeGroupGetOptions(
                    pb.NodeGroupAutoscalingOptionsRequest(id="workers"), timeout=5
                )
            # No line names them, so no request id is sent with them either.
            assert defaults.value.code() is grpc.StatusCode.UNIMPLEMENTED
            assert REQUEST_ID_KEY not in dict(defaults.value.trailing_metadata())
            assert REQUEST_ID_KEY not in dict(read.trailing_metadata())
            _, call = stub.NodeGroupIncreaseSize.with_call(
                pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2), timeout=5
            )
            increase_id = dict(call.trailing_metadata())[REQUEST_ID_KEY]
            with pytest.raises(grpc.RpcError) as refused:
                stub.NodeGroupDeleteNodes(
                    pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node]), timeout=5
                )
            delete_id = dict(refused.value.trailing_metadata())[REQUEST_ID_KEY]
            with pytest.raises(grpc.RpcError) as unknown:
                stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="nope"), timeout=5)
            target_id = dict(unknown.value.trailing_metadata())[REQUEST_ID_KEY]
        assert len({increase_id, delete_id, target_id}) == 3
        events = read_events(process, "rpc", time.monotonic() + 20)
        events += read_events(process, "rpc", time.monotonic() + 20)
        events += read_events(process, "rpc", time.monotonic() + 20)
    lines = [e for e in events if e["event"] == "rpc"]
    assert [(e["method"], e["code"], e["request_id"]) for e in lines] == [
        ("NodeGroupIncreaseSize", "OK", increase_id),
        ("NodeGroupDeleteNodes", "NOT_FOUND", delete_id),
        ("NodeGroupTargetSize", "NOT_FOUND", target_id),
    ]
    increase, delete, target = lines
    assert increase["level"] == "info"
    assert (increase["group"], increase["delta"], increase["target"]) == ("workers", 2, 2)
    assert increase["duration_ms"] >= 0
    assert delete["level"] == "warning"
    assert delete["group"] == "workers"
    assert delete["reason"]
    assert target["group"] == "nope"
    assert "nope" in target["reason"]
    # One line per call: no second line of the controller's or the error mapping's own.
    assert not [e for e in events if e["event"] in {"scale-up accepted", "rpc refused"}]


def test_metrics_listen_is_validated_like_listen(tmp_path):
    def load(**overrides):
        return load_config(write_config(tmp_path, config_data(**overrides)))

    assert load().metrics_listen is None  # off unless set
    assert load(metrics_listen="0.0.0.0:9090").server_settings().metrics_listen == "0.0.0.0:9090"
    for wrong in ("9090", "0.0.0.0:99999", "host:port"):
        with pytest.raises(ConfigError, match="metrics_listen"):
            load(metrics_listen=wrong)
    with pytest.raises(ConfigError, match="metrics_listen must differ"):
        load(listen="127.0.0.1:8086", metrics_listen="127.0.0.1:8086")
    stuck = load(reconcile={"stuck_build_after": "45m", "stuck_delete_after": "5m"})
    settings = stuck.engine_settings()
    assert (settings.reconcile.stuck_build_after, settings.reconcile.stuck_delete_after) == (
        2700.0,
        300.0,
    )
    with pytest.raises(ConfigError, match="stuck_delete_after"):
        load(reconcile={"stuck_delete_after": "0s"})


def test_operations_md_shows_the_status_screens_the_tests_see():
    """docs/operations.md shows the screen in each state as a run shows it: each of its
    screens has the lines the tests find on the live one."""
    text = (Path(__file__).parent.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    blocks = text.split("```")[1::2]
    screens = [block for block in blocks if "\n$ osas status" in "\n" + block]
    assert len(screens) >= len(STATUS_SCREENS)
    for state in STATUS_SCREENS:
        assert any(
            all(re.search(line, screen, re.MULTILINE) for line in STATUS_SCREENS[state])
            for screen in screens
        ), f"docs/operations.md shows no screen of {state} as osas status prints it"
