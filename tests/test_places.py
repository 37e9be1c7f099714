"""Where node groups live: a group may name its region, or another cloud (issue 35).

The configuration resolves every group into a place (a cloud and a region, with the settings
that reach it); `osas check-config` checks each place with the groups that live there, against
the simulator's regions behind one Keystone and a second simulated cloud with its own. osas
serve, whose engine keeps one cloud and region in this release, refuses a configuration of
several places at its start and at a reload, saying so; one place keeps working unchanged.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from fake_cloud import FakeCloud
from support import Provider, config_data, write_config

from osas.app import App, openstack_cloud
from osas.check import EXIT_CLOUD, EXIT_FAILED, EXIT_OK, Report, check_config
from osas.config import ConfigError, load_config, places_of
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


def test_serve_refuses_groups_in_several_places_saying_where_they_live(tmp_path):
    config = load_config(
        with_places(tmp_path, {"auth": AUTH, "region_name": "North"}, gpu={"region_name": "South"})
    )
    with pytest.raises(ConfigError) as refused:
        App(config, FakeCloud(FakeNova()))
    said = str(refused.value)
    assert "the node groups live in 2 places" in said
    assert "keystone.example:5000/k8s, region North: workers" in said
    assert "region South: gpu" in said
    assert "osas check-config checks each of them" in said


async def test_a_reload_into_several_places_is_rejected_and_the_one_place_stays(tmp_path):
    data = config_data()
    path = write_config(tmp_path, data)
    provider = Provider(load_config(path), FakeCloud(FakeNova()), config_path=path)
    await provider.start()
    try:
        data["node_groups"][1]["openstack"] = {"region_name": "South"}
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "rejected"
        assert len(places_of(provider.app.config)) == 1
        del data["node_groups"][1]["openstack"]
        data["node_groups"][1]["max_size"] = 2
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "applied"
    finally:
        await provider.stop()
