"""Developer tasks. `nox -s tests` runs the test suite; `nox` alone runs every check."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "typecheck", "proto", "tests"]
nox.options.error_on_missing_interpreters = True

# Pinned with the committed stubs: a different protoc writes different bytes.
PROTO_TOOLS = ("grpcio-tools==1.85.1", "mypy-protobuf==5.1.0")
# The real-Nova lane: nova 34.0.0 and everything its functional-test fixtures need, pinned
# whole, so that a version bump is a deliberate change (docs/testing.md).
REALNOVA_REQUIREMENTS = "tests/realnova/requirements.txt"
# The chart lane: helm-python-sdk (Helm 4, offline) and kubernetes-validate, pinned whole.
CHART_REQUIREMENTS = "requirements/chart.txt"
# The image's hashed lock files, and the tool that writes them (requirements/README.md).
LOCK_TOOL = "uv==0.13.8"
# The image: where `nox -s image` tags it, and what it checks inside.
IMAGE = os.environ.get("OSAS_IMAGE", "localhost/osas:dev")
IMAGE_CHECK = """
import importlib.util, os, sys
present = [m for m in ("pip", "setuptools", "wheel", "ensurepip", "trustme", "pytest", "hypothesis")
           if importlib.util.find_spec(m)]
print("uid", os.getuid(), "python", sys.version.split()[0], "extra modules", present or "none")
sys.exit(1 if present or os.getuid() == 0 else 0)
"""


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (unit, gRPC on loopback, CLI)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def nova(session: nox.Session) -> None:
    """The scenario suite and smoke tests against real Nova on 127.0.0.1 (its own venv)."""
    # One pip call: a pin that osas's own requirements contradict fails here rather than
    # being upgraded quietly.
    session.install("-r", REALNOVA_REQUIREMENTS, "-e", ".[test]")
    session.run(
        "pytest", "-m", "realnova", "tests/realnova", "tests/test_scenarios.py", *session.posargs
    )


@nox.session
def readme(session: nox.Session) -> None:
    """The README's "Try it on your machine" commands, verbatim, in a fresh copy."""
    session.install("-e", ".[test]")  # the test runner and the project's pytest settings
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "tests/readme",
        *session.posargs,
        env={"OSAS_README_TEST": "1"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and the layer contract of docs/architecture.md."""
    session.install("-e", ".", "ruff", "import-linter")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on osas/."""
    session.install("-e", ".[dev,test]")
    session.run("mypy")


@nox.session
def proto(session: nox.Session) -> None:
    """Regenerate osas/protocol from proto/; fails if the committed stubs were out of date."""
    session.install(*PROTO_TOOLS)
    session.run("python", "proto/generate.py")


@nox.session
def bench(session: nox.Session) -> None:
    """osas against the bare gRPC limit at scale; writes docs/BENCHMARKS.md (not a default
    session: some 15 minutes on 2 cores, `-- --quick` for a couple)."""
    session.install("-e", ".[bench]")
    session.run("osas", "bench", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """A Cluster Autoscaler session against a simulated OpenStack."""
    session.install("-e", ".")
    session.run("osas", "demo", *session.posargs)


@nox.session
def chart(session: nox.Session) -> None:
    """The Helm chart and deploy/: render, lint, validate against Kubernetes schemas (own venv)."""
    session.install("-r", CHART_REQUIREMENTS, "-e", ".[test]")
    session.run("pytest", "tests/chart", *session.posargs)


@nox.session
def manifests(session: nox.Session) -> None:
    """Render deploy/base/osas.yaml from the chart (tests/chart checks it is up to date)."""
    session.install("-r", CHART_REQUIREMENTS, "-e", ".")
    session.run("python", "tests/chart/chartkit.py")


@nox.session
def lock(session: nox.Session) -> None:
    """Regenerate requirements/osas.lock and build.lock (hashed, every platform, Python 3.11)."""
    session.install(LOCK_TOOL)
    common = ["--generate-hashes", "--universal", "--python-version", "3.11", "--quiet"]
    session.run(
        "uv",
        "pip",
        "compile",
        "pyproject.toml",
        *common,
        "--no-emit-package",
        "setuptools",
        "--custom-compile-command",
        "nox -s lock",
        "-o",
        "requirements/osas.lock",
    )
    session.run(
        "uv",
        "pip",
        "compile",
        "requirements/build.in",
        *common,
        "--custom-compile-command",
        "nox -s lock",
        "-o",
        "requirements/build.lock",
    )


def _quiet(*command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run one of the tools this file names (an engine, git), output captured, never raising."""
    return subprocess.run(  # noqa: S603 - our own tools, arguments we build
        command, capture_output=True, text=True, check=False, timeout=timeout
    )


def _engine() -> tuple[str, bool] | None:
    """The container engine to build with, and whether it also runs containers for
    testcontainers (a Docker-compatible API): buildah builds and runs in a chroot, daemonless."""
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path and _quiet(path, "info", timeout=60).returncode == 0:
            return path, name == "docker" or "DOCKER_HOST" in os.environ
    path = shutil.which("buildah")
    return (path, False) if path else None


def _base_image(session: nox.Session) -> str:
    if "OSAS_PYTHON_IMAGE" in os.environ:
        return os.environ["OSAS_PYTHON_IMAGE"]
    text = Path("Containerfile").read_text(encoding="utf-8")
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    if match is None:
        session.error("Containerfile: no ARG PYTHON_IMAGE")
    return match.group(1)


def _ensure_base(session: nox.Session, engine: str, base: str) -> None:
    """The base image in the engine's local store, or the session skipped with the reason.
    Pulled only when asked: CI reaches the package registries and nothing else."""
    tool = Path(engine).name
    have = (engine, "image", "inspect", base) if tool == "docker" else (engine, "inspect", base)
    if _quiet(*have).returncode == 0:
        return
    if os.environ.get("OSAS_PULL_BASE") != "1":
        session.skip(
            f"the base image {base} is not in {tool}'s local store; `{tool} pull` it, set "
            "OSAS_PULL_BASE=1 to let this session pull it, or set OSAS_PYTHON_IMAGE to a "
            "copy this machine has"
        )
    pulled = _quiet(engine, "pull", base)
    if pulled.returncode != 0:
        reason = (pulled.stderr.strip().splitlines() or ["no answer"])[-1]
        session.skip(
            f"the base image {base} cannot be had here ({reason}); set OSAS_PYTHON_IMAGE "
            "to a copy of it in a registry or local store this machine reaches"
        )


@nox.session
def image(session: nox.Session) -> None:
    """Build the image (buildah, podman or docker) and check it: `osas --version` inside, no
    installer or test library, not root; then the testcontainers test where containers run."""
    found = _engine()
    if found is None:
        session.skip("no container engine (buildah, podman or docker with its daemon) here")
    engine, runs_containers = found
    tool = Path(engine).name
    base = _base_image(session)
    _ensure_base(session, engine, base)
    version = re.search(r'__version__ = "(.+)"', Path("osas/__init__.py").read_text())
    if version is None:
        session.error("osas/__init__.py: no __version__")
    git = shutil.which("git")
    commit = _quiet(git, "log", "-1", "--format=%H %cI").stdout.split() if git else []
    revision, created = commit or ["unknown", "1970-01-01T00:00:00Z"]
    build = [engine, "build", "-f", "Containerfile", "-t", IMAGE]
    if tool == "buildah":
        build += ["--isolation", "chroot", "--layers"]
    for arg in (
        f"PYTHON_IMAGE={base}",
        f"VERSION={version.group(1)}",
        f"REVISION={revision}",
        f"CREATED={created}",
    ):
        build += ["--build-arg", arg]
    session.run(*build, ".", external=True)
    if tool == "buildah":
        container = _quiet(engine, "from", IMAGE).stdout.strip()
        try:
            for command in (["osas", "--version"], ["python3", "-c", IMAGE_CHECK]):
                session.run(
                    engine,
                    "run",
                    "--isolation",
                    "chroot",
                    container,
                    "--",
                    *command,
                    external=True,
                )
        finally:
            _quiet(engine, "rm", container)
        size = _quiet(engine, "images", "--format", "{{.Size}}", IMAGE).stdout.strip()
    else:
        run = (engine, "run", "--rm", "--read-only", "--entrypoint")
        session.run(*run, "osas", IMAGE, "--version", external=True)
        session.run(*run, "python3", IMAGE, "-c", IMAGE_CHECK, external=True)
        size = _quiet(engine, "image", "ls", "--format", "{{.Size}}", IMAGE).stdout.strip()
    session.log(f"built {IMAGE} from {base}: {size}")
    if not runs_containers:
        session.log("the testcontainers test needs a Docker-compatible engine: not run here")
        return
    session.install("-e", ".[test]", "testcontainers==4.15.0")
    session.run("pytest", "-m", "container", "tests/test_container.py", env={"OSAS_IMAGE": IMAGE})
