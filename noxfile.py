"""Developer tasks. `nox -s tests` runs the test suite; `nox` alone runs every check."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "typecheck", "proto", "tests"]
nox.options.error_on_missing_interpreters = True

# Pinned with the committed stubs: a different protoc writes different bytes.
PROTO_TOOLS = ("grpcio-tools==1.85.1", "mypy-protobuf==5.1.0")
# The real-Nova lane: nova 34.0.0 and everything its functional-test fixtures need, pinned
# whole, so that a version bump is a deliberate change (docs/testing.md).
REALNOVA_REQUIREMENTS = "tests/realnova/requirements.txt"


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
    """Latency, sync time and memory at scale (not part of the default sessions)."""
    session.install("-e", ".[test]")
    session.run("python", "tests/benchmark/run.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """A Cluster Autoscaler session against a simulated OpenStack."""
    session.install("-e", ".")
    session.run("osas", "demo", *session.posargs)
