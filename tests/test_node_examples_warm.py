"""The install page's warm-pool template (docs/install.md, "kubeadm with a warm pool") lived
as one server lives it, in a throwaway root (tests/node_examples.py): its first boot waiting in
the pool, a second such boot, the boot after osas claimed it, and a reboot of the joined node;
each boot reads the server metadata of that moment from the metadata service (the curl stub)
as the warm-pool contract between osas and the guest sets it. A tool that is missing skips,
with the reason."""

from __future__ import annotations

import itertools
import re

import pytest
import yaml
from node_examples import (
    CLUSTER,
    GROUP,
    KUBEADM_VERSION,
    PROVIDER_ID,
    SAMPLE_VALUES,
    SERVER_NAME,
    UNANSWERED,
    Boot,
    all_examples,
    boot_again,
    boot_cloud_config,
    kubelet_flags,
    render,
)

(EXAMPLE,) = [e for e in all_examples() if e.warm]
PER_BOOT_SCRIPT = "/var/lib/cloud/scripts/per-boot/osas-node.sh"
PREPARED = "/var/lib/osas/prepared"
MARKS = {"osas-cluster": CLUSTER, "osas-node-group": GROUP}
# A token osas minted for the claim: not the sample a user-data token would be.
CLAIM_TOKEN = "w4rm0k.c1a1m3dt0k3n0001"
LABELS = ["osas/node-group=workers", "tier=batch", "team=data"]
LABELS_2 = ["topology.example.com/rack=r12", "disk=ssd"]
TAINTS = ["dedicated=batch:NoSchedule"]
TAINTS_2 = ["example.com/gpu=true:NoExecute"]


def warm(state: str | None) -> dict[str, str]:
    """The metadata of a server waiting in the pool (as a refill creates it)."""
    meta = {**MARKS, "osas-request-id": "a" * 32, "osas-warm": "v1-" + "0f" * 16}
    if state is not None:
        meta["osas-warm-state"] = state
    return meta


def claimed() -> dict[str, str]:
    """The metadata osas writes at the claim, before it starts the server."""
    return {
        **MARKS,
        "osas-request-id": "b" * 32,
        "osas-claimed": "1767225600",
        "osas-node-labels": ",".join(LABELS),
        "osas-node-labels-2": ",".join(LABELS_2),
        "osas-node-taints": ",".join(TAINTS),
        "osas-node-taints-2": ",".join(TAINTS_2),
        "osas-join-token": CLAIM_TOKEN,
    }


def active() -> dict[str, str]:
    """The metadata once the claimed server is ACTIVE: the claim's time and token taken off."""
    meta = claimed()
    del meta["osas-claimed"], meta["osas-join-token"]
    return meta


def first_boot(tmp_path, metadata: list[dict[str, str]]) -> Boot:
    return boot_cloud_config(render(EXAMPLE, tmp_path / "secret"), tmp_path, metadata=metadata)


def flag(arguments: list[str], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in arguments if a.startswith(f"{name}=")]
    values += [b for a, b in itertools.pairwise(arguments) if a == name]
    assert len(values) <= 1, (name, arguments)
    return values[0] if values else None


def assert_waits_without_joining(boot: Boot) -> None:
    assert boot.called("kubeadm", "join") == [], boot.calls
    assert not [call for call in boot.calls if "kubelet" in " ".join(call)], boot.calls
    assert boot.read("/etc/default/kubelet") is None
    assert boot.read("/etc/kubernetes/kubelet.conf") is None
    assert kubelet_flags(boot) == []


def assert_marker_on_every_console(boot: Boot) -> None:
    for name, lines in boot.console().items():
        assert lines == ["osas-warm-prepared"], (name, lines, boot.output)


# -- the template itself ----------------------------------------------------------------------


def test_the_warm_template_boots_only_through_its_per_boot_script():
    """cloud-init runs write_files, runcmd and power_state once per instance id, which
    stop/start keeps (bootcmd runs at every boot too, in cloud-init's first stages): the only
    boot logic is the script cloud-init's scripts_per_boot module runs at every boot."""
    config = yaml.safe_load(EXAMPLE.template)
    assert not {"runcmd", "bootcmd", "power_state"} & config.keys()
    (entry,) = config["write_files"]
    assert entry["path"] == PER_BOOT_SCRIPT
    assert entry["permissions"] == "0755"
    assert entry["content"].startswith("#!/bin/sh\n")


def test_the_warm_template_takes_its_token_from_metadata_and_needs_no_jq():
    assert "${bootstrap_token}" not in EXAMPLE.template
    assert "${join_token}" not in EXAMPLE.template
    assert "osas-join-token" in EXAMPLE.template
    assert not re.search(r"\bjq\b", EXAMPLE.template)
    assert EXAMPLE.minted, "the group mints the token osas puts in metadata"
    assert "join_token" not in EXAMPLE.variables


def test_the_rendered_warm_template_carries_the_script_as_written(tmp_path):
    """osas's renderer fills in the page's variables and leaves the shell's own as written."""
    text = render(EXAMPLE, tmp_path / "secret")
    (entry,) = yaml.safe_load(text)["write_files"]
    script = entry["content"]
    assert "${" not in script, "a placeholder osas left, or a shell ${...} osas would eat"
    assert f"--node-labels=osas/node-group={GROUP}" in script
    assert f'--discovery-token-ca-cert-hash "{SAMPLE_VALUES["ca_cert_hash"]}"' in script
    assert f'--node-name "{SERVER_NAME}"' in script
    assert '--token "$token"' in script


# -- a server's life ---------------------------------------------------------------------------


def test_a_warm_server_prepares_once_waits_powered_off_and_joins_when_claimed(tmp_path):
    # 1. Its first boot, created to refill the pool: prepares, never joins, powers off.
    boot = first_boot(tmp_path, [warm("shutoff")])
    assert boot.returncode == 0, boot.output
    assert boot.called("kubeadm", "version") == [["kubeadm", "version", "-o", "short"]]
    assert boot.called("kubeadm", "config", "images", "pull") == [
        ["kubeadm", "config", "images", "pull", "--kubernetes-version", KUBEADM_VERSION]
    ]
    assert boot.read(PREPARED) is not None
    assert_marker_on_every_console(boot)
    assert boot.calls[-1] == ["poweroff"], boot.calls
    assert boot.called("sleep") == [], "the boot that prepared powers off at once"
    assert len(boot.called("curl")) == 1
    assert_waits_without_joining(boot)

    # 2. Started again while still in the pool (after a host's maintenance, say): prepared
    # already, so straight to the marker, a second read of the metadata 20 s later (the
    # metadata service caches answers), still warm: off again.
    boot = boot_again(boot, [warm("shutoff")])
    assert boot.returncode == 0, boot.output
    assert boot.called("kubeadm") == [], boot.calls
    assert_marker_on_every_console(boot)
    commands = [call[0] for call in boot.calls if call[0] in {"curl", "sleep", "poweroff"}]
    assert commands == ["curl", "sleep", "curl", "poweroff"], boot.calls
    assert boot.called("sleep") == [["sleep", "20"]]
    assert_waits_without_joining(boot)

    # 3. Claimed: osas replaced the metadata and started the server. It joins with the token
    # minted for the claim, the labels and taints of the metadata, and its provider id.
    boot = boot_again(boot, [claimed()])
    assert boot.returncode == 0, boot.output
    assert boot.called("poweroff") == []
    assert boot.called("kubeadm", "config") == []
    (join,) = boot.called("kubeadm", "join")
    assert flag(join, "--token") == CLAIM_TOKEN
    assert flag(join, "--discovery-token-ca-cert-hash") == SAMPLE_VALUES["ca_cert_hash"]
    assert flag(join, "--node-name") == SERVER_NAME
    flags = kubelet_flags(boot)
    assert flag(flags, "--provider-id") == PROVIDER_ID, flags
    labels = (flag(flags, "--node-labels") or "").split(",")
    assert labels[0] == f"osas/node-group={GROUP}"
    assert set(labels) == {f"osas/node-group={GROUP}", *LABELS, *LABELS_2}, labels
    assert (flag(flags, "--register-with-taints") or "").split(",") == TAINTS + TAINTS_2
    assert boot.console()["/dev/ttyS0"] == ["osas-node-joined"]
    joined = boot.read("/etc/default/kubelet")

    # 4. A reboot of the node (the claim's token gone from the metadata by now): it joined
    # before, so nothing is done again.
    boot = boot_again(boot, [active()])
    assert boot.returncode == 0, boot.output
    assert [call[0] for call in boot.calls] == ["curl"], boot.calls
    assert boot.read("/etc/default/kubelet") == joined
    assert boot.console()["/dev/ttyS0"] == []


@pytest.mark.parametrize("state", ["shutoff", None])
def test_a_warm_server_powers_itself_off_unless_kept_paused_suspended_or_shelved(tmp_path, state):
    """With no state in the metadata the server powers off as for shutoff; the boot that
    prepared does so at once, without a second read."""
    boot = first_boot(tmp_path, [warm(state)])
    assert boot.returncode == 0, boot.output
    assert_marker_on_every_console(boot)
    assert boot.calls[-1] == ["poweroff"], boot.calls
    assert [call[0] for call in boot.calls if call[0] in {"curl", "sleep"}] == ["curl"]
    assert_waits_without_joining(boot)


@pytest.mark.parametrize("state", ["paused", "suspended", "shelved_offloaded"])
def test_a_paused_suspended_or_shelved_warm_server_stays_up_and_joins_once_claimed(tmp_path, state):
    """Prepared, the marker printed, it stays up (osas pauses, suspends or shelves it as it
    is) and asks the metadata service again until the warm mark is gone: unpaused or resumed
    after the claim, it goes on from there to the join, without a boot (an unshelved one
    boots, below)."""
    boot = first_boot(tmp_path, [warm(state), warm(state), warm(state), claimed()])
    assert boot.returncode == 0, boot.output
    assert boot.called("poweroff") == []
    assert boot.read(PREPARED) is not None
    assert boot.console()["/dev/console"] == ["osas-warm-prepared", "osas-node-joined"]
    # Four reads of the metadata, a wait before each but the first, then the join.
    commands = [call[0] for call in boot.calls if call[0] in {"curl", "sleep"}]
    assert commands == ["curl", "sleep", "curl", "sleep", "curl", "sleep", "curl"], boot.calls
    assert boot.calls.index(boot.called("kubeadm", "join")[0]) > boot.calls.index(
        boot.called("curl")[-1]
    )
    (join,) = boot.called("kubeadm", "join")
    assert flag(join, "--token") == CLAIM_TOKEN
    assert flag(kubelet_flags(boot), "--provider-id") == PROVIDER_ID


def test_a_claimed_server_without_a_join_token_fails_and_joins_nothing(tmp_path):
    meta = claimed()
    del meta["osas-join-token"]
    boot = first_boot(tmp_path, [meta])
    assert boot.returncode != 0
    assert "no osas-join-token" in boot.output
    assert boot.called("kubeadm") == []
    assert boot.read("/etc/default/kubelet") is None


def test_a_cold_create_of_the_group_joins_at_its_first_boot_without_preparing(tmp_path):
    """A cold create carries the same keys as a claim: it joins at once."""
    boot = first_boot(tmp_path, [claimed()])
    assert boot.returncode == 0, boot.output
    assert boot.called("kubeadm", "config") == []
    assert boot.read(PREPARED) is None
    (join,) = boot.called("kubeadm", "join")
    assert flag(join, "--token") == CLAIM_TOKEN
    assert flag(kubelet_flags(boot), "--provider-id") == PROVIDER_ID


def test_an_unshelved_server_prints_the_marker_again_and_joins_once_claimed(tmp_path):
    """Nova writes no metadata on a shelved server: osas unshelves it first. The boot finds it
    prepared and still warm: the marker again, no preparation, a wait, and the join once the
    claim is written."""
    # Prepared on its first boot (a boot that ends, as one of a shut-off pool does: the
    # shelve of a waiting server ends its boot where the test cannot).
    boot = first_boot(tmp_path, [warm("shutoff")])
    assert boot.read(PREPARED) is not None
    unshelved = [warm("shelved_offloaded"), warm("shelved_offloaded"), claimed()]
    boot = boot_again(boot, unshelved)
    assert boot.returncode == 0, boot.output
    assert boot.called("kubeadm", "config") == []
    assert boot.called("poweroff") == []
    assert boot.console()["/dev/console"] == ["osas-warm-prepared", "osas-node-joined"]
    commands = [call[0] for call in boot.calls if call[0] in {"curl", "sleep"}]
    assert commands == ["curl", "sleep", "curl", "sleep", "curl"], boot.calls
    assert set(map(tuple, boot.called("sleep"))) == {("sleep", "10")}
    (join,) = boot.called("kubeadm", "join")
    assert flag(join, "--token") == CLAIM_TOKEN


def test_a_started_server_whose_second_read_shows_its_claim_joins(tmp_path):
    """Started for a claim, its first read came from the metadata service's cache (still
    warm); the second, 20 s later, shows the claim: it joins rather than powering off."""
    boot = first_boot(tmp_path, [warm("shutoff")])
    assert boot.calls[-1] == ["poweroff"], boot.calls
    boot = boot_again(boot, [warm("shutoff"), claimed()])
    assert boot.returncode == 0, boot.output
    assert boot.called("poweroff") == []
    assert boot.called("kubeadm", "config") == []
    commands = [call[0] for call in boot.calls if call[0] in {"curl", "sleep", "kubeadm"}]
    assert commands == ["curl", "sleep", "curl", "kubeadm"], boot.calls
    assert boot.called("sleep") == [["sleep", "20"]]
    (join,) = boot.called("kubeadm", "join")
    assert flag(join, "--token") == CLAIM_TOKEN
    assert flag(kubelet_flags(boot), "--provider-id") == PROVIDER_ID
    assert boot.console()["/dev/console"] == ["osas-warm-prepared", "osas-node-joined"]


@pytest.mark.parametrize("second", ["warm", "unanswered"])
def test_a_started_server_still_warm_on_its_second_read_powers_off(tmp_path, second):
    """Started while still in the pool (a host's reboot, say): 20 s on, the metadata still
    carries the warm mark, or the metadata service does not answer and the first read
    stands: off again, without joining."""
    boot = first_boot(tmp_path, [warm("shutoff")])
    assert boot.calls[-1] == ["poweroff"], boot.calls
    reads = [warm("shutoff"), warm("shutoff") if second == "warm" else UNANSWERED, claimed()]
    boot = boot_again(boot, reads)
    assert boot.returncode == 0, boot.output
    assert boot.called("kubeadm") == [], boot.calls
    commands = [call[0] for call in boot.calls if call[0] in {"curl", "sleep", "poweroff"}]
    assert commands[-4:] == ["curl", "sleep", "curl", "poweroff"], boot.calls
    assert boot.called("sleep") == [["sleep", "20"]]
    assert_marker_on_every_console(boot)
    assert_waits_without_joining(boot)
