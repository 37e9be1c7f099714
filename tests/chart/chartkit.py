"""Render the chart offline (helm-python-sdk, Helm 4) and validate what it renders: built-in kinds
against the Kubernetes schemas kubernetes-validate ships, custom resources against
crd_schemas."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import chart_schema
import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml
from crd_schemas import SCHEMAS

ROOT = Path(__file__).parent.parent.parent
CHART = ROOT / "charts" / "osas"
DEPLOY = ROOT / "deploy"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema shipped.
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.utils.latest_version())
# Written by the metrics engineer's work; until then a test copy of the chart gets stand-ins.
SHIPPED_FILES = {
    "files/grafana-dashboard.json": json.dumps({"title": "osas (stand-in)", "panels": []}),
    "files/prometheus-rules.yaml": yaml.safe_dump(
        {
            "groups": [
                {
                    "name": "osas-stand-in",
                    "rules": [{"alert": "OsasDown", "expr": "up == 0", "for": "5m"}],
                }
            ]
        }
    ),
}


# A node group that mints a join token per server: the chart then grants create on Secrets in
# kube-system, held by its admission policy (tests/chart/test_admission.py and the real-API lane).
MINTING_WORKERS = {
    "id": "workers",
    "min_size": 0,
    "max_size": 5,
    "flavor": "m1.large",
    "image": "ubuntu-24.04-k8s",
    "networks": ["cluster-net"],
    "user_data_file": "/etc/osas/bootstrap/user-data",
    "bootstrap_token": {"ttl": "30m"},
}


def chart_copy(folder: Path) -> Path:
    """The chart, with stand-ins for the shipped files that do not exist yet (in the copy only)."""
    target = folder / "osas"
    shutil.copytree(CHART, target)
    for name, text in SHIPPED_FILES.items():
        path = target / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return target


# Where the tests' installs pull the image from: the chart has no default (osas publishes none).
EXAMPLE_REPOSITORY = "registry.example.com/osas"


def render_files(
    chart: Path, values: dict[str, Any], *, name: str = "osas", namespace: str = "kube-system"
) -> dict[str, str]:
    """The chart rendered with ``values``, and the example repository where they name none."""
    image = {"repository": EXAMPLE_REPOSITORY, **values.get("image", {})}
    with helm.Chart.load(chart) as loaded:
        return loaded.render(
            values={**values, "image": image}, name=name, namespace=namespace, is_install=True
        )


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every object rendered, NOTES.txt aside."""
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def notes(rendered: dict[str, str]) -> str:
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


# Kinds the chart renders only where the cluster has them (the admission policies: from 1.30,
# which the chart checks), validated from that version on.
SINCE = {
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): "1.30.0",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): "1.30.0",
}


def validate(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` is not valid for every Kubernetes version the chart supports (that has
    its kind)."""
    schema = SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if schema is not None:
        jsonschema.validate(obj, schema)
        return
    since = SINCE.get((obj["apiVersion"], obj["kind"]))
    versions = [v for v in KUBE_VERSIONS if since is None or _newer(v, since)] or [since]
    for version in versions:
        kubernetes_validate.validate(obj, version, strict=True)


def _newer(version: str, than: str) -> bool:
    return tuple(map(int, version.split("."))) >= tuple(map(int, than.split(".")))


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"{len(matches)} {kind} named {name}"
    return matches[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def kustomize(folder: Path) -> list[dict[str, Any]] | None:
    """``kubectl kustomize folder``, or None where kubectl is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


# -- deploy/: plain manifests rendered from the chart -------------------------------------------

BASE = DEPLOY / "base" / "osas.yaml"
BASE_HEADER = """\
# Generated from charts/osas with deploy/values.yaml (release osas, namespace kube-system) by
# `nox -s manifests`: do not edit; change the chart or deploy/values.yaml and run it again.
# tests/chart/test_manifests.py fails when this file and the chart disagree.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (osas.yaml, the cloud-config) as literal blocks, as people write them."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _text)


def render_base(chart: Path = CHART) -> str:
    """deploy/base/osas.yaml as the chart renders it with deploy/values.yaml."""
    values = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    objects = documents(render_files(chart, values, name="osas", namespace="kube-system"))
    body = yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True)
    return BASE_HEADER + body


if __name__ == "__main__":
    # The schema and the defaults first: rendering deploy/ checks its values against them.
    for path in [*chart_schema.write(), BASE]:
        if path == BASE:
            BASE.write_text(render_base())
        print(f"wrote {path.relative_to(ROOT)}")  # noqa: T201
