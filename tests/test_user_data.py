"""User data from files: a template in a mounted Secret, variables whose values are files'
contents. The secret reaches the server's user data and nothing else: no log line, no
configuration (what a ConfigMap would hold), no error CA sees."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import pytest
from support import Provider, ca_client, config_data, config_on, make_config, write_config

from osas.app import openstack_cloud
from osas.check import Report, check_user_data
from osas.config import ConfigError, load_config, startup_summary
from osas.domain.specs import NodeGroupSpec
from osas.engine.userdata import (
    SecretFiles,
    Unfilled,
    UserDataError,
    build_user_data,
    unfilled_placeholders,
)
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

TOKEN = "abcdef.0123456789secret"
IGNITION_TOKEN = 'K10"quoted"\\back\nslash::server:pw'


def spec(**fields) -> NodeGroupSpec:
    base = {
        "group_id": "workers",
        "min_size": 0,
        "max_size": 3,
        "flavor": "m1",
        "image": "img",
        "networks": ("net",),
    }
    return NodeGroupSpec(**(base | fields))


def build(group: NodeGroupSpec, files: SecretFiles | None = None) -> str | None:
    return build_user_data(
        group, cluster_name="c1", name="c1-workers-0a1b", files=files or SecretFiles()
    )


def secret_swap(folder, name: str, text: str) -> None:
    """Update a file as kubelet updates a mounted Secret: a new file renamed over the path."""
    new = folder / f".{name}.new"
    new.write_text(text)
    new.replace(folder / name)


# -- building one server's user data ------------------------------------------------------------


def test_variables_are_read_from_files_and_trailing_newlines_dropped(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "template").write_text(
        "#cloud-config\nruncmd:\n  - kubeadm join --token ${join_token} # ${server_name} "
        "${node_group} ${cluster_name} ${unknown}\n"
    )
    group = spec(
        user_data_file=str(tmp_path / "template"),
        user_data_vars={"join_token": str(tmp_path / "token")},
    )
    text = build(group)
    assert text is not None
    assert f"--token {TOKEN} # c1-workers-0a1b workers c1 ${{unknown}}\n" in text


def test_files_are_read_again_once_they_change(tmp_path):
    secret_swap(tmp_path, "token", "first")
    secret_swap(tmp_path, "template", "t=${join_token}")
    files = SecretFiles()
    group = spec(
        user_data_file=str(tmp_path / "template"),
        user_data_vars={"join_token": str(tmp_path / "token")},
    )
    assert build(group, files) == "t=first"
    secret_swap(tmp_path, "token", "second")
    assert build(group, files) == "t=second"
    secret_swap(tmp_path, "template", "u=${join_token}")
    assert build(group, files) == "u=second"


def test_an_inline_template_takes_variables_from_files_too(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    group = spec(
        user_data="token=${join_token}", user_data_vars={"join_token": str(tmp_path / "token")}
    )
    assert build(group) == f"token={TOKEN}"


def test_json_mode_fills_placeholders_inside_strings_without_breaking_json(tmp_path):
    (tmp_path / "token").write_text(IGNITION_TOKEN)
    ignition = {
        "ignition": {"version": "3.4.0"},
        "storage": {
            "files": [
                {"path": "/etc/hostname", "contents": {"source": "data:,${server_name}"}},
                {"path": "/etc/join", "mode": 384, "contents": {"source": "data:,${join_token}"}},
            ]
        },
    }
    (tmp_path / "ign.json").write_text(json.dumps(ignition, indent=2))
    group = spec(
        user_data_file=str(tmp_path / "ign.json"),
        user_data_vars={"join_token": str(tmp_path / "token")},
        user_data_format="json",
    )
    text = build(group)
    assert text is not None
    document = json.loads(text)  # still JSON, quotes, backslash and newline escaped
    files = document["storage"]["files"]
    assert files[0]["contents"]["source"] == "data:,c1-workers-0a1b"
    assert files[1]["contents"]["source"] == f"data:,{IGNITION_TOKEN}"
    assert files[1]["mode"] == 384


def test_a_json_template_that_is_not_json_is_refused_without_quoting_it(tmp_path):
    (tmp_path / "ign.json").write_text('{"token": "' + TOKEN + '",}')
    group = spec(user_data_file=str(tmp_path / "ign.json"), user_data_format="json")
    with pytest.raises(UserDataError) as refused:
        build(group)
    assert "is not JSON" in str(refused.value)
    assert "line 1" in str(refused.value)
    assert TOKEN not in str(refused.value)


@pytest.mark.parametrize("missing", ["template", "token"])
def test_a_missing_file_is_a_precise_error(tmp_path, missing):
    for name in ("template", "token"):
        if name != missing:
            (tmp_path / name).write_text("x ${join_token}")
    group = spec(
        user_data_file=str(tmp_path / "template"),
        user_data_vars={"join_token": str(tmp_path / "token")},
    )
    with pytest.raises(UserDataError) as refused:
        build(group)
    where = "user_data_file" if missing == "template" else "user_data_vars.join_token"
    assert str(refused.value) == (
        f"node group 'workers': {where}: {tmp_path / missing} does not exist"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_file_is_a_precise_error(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0)
    group = spec(user_data="${t}", user_data_vars={"t": str(path)})
    with pytest.raises(UserDataError, match="cannot be read: Permission denied"):
        build(group)


def test_user_data_over_the_nova_limit_once_filled_in_is_refused(tmp_path):
    (tmp_path / "template").write_text("#cloud-config\n# ${big}\n")
    (tmp_path / "big").write_text("s" * 49_140)  # fits alone, not with the template around it
    group = spec(
        user_data_file=str(tmp_path / "template"), user_data_vars={"big": str(tmp_path / "big")}
    )
    with pytest.raises(UserDataError) as refused:
        build(group)
    assert "65544 bytes base64-encoded once filled in; Nova accepts 65535" in str(refused.value)
    assert "sss" not in str(refused.value)


def test_a_file_too_large_is_refused_before_it_is_read(tmp_path):
    (tmp_path / "template").write_text("x" * 70_000)
    group = spec(user_data_file=str(tmp_path / "template"))
    with pytest.raises(UserDataError, match="is 70000 bytes; user data is at most 65535"):
        build(group)


def test_non_utf8_file_is_refused(tmp_path):
    (tmp_path / "token").write_bytes(b"ok\xff")
    group = spec(user_data="${t}", user_data_vars={"t": str(tmp_path / "token")})
    with pytest.raises(UserDataError, match="not UTF-8 text"):
        build(group)


# -- placeholders osas leaves as written ---------------------------------------------------------


def test_every_braced_placeholder_no_variable_fills_is_found_with_its_line():
    template = (
        "#cloud-config\n"
        "hostname: ${server_name}\n"
        "runcmd:\n"
        "  - echo ${join_token} ${ca_cert_hash} $${HOME} $uuid $(hostname)\n"
        "  - echo ${cluster_name}-${node_group} ${ca_cert_hash}\n"
    )
    assert unfilled_placeholders(template, ["join_token"]) == (
        Unfilled("ca_cert_hash", 4),
        Unfilled("ca_cert_hash", 5),
    )
    assert unfilled_placeholders(template, ["join_token", "ca_cert_hash"]) == ()
    assert str(Unfilled("ca_cert_hash", 4)) == "${ca_cert_hash} (line 4)"


def warnings_logged(caplog) -> list[dict]:
    """The warnings logged since the last call (structlog hands the stdlib its event dicts)."""
    events = [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict)
        and record.msg.get("event") == "user data leaves placeholders as written"
    ]
    caplog.clear()
    return events


async def test_serve_logs_placeholders_left_as_written_once_per_group_and_template(
    tmp_path, caplog, logs_at_debug, sim
):
    data = config_on(sim)
    data["node_groups"][0]["user_data"] = (
        "#cloud-config\nruncmd:\n  - echo ${forgotten} $${HOME} $uuid ${server_name}\n"
    )
    path = write_config(tmp_path, data)
    config = load_config(path)
    provider = Provider(config, openstack_cloud(config), config_path=path)
    await provider.start()
    try:
        at_start = warnings_logged(caplog)
        assert await provider.app.reload_once(force=True) == "applied"
        after_an_unchanged_reload = warnings_logged(caplog)
        data["node_groups"][0]["user_data"] += "# ${also_forgotten}\n"
        write_config(tmp_path, data)
        assert await provider.app.reload_once() == "applied"
        after_a_changed_template = warnings_logged(caplog)
    finally:
        await provider.stop()
    assert [(e["node_group"], e["placeholders"]) for e in at_start] == [
        ("workers", ["${forgotten} (line 3)"])
    ]
    assert at_start[0]["source"] == "user_data"
    assert "write $${forgotten}" in at_start[0]["fix"]
    assert after_an_unchanged_reload == []
    assert [e["placeholders"] for e in after_a_changed_template] == [
        ["${forgotten} (line 3)", "${also_forgotten} (line 4)"]
    ]


def test_check_config_lists_each_placeholder_left_as_written(tmp_path):
    import io  # noqa: PLC0415

    (tmp_path / "template").write_text("#cloud-config\n# ${join_token}\nx: ${a} ${b}\ny: ${a}\n")
    (tmp_path / "token").write_text(TOKEN)
    data = config_data()
    data["node_groups"][0].pop("user_data")
    data["node_groups"][0]["user_data_file"] = str(tmp_path / "template")
    data["node_groups"][0]["user_data_vars"] = {"join_token": str(tmp_path / "token")}
    out = io.StringIO()
    assert check_user_data(load_config(write_config(tmp_path, data)), Report(out)) == 1
    lines = out.getvalue().splitlines()
    where = f"user data: PROBLEM: node group 'workers': {tmp_path / 'template'}"
    assert lines[:4] == [
        f"{where} line 3: ${{a}} names no variable; osas leaves it as written",
        f"{where} line 3: ${{b}} names no variable; osas leaves it as written",
        f"{where} line 4: ${{a}} names no variable; osas leaves it as written",
        (
            "user data:   fix: name it in user_data_vars (this group's: join_token; osas itself "
            "fills cluster_name, node_group, server_name), or, if the shell is meant to expand "
            "it, write $${a}, $${b}"
        ),
    ]
    assert TOKEN not in out.getvalue()


# -- configuration ----------------------------------------------------------------------------


def group_config(tmp_path, **fields):
    data = config_data()
    data["node_groups"][0].pop("user_data")
    data["node_groups"][0].update(fields)
    return write_config(tmp_path, data)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"user_data": "a", "user_data_file": "/etc/osas/ud"},
            "give either user_data or user_data_file, not both",
        ),
        ({"user_data_vars": {"t": "/etc/t"}}, "user_data_vars needs a template"),
        (
            {"user_data": "a", "user_data_vars": {"server_name": "/etc/t"}},
            "user_data_vars ['server_name'] are filled in by osas itself",
        ),
        ({"user_data": "a", "user_data_vars": {"join-token": "/etc/t"}}, "join-token"),
        (
            {"user_data": '{"a": 1,}', "user_data_format": "json"},
            "user_data is not JSON (user_data_format: json)",
        ),
        ({"user_data_file": "/etc/ud", "user_data_format": "yaml"}, "user_data_format"),
    ],
)
def test_user_data_sources_are_checked_at_load(tmp_path, fields, reason):
    with pytest.raises(ConfigError) as refused:
        load_config(group_config(tmp_path, **fields))
    assert reason in str(refused.value)


def test_file_sources_reach_the_group_spec(tmp_path):
    config = load_config(
        group_config(
            tmp_path,
            user_data_file="/etc/osas/bootstrap/user-data",
            user_data_vars={"join_token": "/etc/osas/bootstrap/token"},
            user_data_format="json",
        ),
        read_files=False,  # the pod's paths
    )
    group = config.cluster_spec().node_groups[0]
    assert group.user_data is None
    assert group.user_data_file == "/etc/osas/bootstrap/user-data"
    assert group.user_data_vars == {"join_token": "/etc/osas/bootstrap/token"}
    assert group.user_data_format == "json"


# -- end to end: osas, openstacksdk and the simulated OpenStack ---------------------------------


async def test_a_secret_in_a_variable_file_reaches_the_server_and_nothing_else(  # noqa: PLR0915
    tmp_path, capfd, logs_at_debug
):
    bootstrap = tmp_path / "bootstrap"
    bootstrap.mkdir()
    secret_swap(bootstrap, "token", TOKEN + "\n")
    secret_swap(
        bootstrap,
        "user-data",
        "#cloud-config\nruncmd:\n  - kubeadm join --token ${join_token} --name ${server_name}\n",
    )
    (bootstrap / "big").write_text("s" * 49_140)
    groups = config_data()["node_groups"]
    workers = groups[0]
    workers.pop("user_data")
    workers["user_data_file"] = str(bootstrap / "user-data")
    workers["user_data_vars"] = {"join_token": str(bootstrap / "token")}
    # A group whose token file goes missing once osas runs (a start or a reload without it
    # is refused), and one whose user data outgrows Nova's limit.
    broken = {**workers, "id": "broken", "min_size": 0}
    broken["user_data_vars"] = {"join_token": str(bootstrap / "gone")}
    (bootstrap / "gone").write_text(TOKEN)
    huge = {**workers, "id": "huge", "min_size": 0, "user_data_file": None}
    huge["user_data"] = "${join_token}${big}"
    huge["user_data_vars"] = {"join_token": str(bootstrap / "token"), "big": str(bootstrap / "big")}
    del huge["user_data_file"]
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        auth = sim.clouds_yaml_entry()["auth"]
        config = make_config(
            tmp_path,
            openstack={"auth": auth},
            node_groups=[workers, broken, huge],
        )
        config_text = (tmp_path / "osas.yaml").read_text()
        (bootstrap / "gone").unlink()
        provider = Provider(config, openstack_cloud(config))
        await provider.start()
        seen: list[str] = []
        try:
            async with ca_client(provider.address) as ca:
                await ca.refresh()
                await ca.increase("workers", 1)
                await ca.increase("broken", 1)
                await ca.increase("huge", 1)

                async def errors() -> list[pb.Instance]:
                    return [
                        i
                        for group in ("broken", "huge")
                        for i in await ca.nodes(group)
                        if i.status.HasField("errorInfo")
                    ]

                for _ in range(200):
                    await provider.sync()
                    failed = await errors()
                    ours = [s for s in sim.nova.all_servers() if "-workers-" in s.name]
                    if len(failed) == 2 and ours:
                        break
                    await asyncio.sleep(0.05)
                failed = await errors()
                seen += [
                    f"{i.status.errorInfo.errorCode}: {i.status.errorInfo.errorMessage}"
                    for i in failed
                ]
                seen += [g.debug for g in await ca.node_groups()]
        finally:
            await provider.stop()
        servers = sim.nova.all_servers()
    assert len(servers) == 1  # the broken groups never reached Nova
    user_data = base64.b64decode(servers[0].user_data or "").decode()
    assert f"kubeadm join --token {TOKEN} --name {servers[0].name}\n" in user_data
    huge_size = len(base64.b64encode((TOKEN + "s" * 49_140).encode()))
    assert sorted(seen[:2]) == [
        (
            "UserDataUnavailable: node group 'broken': user_data_vars.join_token: "
            f"{bootstrap / 'gone'} does not exist"
        ),
        (
            f"UserDataUnavailable: node group 'huge': the user data from user_data is {huge_size} "
            "bytes base64-encoded once filled in; Nova accepts 65535"
        ),
    ]
    captured = capfd.readouterr()
    assert "user data cannot be built; create refused" in captured.err  # the logs were captured
    everything = "\n".join(
        [*seen, captured.out, captured.err, config_text, repr(config), repr(config.cluster_spec())]
    )
    everything += json.dumps(startup_summary(config))
    assert TOKEN not in everything
    assert "sssss" not in everything


def test_check_config_builds_every_group_user_data_without_showing_it(tmp_path):
    import io  # noqa: PLC0415

    (tmp_path / "token").write_text(TOKEN)
    data = config_data()
    data["node_groups"][0]["user_data_vars"] = {"join_token": str(tmp_path / "token")}
    data["node_groups"][0]["user_data"] = "token=${join_token}"
    data["node_groups"][1]["user_data"] = "${t}"
    data["node_groups"][1]["user_data_vars"] = {"t": str(tmp_path / "gone")}
    (tmp_path / "gone").write_text("there when the configuration loaded")
    config = load_config(write_config(tmp_path, data))
    (tmp_path / "gone").unlink()
    out = io.StringIO()
    assert check_user_data(config, Report(out)) == 1
    report = out.getvalue()
    assert "user data: ok: node group 'workers', 29 bytes" in report
    problem = f"user data: PROBLEM: node group 'gpu': user_data_vars.t: {tmp_path / 'gone'}"
    assert problem in report
    assert TOKEN not in report
