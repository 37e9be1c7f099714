"""Keeps the inventory in step with the cloud: complete listings now and then, cheap
incremental ones in between, so steady-state traffic does not grow with the cluster.

The first listing fetches every server's details. Later complete listings (resyncs) fetch
only ids (Nova's brief listing), plus the details of what changed since the last listing and
of ids the inventory does not know; they are compared with the inventory in slices, with the
event loop given a turn between slices, and the difference is applied at the end in one step
of O(changed): readers never see a half-applied listing, and never wait long for the loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import anyio
import anyio.lowlevel
import structlog

from osas.cloud.errors import CloudError, CredentialsRefused
from osas.cloud.port import Cloud
from osas.domain.inventory import Inventory
from osas.domain.ledger import Orders
from osas.domain.problems import ProblemSettings, ProblemWatch
from osas.domain.servers import Flavor, OwnershipMarks, Server, ServerRecord
from osas.domain.specs import NodeGroupSpec
from osas.engine.events import carry_out, log_problems
from osas.engine.metrics import EngineMetrics
from osas.engine.queue import TaskQueue
from osas.engine.settings import EngineSettings

logger = structlog.get_logger(__name__)
T = TypeVar("T")

# Work done between two turns of the event loop during a complete listing: ids compared with
# the inventory, and servers checked for their ownership marks (a few milliseconds each).
_IDS_PER_SLICE = 5000
_RECORDS_PER_SLICE = 500
# Above this many listed ids the inventory does not know (and no detail listing showed), one
# complete detail listing costs Nova less than a GET for each.
_DETAIL_GETS_MAX = 100


async def _turns(items: Sequence[T], size: int) -> AsyncIterator[Sequence[T]]:
    """``items`` in slices of ``size``; the event loop gets a turn after each."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
        await anyio.lowlevel.checkpoint()


@dataclass(slots=True)
class SyncStatus:
    full_syncs: int = 0
    incremental_syncs: int = 0
    failures: int = 0
    last_error: str | None = None
    # Why OpenStack refuses osas's credentials, while it does (an operator's error).
    credentials_refused: str | None = None


class Reconciler:
    """``reconcile_once`` does one sync; ``run_reconciler`` repeats it, sooner when nudged."""

    def __init__(
        self,
        cloud: Cloud,
        inventory: Inventory,
        queue: TaskQueue,
        settings: EngineSettings,
        *,
        clock: Callable[[], float] = anyio.current_time,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self._clock = clock
        self._metrics = metrics
        self._cloud = cloud
        self._inventory = inventory
        self._ledger = inventory.ledger
        self._queue = queue
        self._settings = settings
        self._marks = OwnershipMarks(inventory.cluster.cluster_name)  # restart-only
        self._last_full: float | None = None
        # Wall-clock start of the last successful listing, for changes-since.
        self._last_listing: datetime | None = None
        self._nudged = anyio.Event()
        self._last_nudged = -math.inf  # when a nudge last started a sync
        # Groups whose flavor a reload could not fetch: fetched at the next sync of any kind.
        self._flavors_wanted: set[str] = set()
        # Ids a listing by the cluster tag shows that lack the metadata marks: not ours, and not
        # worth a GET at every resync (a marks change bumps them into the changes-since listing).
        self._foreign: set[str] = set()
        self.status = SyncStatus()
        # Servers a person should look at; reviewed after every sync, never acted on.
        self.problems = ProblemWatch(
            ProblemSettings(
                settings.reconcile.stuck_build_after, settings.reconcile.stuck_delete_after
            )
        )

    def nudge(self) -> None:
        """Ask for a sync soon (Refresh does this); never waits."""
        self._nudged.set()

    def _full_due(self, now: float) -> bool:
        return (
            self._last_full is None
            or self._last_listing is None
            or now - self._last_full >= self._settings.reconcile.full_resync_interval
        )

    async def reconcile_once(self, *, full: bool | None = None) -> Orders:
        """One sync; raises ``CloudError`` and keeps the last good inventory when it fails.
        What the ledger made of it (deletes queued, events logged) is returned."""
        now = self._clock()
        if full is None:
            full = self._full_due(now)
        full = full or self._last_listing is None
        generation = self._ledger.begin_sync()
        started = datetime.now(UTC)
        begun = time.perf_counter()
        try:
            orders = await self._list(generation, full=full)
        except CloudError as exc:
            self._failed(exc)
            if self._metrics is not None:
                self._metrics.record_sync(full=full, seconds=None)
            raise
        if self.status.credentials_refused is not None:
            logger.info("OpenStack accepts osas's credentials again")
            self.status.credentials_refused = None
        if full:
            self._last_full = now
            self.status.full_syncs += 1
        else:
            self.status.incremental_syncs += 1
        self._last_listing = started
        self.status.last_error = None
        carry_out(orders, self._queue, self._metrics)
        if self._metrics is not None:
            self._metrics.record_sync(full=full, seconds=time.perf_counter() - begun)
        configured = {spec.group_id for spec in self._inventory.cluster.node_groups}
        changes = self.problems.review(
            self._inventory.snapshot, self._ledger.deleting_ids(), configured, time.time()
        )
        log_problems(changes, self._metrics)
        if full:
            logger.info(
                "complete listing applied",
                servers=len(self._inventory.snapshot),
                seconds=round(time.perf_counter() - begun, 3),
            )
        else:
            logger.debug("inventory synced", servers=len(self._inventory.snapshot))
        return orders

    async def _list(self, generation: int, *, full: bool) -> Orders:
        """The listing of one sync, settled: the first (every detail), a complete one (ids,
        and details of what changed), or an incremental one."""
        if self._last_listing is None:
            tag = self._marks.cluster_tag
            details = await self._claim_pages(self._cloud.list_server_pages(tag))
            return await self._complete(generation, details, None)
        if full:
            return await self._resync(generation, self._last_listing)
        orders = await self._incremental(generation, self._last_listing)
        if self._flavors_wanted:
            await self._refresh_flavors(set(self._flavors_wanted))
        return orders

    def _failed(self, exc: CloudError) -> None:
        self.status.failures += 1
        self.status.last_error = str(exc)
        if isinstance(exc, CredentialsRefused):
            if self.status.credentials_refused is None:
                # Said once, when it starts: creates wait meanwhile, none is reported failed.
                logger.error(
                    "OpenStack refuses osas's credentials: creates wait, nothing is reported "
                    "failed to CA, and /readyz says so until they are fixed",
                    reason=str(exc),
                )
            self.status.credentials_refused = str(exc)

    async def _claim(self, records: list[ServerRecord]) -> dict[str, Server | None]:
        """Each record as ours (a Server) or not (None), by id, in slices."""
        claimed: dict[str, Server | None] = {}
        claim = self._marks.claim
        async for chunk in _turns(records, _RECORDS_PER_SLICE):
            for record in chunk:
                claimed[record.server_id] = claim(record)
        return claimed

    async def _claim_pages(
        self, pages: AsyncIterator[list[ServerRecord]]
    ) -> dict[str, Server | None]:
        """A listing claimed page by page: only what is ours outlives its page (at 50,000
        servers the records of a whole listing would hold some 50 MB at once)."""
        claimed: dict[str, Server | None] = {}
        async for page in pages:
            claimed.update(await self._claim(page))
        return claimed

    async def _resync(self, generation: int, since: datetime) -> Orders:
        """A complete listing by ids, with details only for what changed or is new."""
        tag = self._marks.cluster_tag
        listed = await self._cloud.list_server_ids(tag)
        since -= timedelta(seconds=self._settings.reconcile.changes_since_overlap)
        details = await self._claim(await self._cloud.list_servers(tag, changes_since=since))
        snapshot, foreign = self._inventory.snapshot, self._foreign
        unknown: list[str] = []
        async for chunk in _turns(list(listed), _IDS_PER_SLICE):
            unknown += (i for i in chunk if i not in snapshot and i not in details)
        unknown = [server_id for server_id in unknown if server_id not in foreign]
        if len(unknown) > _DETAIL_GETS_MAX:
            details = await self._claim_pages(self._cloud.list_server_pages(tag))
            return await self._complete(generation, details, None)
        for server_id in unknown:
            record = await self._cloud.get_server(server_id)
            if record is not None:
                details[server_id] = self._marks.claim(record)
        return await self._complete(generation, details, listed)

    async def _complete(
        self, generation: int, details: dict[str, Server | None], listed: set[str] | None
    ) -> Orders:
        """Settle a complete listing: ``listed`` holds every id it showed (None: exactly the
        ids of ``details``), ``details`` the servers that may have changed (None: not ours).
        Compared with the inventory in slices; the difference applied in one step."""
        snapshot = self._inventory.snapshot
        changed: list[Server] = []
        async for chunk in _turns(list(details.values()), _RECORDS_PER_SLICE):
            changed += (s for s in chunk if s is not None and snapshot.get(s.server_id) != s)
        shown: Container[str] = details if listed is None else listed
        gone: list[str] = []
        async for known in _turns(snapshot.ids(), _IDS_PER_SLICE):
            for server_id in known:
                if server_id in details:
                    if details[server_id] is None:
                        gone.append(server_id)  # lost its marks
                elif server_id not in shown:
                    gone.append(server_id)
        omitted = [server_id for server_id in gone if server_id not in details]
        omitted += self._ledger.created_unlisted(shown)
        found = await self._confirm_absent(omitted)
        # Still there, with our marks: the listing missed them (Nova's paging does, while
        # builds are in flight). Taken as listed, never as gone.
        gone = [server_id for server_id in gone if server_id not in found]
        changed += (s for s in found.values() if snapshot.get(s.server_id) != s)
        not_ours = {server_id for server_id, server in details.items() if server is None}
        self._foreign = not_ours | (self._foreign & listed if listed is not None else set())
        await self._refresh_flavors()
        self.problems.observe(changed)
        return self._ledger.settle_complete(generation, changed, gone, self._clock())

    async def _confirm_absent(self, server_ids: list[str]) -> dict[str, Server]:
        """The servers a complete listing left out that a GET still finds with our marks.

        A complete listing is the only evidence that a server is gone, and real Nova's paged
        listings can miss one while builds are in flight; taking that as a deletion would
        shrink the target (CA would ask for a server too many) or give a create up and delete
        its server as an orphan. One GET per server left out: normally none."""
        found: dict[str, Server] = {}
        for server_id in server_ids:
            record = await self._cloud.get_server(server_id)
            server = None if record is None else self._marks.claim(record)
            if server is not None:
                found[server_id] = server
        if found:
            logger.warning(
                "a complete listing missed servers a GET still finds", servers=len(found)
            )
        return found

    async def _incremental(self, generation: int, since: datetime) -> Orders:
        """What changed in the project since the last listing, deleted servers included (an
        untagged ``changes-since``: Nova drops a deleted server's tags, so a tag filter would
        hide exactly the deletions). A server deleted behind osas's back leaves CA's view
        within one incremental sync; the cost follows what changed in the project, not its
        size, and the complete listing stays a safety net."""
        since -= timedelta(seconds=self._settings.reconcile.changes_since_overlap)
        records = await self._cloud.list_changes(since)
        snapshot = self._inventory.snapshot
        changed: list[Server] = []
        gone: list[str] = []
        for record in records:
            server = self._marks.claim(record)
            if server is not None and record.status != "DELETED":
                changed.append(server)
            elif record.server_id in snapshot or self._ledger.is_marked(record.server_id):
                # Deleted (its tags and metadata gone with it), or lost its marks: no longer
                # ours to report.
                gone.append(record.server_id)
        self.problems.observe(changed)
        return self._ledger.settle_changes(generation, changed, gone, self._clock())

    def want_flavors(self, group_ids: Iterable[str]) -> None:
        """Fetch these groups' flavors at the next sync (a reload could not)."""
        self._flavors_wanted.update(group_ids)
        self.nudge()

    async def _refresh_flavors(self, group_ids: Container[str] | None = None) -> None:
        """Each flavor the groups name (or those of ``group_ids``), fetched once however many
        groups share it."""
        cluster = self._inventory.cluster
        specs = [s for s in cluster.node_groups if group_ids is None or s.group_id in group_ids]
        for spec, flavor in await self.flavors_of(specs):
            self._inventory.snapshot.set_flavor(spec.group_id, flavor)
            self._flavors_wanted.discard(spec.group_id)

    async def flavors_of(
        self, specs: Iterable[NodeGroupSpec]
    ) -> list[tuple[NodeGroupSpec, Flavor | None]]:
        """The flavor of each group, fetched once however many groups share it (a reload
        fetches those of new and changed groups before it takes effect)."""
        fetched: dict[str, Flavor | None] = {}
        found = []
        for spec in specs:
            if spec.flavor not in fetched:
                fetched[spec.flavor] = await self._cloud.get_flavor(spec.flavor)
            flavor = fetched[spec.flavor]
            if flavor is None:
                logger.error("flavor not found", group=spec.group_id, flavor=spec.flavor)
            found.append((spec, flavor))
        return found

    async def run_reconciler(self) -> None:
        """Sync after every ``reconcile.interval``, or sooner when nudged, for ever. Failures
        are logged and retried with backoff; the inventory keeps its last good state meanwhile.
        The first sync is the caller's (the app does it before serving)."""
        failures = 0
        while True:
            delay = self._settings.reconcile.interval
            if failures:
                delay = min(delay, self._settings.reconcile.retry_backoff * 2 ** min(failures, 6))
            await self._wait(delay)
            try:
                await self.reconcile_once()
            except CloudError as exc:
                failures += 1
                logger.warning("sync failed", error=str(exc), consecutive_failures=failures)
            else:
                failures = 0

    async def _wait(self, delay: float) -> None:
        """Until ``delay`` has passed, or a nudge (Refresh) came. Nudges start at most one
        extra sync per ``reconcile.interval``: a nudge within an interval of the last one that
        did waits for that interval's end, so Refresh calls faster than the interval cost one
        extra listing each interval, however many there are."""
        deadline = self._clock() + delay if math.isfinite(delay) else math.inf
        while True:
            left = deadline - self._clock()
            if left <= 0:
                return
            with anyio.move_on_after(left if math.isfinite(left) else None):
                await self._nudged.wait()
            if not self._nudged.is_set():
                return  # the regular sync
            self._nudged = anyio.Event()
            now = self._clock()
            allowed = self._last_nudged + self._settings.reconcile.interval
            if now >= allowed:
                self._last_nudged = now
                return
            # Too soon after the last extra sync: one more at the end of its interval.
            deadline = min(deadline, allowed)
            self._last_nudged = allowed
