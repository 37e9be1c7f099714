"""User-data examples as a user meets them, and the tools a node runs them with.

An example is a cloud-config or Ignition template in the docs (a fenced block) or in an example
configuration (a node group's inline ``user_data``). Each is rendered by osas's own renderer with
exactly the variables that its page has the user create: a variable counts only when the page's
``kubectl create secret`` command makes the file and the node group's ``user_data_vars`` names it
where the chart mounts that Secret (``userDataSecrets``). Then the real tools judge the result:
cloud-init's schema validator and its own write_files and runcmd code, ``sh -n``,
``ignition-validate``, and a throwaway root in which the join script runs against stubs of
``kubeadm``, ``systemctl``, ``poweroff`` and ``curl`` (the metadata service, serving the server
metadata a test gives). A per-boot script runs again in the same root, as a later boot of the
same server (a warm pool's: tests/test_node_examples_warm.py).

A tool that is missing skips its check with the reason, unless ``OSAS_REQUIRE_TOOLS=1`` (CI
installs them) turns that into a failure.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from osas.domain.specs import BootstrapTokenSpec, NodeGroupSpec, WarmPoolSpec
from osas.engine.userdata import (
    SecretFiles,
    build_user_data,
    unfilled_placeholders,
)

ROOT = Path(__file__).parent.parent
CLUSTER = "prod-eu1"
GROUP = "workers"
SERVER_NAME = f"{CLUSTER}-{GROUP}-5f2a9c"
INSTANCE_ID = "0c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5"
# The version the kubeadm stub reports (``kubeadm version -o short``).
KUBEADM_VERSION = "v1.31.4"
PROVIDER_ID = f"openstack:///{INSTANCE_ID}"
# What the files of a bootstrap Secret hold, in the forms the node software expects.
SAMPLE_VALUES = {
    "join_token": "abcdef.0123456789abcdef",
    # What osas fills in for a group with bootstrap_token (tests mint a real one where it
    # matters: tests/test_node_examples.py).
    "bootstrap_token": "k2m4p6.q8r0t2v4x6z8b0d2",
    "ca_cert_hash": "sha256:" + "5e" * 32,
}
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
_HEADING = re.compile(r"^(#{1,6}) (.+)$", re.MULTILINE)


def require(tool: str) -> str:
    """The tool's path; a skip with the reason where it is missing (a failure in CI)."""
    path = shutil.which(tool)
    if path is None:
        reason = f"{tool} is not installed (Debian: apt-get install {DEBIAN_PACKAGES[tool]})"
        if os.environ.get("OSAS_REQUIRE_TOOLS") == "1":
            pytest.fail(f"OSAS_REQUIRE_TOOLS=1 but {reason}")
        pytest.skip(reason)
    return path


DEBIAN_PACKAGES = {"cloud-init": "cloud-init", "ignition-validate": "ignition"}


# -- finding the examples and what their page has the user create -------------------------------


@dataclass(frozen=True)
class Block:
    """A fenced block of a Markdown page, with the headings it sits under."""

    lang: str
    text: str
    sections: tuple[str, ...]
    line: int


def markdown_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    headings = [(m.start(), len(m.group(1)), m.group(2).strip()) for m in _HEADING.finditer(text)]
    fences = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    blocks = []
    for match in _FENCE.finditer(text):
        trail: list[tuple[int, str]] = []
        for start, level, title in headings:
            # A heading inside a code block (a shell comment) is not a heading.
            if start > match.start() or any(a < start < b for a, b in fences):
                continue
            trail = [(lvl, name) for lvl, name in trail if lvl < level] + [(level, title)]
        blocks.append(
            Block(
                lang=match.group(1),
                text=match.group(2),
                sections=tuple(name for _, name in trail),
                line=text.count("\n", 0, match.start()) + 2,
            )
        )
    return blocks


def template_kind(text: str) -> str | None:
    """ "cloud-config", "ignition", or None for anything that is no user data."""
    if text.startswith("#cloud-config"):
        return "cloud-config"
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return "ignition" if isinstance(document, dict) and "ignition" in document else None


@dataclass(frozen=True)
class SecretCommand:
    name: str
    keys: frozenset[str]


def secret_commands(script: str) -> list[SecretCommand]:
    """The ``kubectl create secret generic`` commands of a shell block, with the keys each
    Secret gets (``--from-file=key=path``, ``--from-file=path``, ``--from-literal=key=value``)."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        # Only a line that may be such a command is split: any block is asked (a template's
        # script may open a quotation a later line closes).
        if "secret" not in line or "generic" not in line:
            continue
        words = shlex.split(line, comments=True)
        if "secret" not in words or "generic" not in words:
            continue
        name = words[words.index("generic") + 1]
        keys = set()
        for word in words:
            if word.startswith("--from-file="):
                value = word.removeprefix("--from-file=")
                keys.add(value.split("=", 1)[0] if "=" in value else posixpath.basename(value))
            elif word.startswith("--from-literal="):
                keys.add(word.removeprefix("--from-literal=").split("=", 1)[0])
        commands.append(SecretCommand(name, frozenset(keys)))
    return commands


@dataclass(frozen=True)
class GroupKeys:
    """A node group's user data keys, as a page or a configuration writes them."""

    user_data: str | None
    user_data_file: str | None
    user_data_vars: dict[str, str]
    user_data_format: str
    minted: bool  # bootstrap_token: osas mints ${bootstrap_token} per server
    warm: bool  # warm_pool: servers wait prepared; the join token comes in server metadata


def _mappings(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _mappings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _mappings(item)


def group_keys(document: Any) -> list[GroupKeys]:
    return [
        GroupKeys(
            user_data=mapping.get("user_data"),
            user_data_file=mapping.get("user_data_file"),
            user_data_vars=dict(mapping.get("user_data_vars") or {}),
            user_data_format=mapping.get("user_data_format", "text"),
            minted=mapping.get("bootstrap_token") is not None,
            warm=mapping.get("warm_pool") is not None,
        )
        for mapping in _mappings(document)
        if {"user_data", "user_data_file", "user_data_vars"} & mapping.keys()
    ]


def secret_mounts(document: Any) -> dict[str, str]:
    """Secret name -> mount path, from the chart's ``userDataSecrets``."""
    return {
        entry["secretName"]: entry["mountPath"]
        for mapping in _mappings(document)
        for entry in mapping.get("userDataSecrets") or []
    }


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


@dataclass
class Example:
    """One template, the variables its page creates, and what is wrong with the page."""

    name: str  # where it is: file and section, or file and group
    kind: str
    template: str
    variables: dict[str, str]  # variable -> the value its file would hold
    user_data_format: str
    joins: bool  # meant to make a node join (not the simulator's stand-in user data)
    problems: list[str] = field(default_factory=list)
    minted: bool = False  # its group has bootstrap_token: osas fills ${bootstrap_token}
    warm: bool = False  # its group has a warm_pool: it joins from the server's metadata


def _nearest(blocks: list[Block], sections: tuple[str, ...], wanted: Any) -> list[Any]:
    """What ``wanted`` finds in the blocks of the innermost section that has any, going out
    from ``sections`` to the whole page."""
    for depth in range(len(sections), -1, -1):
        found = [
            item
            for block in blocks
            if block.sections[:depth] == sections[:depth]
            for item in wanted(block)
        ]
        if found:
            return found
    return []


def page_examples(path: Path) -> list[Example]:
    blocks = markdown_blocks(path)
    relative = path.relative_to(ROOT)
    mounts: dict[str, str] = {}
    for block in blocks:
        if block.lang == "yaml":
            mounts |= secret_mounts(_yaml(block.text))
    examples = []
    for block in blocks:
        kind = template_kind(block.text)
        if kind is None:
            continue
        name = f"{relative}: {' / '.join(block.sections[1:]) or block.sections[-1]}"
        secrets = _nearest(blocks, block.sections, lambda b: secret_commands(b.text))
        keys = _nearest(
            blocks,
            block.sections,
            lambda b: group_keys(_yaml(b.text)) if b.lang == "yaml" else [],
        )
        example = Example(name, kind, block.text, {}, "text", joins=True)
        if not secrets or not keys:
            example.problems.append(
                f"line {block.line}: the page makes no bootstrap Secret or names no node "
                "group keys for this example"
            )
            examples.append(example)
            continue
        group = keys[0]
        example.user_data_format = group.user_data_format
        example.minted = group.minted
        example.warm = group.warm
        created = {
            posixpath.join(mounts.get(secret.name, "?"), key)
            for secret in secrets
            for key in secret.keys
        }
        if group.user_data_file not in created:
            example.problems.append(
                f"line {block.line}: user_data_file {group.user_data_file} is not a file of a "
                "Secret the page makes, where the chart mounts it"
            )
        for variable, file in group.user_data_vars.items():
            if file in created:
                example.variables[variable] = sample_value(variable)
            else:
                example.problems.append(
                    f"line {block.line}: user_data_vars.{variable} reads {file}, which no "
                    "Secret the page makes holds"
                )
        examples.append(example)
    return examples


def config_examples(path: Path, document: Any, *, joins: bool) -> list[Example]:
    """Inline templates of the node groups of a configuration (or of chart values)."""
    relative = path.relative_to(ROOT)
    return [
        Example(
            name=f"{relative}: inline user_data",
            kind=template_kind(group.user_data) or "unknown",
            template=group.user_data,
            # A configuration's variables are files it names; their values are the samples.
            variables={name: sample_value(name) for name in group.user_data_vars},
            user_data_format=group.user_data_format,
            joins=joins,
            minted=group.minted,
            warm=group.warm,
        )
        for group in group_keys(document)
        if group.user_data is not None
    ]


def sample_value(variable: str) -> str:
    return SAMPLE_VALUES.get(variable, f"{variable}-value")


# The local try's configuration gives the simulator a stand-in template: no node ever boots it.
SIMULATOR_ONLY = {"examples/osas.yaml"}


def all_examples() -> list[Example]:
    found = [
        example for page in sorted((ROOT / "docs").glob("*.md")) for example in page_examples(page)
    ]
    found += page_examples(ROOT / "README.md")
    configs = [
        ROOT / "examples" / "osas.yaml",
        ROOT / "charts" / "osas" / "values.yaml",
        *sorted((ROOT / "deploy").rglob("*.yaml")),
    ]
    for path in configs:
        for document in yaml.safe_load_all(path.read_text()):
            found += config_examples(
                path,
                document,
                joins=str(path.relative_to(ROOT)) not in SIMULATOR_ONLY,
            )
    return found


# -- rendering, as osas does it for a create ------------------------------------------------------


def fills_token(example: Example) -> bool:
    """Whether osas fills a minted token in as ``${bootstrap_token}``: for a group that mints,
    unless it has a warm pool (its servers get the token in metadata at their claim)."""
    return example.minted and not example.warm


def render(example: Example, folder: Path, *, bootstrap_token: str | None = None) -> str:
    """The user data osas would send for a server of ``workers``: the template and each
    variable's value in files, as the mounted Secret holds them; for a group that fills a
    minted token in, ``bootstrap_token`` (its sample unless given) as osas's minted token."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "user-data").write_text(example.template)
    files = {}
    for variable, value in example.variables.items():
        (folder / variable).write_text(value + "\n")
        files[variable] = str(folder / variable)
    spec = NodeGroupSpec(
        group_id=GROUP,
        min_size=0,
        max_size=3,
        flavor="m1.large",
        image="node-image",
        networks=("cluster-net",),
        user_data_file=str(folder / "user-data"),
        user_data_vars=files,
        user_data_format=example.user_data_format,
        bootstrap_token=BootstrapTokenSpec() if example.minted else None,
        warm_pool=WarmPoolSpec() if example.warm else None,
    )
    filled = bootstrap_token or SAMPLE_VALUES["bootstrap_token"]
    token = filled if fills_token(example) else None
    text = build_user_data(
        spec, cluster_name=CLUSTER, name=SERVER_NAME, files=SecretFiles(), bootstrap_token=token
    )
    assert text is not None
    return text


def unfilled(example: Example) -> list[str]:
    variables = [*example.variables, *(["bootstrap_token"] if fills_token(example) else [])]
    return [str(p) for p in unfilled_placeholders(example.template, variables)]


# -- the tools ------------------------------------------------------------------------------------


def cloud_init_schema(text: str, folder: Path) -> str:
    """cloud-init's own verdict on a cloud-config ("" when valid)."""
    tool = require("cloud-init")
    path = folder / "cloud-config.yaml"
    path.write_text(text)
    done = subprocess.run(
        [tool, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip()


def cloud_init_runcmd(items: list[Any]) -> str:
    """The script cloud-init writes for ``runcmd`` (its own shellify), where cloud-init is
    installed; else the same by its documented rule (strings as lines, lists quoted)."""
    if shutil.which("cloud-init"):
        code = (
            "import json, sys; from cloudinit import util; "
            "print(util.shellify(json.load(sys.stdin)), end='')"
        )
        return subprocess.run(
            ["/usr/bin/python3", "-c", code],
            input=json.dumps(items),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    lines = [item if isinstance(item, str) else shlex.join(map(str, item)) for item in items]
    return "\n".join(["#!/bin/sh", *lines]) + "\n"


def sh_syntax(script: str) -> str:
    """``sh -n``'s complaint about a script ("" when it parses)."""
    done = subprocess.run(
        ["/bin/sh", "-n"], input=script, capture_output=True, text=True, check=False
    )
    return done.stderr.strip()


def ignition_validate(text: str, folder: Path) -> str:
    tool = require("ignition-validate")
    path = folder / "config.ign"
    path.write_text(text)
    done = subprocess.run([tool, str(path)], capture_output=True, text=True, check=False)
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip()


def data_url(source: str) -> bytes:
    """The bytes of an Ignition ``data:`` URL (percent-encoded or base64)."""
    header, _, payload = source.partition(",")
    assert header.startswith("data:"), source
    if header.endswith(";base64"):
        return base64.b64decode(payload)
    return urllib.parse.unquote_to_bytes(payload)


# -- a node's boots, in a throwaway root ---------------------------------------------------------

# Stubs for what a join calls: they record their arguments. kubeadm reports a version and, when
# it joins, leaves kubelet.conf as a join does; curl answers the metadata service with the
# documents queued in /run/osas-meta (each read takes the next; the last one stays), or with
# one without server metadata when none is queued. A queued read that is not answered
# (UNANSWERED) fails as curl does when it cannot connect (exit 7).
_STUB = """#!/bin/sh
{ printf '%s' "${0##*/}"; for a in "$@"; do printf '\\t%s' "$a"; done; echo; } >> /run/osas-calls
"""
_KUBEADM = (
    _STUB
    + f"""case "$1" in
  version) echo {KUBEADM_VERSION};;
  join) mkdir -p /etc/kubernetes && echo "# kubeadm join's" >/etc/kubernetes/kubelet.conf;;
esac
"""
)
_CURL = (
    _STUB
    + """case "$*" in
  *169.254.169.254/openstack/latest/meta_data.json*)
    set -- /run/osas-meta/*
    if [ -e "$1" ]; then
      case "$1" in *.unanswered) answer=7;; *) answer=0; cat "$1";; esac
      if [ $# -gt 1 ]; then rm "$1"; fi
      exit "$answer"
    else
      printf '{"uuid": "%s", "name": "%s", "availability_zone": "nova"}' \\
        "$(cat /run/osas-instance-id)" "$(cat /run/osas-server-name)"
    fi;;
  *) exit 22;;
esac
"""
)
STUBBED = ("kubeadm", "systemctl", "k3s", "rke2", "hostnamectl", "poweroff", "sleep")
# The consoles a script may write to: files here, read back by the test.
CONSOLES = ("/dev/console", "/dev/ttyS0")
_SETUP = """
set -eu
root=$1
mount --bind -o ro /usr "$root/usr"
touch "$root/dev/null"
mount --bind /dev/null "$root/dev/null"
shift
exec chroot "$root" "$@"
"""


@dataclass
class Boot:
    """What a boot left: the files under its root, the stubs' calls, how it ended."""

    root: Path
    calls: list[list[str]]
    returncode: int
    output: str

    def read(self, path: str) -> str | None:
        file = self.root / path.lstrip("/")
        return file.read_text() if file.is_file() else None

    def console(self) -> dict[str, list[str]]:
        """The lines written on each console during this boot."""
        return {name: (self.read(name) or "").splitlines() for name in CONSOLES}

    def called(self, *prefix: str) -> list[list[str]]:
        """The stubs' calls that start with ``prefix``."""
        return [call for call in self.calls if tuple(call[: len(prefix)]) == prefix]


@functools.cache
def _sandbox_command() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    command = [unshare, "--mount", "--net", "--fork"]
    if os.geteuid() != 0:
        command[1:1] = ["--user", "--map-root-user"]
    probe = subprocess.run([*command, "true"], capture_output=True, check=False)
    return command if probe.returncode == 0 else None


def new_root(folder: Path) -> Path:
    root = folder / "root"
    for name in (
        "usr",
        "etc",
        "run",
        "tmp",
        "dev",
        "opt/stubs",
        "opt/boot",
        "var/lib/cloud/data",
        "var/lib/cloud/instance/scripts",
    ):
        (root / name).mkdir(parents=True, exist_ok=True)
    for name in ("bin", "sbin", "lib", "lib64"):
        (root / name).symlink_to(f"usr/{name}")
    for name in ("passwd", "group"):
        shutil.copy(f"/etc/{name}", root / "etc" / name)
    (root / "var/lib/cloud/data/instance-id").write_text(INSTANCE_ID + "\n")
    for name in STUBBED:
        (root / "opt/stubs" / name).write_text(_STUB)
    (root / "opt/stubs/kubeadm").write_text(_KUBEADM)
    (root / "opt/stubs/curl").write_text(_CURL)
    for stub in (root / "opt/stubs").iterdir():
        stub.chmod(0o755)
    return root


# In a list of server metadata a boot reads: a read the metadata service does not answer.
UNANSWERED: dict[str, str] = {}


def metadata_document(meta: dict[str, str] | None) -> dict[str, Any]:
    """meta_data.json as Nova's metadata service serves it for this server: ``meta``, the
    server's metadata, only when it has any."""
    document: dict[str, Any] = {
        "uuid": INSTANCE_ID,
        "name": SERVER_NAME,
        "hostname": SERVER_NAME,
        "availability_zone": "nova",
        "launch_index": 0,
    }
    if meta:
        document["meta"] = dict(meta)
    return document


def _power_on(root: Path, metadata: list[dict[str, str]]) -> None:
    """What each boot starts from: /run empty (a tmpfs), fresh consoles, and the metadata
    service's answers for this boot, in the order its reads get them."""
    shutil.rmtree(root / "run")
    (root / "run/osas-meta").mkdir(parents=True)
    (root / "run/osas-instance-id").write_text(INSTANCE_ID)
    (root / "run/osas-server-name").write_text(SERVER_NAME)
    (root / "run/osas-calls").write_text("")
    for name in CONSOLES:
        (root / name.lstrip("/")).write_text("")
    for index, meta in enumerate(metadata):
        if meta is UNANSWERED:
            (root / f"run/osas-meta/{index:03}.unanswered").write_text("")
            continue
        document = json.dumps(metadata_document(meta))
        (root / f"run/osas-meta/{index:03}.json").write_text(document)


def run_in_root(
    root: Path, command: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    sandbox = _sandbox_command()
    if sandbox is None:
        reason = "no mount namespace here (unshare as root, or user namespaces)"
        if os.environ.get("OSAS_REQUIRE_TOOLS") == "1":
            pytest.fail(f"OSAS_REQUIRE_TOOLS=1 but {reason}")
        pytest.skip(reason)
    path = "/opt/stubs:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return subprocess.run(
        [
            *sandbox,
            "/bin/sh",
            "-c",
            _SETUP,
            "setup",
            str(root),
            "/usr/bin/env",
            "-i",
            f"PATH={path}",
            *(f"{k}={v}" for k, v in env.items()),
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _calls(root: Path) -> list[list[str]]:
    return [line.split("\t") for line in (root / "run/osas-calls").read_text().splitlines()]


_WRITE_FILES = """
import json, sys
from cloudinit.config.cc_write_files import write_files
write_files("write_files", json.load(open(sys.argv[1])), "root:root")
"""
# cloud-init's scripts_per_boot module: every executable file of the folder, in name order.
_PER_BOOT = """
from cloudinit import subp
subp.runparts("/var/lib/cloud/scripts/per-boot")
"""
PER_BOOT = "/usr/bin/python3 /opt/boot/per-boot.py"


def boot_cloud_config(
    text: str, folder: Path, *, metadata: list[dict[str, str]] | None = None
) -> Boot:
    """A first boot, as cloud-init runs it, in a root of its own with the host's /usr
    read-only and no network: write_files (its own code; the init stage), then in the final
    stage the per-boot scripts (its own runparts) and the runcmd script it writes. The
    metadata service answers with ``metadata`` (one server metadata per read, UNANSWERED for
    a read that fails; the last one stays), or with none."""
    require("cloud-init")
    config = yaml.safe_load(text)
    root = new_root(folder)
    _power_on(root, metadata or [])
    (root / "opt/boot/write-files.json").write_text(json.dumps(config.get("write_files") or []))
    (root / "opt/boot/write-files.py").write_text(_WRITE_FILES)
    (root / "opt/boot/per-boot.py").write_text(_PER_BOOT)
    runcmd = root / "var/lib/cloud/instance/scripts/runcmd"
    runcmd.write_text(cloud_init_runcmd(config.get("runcmd") or []))
    runcmd.chmod(0o700)
    write_files = "/usr/bin/python3 /opt/boot/write-files.py /opt/boot/write-files.json"
    script = f"{write_files} && {PER_BOOT} && /var/lib/cloud/instance/scripts/runcmd"
    done = run_in_root(root, ["/bin/sh", "-c", script], {})
    return Boot(root, _calls(root), done.returncode, done.stdout + done.stderr)


def boot_again(previous: Boot, metadata: list[dict[str, str]]) -> Boot:
    """A later boot of the same server (same disk, same instance id): cloud-init runs only its
    per-boot scripts again; write_files and runcmd ran at the first boot."""
    root = previous.root
    _power_on(root, metadata)
    done = run_in_root(root, ["/bin/sh", "-c", PER_BOOT], {})
    return Boot(root, _calls(root), done.returncode, done.stdout + done.stderr)


def create_metadata(example: Example) -> list[dict[str, str]]:
    """The server metadata of a cold create of the example's group, as osas sets it: its
    marks, and for a group with a warm pool (whose template serves its cold creates too) the
    join token osas minted (the sample here)."""
    meta = {
        "osas-cluster": CLUSTER,
        "osas-node-group": GROUP,
        "osas-request-id": "7" * 32,
    }
    if example.warm and example.minted:
        meta["osas-join-token"] = SAMPLE_VALUES["bootstrap_token"]
    return [meta]


def boot_ignition(text: str, folder: Path) -> Boot:
    """Ignition's files written as it writes them (data URLs decoded, modes set), then each
    enabled unit's ExecStart run as systemd would, with its EnvironmentFile."""
    config = json.loads(text)
    root = new_root(folder)
    _power_on(root, [])
    for entry in config.get("storage", {}).get("files", []):
        path = root / entry["path"].lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data_url(entry["contents"]["source"]))
        path.chmod(entry.get("mode", 0o644))
    outputs, returncode = [], 0
    for unit in config.get("systemd", {}).get("units", []):
        if not unit.get("enabled"):
            continue
        settings = unit_settings(unit["contents"])
        env = {}
        for env_file in settings.get("EnvironmentFile", []):
            env |= dict(
                line.split("=", 1)
                for line in (root / env_file.lstrip("-/")).read_text().splitlines()
                if "=" in line and not line.startswith("#")
            )
        for command in settings.get("ExecStart", []):
            done = run_in_root(root, shlex.split(command), env)
            outputs.append(done.stdout + done.stderr)
            returncode = returncode or done.returncode
    return Boot(root, _calls(root), returncode, "\n".join(outputs))


def unit_settings(contents: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in contents.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


# -- what kubelet is started with ----------------------------------------------------------------


def kubelet_flags(boot: Boot) -> list[str]:
    """The flags a join left for kubelet, wherever the node software reads them: kubeadm's
    drop-in reads KUBELET_EXTRA_ARGS from /etc/default/kubelet (deb) or /etc/sysconfig/kubelet
    (rpm); k3s and RKE2 read ``kubelet-arg`` and ``node-label`` from their config.yaml."""
    flags: list[str] = []
    for env_file in ("/etc/default/kubelet", "/etc/sysconfig/kubelet"):
        text = boot.read(env_file)
        for line in (text or "").splitlines():
            if line.startswith("KUBELET_EXTRA_ARGS="):
                flags += shlex.split(line.removeprefix("KUBELET_EXTRA_ARGS="))
    for config in ("/etc/rancher/k3s/config.yaml", "/etc/rancher/rke2/config.yaml"):
        text = boot.read(config)
        if text is None:
            continue
        settings = yaml.safe_load(text)
        flags += [f"--{arg}" for arg in settings.get("kubelet-arg", [])]
        labels = settings.get("node-label", [])
        if labels:
            flags.append("--node-labels=" + ",".join(labels))
    return flags
