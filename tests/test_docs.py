"""What the README promises a newcomer holds for the tree it ships in."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from osas.config import load_config

ROOT = Path(__file__).parent.parent


def nox_sessions() -> set[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d).startswith("nox.session") for d in node.decorator_list)
    }


def test_the_readme_lists_every_nox_session_and_no_other():
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `nox -s (\w+)`", readme, flags=re.MULTILINE))
    assert listed == nox_sessions()


def test_the_example_configuration_loads_and_points_at_the_simulator(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = load_config(ROOT / "examples" / "osas.yaml")
    assert config.openstack.cloud == "osas-sim"
    assert config.metrics_listen == "127.0.0.1:8088"
    assert "osas status --url http://127.0.0.1:8088" in (ROOT / "README.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "--config examples/osas.yaml" in readme


def test_every_group_of_a_shipped_configuration_carries_the_label_its_nodes_register():
    """The install page's kubelet arguments register each node with the label the chart adds
    to its group's template (``managedNodes.label``); a configuration written without the chart
    names it itself, or CA's template for the group differs from its nodes."""
    values = yaml.safe_load((ROOT / "charts" / "osas" / "values.yaml").read_text())
    label = values["managedNodes"]["label"]
    install = (ROOT / "docs" / "install.md").read_text()
    assert f"--node-labels={label}=${{node_group}}" in install
    assert f'node-label: ["{label}=${{node_group}}"]' in install
    readme = (ROOT / "README.md").read_text()
    written = {
        "README.md": [
            block
            for block in re.findall(r"^```yaml\n(.*?)^```", readme, flags=re.DOTALL | re.MULTILINE)
            if "node_groups:" in block
        ],
        **{
            str(path.relative_to(ROOT)): [path.read_text()]
            for path in (
                ROOT / "examples" / "osas.yaml",
                ROOT / "deploy/overlays/example/osas.yaml",
            )
        },
    }
    for where, texts in written.items():
        groups = [
            group
            for text in texts
            for document in yaml.safe_load_all(text)
            for group in (document or {}).get("node_groups", [])
        ]
        assert groups, where
        for group in groups:
            assert group.get("labels", {}).get(label) == group["id"], (where, group["id"])
