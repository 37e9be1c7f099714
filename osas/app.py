"""The composition root: builds every part from the configuration and runs their lifecycle.

Start: gRPC up and NOT_SERVING (RPCs answer UNAVAILABLE) -> first full sync -> workers and
reconciler -> SERVING. Stop, all within ``shutdown_grace``: mutations refused and health
NOT_SERVING at once, queued creates dropped with one warning, queued deletes sent, in-flight
RPCs and cloud calls given the rest of the grace; then whatever is left is abandoned (cloud
calls run in daemon threads, so nothing holds the process) and the cloud client is closed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Literal

import anyio
import structlog

from osas.cloud.errors import CloudConfigurationError, CloudError
from osas.cloud.port import Cloud
from osas.config import OsasConfig
from osas.domain.inventory import Inventory
from osas.engine.controller import Controller
from osas.engine.queue import TaskQueue
from osas.engine.reconciler import Reconciler
from osas.engine.workers import Workers
from osas.service.server import ProviderServer

logger = structlog.get_logger(__name__)

LogFormat = Literal["json", "console"]
_QUIET_LIBRARIES = ("keystoneauth", "keystoneauth1", "openstack", "urllib3", "stevedore")
_FIRST_SYNC_MAX_BACKOFF = 30.0


def configure_logging(level: str = "info", fmt: LogFormat = "json") -> None:
    """structlog for our own events, and the same rendering for stdlib loggers (domain, grpc)."""
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
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
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
    # Their debug output carries request bodies and token fingerprints: never below WARNING.
    for name in _QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


async def _guarded(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Run a background loop; if it dies, say so loudly and take the process down with it,
    rather than serve from an inventory nobody updates."""
    try:
        await run()
    except anyio.get_cancelled_exc_class():
        raise
    except Exception:
        logger.exception("background task died", task=name)
        raise


class App:
    """One osas process: inventory, queue, workers, reconciler, controller and gRPC servers."""

    def __init__(self, config: OsasConfig, cloud: Cloud) -> None:
        self.config = config
        self.cloud = cloud
        cluster = config.cluster_spec()
        settings = config.engine_settings()
        self.settings = settings
        self.inventory = Inventory(cluster, config.ledger_settings())
        self.queue = TaskQueue(settings.queue_capacity)
        self.reconciler = Reconciler(cluster, cloud, self.inventory, self.queue, settings)
        self.workers = Workers(cluster, cloud, self.inventory, self.queue, settings)
        self.controller = Controller(cluster, self.inventory, self.queue, self.reconciler, settings)
        self.server = ProviderServer(self.controller, config.server_settings())
        self._stop = anyio.Event()
        self._workers_done = anyio.Event()
        self.serving = anyio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def _first_sync(self) -> None:
        """Check the cloud and list it; retried until OpenStack answers. A cloud that cannot be
        used as configured (credentials, microversion) stops the process instead."""
        delay = self.settings.retry_backoff
        while True:
            try:
                described = await self.cloud.verify()
                logger.info("cloud ready", cloud=described)
                await self.reconciler.reconcile_once(full=True)
            except CloudConfigurationError:
                raise
            except CloudError as exc:
                logger.warning("first sync failed; retrying", error=str(exc), retry_in=delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, _FIRST_SYNC_MAX_BACKOFF)
            else:
                logger.info("first sync done", servers=len(self.inventory.snapshot))
                return

    async def run(self) -> None:
        """Run until ``stop``; ``serving`` is set once health says SERVING. Stopping works at
        any point, also while the first sync is still waiting for OpenStack."""
        await self.server.start()
        try:
            async with anyio.create_task_group() as background:
                background.start_soon(self._start_serving, background)
                await self._stop.wait()
                await self._shutdown(background)
        finally:
            # Also when cancelled: release the ports and connections, whatever happened.
            with anyio.CancelScope(shield=True):
                await self.server.close()
                await self.cloud.close()

    async def _start_serving(self, background: anyio.abc.TaskGroup) -> None:
        await self._first_sync()
        background.start_soon(_guarded, "workers", self._run_workers)
        background.start_soon(_guarded, "reconciler", self.reconciler.run_reconciler)
        await self.server.set_serving()
        self.serving.set()

    async def _run_workers(self) -> None:
        try:
            await self.workers.run_workers()
        finally:
            self._workers_done.set()

    async def _shutdown(self, background: anyio.abc.TaskGroup) -> None:
        grace = self.server_grace
        logger.info("shutting down", grace_seconds=grace)
        self.controller.stop_accepting()
        dropped = self.workers.drain()
        if dropped:
            logger.warning(
                "queued creates dropped at shutdown; the Cluster Autoscaler asks again",
                dropped=sum(dropped.values()),
                groups=dropped,
            )
        with anyio.move_on_after(grace) as scope:
            async with anyio.create_task_group() as stopping:
                stopping.start_soon(self.server.stop)
                if self.serving.is_set():
                    await self._workers_done.wait()
        if scope.cancelled_caught:
            logger.error(
                "shutdown grace over; work abandoned",
                deletes_not_sent=self.queue.queued_deletes(),
                tasks_in_flight=self.queue.in_hand_count() - len(self.queue),
            )
        background.cancel_scope.cancel()

    @property
    def server_grace(self) -> float:
        return self.config.shutdown_grace.total_seconds()
