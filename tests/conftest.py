from __future__ import annotations

import logging
import sys
from pathlib import Path

# Imported here, not by hypothesis in the middle of a stateful run: hypothesis is a pytest
# plugin, so pytest rewrites its modules as they are imported, and CPython 3.11.7 fails such a
# compile under the recursion limit hypothesis raises while it runs ("SystemError: AST
# constructor recursion depth mismatch", python/cpython#106905, fixed in later releases).
import hypothesis.internal.conjecture.optimiser  # noqa: F401
import pytest
import structlog
from support import sdk_connection

from osas.process import configure_logging
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

# Tests are not a package: make tests/support.py importable from every test module.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``long`` first, each group in its own order. Parallel workers
    (``nox -s tests`` runs pytest-xdist, handing out one test at a time) then start the long
    ones while the short ones fill the gaps, and no worker is left running a long test at the
    end while the others wait."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture
def logs_at_debug():
    """osas's own logging, JSON at debug (what could leak a secret would show), undone after."""
    configure_logging("debug", "json", cache_loggers=False)  # nothing kept after the test
    yield
    logging.getLogger().handlers.clear()
    structlog.reset_defaults()


@pytest.fixture
def sim():
    """The simulated OpenStack on 127.0.0.1 (modules with needs of their own define theirs)."""
    with SimulatedOpenStack(FakeNova()) as simulated:
        yield simulated


@pytest.fixture
def conn(sim):
    """Unmodified openstacksdk connected to ``sim`` as osas's user, in its first region."""
    connection = sdk_connection(sim)
    yield connection
    connection.close()
