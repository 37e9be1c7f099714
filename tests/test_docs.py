"""What the README promises a newcomer holds for the tree it ships in."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
