"""How an osas process is set up before it runs anything: its logging (JSON or console lines
on stderr, for our events and every library's) and the C library and interpreter settings a
long-running server with large listings wants."""

from __future__ import annotations

import ctypes
import gc
import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["json", "console"]
# keystoneauth warns before it raises (an identity endpoint it cannot discover, a connection
# it retries); osas says what the error it raises means, once, in its own words.
_SAID_BY_OSAS = ("keystoneauth", "keystoneauth1")
_QUIET_LIBRARIES = (
    "openstack",
    "urllib3",
    "stevedore",
    "httpx",
    "httpcore",
)
# The Kubernetes client logs a line per API request at INFO (the election's every renew):
# debugging detail, shown at debug level only.
_REQUEST_LINES = ("httpx2",)
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # mallopt's parameters (malloc.h)


def configure_logging(
    level: str = "info", fmt: LogFormat = "json", *, cache_loggers: bool = True
) -> None:
    """structlog for our own events, and the same rendering for stdlib loggers (domain, grpc).
    ``cache_loggers``: each module's logger is built once, on first use (a process configures
    logging once; a test that configures it for a while passes False, so that no module keeps
    its configuration afterwards)."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        # Events below the level are dropped first, not formatted and then thrown away.
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=cache_loggers,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Python's warnings and grpc's Python logger ("grpc._cython...") reach stderr through this
    # handler too, as JSON like every other line (gRPC's C core is silenced in __main__).
    logging.captureWarnings(capture=True)
    # Their debug output carries request bodies and token fingerprints: never below WARNING.
    for name in _QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    for name in _SAID_BY_OSAS:
        logging.getLogger(name).setLevel(max(logging.ERROR, root.level))
    for name in _REQUEST_LINES:
        request_lines = logging.getLogger(name)
        request_lines.filters[:] = [_as_debug]
        request_lines.setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING)


def _as_debug(record: logging.LogRecord) -> bool:
    """A request line, logged at INFO by its library, said at DEBUG."""
    if record.levelno == logging.INFO:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return True


# Objects the garbage collector tracks, made and not yet freed, before it walks the youngest
# of them. A page of a complete listing (1,000 servers) holds some 2,000 such objects while it
# is read and claimed, all freed with the page: at CPython's 700, each page set off several
# passes in the worker thread reading it, holding the interpreter some 45 ms a listing at
# 50,000 servers (docs/BENCHMARKS.md), every one of them for objects about to be freed.
YOUNGEST_GENERATION_THRESHOLD = 10_000


def tune_process() -> None:
    """glibc raises its mmap threshold each time a large block is freed, and then serves the
    megabyte-sized pages of every listing from per-thread heaps that never shrink: at 50,000
    servers that holds some 20 MB for good. Fixed at glibc's default, with two heaps, such
    blocks go back to the system when freed. Nothing to do on other C libraries. The garbage
    collector walks its youngest objects once a page of a listing could not fill them."""
    # Worker threads parse listings in Python: the event loop gets the GIL back within a
    # millisecond of asking, not the default five.
    sys.setswitchinterval(0.001)
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNGEST_GENERATION_THRESHOLD, older, oldest)
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
        libc.mallopt(_M_ARENA_MAX, 2)
    except (OSError, AttributeError):
        return
