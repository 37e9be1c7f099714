"""What ships: the kustomize base's configuration loads, the Deployment runs one writer with
rotation-friendly mounts, and the image recipe installs exactly the hashed lock, which is in
step with pyproject.toml. (The chart itself is tested in its own lane: nox -s chart.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import osas
from osas.config import load_config

ROOT = Path(__file__).parent.parent
LOCK = ROOT / "requirements" / "osas.lock"


def base_objects() -> list[dict]:
    return [
        d for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "osas.yaml").read_text()) if d
    ]


def test_base_manifest_config_is_valid(tmp_path):
    objects = base_objects()
    config_map = next(
        d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "osas"
    )
    path = tmp_path / "osas.yaml"
    path.write_text(config_map["data"]["osas.yaml"])
    config = load_config(path)
    assert config.tls is not None
    assert "osas.kube-system.svc" in config.tls.server_names
    deployment = next(d for d in objects if d["kind"] == "Deployment")
    # One writer among two replicas, elected through the Lease: the holder publishes itself
    # as the only endpoint of the Service CA dials, the other stands by.
    assert deployment["spec"]["replicas"] == 2
    assert config.leader_election.enabled
    assert config.leader_election.service_name == "osas"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"registry.invalid/osas:{osas.__version__}"  # never pulled
    tls_mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert "subPath" not in tls_mount  # a subPath mount would never see a rotation
    assert str(config.tls.cert_file).startswith(tls_mount["mountPath"])


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of requirements/osas.lock."""
    entries: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        if match:
            name, version = match.groups()
            entries[canonicalize_name(name)] = (
                version,
                re.findall(r"--hash=sha256:[0-9a-f]{64}", block),
            )
    return entries


def test_lock_pins_every_dependency_with_hashes_and_no_test_library():
    entries = locked()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in entries, f"{name} is not in requirements/osas.lock: run `nox -s lock`"
        version, _ = entries[name]
        assert requirement.specifier.contains(version), (
            f"{name}=={version} vs {text}: `nox -s lock`"
        )
    for name, (_, hashes) in entries.items():
        assert hashes, f"{name} has no hash"
    for unwanted in ("pip", "setuptools", "wheel", "trustme", "pytest", "hypothesis"):
        assert unwanted not in entries


def test_containerfile_pins_its_base_and_installs_only_the_lock():
    text = (ROOT / "Containerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=\S+@sha256:[0-9a-f]{64}$", text, re.MULTILINE)
    installs = re.findall(r"pip install [^\n]*(?:\\\n[^\n]*)*", text)
    assert installs
    for command in installs:
        assert "--require-hashes" in command or "--no-index" in command, command
    assert "USER 65532:65532" in text
    for label in ("version", "revision", "created", "source", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text


def test_every_containerfile_argument_has_a_default():
    """buildah warns about every ARG without a default that a build does not give, and a build
    gives PIP_CERT only behind a proxy: each has a default, empty where unset means nothing."""
    arguments = re.findall(r"^ARG (\S+)$", (ROOT / "Containerfile").read_text(), re.MULTILINE)
    assert "PIP_CERT" in [argument.split("=")[0] for argument in arguments]
    assert [argument for argument in arguments if "=" not in argument] == []
