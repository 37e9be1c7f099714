"""What the README promises a newcomer holds for the tree it ships in."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.utils import canonicalize_name

import osas
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


# -- installing osas: the distribution's name, never osas from PyPI --------------------------

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DISTRIBUTION = PYPROJECT["project"]["name"]
# pip's options that take a value: the word after them is no requirement.
PIP_VALUE_OPTIONS = {
    "-r", "--requirement", "-c", "--constraint", "-f", "--find-links", "-i", "--index-url",
    "--extra-index-url", "-t", "--target", "--prefix", "--root", "--cert", "--platform",
}  # fmt: skip
# Where a user or a build is told to install something: every text file of these, this one
# excepted (it names what it looks for).
INSTALL_TEXTS = ("README.md", "CHANGELOG.md", "Containerfile", "noxfile.py", ".ci/run")
INSTALL_FOLDERS = ("docs", "osas", "charts", "deploy", "examples", "requirements", "tests")


def install_commands() -> list[tuple[str, list[str]]]:
    """Every ``pip install`` written in the repository's docs, code and build files: where, and
    its words (continued lines joined; it ends at a shell's ``&&``, ``;``, ``|`` or comment, and
    in Markdown at the closing backtick)."""
    paths = [ROOT / name for name in INSTALL_TEXTS]
    for folder in INSTALL_FOLDERS:
        paths += [p for p in (ROOT / folder).rglob("*") if p.is_file()]
    found = []
    for path in paths:
        if path == Path(__file__) or path.suffix in {".pyc", ".png", ".svg", ".tgz"}:
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"pip install((?:[^\n`]*\\\n)*[^\n`]*)", text):
            words = match.group(1).replace("\\\n", " ").split()
            ends = [i for i, w in enumerate(words) if w in {"&&", "||", "|", ";"} or w[0] == "#"]
            words = words[: min(ends, default=len(words))]
            found.append((str(path.relative_to(ROOT)), [bare(word) for word in words]))
    return found


def bare(word: str) -> str:
    """A word of a command without its quotes, or a sentence's punctuation after it."""
    word = word.strip("'\"(")
    return word if word.startswith(".") else word.rstrip(".,;:)")


def requirements(words: list[str]) -> list[str]:
    """The words of a pip command that name what to install (not options, not their values)."""
    named, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in PIP_VALUE_OPTIONS:
            skip = True
        elif word and not word.startswith("-"):
            named.append(word)
    return named


def test_no_doc_or_code_installs_osas_or_this_project_from_pypi():
    commands = install_commands()
    assert any(where == "docs/cli.md" for where, _ in commands)  # the scan sees the docs
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    for where, words in commands:
        for requirement in requirements(words):
            if requirement.startswith(("/", ".")):  # a path: this clone, or a built wheel
                extra = re.fullmatch(r"\.\[(\w+)\]", requirement)
                assert extra is None or extra.group(1) in extras, (where, requirement)
                continue
            name = canonicalize_name(re.split(r"[\[<>=!~;]", requirement)[0])
            # "osas" on PyPI is another project; osas itself is published nowhere.
            assert name != "osas", f"{where}: pip install {' '.join(words)}"
            if name == canonicalize_name(DISTRIBUTION):
                assert "--no-index" in words, f"{where}: {DISTRIBUTION} is not on PyPI"


def test_the_docs_name_the_distribution_pyproject_builds_and_the_image_installs():
    assert canonicalize_name(DISTRIBUTION) != "osas"  # PyPI's osas is another project
    assert f"The distribution is called `{DISTRIBUTION}`" in (ROOT / "docs" / "cli.md").read_text()
    assert f"osas's distribution is `{DISTRIBUTION}`" in " ".join(
        (ROOT / "README.md").read_text().split()
    )
    image_installs = [words for where, words in install_commands() if where == "Containerfile"]
    assert [DISTRIBUTION] in [requirements(words) for words in image_installs]
    # The package and the command keep the name osas.
    assert PYPROJECT["project"]["scripts"] == {"osas": "osas.__main__:main"}
    assert PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["osas"]


# -- the image: docs/install.md's build command and nox -s image's --------------------------


def noxfile_functions(*names: str) -> dict[str, Any]:
    """Functions (and constants) of noxfile.py as nox runs them: with the module's imports, but
    for nox itself (the test suite's venv has none; these functions do not use it)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())

    def named(node: ast.stmt) -> str | None:
        if isinstance(node, ast.FunctionDef):
            return node.name
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            return node.targets[0].id
        return None

    body = [
        node
        for node in tree.body
        if (
            isinstance(node, ast.Import | ast.ImportFrom) and "nox" not in ast.unparse(node).split()
        )
        or named(node) in names
    ]
    assert {named(node) for node in body} - {None} == set(names)
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body, type_ignores=[]), "noxfile.py", "exec"), namespace)  # noqa: S102
    return namespace


def documented_image_builds() -> list[list[str]]:
    """docs/install.md's image commands, run from the repository's root by bash with a buildah
    that only says what it is asked: the arguments of each ``buildah build``."""
    text = (ROOT / "docs" / "install.md").read_text()
    (block,) = re.findall(r"<!-- image-build -->\s*```sh\n(.*?)```", text, re.DOTALL)
    script = 'buildah() { printf "%s\\n" "--call--" "$@"; }\n' + block
    said = subprocess.run(
        [shutil.which("bash") or "bash", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    calls = [call.splitlines() for call in said.split("--call--\n")[1:]]
    return [call[1:] for call in calls if call[0] == "build"]


def test_the_documented_image_build_gives_the_labels_and_isolation_nox_gives(monkeypatch):
    if not (ROOT / ".git").exists():
        pytest.skip("not a clone: no commit to label the image with")
    monkeypatch.chdir(ROOT)
    nox = noxfile_functions("_quiet", "_label_arguments", "_build_options")
    labels = nox["_label_arguments"]()
    assert labels["VERSION"] == osas.__version__
    assert re.fullmatch(r"[0-9a-f]{40}", labels["REVISION"])
    # Every build argument the Containerfile's labels read, and no other.
    containerfile = (ROOT / "Containerfile").read_text()
    (label,) = re.findall(r"^LABEL (?:.*\\\n)*.*$", containerfile, re.MULTILINE)
    assert set(labels) == set(re.findall(r"\$\{(\w+)\}", label))
    options = nox["_build_options"]("buildah")
    builds = documented_image_builds()
    assert len(builds) == 2  # one platform, then both in a manifest list
    for build in builds:
        given = [build[i + 1] for i, word in enumerate(build) if word == "--build-arg"]
        assert dict(argument.split("=", 1) for argument in given) == labels
        isolation = build[build.index("--isolation") : build.index("--isolation") + 2]
        assert isolation == options[options.index("--isolation") :][:2] == ["--isolation", "chroot"]
    # What nox adds: no image per step left behind (buildah's default, said in case
    # BUILDAH_LAYERS says otherwise).
    assert "--layers=false" in options


# -- "Try it on your machine": its ports ----------------------------------------------------


def test_the_readme_names_the_ports_try_it_uses_and_moves_osas_off_them(monkeypatch):
    readme = (ROOT / "README.md").read_text()
    commands = "\n".join(re.findall(r"<!-- readme-test -->\s*```sh\n(.*?)```", readme, re.DOTALL))
    example = (ROOT / "examples" / "osas.yaml").read_text()
    used = set(re.findall(r"127\.0\.0\.1:(\d+)", commands + example))
    used |= set(re.findall(r"--port (\d+)", commands))
    paragraph, moved = re.findall(
        r"^(The commands need .*?)```sh\n(.*?)```", readme, re.DOTALL | re.MULTILINE
    )[0]
    assert set(re.findall(r"\b(\d{4,5})\b", paragraph)) == used
    # The other ports it gives osas are the ones osas then listens on, and asks for status.
    exports = dict(re.findall(r"\b(OSAS_\w+)=(\S+)", moved))
    for name, value in exports.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)
    config = load_config(ROOT / "examples" / "osas.yaml")
    listeners = {config.listen, config.health_listen, config.metrics_listen}
    assert listeners == set(exports.values())
    assert {address.rsplit(":", 1)[1] for address in listeners}.isdisjoint(used)
    assert f"--url http://{config.metrics_listen} " in moved


# -- one procedure per task -------------------------------------------------------------------


def test_the_credential_rotation_is_written_once_and_linked_from_the_other_pages():
    pages = {path.name: path.read_text() for path in (ROOT / "docs").glob("*.md")}
    procedure = "operations.md#rotating-the-application-credential"
    heading = r"^### Rotating the application credential\n(.*?)^##"
    (section,) = re.findall(heading, pages["operations.md"], re.MULTILINE | re.DOTALL)
    steps = re.findall(r"^\d\. \*\*(.+?)\*\*", section, re.MULTILINE)
    assert [step.split()[0] for step in steps] == ["A", "Update", "Watch", "Delete"]
    # The steps nowhere else; the pages that speak of changing credentials link to them.
    for name, text in pages.items():
        if name != "operations.md":
            assert "application credential delete" not in text, name
    for name in ("install.md", "openstack.md"):
        assert procedure in pages[name], name


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


# -- the README's test command: what it says at its end, and the lanes it leaves ------------------


def test_the_test_session_ends_with_its_time_what_it_skipped_and_why_and_the_other_lanes(
    tmp_path,
):
    """The lines `nox -s tests` ends with, from a JUnit report pytest itself writes."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_some.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "@pytest.mark.skip(reason='needs the moon')\n"
        "def test_skipped(): pass\n"
    )
    (suite / "test_none.py").write_text(
        "import pytest\npytest.skip('run by its own lane', allow_module_level=True)\n"
    )
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=suite,
        capture_output=True,
        check=True,
    )
    nox = noxfile_functions("_minutes", "_skip_reason", "_what_ran", "TEST_WORKERS", "OTHER_LANES")
    lines = nox["_what_ran"](report, 20.4, 170.6, "on 4 workers")
    assert (
        lines[0]
        == "tests: 1 passed, 2 skipped in 3 min 11 s (install 20 s, pytest 2 min 51 s on 4 workers)"
    )
    assert lines[1] == "left out here (2 skipped), and why:"
    assert sorted(lines[2:4]) == ["    1  needs the moon", "    1  run by its own lane"]
    assert lines[4] == "left to the other lanes, which .ci/run runs after this one:"
    assert lines[5:] == [f"  nox -s {lane}: {what}" for lane, what in nox["OTHER_LANES"].items()]
    assert nox["_what_ran"](tmp_path / "none.xml", 1, 2, "")[0].endswith(
        "pytest wrote no report: see its output above"
    )


def test_ci_runs_the_readme_test_command_then_every_lane_the_suite_leaves_and_docs_list_them():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^(python3 .*nox -s tests)\s", readme, flags=re.MULTILINE)
    assert f"\n{command}\n" in ci
    after = ci[ci.index(command) + len(command) :]
    run = [" ".join(m.split()) for m in re.findall(r"nox -s ([\w ]+)$", after, re.MULTILINE)]
    lanes = noxfile_functions("OTHER_LANES")["OTHER_LANES"]
    assert sorted(run) == sorted(lanes)
    table = (ROOT / "docs" / "testing.md").read_text()
    for lane in [*lanes, "tests"]:
        assert f"`nox -s {lane}`" in table, lane
