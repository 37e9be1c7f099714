from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import structlog

from osas.app import configure_logging

# Tests are not a package: make tests/support.py importable from every test module.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def logs_at_debug():
    """osas's own logging, JSON at debug (what could leak a secret would show), undone after."""
    configure_logging("debug", "json")
    yield
    logging.getLogger().handlers.clear()
    structlog.reset_defaults()
