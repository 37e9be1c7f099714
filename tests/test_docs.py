"""What the README promises a newcomer holds for the tree it ships in."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from packaging.utils import canonicalize_name

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
