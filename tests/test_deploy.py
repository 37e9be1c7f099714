"""The shipped manifests and chart values hold configurations osas accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

from osas.config import load_config

ROOT = Path(__file__).parent.parent


def test_plain_manifest_config_is_valid(tmp_path):
    documents = list(yaml.safe_load_all((ROOT / "deploy" / "osas.yaml").read_text()))
    config_map = next(
        d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "osas"
    )
    path = tmp_path / "osas.yaml"
    path.write_text(config_map["data"]["osas.yaml"])
    config = load_config(path)
    assert config.tls is not None
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1  # one writer
    mounts = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    tls_mount = next(m for m in mounts if m["name"] == "tls")
    assert "subPath" not in tls_mount  # a subPath mount would never see a rotation
    assert str(config.tls.cert_file).startswith(tls_mount["mountPath"])


def test_chart_default_config_is_valid(tmp_path):
    values = yaml.safe_load((ROOT / "charts" / "osas" / "values.yaml").read_text())
    path = tmp_path / "osas.yaml"
    path.write_text(yaml.safe_dump(values["config"]))
    assert load_config(path).cluster_name == "my-cluster"
