"""Keeps the inventory in step with the cloud: complete listings now and then, cheap
incremental ones in between, so steady-state traffic does not grow with the cluster."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import anyio
import structlog

from osas.cloud.errors import CloudError
from osas.cloud.port import Cloud
from osas.domain.inventory import Inventory
from osas.domain.ledger import Next
from osas.domain.servers import OwnershipMarks, Server
from osas.domain.specs import ClusterSpec
from osas.engine.events import follow
from osas.engine.queue import TaskQueue
from osas.engine.settings import EngineSettings

logger = structlog.get_logger(__name__)


@dataclass(slots=True)
class SyncStatus:
    full_syncs: int = 0
    incremental_syncs: int = 0
    failures: int = 0
    last_error: str | None = None


class Reconciler:
    """``reconcile_once`` does one sync; ``run_reconciler`` repeats it, sooner when nudged."""

    def __init__(
        self,
        cluster: ClusterSpec,
        cloud: Cloud,
        inventory: Inventory,
        queue: TaskQueue,
        settings: EngineSettings,
        *,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        self._clock = clock
        self._cluster = cluster
        self._cloud = cloud
        self._inventory = inventory
        self._ledger = inventory.ledger
        self._queue = queue
        self._settings = settings
        self._marks = OwnershipMarks(cluster.cluster_name)
        self._last_full: float | None = None
        # Wall-clock start of the last successful listing, for changes-since.
        self._last_listing: datetime | None = None
        self._nudged = anyio.Event()
        self.status = SyncStatus()

    def nudge(self) -> None:
        """Ask for a sync soon (Refresh does this); never waits."""
        self._nudged.set()

    def _full_due(self, now: float) -> bool:
        return (
            self._last_full is None
            or self._last_listing is None
            or now - self._last_full >= self._settings.full_resync_interval
        )

    async def reconcile_once(self, *, full: bool | None = None) -> Next:
        """One sync; raises ``CloudError`` and keeps the last good inventory when it fails.
        What the ledger made of it (deletes queued, events logged) is returned."""
        now = self._clock()
        if full is None:
            full = self._full_due(now)
        generation = self._ledger.begin_sync()
        started = datetime.now(UTC)
        tag = self._marks.cluster_tag
        try:
            if full or self._last_listing is None:
                records = await self._cloud.list_servers(tag)
                servers = [s for r in records if (s := self._marks.claim(r)) is not None]
                await self._refresh_flavors()
                steps = self._ledger.settle_full(generation, servers, self._clock())
                self._last_full = now
                self.status.full_syncs += 1
            else:
                steps = await self._incremental(generation, self._last_listing)
                self.status.incremental_syncs += 1
        except CloudError as exc:
            self.status.failures += 1
            self.status.last_error = str(exc)
            raise
        self._last_listing = started
        self.status.last_error = None
        follow(steps, self._queue)
        logger.debug("inventory synced", full=full, servers=len(self._inventory.snapshot))
        return steps

    async def _incremental(self, generation: int, since: datetime) -> Next:
        since -= timedelta(seconds=self._settings.changes_since_overlap)
        records = await self._cloud.list_servers(self._marks.cluster_tag, changes_since=since)
        changed: list[Server] = []
        gone: list[str] = []
        for record in records:
            server = self._marks.claim(record)
            if server is None:
                gone.append(record.server_id)  # lost its marks: no longer ours to report
            else:
                changed.append(server)
        # A tag filter hides deleted servers (Nova drops their tags), so the servers osas is
        # deleting are checked one by one: traffic grows with deletes in flight, not cluster size.
        listed = {server.server_id for server in changed}
        for server_id in self._ledger.deleting_ids():
            if server_id in listed:
                continue
            current = await self._cloud.get_server(server_id)
            server = None if current is None else self._marks.claim(current)
            if server is None:
                gone.append(server_id)
            else:
                changed.append(server)
        return self._ledger.settle_changes(generation, changed, gone, self._clock())

    async def _refresh_flavors(self) -> None:
        for spec in self._cluster.node_groups:
            flavor = await self._cloud.get_flavor(spec.flavor)
            if flavor is None:
                logger.error("flavor not found", group=spec.group_id, flavor=spec.flavor)
            self._inventory.snapshot.set_flavor(spec.group_id, flavor)

    async def run_reconciler(self) -> None:
        """Sync after every ``reconcile_interval``, or sooner when nudged, for ever. Failures
        are logged and retried with backoff; the inventory keeps its last good state meanwhile.
        The first sync is the caller's (the app does it before serving)."""
        failures = 0
        while True:
            delay = self._settings.reconcile_interval
            if failures:
                delay = min(delay, self._settings.retry_backoff * 2 ** min(failures, 6))
            await self._wait(delay)
            try:
                await self.reconcile_once()
            except CloudError as exc:
                failures += 1
                logger.warning("sync failed", error=str(exc), consecutive_failures=failures)
            else:
                failures = 0

    async def _wait(self, delay: float) -> None:
        with anyio.move_on_after(delay if math.isfinite(delay) else None):
            await self._nudged.wait()
        self._nudged = anyio.Event()
