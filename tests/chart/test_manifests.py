"""deploy/: the kustomize base is the chart rendered with deploy/values.yaml, byte for byte, and
what `kubectl kustomize` makes of the base and the example overlay is valid and loads."""

from __future__ import annotations

import pytest
import yaml

pytest.importorskip("helm_python", reason="chart tests run in their own venv: nox -s chart")
pytest.importorskip("kubernetes_validate", reason="chart tests run in their own venv: nox -s chart")

from chart_schema import (
    DEFAULTS_TEMPLATE,
    VALUES_SCHEMA,
    defaults_template_text,
    values_schema_text,
)
from chartkit import BASE, DEPLOY, find, kustomize, render_base, validate

import osas
from osas.config import load_config


def test_the_base_is_the_chart_rendered():
    assert BASE.read_text() == render_base(), "deploy/base is stale: run `nox -s manifests`"


def test_the_config_schema_is_osas_own():
    """values.schema.json's `config` is generated from osas's configuration models."""
    assert VALUES_SCHEMA.read_text() == values_schema_text(), (
        "charts/osas/values.schema.json is stale: run `nox -s manifests`"
    )


def test_the_templates_know_osas_defaults():
    assert DEFAULTS_TEMPLATE.read_text() == defaults_template_text(), (
        "charts/osas/templates/_config_defaults.tpl is stale: run `nox -s manifests`"
    )


@pytest.fixture(scope="module", params=["base", "overlays/example"])
def built(request):
    objects = kustomize(DEPLOY / request.param)
    if objects is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` cannot run")
    return request.param, objects


def osas_config_of(objects, tmp_path):
    path = tmp_path / "osas.yaml"
    text = find(objects, "ConfigMap", "osas")["data"]["osas.yaml"]
    path.write_text(text)
    return load_config(path, read_files=False)  # the files are the pod's mounted Secret


def test_the_overlay_keeps_the_leader_election_of_the_base(built):
    """The example overlay replaces the base's osas.yaml: it must still elect one writer that
    publishes itself behind the selector-less Service CA dials."""
    _, objects = built
    config = yaml.safe_load(find(objects, "ConfigMap", "osas")["data"]["osas.yaml"])
    election = config["leader_election"]
    assert election["enabled"] is True
    assert election["service_name"] == "osas"
    # The base's Role grants one Lease: the one this configuration names.
    lease = election.get("lease_name") or f"osas-{config['cluster_name']}"
    role = find(objects, "Role", "osas-lease")
    assert role["metadata"]["namespace"] == election.get("lease_namespace", "kube-system")
    assert [r["resourceNames"] for r in role["rules"] if "resourceNames" in r] == [[lease]]
    assert "selector" not in find(objects, "Service", "osas")["spec"]
    assert find(objects, "Deployment")["spec"]["replicas"] == 2


def test_kustomize_output_is_valid(built):
    _, objects = built
    for obj in objects:
        validate(obj)


def test_kustomize_output_runs_osas_as_the_chart_does(built, tmp_path):
    folder, objects = built
    config = osas_config_of(objects, tmp_path)
    base = osas_config_of(kustomize(DEPLOY / "base"), tmp_path)
    assert config.tls == base.tls  # what CA dials and presents is the base's
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # The base names an image that can never be pulled; the overlay names the user's.
    registry = "registry.invalid" if folder == "base" else "registry.example.com"
    assert container["image"] == f"{registry}/osas:{osas.__version__}"
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    for group in config.node_groups:
        assert group.labels["osas/node-group"] == group.group_id
        for path in [group.user_data_file, *group.user_data_vars.values()]:
            if path is not None:
                assert any(str(path).startswith(m + "/") for m in mounts), path
    cloud_config = yaml.safe_load(
        find(objects, "Secret", "osas-ca-cloud-config")["stringData"]["cloud-config.yaml"]
    )
    assert cloud_config["address"] == "osas.kube-system.svc:8086"
    assert cloud_config["address"].partition(":")[0] in config.tls.server_names
