"""Developer tasks. `nox -s tests` runs the test suite; `nox` alone runs every check."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree as ET

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "typecheck", "proto", "tests"]
nox.options.error_on_missing_interpreters = True

# The main suite's workers (pytest-xdist): its tests wait on processes, sockets and clocks
# about half the time, so twice the cores keeps the cores busy (docs/testing.md: the figures).
TEST_WORKERS = 2 * (os.cpu_count() or 1)
# What `nox -s tests` leaves to the other lanes; `.ci/run` runs each of them after it.
OTHER_LANES = {
    "nova": "the scenarios and smoke tests against real Nova and Keystone",
    "readme": "the README's commands verbatim and every CLI refusal, in a fresh copy",
    "chart": "the Helm chart and deploy/, rendered and validated",
    "image": "the image built and run as the chart's pod",
    "lint typecheck proto": "ruff and the layer contracts, mypy --strict, the generated stubs",
}
# Pinned with the committed stubs: a different protoc writes different bytes.
PROTO_TOOLS = ("grpcio-tools==1.85.1", "mypy-protobuf==5.1.0")
# The real-Nova lane: nova 34.0.0 and everything its functional-test fixtures need, and
# keystone 30.0.0, pinned whole, so that a version bump is a deliberate change (docs/testing.md).
REALNOVA_REQUIREMENTS = "tests/realnova/requirements.txt"
# The chart lane: helm-python-sdk (Helm 4, offline) and kubernetes-validate, pinned whole.
CHART_REQUIREMENTS = "requirements/chart.txt"
# The image's hashed lock files, and the tool that writes them (requirements/README.md).
LOCK_TOOL = "uv==0.13.8"
# The image: where `nox -s image` tags it, and what it checks inside.
IMAGE = os.environ.get("OSAS_IMAGE", "localhost/osas:dev")
# The Containerfile's bases, and the stand-ins tests/image/standin.py makes of them from Debian
# packages where they cannot be pulled (CI reaches package registries only).
STANDINS = {
    "BUILD_IMAGE": ("debian-slim", "localhost/osas-standin/debian:13-slim"),
    "PYTHON_IMAGE": ("distroless", "localhost/osas-standin/python3-debian13:nonroot"),
}


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (unit, gRPC on loopback, CLI), on parallel workers; at its end, how long
    it took and what it left out. ``nox -s tests -- -n 0`` runs it in one process."""
    begun = time.monotonic()
    session.install("-e", ".[test]")
    installed = time.monotonic()
    report = Path(session.create_tmp()) / "tests.xml"
    report.unlink(missing_ok=True)
    try:
        session.run(
            "pytest",
            *("-n", str(TEST_WORKERS), "--dist", "load", "--maxschedchunk", "1"),
            f"--junitxml={report}",
            *session.posargs,
        )
    finally:
        asked = any(arg.startswith(("-n", "--numprocesses")) for arg in session.posargs)
        workers = "on the workers asked for" if asked else f"on {TEST_WORKERS} workers"
        for line in _what_ran(report, installed - begun, time.monotonic() - installed, workers):
            session.log(line)


@nox.session
def nova(session: nox.Session) -> None:
    """Scenarios and smoke tests against real Nova and Keystone on 127.0.0.1 (its own venv)."""
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
    session.run("osas", "bench", "--out", "docs/BENCHMARKS.md", *session.posargs)


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
    """Generate the chart's config schema and defaults from osas's models, and render
    deploy/base/osas.yaml from the chart (tests/chart checks all three are up to date)."""
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


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _skip_reason(skipped: ET.Element) -> str:
    """Why pytest skipped a test, as its report says; a module skipped whole says it in the
    element's text ("('path', line, 'Skipped: why')")."""
    message = skipped.get("message", "")
    found = re.search(r"Skipped: (.*)'\)$", skipped.text or "")
    return found.group(1) if message == "collection skipped" and found else message


def _what_ran(report: Path, install: float, run: float, workers: str) -> list[str]:
    """The lines `nox -s tests` ends with: its time and counts, what it skipped and why, and
    the lanes it leaves to others, read from pytest's JUnit XML report."""
    took = (
        f"{_minutes(install + run)} (install {_minutes(install)}, pytest {_minutes(run)} {workers})"
    )
    if not report.is_file():
        return [f"tests took {took}; pytest wrote no report: see its output above"]
    cases = list(ET.parse(report).getroot().iter("testcase"))  # noqa: S314 - our own file
    ends = {"skipped", "failure", "error"}
    outcomes = Counter(
        next((child.tag for child in case if child.tag in ends), "passed") for case in cases
    )
    counted = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
    reasons = Counter(
        _skip_reason(child) for case in cases for child in case if child.tag == "skipped"
    )
    return [
        f"tests: {counted} in {took}",
        f"left out here ({outcomes['skipped']} skipped), and why:",
        *(f"  {count:>3}  {reason}" for reason, count in reasons.most_common()),
        "left to the other lanes, which .ci/run runs after this one:",
        *(f"  nox -s {lane}: {what}" for lane, what in OTHER_LANES.items()),
    ]


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


def _pinned_bases(session: nox.Session) -> dict[str, str]:
    """The Containerfile's pinned bases: build argument -> image reference."""
    text = Path("Containerfile").read_text(encoding="utf-8")
    bases = dict(re.findall(r"^ARG (\w+_IMAGE)=(\S+)$", text, re.MULTILINE))
    if set(bases) != set(STANDINS):
        session.error(f"Containerfile: expected ARG {' and '.join(STANDINS)}, found {bases}")
    return bases


def _base(session: nox.Session, engine: str, arg: str, pinned: str) -> str:
    """The image to build ``arg`` on: ``OSAS_<ARG>`` if set; the pinned base where the local
    store has it (or OSAS_PULL_BASE=1 pulls it); else, with buildah as root, a stand-in made
    from Debian packages (tests/image/standin.py); else the session is skipped."""
    tool = Path(engine).name
    if f"OSAS_{arg}" in os.environ:
        return os.environ[f"OSAS_{arg}"]
    have = (engine, "image", "inspect", pinned) if tool == "docker" else (engine, "inspect", pinned)
    if _quiet(*have).returncode == 0:
        return pinned
    if os.environ.get("OSAS_PULL_BASE") == "1":
        pulled = _quiet(engine, "pull", pinned)
        if pulled.returncode == 0:
            return pinned
        session.log(f"cannot pull {pinned}: {pulled.stderr.strip().splitlines()[-1:]}")
    kind, standin = STANDINS[arg]
    if tool != "buildah" or os.geteuid() != 0 or not shutil.which("mmdebstrap"):
        session.skip(
            f"the base {pinned} is not in {tool}'s local store and no stand-in can be made here "
            "(it takes buildah, mmdebstrap and root); pull it, set OSAS_PULL_BASE=1, or set "
            f"OSAS_{arg} to a copy this machine has"
        )
    if (
        os.environ.get("OSAS_STANDIN_REFRESH") == "1"
        or _quiet(engine, "inspect", standin).returncode
    ):
        session.log(f"{pinned} cannot be had here: making a stand-in from Debian packages")
        session.run("python", "tests/image/standin.py", kind, standin, external=True)
    else:
        session.log(f"{pinned} cannot be had here: using the stand-in {standin} (made before)")
    return standin


def _pip_cert() -> str | None:
    """The CA bundle pip on this machine is told to trust (a proxy that re-signs TLS), if any."""
    cert = os.environ.get("PIP_CERT")
    if not cert:
        found = _quiet(sys.executable, "-m", "pip", "config", "get", "global.cert")
        cert = found.stdout.strip() if found.returncode == 0 else None
    return cert if cert and Path(cert).is_file() else None


def _label_arguments() -> dict[str, str]:
    """The build arguments of the image's OCI labels, the values docs/install.md's command gives
    them (tests/test_docs.py runs both and compares): osas's version, the commit, its date."""
    version = re.search(
        r'^__version__ = "(.*)"$', Path("osas/__init__.py").read_text(), re.MULTILINE
    )
    if version is None:
        raise ValueError("osas/__init__.py: no __version__")
    git = shutil.which("git")
    commit = _quiet(git, "log", "-1", "--format=%H %cI").stdout.split() if git else []
    revision, created = commit or ["unknown", "1970-01-01T00:00:00Z"]
    return {"VERSION": version.group(1), "REVISION": revision, "CREATED": created}


def _build_options(tool: str) -> list[str]:
    """What the engine is told besides the build's arguments. buildah runs the steps in a
    chroot (no OCI runtime needed), as docs/install.md's command does. buildah and podman
    commit no image per step (``--layers=false``: a build left ~380 MB of them behind) and
    remove their working containers also after a failed build."""
    options = ["--isolation", "chroot"] if tool == "buildah" else []
    if tool in {"buildah", "podman"}:
        options += ["--layers=false", "--force-rm"]
    return options


def _image_id(engine: str, image: str) -> str:
    """The id of the image ``image`` names in the engine's store ('' where none)."""
    return _quiet(engine, "images", "-q", "--no-trunc", image).stdout.strip()


@nox.session
def image(session: nox.Session) -> None:
    """Build the image on its pinned bases (or stand-ins made from Debian packages where they
    cannot be had), then run it as the chart's pod against the simulator: SERVING, a scale-up
    over mTLS, the helm test pod, SIGTERM; size, layers and start time in the output."""
    found = _engine()
    if found is None:
        session.skip("no container engine (buildah, podman or docker with its daemon) here")
    engine, runs_containers = found
    tool = Path(engine).name
    bases = {
        arg: _base(session, engine, arg, pinned) for arg, pinned in _pinned_bases(session).items()
    }
    build = [engine, "build", "-f", "Containerfile", "-t", IMAGE, *_build_options(tool)]
    arguments = {**bases, **_label_arguments()}
    cert = _pip_cert()
    if cert:
        arguments["PIP_CERT"] = "/run/osas-build-ca.crt"
        build += ["--volume", f"{cert}:/run/osas-build-ca.crt:ro"]
    for name, value in arguments.items():
        build += ["--build-arg", f"{name}={value}"]
    replaced = _image_id(engine, IMAGE)
    session.run(*build, ".", external=True)
    if replaced and replaced != _image_id(engine, IMAGE):
        # The image the tag named before: untagged now, it would stay behind (~160 MB a build).
        # Refused while another tag or a container still uses it, and then kept.
        _quiet(engine, "rmi", replaced)
    if tool != "buildah" or os.geteuid() != 0 or not shutil.which("unshare"):
        session.log(f"built {IMAGE}; running it as the chart's pod takes buildah and root: skipped")
    else:
        session.install("-r", CHART_REQUIREMENTS, "-e", ".[test]")
        report = Path(session.create_tmp()) / "image-report.json"
        report.unlink(missing_ok=True)
        env = {"OSAS_IMAGE": IMAGE, "OSAS_IMAGE_REPORT": str(report), "GRPC_DNS_RESOLVER": "native"}
        try:
            session.run(
                "unshare",
                "--net",
                "--mount",
                "--fork",
                "python",
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "tests/image",
                *session.posargs,
                env=env,
                external=True,
            )
        finally:
            if report.exists():
                facts = json.loads(report.read_text())
                session.log(
                    f"image {IMAGE} on {bases['PYTHON_IMAGE']}: {facts.get('size')}, "
                    f"{facts.get('layers')} layers; SERVING {facts.get('start_seconds')} s after "
                    f"start; SIGTERM to exit 0 in {facts.get('stop_seconds')} s"
                )
    if not runs_containers:
        session.log("the testcontainers test needs a Docker-compatible engine: not run here")
        return
    session.install("-e", ".[test]", "testcontainers==4.15.0")
    session.run("pytest", "-m", "container", "tests/test_container.py", env={"OSAS_IMAGE": IMAGE})
