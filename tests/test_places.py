"""Where node groups live: a group may name its region, or another cloud (issue 35).

The configuration resolves every group into a place (a cloud and a region, with the settings
that reach it); `osas check-config` checks each place with the groups that live there, against
the simulator's regions behind one Keystone and a second simulated cloud with its own. osas
serve runs an engine per place: each scales in its own, a failing place fails nothing elsewhere,
status, metrics and logs say which place each figure belongs to, and each place spells its nodes'
provider ids as its cloud-provider-openstack does.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import anyio
import grpc
import pytest
import yaml
from fake_cloud import FakeCloud
from support import (
    Provider,
    config_data,
    engine_of,
    eventually,
    serving_places,
    write_config,
)

from osas.app import App, openstack_cloud
from osas.check import EXIT_CLOUD, EXIT_FAILED, EXIT_OK, Report, check_config
from osas.cli.status_table import render_status
from osas.config import ConfigError, load_config, places_of
from osas.demo.client import CaClient
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

AUTH = {
    "auth_url": "https://keystone.example:5000/v3",
    "username": "osas",
    "password": "secret",
    "project_name": "k8s",
    "user_domain_name": "Default",
    "project_domain_name": "Default",
}


def groups_in(places) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(place.cloud, place.region, place.group_ids) for place in places]


def with_places(tmp_path: Path, openstack: dict, **blocks: dict) -> Path:
    """The test configuration, the top-level ``openstack`` block given, and group blocks."""
    data = config_data(openstack=openstack)
    for group in data["node_groups"]:
        if group["id"] in blocks:
            group["openstack"] = blocks[group["id"]]
    return write_config(tmp_path, data)


def test_groups_without_a_block_of_their_own_live_where_openstack_says(tmp_path):
    config = load_config(with_places(tmp_path, {"auth": AUTH, "region_name": "North"}))
    assert groups_in(places_of(config)) == [
        ("keystone.example:5000/k8s", "North", ("workers", "gpu"))
    ]
    [place] = places_of(config)
    assert place.settings == config.openstack_settings()


def test_a_region_alone_keeps_the_clouds_credentials_and_tls(tmp_path):
    top = {"auth": AUTH, "region_name": "North", "cacert": "/etc/ca.pem", "interface": "internal"}
    config = load_config(with_places(tmp_path, top, gpu={"region_name": "South"}))
    north, south = places_of(config)
    assert groups_in([north, south]) == [
        ("keystone.example:5000/k8s", "North", ("workers",)),
        ("keystone.example:5000/k8s", "South", ("gpu",)),
    ]
    assert south.settings.auth == north.settings.auth
    assert (south.settings.cacert, south.settings.interface) == (Path("/etc/ca.pem"), "internal")
    assert south.settings.api_timeout == north.settings.api_timeout
    assert str(south) == "keystone.example:5000/k8s, region South"


def test_another_cloud_takes_its_own_tls_and_groups_of_one_place_share_it(tmp_path):
    top = {"auth": AUTH, "region_name": "North", "cacert": "/etc/ca.pem"}
    public = {"cloud": "public", "verify": False}
    config = load_config(with_places(tmp_path, top, workers=public, gpu=public))
    assert groups_in(places_of(config)) == [
        ("keystone.example:5000/k8s", "North", ()),  # checked even with no group in it
        ("public", "", ("workers", "gpu")),
    ]
    other = places_of(config)[1].settings
    assert (other.cloud, other.auth, other.cacert, other.verify) == ("public", None, None, False)


def test_groups_of_one_place_that_say_different_ways_to_reach_it_are_refused(tmp_path):
    top = {"auth": AUTH, "region_name": "North"}
    path = with_places(
        tmp_path, top, workers={"cloud": "public", "verify": False}, gpu={"cloud": "public"}
    )
    with pytest.raises(
        ConfigError,
        match=re.escape("node group 'gpu' lives in public, region (default) as workers does"),
    ):
        load_config(path)


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ({}, "name the group's cloud ('cloud' or 'auth'), its 'region_name', or both"),
        ({"cloud": "a", "auth": AUTH}, "give either 'cloud' (clouds.yaml) or 'auth', not both"),
        ({"region_name": "South", "cacert": "/ca.pem"}, "verify, cacert and interface go with"),
        ({"region": "South"}, "region"),  # a misspelt key is refused, never ignored
    ],
)
def test_a_groups_block_that_says_nowhere_or_too_much_is_refused(tmp_path, block, said):
    with pytest.raises(ConfigError, match="node_groups") as refused:
        load_config(with_places(tmp_path, {"auth": AUTH}, gpu=block))
    assert said in str(refused.value)


@pytest.fixture
def two_places():
    """One simulated cloud with two regions, and a second cloud with a Keystone of its own."""
    with (
        SimulatedOpenStack(FakeNova()) as private,
        SimulatedOpenStack(FakeNova(), region="Burst") as public,
    ):
        south = private.add_region("RegionTwo")
        south.add_image("south-only")
        public.add_image("public-only")
        yield private, south, public


def sim_auth(sim: SimulatedOpenStack) -> dict:
    return sim.clouds_yaml_entry()["auth"]


async def checked(config) -> tuple[int, str, list[str]]:
    """check-config's exit code, output and problems."""
    out = io.StringIO()
    report = Report(out)
    clouds = [(place, openstack_cloud(config, place=place)) for place in places_of(config)]
    code = await check_config(config, clouds, report)
    return code, out.getvalue(), report.problems


async def test_check_config_checks_each_place_with_the_groups_living_there(tmp_path, two_places):
    private, south, public = two_places
    top = {"auth": sim_auth(private), "region_name": "RegionOne"}
    data = config_data(openstack=top)
    workers, gpu = data["node_groups"]
    gpu["flavor"] = "m1.small"
    gpu["image"] = "south-only"
    gpu["openstack"] = {"region_name": "RegionTwo"}
    burst = {**workers, "id": "burst", "image": "public-only"}
    burst["openstack"] = {"auth": sim_auth(public), "region_name": "Burst"}
    data["node_groups"].append(burst)
    config = load_config(write_config(tmp_path, data))
    code, said, _ = await checked(config)
    assert code == EXIT_OK, said
    assert "place: 127.0.0.1" in said
    assert ", region RegionOne (node groups: workers)" in said
    assert ", region RegionTwo (node groups: gpu)" in said
    assert ", region Burst (node groups: burst)" in said
    # Each name looked up in its own place: the ids are that region's, or that cloud's.
    south_image = next(i for i in south.images() if i.name == "south-only")
    public_image = next(i for i in public.images() if i.name == "public-only")
    assert f"ok ({south_image.image_id})" in said
    assert f"ok ({public_image.image_id})" in said
    assert south.calls["compute.versions"] + south.calls["compute.version"] >= 1
    assert public.calls["compute.flavors.list"] + public.calls["compute.flavors.get"] >= 1


async def test_a_name_found_in_another_place_only_is_not_found_where_the_group_lives(
    tmp_path, two_places
):
    private, _, _ = two_places
    data = config_data(openstack={"auth": sim_auth(private), "region_name": "RegionOne"})
    data["node_groups"][1]["flavor"] = "m1.small"
    data["node_groups"][0]["image"] = "south-only"  # lives in RegionOne: not there
    data["node_groups"][1]["openstack"] = {"region_name": "RegionTwo"}
    code, said, problems = await checked(load_config(write_config(tmp_path, data)))
    assert code == EXIT_FAILED, said
    [problem] = problems
    assert problem.startswith("cloud 127.0.0.1:")
    assert problem.endswith("region RegionOne: node group 'workers': image 'south-only' not found")


async def test_a_place_that_cannot_be_used_is_said_and_the_others_are_still_checked(
    tmp_path, two_places
):
    private, south, _ = two_places
    south.nova.faults.error_rate = 1.0
    data = config_data(openstack={"auth": sim_auth(private), "region_name": "RegionOne"})
    data["node_groups"][1]["flavor"] = "m1.small"
    data["node_groups"][1]["openstack"] = {"region_name": "RegionTwo"}
    code, said, problems = await checked(load_config(write_config(tmp_path, data)))
    assert code == EXIT_CLOUD
    [problem] = problems
    assert "region RegionTwo: the cloud cannot be used: HTTP 503" in problem
    assert "all resources found" in said  # RegionOne's, checked all the same


# -- serving groups in two regions ------------------------------------------------------------


def two_region_config(tmp_path: Path, private: SimulatedOpenStack, **reconcile: str) -> Path:
    """workers in RegionOne (the top-level block's place), gpu (made small) in RegionTwo."""
    data = config_data(openstack={"auth": sim_auth(private), "region_name": "RegionOne"})
    data["reconcile"].update(reconcile)
    gpu = data["node_groups"][1]
    gpu.update(flavor="m1.small", openstack={"region_name": "RegionTwo"})
    del gpu["availability_zone"]
    return write_config(tmp_path, data)


def serving(path: Path) -> contextlib.AbstractAsyncContextManager[tuple[Provider, CaClient]]:
    return serving_places(load_config(path), config_path=path)


async def scale_in_both(provider: Provider, ca: CaClient, private, south) -> None:
    """Two gpu servers in RegionTwo and a workers server in RegionOne, listed by both places."""
    await ca.increase("gpu", 2)
    await ca.increase("workers", 1)
    await eventually(
        lambda: len(south.nova.live_servers()) == 2 and len(private.nova.live_servers()) == 1,
        what="two servers in RegionTwo, one in RegionOne",
    )
    for engine in provider.app.places:
        await engine.reconciler.reconcile_once(full=True)


async def test_groups_in_two_regions_each_scale_in_their_own(tmp_path, two_places):
    private, south, _ = two_places
    async with serving(two_region_config(tmp_path, private)) as (provider, ca):
        assert {g.id for g in await ca.node_groups()} == {"workers", "gpu"}
        assert [str(e.place).split(", ")[1] for e in provider.app.places] == [
            "region RegionOne",
            "region RegionTwo",
        ]
        await scale_in_both(provider, ca, private, south)
        assert (await ca.target_size("gpu"), await ca.target_size("workers")) == (2, 1)
        south_ids = {s.server_id for s in south.nova.live_servers()}
        assert {i.id for i in await ca.nodes("gpu")} == {f"openstack:///{i}" for i in south_ids}
        # A node of either region is found in its group.
        some = next(iter(south_ids))
        assert (await ca.group_for_node("n", f"openstack:///{some}")).id == "gpu"
        north = private.nova.live_servers()[0].server_id
        assert (await ca.group_for_node("n", f"openstack:///{north}")).id == "workers"
        template = await ca.template("gpu")
        assert b"RegionTwo" in template.nodeBytes  # topology.kubernetes.io/region


async def test_a_failing_region_slows_and_fails_nothing_elsewhere(tmp_path, two_places):
    """RegionTwo answering 503 to every call past its max_inventory_age: Refresh still
    succeeds (CA's loop goes on), RegionOne's groups scale; RegionTwo's groups answer from
    what it last listed and refuse scale-ups. Refresh fails only once no region is fresh."""
    private, south, _ = two_places
    path = two_region_config(tmp_path, private, interval="1s", max_inventory_age="2s")
    async with serving(path) as (provider, ca):
        south.nova.faults.error_rate = 1.0
        await anyio.sleep(2.5)
        stale = engine_of(provider, "RegionTwo").controller.staleness()
        assert stale is not None
        assert "OpenStack unreachable?" in stale
        await ca.refresh()
        assert await ca.target_size("gpu") == 0  # its last listing's, not an error
        # A scale-up there would sit in doubt, unseen by CA: refused, so that CA backs the
        # group off and scales another; nothing is queued.
        with pytest.raises(grpc.aio.AioRpcError) as held:
            await ca.increase("gpu", 1)
        assert held.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "node group 'gpu' cannot scale up now: inventory is" in str(held.value.details())
        assert await ca.target_size("gpu") == 0
        assert len(engine_of(provider, "RegionTwo").queue) == 0
        await ca.increase("workers", 2)
        await eventually(lambda: len(private.nova.live_servers()) == 2, what="RegionOne scales")
        private.nova.faults.error_rate = 1.0
        await anyio.sleep(2.5)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ca.refresh()
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        said = refused.value.details() or ""
        assert "region RegionOne: inventory is" in said
        assert "region RegionTwo: inventory is" in said


async def test_a_region_down_at_start_holds_the_other_back_only_until_it_tried(
    tmp_path, two_places
):
    private, south, _ = two_places
    south.nova.faults.error_rate = 1.0
    async with serving(two_region_config(tmp_path, private, retry_backoff="0.2s")) as (_, ca):
        # Serving on RegionOne: RegionTwo's group is out of CA's view until it is listed.
        assert [g.id for g in await ca.node_groups()] == ["workers"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ca.target_size("gpu")
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        south.nova.faults.error_rate = 0.0
        await eventually_async(
            lambda: _groups(ca), {"workers", "gpu"}, what="RegionTwo listed once it answers"
        )


async def _groups(ca: CaClient) -> set[str]:
    await ca.refresh()
    return {g.id for g in await ca.node_groups()}


async def eventually_async(get, expected, *, what: str, timeout: float = 10.0) -> None:
    deadline = anyio.current_time() + timeout
    while (got := await get()) != expected:
        assert anyio.current_time() < deadline, f"{what}: {got}"
        await anyio.sleep(0.1)


async def test_a_reload_cannot_move_a_group_to_another_place(tmp_path, two_places):
    private, _, _ = two_places
    path = two_region_config(tmp_path, private)
    async with serving(path) as (provider, _):
        data = yaml.safe_load(path.read_text())
        data["node_groups"][0]["openstack"] = {"region_name": "RegionTwo"}
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "rejected"
        data["node_groups"][0].pop("openstack")
        data["node_groups"].append({**data["node_groups"][1], "id": "gpu-2"})  # same place
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "applied"
        engine = engine_of(provider, "RegionTwo")
        assert [g.group_id for g in engine.inventory.cluster.node_groups] == ["gpu", "gpu-2"]


def test_serve_needs_a_cloud_for_each_place(tmp_path):
    config = load_config(
        with_places(tmp_path, {"auth": AUTH, "region_name": "North"}, gpu={"region_name": "South"})
    )
    with pytest.raises(ValueError, match="a cloud for each of"):
        App(config, {("keystone.example:5000/k8s", "North"): FakeCloud(FakeNova())})


async def test_status_metrics_and_logs_say_which_place_fails(
    tmp_path, two_places, caplog, logs_at_debug
):
    private, south, _ = two_places
    async with serving(two_region_config(tmp_path, private, interval="0.3s")) as (provider, _):
        south.nova.faults.error_rate = 1.0
        failing = engine_of(provider, "RegionTwo").reconciler.status
        await eventually(lambda: failing.consecutive_failures >= 1, what="RegionTwo failing")
        status = provider.app.status()
        by_region = {place["region"]: place for place in status["places"]}
        assert by_region["RegionTwo"]["groups"] == ["gpu"]
        assert "503" in by_region["RegionTwo"]["syncs"]["last_error"]
        assert by_region["RegionOne"]["syncs"]["last_error"] is None
        assert {(g["id"], g["region"]) for g in status["groups"]} == {
            ("workers", "RegionOne"),
            ("gpu", "RegionTwo"),
        }
        screen = render_status(status)
        assert ", region RegionTwo (gpu): OpenStack FAILING for" in screen
        assert ", region RegionOne (workers): last sync" in screen
        registry = provider.app.registry
        cloud = provider.app.places[0].place.cloud
        two = {"cloud": cloud, "region": "RegionTwo"}
        assert registry.get_sample_value("osas_reconcile_failing_seconds", two) > 0
        one = {"cloud": cloud, "region": "RegionOne"}
        assert registry.get_sample_value("osas_reconcile_failing_seconds", one) == 0
        assert registry.get_sample_value("osas_node_group_place", {"group": "gpu", **two}) == 1
        failures = "osas_reconcile_failures_total"
        assert registry.get_sample_value(failures, {**two, "kind": "incremental"}) >= 1
        assert registry.get_sample_value(failures, {**one, "kind": "incremental"}) == 0
        synced = "osas_reconcile_duration_seconds_count"
        assert registry.get_sample_value(synced, {**one, "kind": "incremental"}) >= 1
    failed = [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == "sync failed"
    ]
    assert failed
    assert all(str(line.get("place")).endswith(", region RegionTwo") for line in failed), failed


async def test_each_place_has_its_own_quota_and_a_second_cloud_its_own_keystone(
    tmp_path, two_places
):
    """RegionTwo's project holds one more server: only its group's max size says so. A group
    in the second cloud (its own Keystone, its own credentials) scales there."""
    private, south, public = two_places
    south.nova.quota.instances = 1
    path = two_region_config(tmp_path, private)
    data = yaml.safe_load(path.read_text())
    burst = {**data["node_groups"][0], "id": "burst", "min_size": 0, "max_size": 4}
    burst["openstack"] = {"auth": sim_auth(public), "region_name": "Burst"}
    data["node_groups"].append(burst)
    write_config(tmp_path, data)
    async with serving(path) as (provider, ca):
        for engine in provider.app.places:
            await engine.reconciler.read_quota_once()
        await ca.refresh()
        maxima = {g.id: g.maxSize for g in await ca.node_groups()}
        assert maxima == {"workers": 10, "gpu": 1, "burst": 4}
        await ca.increase("burst", 2)
        await eventually(lambda: len(public.nova.live_servers()) == 2, what="burst servers")
        assert private.nova.live_servers() == []
        assert south.nova.live_servers() == []
        assert len(provider.app.places) == 3


# -- a cloud's own clouds.yaml, and provider ids per place ---------------------------------


async def test_a_clouds_file_is_read_alone_for_its_cloud(tmp_path, two_places, monkeypatch):
    """A group's clouds_file holds its cloud's credentials (a Secret of its own in the chart):
    that cloud is read from that file alone, even where OS_CLIENT_CONFIG_FILE names another
    file with an entry of the same name; a file that cannot be read is said as such."""
    private, _, public = two_places
    decoy = tmp_path / "clouds.yaml"
    private.write_clouds_yaml(decoy, "burst")  # the same entry name, in the wrong cloud
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(decoy))
    own = tmp_path / "burst" / "clouds.yaml"
    public.write_clouds_yaml(own, "burst")
    path = two_region_config(tmp_path, private)
    data = yaml.safe_load(path.read_text())
    burst = {**data["node_groups"][0], "id": "burst", "min_size": 0, "max_size": 4}
    burst["openstack"] = {"cloud": "burst", "clouds_file": str(own)}
    data["node_groups"].append(burst)
    write_config(tmp_path, data)
    config = load_config(path)
    assert [place.settings.clouds_file for place in places_of(config)][-1] == own
    async with serving(path) as (_, ca):
        await ca.increase("burst", 2)
        await eventually(lambda: len(public.nova.live_servers()) == 2, what="burst servers")
        assert private.nova.live_servers() == []

    own.unlink()
    code, said, problems = await checked(load_config(path))
    assert code == EXIT_CLOUD, said
    assert [p for p in problems if "burst" in p] == [
        next(p for p in problems if f"clouds_file {own} cannot be read or is not YAML" in p)
    ]


def test_clouds_file_goes_with_a_cloud_entry(tmp_path):
    path = with_places(
        tmp_path, {"auth": AUTH}, gpu={"region_name": "South", "clouds_file": "/x/clouds.yaml"}
    )
    with pytest.raises(ConfigError, match="clouds_file goes with 'cloud'"):
        load_config(path)


def test_groups_of_one_place_spell_provider_ids_one_way(tmp_path):
    data = config_data(openstack={"auth": AUTH, "region_name": "North"}, provider_id_region="North")
    workers, gpu = data["node_groups"]
    gpu["openstack"] = {"region_name": "South", "provider_id_region": "South"}
    places = places_of(load_config(write_config(tmp_path, data)))
    assert [(p.region, p.provider_id_region) for p in places] == [
        ("North", "North"),
        ("South", "South"),
    ]
    # A group with no word of its own takes the top-level form, in whatever place.
    del gpu["openstack"]["provider_id_region"]
    places = places_of(load_config(write_config(tmp_path, data)))
    assert [p.provider_id_region for p in places] == ["North", "North"]
    workers["openstack"] = {"region_name": "South", "provider_id_region": "South"}
    with pytest.raises(ConfigError, match="provider ids name region 'North', not 'South'"):
        load_config(write_config(tmp_path, data))


async def test_each_place_spells_its_nodes_provider_ids_as_its_own_cloud_provider_does(
    tmp_path, two_places
):
    """cloud-provider-openstack running regional writes openstack://<region>/<uuid>: a place
    that says so answers and matches its nodes that way, the other keeps openstack:///<uuid>,
    and an id in the other form names no node of the place."""
    private, south, _ = two_places
    path = two_region_config(tmp_path, private)
    data = yaml.safe_load(path.read_text())
    data["node_groups"][1]["openstack"]["provider_id_region"] = "RegionTwo"
    write_config(tmp_path, data)
    async with serving(path) as (provider, ca):
        await scale_in_both(provider, ca, private, south)
        south_ids = sorted(s.server_id for s in south.nova.live_servers())
        north = private.nova.live_servers()[0].server_id
        assert sorted(i.id for i in await ca.nodes("gpu")) == [
            f"openstack://RegionTwo/{i}" for i in south_ids
        ]
        assert [i.id for i in await ca.nodes("workers")] == [f"openstack:///{north}"]
        assert (await ca.group_for_node("n", f"openstack://RegionTwo/{south_ids[0]}")).id == "gpu"
        assert (await ca.group_for_node("n", f"openstack:///{north}")).id == "workers"
        assert (await ca.group_for_node("n", f"openstack:///{south_ids[0]}")).id == ""
        assert (await ca.group_for_node("n", f"openstack://RegionTwo/{north}")).id == ""
        # CA deletes by the id it was given: the regional one.
        await ca.delete("gpu", [("n", f"openstack://RegionTwo/{south_ids[0]}")])
        await eventually(
            lambda: [s.server_id for s in south.nova.live_servers()] == south_ids[1:],
            what="the named server deleted",
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ca.delete("gpu", [("n", f"openstack:///{south_ids[1]}")])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert "neither 'openstack://RegionTwo/<server-uuid>'" in str(refused.value.details())
        assert len(south.nova.live_servers()) == 1

        # A reload may not change how a place spells its ids: that needs a restart.
        data["node_groups"][1]["openstack"]["provider_id_region"] = "Elsewhere"
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "rejected"
        assert {i.id for i in await ca.nodes("gpu")} == {
            f"openstack://RegionTwo/{i}" for i in south_ids
        }  # the one deleted still listed, as deleting
