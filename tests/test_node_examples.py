"""Every user-data example a user may copy (docs/, README, examples/, the chart's values,
deploy/) is rendered by osas's renderer with exactly the variables its page has the user
create, and judged by the tools a node runs it with: YAML, cloud-init's schema and its own
write_files and runcmd code, ``sh -n``, ``ignition-validate``, and a first boot in a throwaway
root that must leave kubelet with the provider id ``openstack:///<instance id>``
(tests/node_examples.py says how). A tool that is missing skips its check, with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
import yaml
from node_examples import (
    CLUSTER,
    INSTANCE_ID,
    PROVIDER_ID,
    ROOT,
    SAMPLE_VALUES,
    SERVER_NAME,
    Boot,
    Example,
    all_examples,
    boot_cloud_config,
    boot_ignition,
    cloud_init_runcmd,
    cloud_init_schema,
    create_metadata,
    data_url,
    ignition_validate,
    kubelet_flags,
    markdown_blocks,
    render,
    sh_syntax,
    unfilled,
    unit_settings,
)
from support import config_data, write_config

from osas.election.tokens import NODE_TOKEN_GROUP, BootstrapTokens
from osas.sim.kubernetes import KubeStandIn, bootstrap_user

EXAMPLES = all_examples()
INSTALL = "docs/install.md"


def examples(*, kind: str | None = None, joins: bool | None = None) -> list[Example]:
    chosen = [
        example
        for example in EXAMPLES
        if (kind is None or example.kind == kind) and (joins is None or example.joins == joins)
    ]
    return [pytest.param(example, id=example.name) for example in chosen]


def test_the_examples_are_found_where_users_read_them():
    install = sorted(e.name for e in EXAMPLES if e.name.startswith(INSTALL))
    assert install == [
        f"{INSTALL}: Step 2: user data and the join token / Ignition (Flatcar, Fedora CoreOS)",
        f"{INSTALL}: Step 2: user data and the join token / RKE2 agent",
        f"{INSTALL}: Step 2: user data and the join token / k3s agent",
        f"{INSTALL}: Step 2: user data and the join token / kubeadm (Kubernetes 1.27 and later)",
        f"{INSTALL}: Step 2: user data and the join token / kubeadm with a token per server",
        f"{INSTALL}: Step 2: user data and the join token / kubeadm with a warm pool",
    ]
    minted = sorted(e.name.rsplit(" / ", 1)[-1] for e in EXAMPLES if e.minted)
    assert minted == ["kubeadm with a token per server", "kubeadm with a warm pool"]
    (warm,) = [e.name for e in EXAMPLES if e.warm]
    assert warm.endswith("kubeadm with a warm pool")
    # The local try's stand-in, which the simulator takes and no node boots.
    assert [e.name for e in EXAMPLES if not e.joins] == ["examples/osas.yaml: inline user_data"]
    assert all(e.kind in {"cloud-config", "ignition"} for e in EXAMPLES)


@pytest.mark.parametrize("example", examples())
def test_an_example_uses_only_the_variables_its_page_has_the_user_create(example):
    assert example.problems == []
    assert unfilled(example) == [], "osas would leave these in the user data as written"


@pytest.mark.parametrize("example", examples(kind="cloud-config"))
def test_a_cloud_config_example_is_valid_for_cloud_init(example, tmp_path):
    text = render(example, tmp_path / "secret")
    assert text.startswith("#cloud-config\n")
    assert isinstance(yaml.safe_load(text), dict), "not a YAML mapping"
    assert cloud_init_schema(text, tmp_path) == ""


@pytest.mark.parametrize("example", examples())
def test_every_script_of_an_example_parses(example, tmp_path):
    text = render(example, tmp_path / "secret")
    scripts: dict[str, str] = {}
    if example.kind == "cloud-config":
        config = yaml.safe_load(text)
        scripts["runcmd"] = cloud_init_runcmd(config.get("runcmd") or [])
        for entry in config.get("write_files") or []:
            if entry.get("content", "").startswith("#!"):
                scripts[entry["path"]] = entry["content"]
    else:
        for entry in json.loads(text).get("storage", {}).get("files", []):
            content = data_url(entry["contents"]["source"]).decode()
            if content.startswith("#!"):
                scripts[entry["path"]] = content
    for name, script in scripts.items():
        assert sh_syntax(script) == "", name


@pytest.mark.parametrize("example", examples(kind="ignition"))
def test_an_ignition_example_is_valid_for_ignition(example, tmp_path):
    assert ignition_validate(render(example, tmp_path / "secret"), tmp_path) == ""


def joined_as(boot: Boot) -> str:
    """Which node software the boot started, from the calls it made."""
    for call in boot.calls:
        if call[:2] == ["kubeadm", "join"]:
            return "kubeadm"
        if call[:3] == ["systemctl", "enable", "--now"] and len(call) > 3:
            return call[3].split("-agent")[0]
    raise AssertionError(f"no join: calls {boot.calls}\n{boot.output}")


def flag(arguments: list[str], name: str) -> str | None:
    for index, argument in enumerate(arguments):
        if argument == name and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith(f"{name}="):
            return argument.split("=", 1)[1]
    return None


@pytest.mark.parametrize("example", examples(joins=True))
def test_a_node_booted_from_an_example_joins_with_its_provider_id(example, tmp_path):
    text = render(example, tmp_path / "secret")
    if example.kind == "cloud-config":
        assert yaml.safe_load(text).get("hostname") == SERVER_NAME
        boot = boot_cloud_config(text, tmp_path, metadata=create_metadata(example))
    else:
        boot = boot_ignition(text, tmp_path)
        assert boot.read("/etc/hostname").strip() == SERVER_NAME
    assert boot.returncode == 0, boot.output
    assert boot.called("poweroff") == [], "a node that joins stays up"
    flags = kubelet_flags(boot)
    assert flag(flags, "--provider-id") == PROVIDER_ID, flags
    assert "osas/node-group=workers" in (flag(flags, "--node-labels") or "").split(","), flags
    software = joined_as(boot)
    if software == "kubeadm":
        join = next(call for call in boot.calls if call[:2] == ["kubeadm", "join"])
        token = SAMPLE_VALUES["bootstrap_token" if example.minted else "join_token"]
        assert flag(join, "--token") == token
        assert flag(join, "--discovery-token-ca-cert-hash") == SAMPLE_VALUES["ca_cert_hash"]
        assert flag(join, "--node-name") == SERVER_NAME
    else:
        settings = yaml.safe_load(boot.read(f"/etc/rancher/{software}/config.yaml"))
        assert settings["token"] == SAMPLE_VALUES["join_token"]
        assert settings["node-name"] == SERVER_NAME
        assert settings["server"].startswith("https://")


async def test_the_per_server_token_example_joins_with_a_token_that_authenticates(tmp_path):
    """The page's template rendered with a token osas minted (against the Kubernetes stand-in,
    whose authenticator has the API server's rules) and booted: kubeadm join gets that token,
    and it authenticates as a kubeadm node bootstrapper."""
    (example,) = [e for e in EXAMPLES if e.minted and not e.warm]
    with KubeStandIn() as standin:
        tokens = BootstrapTokens(
            standin.write_kubeconfig(tmp_path / "kubeconfig"), cluster_name=CLUSTER
        )
        try:
            minted = await tokens.mint(server_name=SERVER_NAME, group_id="workers", ttl=1800)
        finally:
            await tokens.aclose()
        text = render(example, tmp_path / "secret", bootstrap_token=minted)
        assert cloud_init_schema(text, tmp_path) == ""
        boot = boot_cloud_config(text, tmp_path)
        assert boot.returncode == 0, boot.output
        join = next(call for call in boot.calls if call[:2] == ["kubeadm", "join"])
        assert flag(join, "--token") == minted
        secret = standin.secret("kube-system", f"bootstrap-token-{minted[:6]}")
        assert secret is not None
        assert bootstrap_user(
            lambda name: standin.secret("kube-system", name), minted, datetime.now(UTC)
        ) == (f"system:bootstrap:{minted[:6]}", ["system:bootstrappers", NODE_TOKEN_GROUP])


def test_the_ignition_example_runs_its_join_from_an_enabled_unit():
    (example,) = [e for e in EXAMPLES if e.kind == "ignition"]
    units = json.loads(example.template)["systemd"]["units"]
    (join,) = [u for u in units if u.get("enabled")]
    settings = unit_settings(join["contents"])
    assert settings["WantedBy"] == ["multi-user.target"]
    assert settings["After"] == ["network-online.target"]
    assert settings["Type"] == ["oneshot"]


def test_the_ignition_join_script_is_the_one_the_page_shows():
    """The script travels base64-encoded; the page shows it in clear, and the two agree."""
    (example,) = [e for e in EXAMPLES if e.kind == "ignition"]
    files = json.loads(example.template)["storage"]["files"]
    (script,) = [f for f in files if f["path"] == "/opt/osas/join.sh"]
    shown = [
        block.text
        for block in markdown_blocks(ROOT / INSTALL)
        if block.lang == "sh"
        and block.text.startswith("#!/bin/sh")
        and any("Ignition" in section for section in block.sections)
    ]
    assert shown == [data_url(script["contents"]["source"]).decode()]


def test_the_kubeadm_example_works_across_the_documented_range():
    """kubeadm's configuration file changes version (v1beta3 up to 1.30, v1beta4 from 1.31):
    the example uses only join flags and kubelet's KUBELET_EXTRA_ARGS, both unchanged from
    1.27 on, so one example serves the whole range its heading states."""
    (example,) = [e for e in EXAMPLES if "kubeadm (Kubernetes 1.27 and later)" in e.name]
    assert "kubeadm.k8s.io/" not in example.template
    assert "kubeadm join" in example.template


def test_check_config_names_a_variable_the_page_forgot(tmp_path):
    """The kubeadm example as an earlier page had it: ``${ca_cert_hash}`` used, but no Secret
    file and no ``user_data_vars`` entry for it."""
    (example,) = [e for e in EXAMPLES if "kubeadm (Kubernetes" in e.name]
    (tmp_path / "user-data").write_text(example.template)
    (tmp_path / "token").write_text(SAMPLE_VALUES["join_token"] + "\n")
    data = config_data()
    group = data["node_groups"][0]
    group.pop("user_data")
    group["user_data_file"] = str(tmp_path / "user-data")
    group["user_data_vars"] = {"join_token": str(tmp_path / "token")}
    data["node_groups"] = [group]
    config = write_config(tmp_path, data)
    done = subprocess.run(
        [sys.executable, "-m", "osas", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OS_CLIENT_CONFIG_FILE": str(tmp_path / "absent.yaml")},
        check=False,
    )
    line = next(
        number
        for number, text in enumerate(example.template.splitlines(), start=1)
        if "${ca_cert_hash}" in text
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"user data: PROBLEM: node group 'workers': {tmp_path / 'user-data'} line {line}: "
        "${ca_cert_hash} names no variable; osas leaves it as written"
    ) in done.stdout
    assert "write $${ca_cert_hash}" in done.stdout
    assert SAMPLE_VALUES["join_token"] not in done.stdout + done.stderr
    assert INSTANCE_ID not in done.stdout
