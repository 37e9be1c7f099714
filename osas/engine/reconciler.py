"""Keeps the inventory in step with the cloud: complete listings now and then, cheap
incremental ones in between, so steady-state traffic does not grow with the cluster.

A complete listing reads every server of the cluster again, with its details (state and
marks): a change Nova's ``changes-since`` cannot show (a metadata key deleted by hand, a tag
removed, a server a listing missed) is seen within one ``full_resync_interval``. It is
claimed page by page and compared with the inventory in slices, with the event loop given a
turn between slices, and the difference is applied at the end in one step of O(changed):
readers never see a half-applied listing, and never wait long for the loop.

Incremental listings ask for what changed since the last listing by Nova's clock (the
``Date`` of its answer), never osas's: Nova compares ``changes-since`` with its own
``updated_at``, so a value from a clock that disagrees with Nova's would hide every change
for as long as they disagree. A Nova clock that went back (its answers dated before the last
one) could hide changes stamped in the gap: a complete listing follows at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import anyio
import anyio.lowlevel
import structlog

from osas.cloud.errors import CloudError, CredentialsRefused
from osas.cloud.port import VERIFY_WAITS_FOR, Cloud, ServerListing
from osas.domain.inventory import Inventory
from osas.domain.ledger import Orders
from osas.domain.problems import JoinWatch, ProblemSettings, ProblemWatch
from osas.domain.servers import Flavor, OwnershipMarks, Server, ServerRecord, WarmServer
from osas.domain.specs import NodeGroupSpec
from osas.engine.events import carry_out, log_group_problems, log_problems
from osas.engine.metrics import EngineMetrics
from osas.engine.queue import TaskQueue
from osas.engine.settings import EngineSettings

logger = structlog.get_logger(__name__)
T = TypeVar("T")

# Work done between two turns of the event loop during a complete listing: ids compared with
# the inventory, and servers checked for their ownership marks (a few milliseconds each).
_IDS_PER_SLICE = 5000
_RECORDS_PER_SLICE = 500
# Nova's clock this far from osas's is said once (warning) and kept in /metrics; below it,
# the Date header's whole seconds and the round trip explain the difference.
CLOCK_OFFSET_WARNING = 5.0


def _parse_time(text: str) -> datetime | None:
    """Nova's ISO 8601 timestamps ("2026-11-27T00:15:18Z"), as aware datetimes."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def newest_update(listing: ServerListing) -> datetime | None:
    """The newest ``updated`` a listing showed: Nova's time where it sent no Date header."""
    times = [t for r in listing.records if r.updated and (t := _parse_time(r.updated))]
    return max(times, default=None)


async def _turns(items: Sequence[T], size: int) -> AsyncIterator[Sequence[T]]:
    """``items`` in slices of ``size``; the event loop gets a turn after each."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
        await anyio.lowlevel.checkpoint()


@dataclass(slots=True)
class _BuildingRead:
    """What reading the building servers again found."""

    changed: list[Server] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    unowned: list[str] = field(default_factory=list)

    def take(self, server_id: str, record: ServerRecord | None, server: Server | None) -> None:
        """One server read again: ``record`` None (Nova's 404) is gone; ``server``, the
        record claimed, None when it lacks a mark."""
        if record is None or record.status == "DELETED":
            self.gone.append(server_id)
        elif server is None:
            self.unowned.append(server_id)  # a mark removed by hand: no longer ours
        else:
            self.changed.append(server)


@dataclass(slots=True)
class SyncStatus:
    full_syncs: int = 0
    incremental_syncs: int = 0
    failures: int = 0
    last_error: str | None = None
    # Failures since the last sync that worked, and when the first of them was begun (the
    # reconciler's clock): an outage's length, counted from the first attempt that did not
    # work (a hung cloud fails only at the attempt's timeout), also before any sync worked.
    consecutive_failures: int = 0
    failing_since: float | None = None
    # The request to OpenStack in progress ("a complete listing", ...) and since when: what
    # osas waits for, while a hung cloud has not answered yet.
    waiting_for: str | None = None
    waiting_since: float | None = None
    # Why OpenStack refuses osas's credentials, while it does (an operator's error).
    credentials_refused: str | None = None
    # Nova's clock minus osas's, seconds, as the last listing's Date header showed it.
    nova_clock_offset: float | None = None
    # Complete listings made at once because Nova's clock went back.
    clock_jumps: int = 0


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
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        leading: Callable[[], bool] = lambda: True,
        metrics: EngineMetrics | None = None,
        place: tuple[str, str] = ("", ""),
    ) -> None:
        self._clock = clock
        self._place = place  # (cloud, region): what its syncs are labelled with
        # A standby keeps its inventory warm with incremental syncs alone: the complete listing
        # (78 MB of Nova's answers at 50,000 servers) is the writer's, and the first one a new
        # leader makes (``want_complete``).
        self._leading = leading
        # osas's own wall clock: only ever compared with Nova's, to say how far apart they are.
        self._wall_clock = wall_clock
        self._metrics = metrics
        self._cloud = cloud
        self._inventory = inventory
        self._ledger = inventory.ledger
        self._queue = queue
        self._settings = settings
        self._marks = OwnershipMarks(inventory.cluster.cluster_name)  # restart-only
        self._last_full: float | None = None
        # Nova's clock when it answered the last successful listing: the next changes-since.
        self._since: datetime | None = None
        self._nudged = anyio.Event()
        self._last_nudged = -math.inf  # when a nudge last started a sync
        # Groups whose flavor a reload could not fetch: fetched at the next sync of any kind.
        self._flavors_wanted: set[str] = set()
        self._offset_warned = False
        self._went_back = False  # the last listing was dated before the one before it
        self._quota_read_at: float | None = None
        self._quota_error: str | None = None  # why the last quota read failed
        self._quota_unread: set[str] = set()  # resources the last read could not read
        self._building_error: str | None = None  # why building servers were last not read
        self.status = SyncStatus()
        # Servers a person should look at; reviewed after every sync, never acted on.
        self.problems = ProblemWatch(
            ProblemSettings(
                settings.reconcile.stuck_build_after, settings.reconcile.stuck_delete_after
            )
        )
        # Node groups whose servers CA deletes before they join: told by DeleteNodes and
        # NodeGroupForNode (the controller), aged here.
        self.unjoined = JoinWatch()

    def nudge(self) -> None:
        """Ask for a sync soon (Refresh does this); never waits."""
        self._nudged.set()

    def _full_due(self, now: float) -> bool:
        if self._last_full is None or self._since is None:
            return True
        interval = self._settings.reconcile.full_resync_interval
        return now - self._last_full >= interval and self._leading()

    def want_complete(self) -> None:
        """A complete listing at the next sync, soon (a standby that just took the Lease
        reads what incremental syncs cannot show before long)."""
        self._last_full = None
        self.nudge()

    async def reconcile_once(self, *, full: bool | None = None) -> Orders:
        """One sync; raises ``CloudError`` and keeps the last good inventory when it fails.
        What the ledger made of it (deletes queued, events logged) is returned."""
        now = self._clock()
        if full is None:
            full = self._full_due(now)
        full = full or self._since is None
        orders = await self._sync(full=full)
        if not full and self._since is not None and self._went_back:
            # Nova's clock went back: changes stamped before the old changes-since would stay
            # hidden from every incremental listing. One complete listing sees them all.
            self.status.clock_jumps += 1
            orders = await self._sync(full=True)
        if self._quota_due(self._clock()):
            await self.read_quota_once()
        return orders

    def _quota_due(self, now: float) -> bool:
        interval = self._settings.reconcile.quota_interval
        if interval <= 0:
            return False
        read_at = self._quota_read_at
        return read_at is None or now - read_at >= interval or self._inventory.quota.stale

    async def read_quota_once(self) -> None:
        """The project's quota read again, with what osas has in hand now. A failure is
        logged (once while it lasts) and leaves no headroom known: Nova's own refusals decide
        until a read works again."""
        self._quota_read_at = self._clock()
        cluster = self._inventory.cluster
        server_groups = sorted({s.server_group for s in cluster.node_groups if s.server_group})
        volumes = any(spec.boot_volume is not None for spec in cluster.node_groups)
        try:
            quota = await self._cloud.get_quota(server_groups, volumes=volumes)
        except CloudError as exc:
            self._inventory.quota.forget()
            if self._quota_error != str(exc):
                self._quota_error = str(exc)
                logger.warning(
                    "the project's quota cannot be read; max sizes are not bounded by it",
                    error=str(exc),
                )
            return
        if self._quota_error is not None:
            logger.info("the project's quota is read again")
            self._quota_error = None
        if set(quota.unread) != self._quota_unread:
            self._quota_unread = set(quota.unread)
            if quota.unread:
                logger.warning(
                    "part of the project's quota cannot be read; it bounds nothing",
                    unread=dict(quota.unread),
                )
        self._inventory.quota.read(quota, self._inventory.not_counted_by_nova())

    async def _sync(self, *, full: bool) -> Orders:
        now = self._clock()
        generation = self._ledger.begin_sync(now)
        begun = time.perf_counter()
        self._went_back = False
        with self._attempt(
            "a complete listing of the servers" if full else "a listing of changes", full=full
        ):
            orders = await self._list(generation, full=full)
        if self.status.credentials_refused is not None:
            logger.info("OpenStack accepts osas's credentials again")
            self.status.credentials_refused = None
        if full:
            self._last_full = now
            self.status.full_syncs += 1
        else:
            self.status.incremental_syncs += 1
        self.status.last_error = None
        self.status.consecutive_failures = 0
        self.status.failing_since = None
        carry_out(orders, self._queue, self._metrics)
        # A listing may show a DELETE taken (or a reload raised max_size): held creates look
        # again.
        self._queue.release_held()
        if self._metrics is not None:
            self._metrics.record_sync(self._place, full=full, seconds=time.perf_counter() - begun)
        configured = {spec.group_id for spec in self._inventory.cluster.node_groups}
        now = time.time()
        changes = self.problems.review(
            self._inventory.snapshot, self._ledger.deleting_ids(), configured, now
        )
        log_problems(changes, self._metrics)
        log_group_problems(self.unjoined.review(configured, now), self._metrics)
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
        """The listing of one sync, settled: a complete one (every server's details, page by
        page) or an incremental one (what changed since the last listing, by Nova's clock)."""
        if full or self._since is None:
            return await self._complete_listing(generation)
        orders = await self._incremental(generation, self._since)
        if self._flavors_wanted:
            await self._refresh_flavors(set(self._flavors_wanted))
        return orders

    def _since_for_next(self, nova_time: datetime | None, wall_before: datetime) -> None:
        """Remember Nova's time of a listing just made, for the next ``changes-since``; note
        how far Nova's clock is from osas's, and whether it went back."""
        if nova_time is None:
            return  # neither a Date header nor a server's `updated`: keep the last one
        overlap = self._settings.reconcile.changes_since_overlap
        previous = self._since
        if previous is not None and (previous - nova_time).total_seconds() > overlap / 2:
            logger.warning(
                "Nova's clock went back; listing every server again",
                seconds=round((previous - nova_time).total_seconds()),
            )
            self._went_back = True
        self._since = nova_time
        offset = (nova_time - wall_before).total_seconds()
        self.status.nova_clock_offset = offset
        if abs(offset) > CLOCK_OFFSET_WARNING and not self._offset_warned:
            self._offset_warned = True
            logger.warning(
                "Nova's clock and osas's disagree; osas takes changes-since from Nova's clock",
                nova_minus_osas_seconds=round(offset),
            )
        elif abs(offset) <= CLOCK_OFFSET_WARNING and self._offset_warned:
            self._offset_warned = False
            logger.info("Nova's clock and osas's agree again", nova_minus_osas_seconds=offset)

    async def verify_cloud(self) -> str:
        """The cloud checked before the first sync (``Cloud.verify``); its failure counts as
        a failed sync, so that /status and the metrics show why the first one is not done."""
        with self._attempt(VERIFY_WAITS_FOR, full=True):
            described = await self._cloud.verify()
        self._inventory.region = self._cloud.region()
        return described

    def retrying(self) -> str | None:
        """Why the sync in progress is trying a request again, while it is (its failure comes
        only once every try has failed)."""
        return self._cloud.retrying() if self.status.waiting_for is not None else None

    @contextmanager
    def _attempt(self, what: str, *, full: bool) -> Iterator[None]:
        """A sync's request to OpenStack: shown as awaited (``what``, since now) while it is in
        progress, and counted as a failed sync when it fails."""
        self.status.waiting_for, self.status.waiting_since = what, self._clock()
        try:
            yield
        except CloudError as exc:
            self._failed(exc)
            if self._metrics is not None:
                self._metrics.record_sync(self._place, full=full, seconds=None)
            raise
        finally:
            self.status.waiting_for = self.status.waiting_since = None

    def _failed(self, exc: CloudError) -> None:
        status = self.status
        status.failures += 1
        status.last_error = str(exc)
        status.consecutive_failures += 1
        if status.failing_since is None:
            status.failing_since = status.waiting_since or self._clock()
        if isinstance(exc, CredentialsRefused):
            if self.status.credentials_refused is None:
                # Said once, when it starts: creates wait meanwhile, none is reported failed.
                logger.error(
                    "OpenStack refuses osas's credentials: creates wait, nothing is reported "
                    "failed to CA, and /readyz says so until they are fixed",
                    reason=str(exc),
                )
            self.status.credentials_refused = str(exc)

    async def _claim(
        self,
        records: list[ServerRecord],
        claimed: dict[str, Server | None],
        warm: list[WarmServer],
    ) -> None:
        """Each record as ours (a Server) or not (None), into ``claimed`` by id, in slices; the
        warm servers among those not ours (none but a node group's pool) into ``warm``."""
        claim, known = self._marks.claim, self._inventory.snapshot.getter()
        async for chunk in _turns(records, _RECORDS_PER_SLICE):
            for record in chunk:
                server = claim(record, known(record.server_id))
                if server is None:
                    waiting = self._marks.warm(record)
                    if waiting is not None:
                        warm.append(waiting)
                # An unchanged server stays the inventory's object, keyed by its own id string:
                # nothing of the record outlives its page.
                claimed[record.server_id if server is None else server.server_id] = server

    async def _claim_pages(
        self, pages: AsyncIterator[ServerListing], warm: list[WarmServer]
    ) -> tuple[dict[str, Server | None], datetime | None]:
        """A listing claimed page by page: only what is ours outlives its page (at 50,000
        servers the records of a whole listing would hold some 50 MB at once), warm servers
        into ``warm``. With Nova's time of its first answer (else the newest ``updated`` it
        showed)."""
        claimed: dict[str, Server | None] = {}
        nova_time: datetime | None = None
        newest: datetime | None = None
        first = True
        async for page in pages:
            if first:
                nova_time, first = page.nova_time, False
            if nova_time is None:
                page_newest = newest_update(page)
                if page_newest is not None and (newest is None or page_newest > newest):
                    newest = page_newest
            await self._claim(page.records, claimed, warm)
        return claimed, nova_time or newest

    async def _complete_listing(self, generation: int) -> Orders:
        """Every server carrying the cluster's tag, with its details, settled as a whole."""
        wall_before = self._wall_clock()
        pages = self._cloud.list_server_pages(self._marks.cluster_tag)
        warm: list[WarmServer] = []
        details, nova_time = await self._claim_pages(pages, warm)
        orders = await self._complete(generation, details)
        self._inventory.warm.replace(warm)
        self._since_for_next(nova_time, wall_before)
        return orders

    async def _complete(self, generation: int, details: dict[str, Server | None]) -> Orders:
        """Settle a complete listing: ``details`` holds every server it showed (None: not
        ours: it lacks a mark). Compared with the inventory in slices; the difference applied
        in one step."""
        snapshot = self._inventory.snapshot
        held = snapshot.getter()
        changed: list[Server] = []
        async for chunk in _turns(list(details.values()), _RECORDS_PER_SLICE):
            changed += (s for s in chunk if s is not None and held(s.server_id) is not s)
        gone: list[str] = []
        unowned: list[str] = []
        async for known in _turns(snapshot.ids(), _IDS_PER_SLICE):
            for server_id in known:
                if server_id not in details:
                    gone.append(server_id)
                elif details[server_id] is None:
                    unowned.append(server_id)  # lost a mark by hand: no longer ours
        omitted = gone + self._ledger.created_unlisted(details)
        found, untagged = await self._confirm_absent(omitted)
        # Still there, with our marks: the listing missed them (Nova's paging does, while
        # builds are in flight). Taken as listed, never as gone.
        gone = [server_id for server_id in gone if server_id not in found]
        unowned += untagged
        gone = [server_id for server_id in gone if server_id not in untagged]
        changed += (s for s in found.values() if snapshot.get(s.server_id) != s)
        await self._refresh_flavors()
        self.problems.observe(changed)
        return self._ledger.settle_complete(
            generation, changed, gone, self._clock(), unowned=unowned
        )

    async def _confirm_absent(self, server_ids: list[str]) -> tuple[dict[str, Server], list[str]]:
        """The servers a complete listing left out that a GET still finds with our marks, and
        those it finds without one (a tag removed by hand takes a server out of the tagged
        listing: not ours any more, but not gone either).

        A complete listing is the only evidence that a server is gone, and real Nova's paged
        listings can miss one while builds are in flight; taking that as a deletion would
        shrink the target (CA would ask for a server too many) or give a create up and delete
        its server as an orphan. One GET per server left out: normally none."""
        found: dict[str, Server] = {}
        unowned: list[str] = []
        for server_id in server_ids:
            record = await self._cloud.get_server(server_id)
            server = None if record is None else self._marks.claim(record)
            if server is not None:
                found[server_id] = server
            elif record is not None and record.status != "DELETED":
                unowned.append(server_id)
        if found:
            logger.warning(
                "a complete listing missed servers a GET still finds", servers=len(found)
            )
        return found, unowned

    async def _incremental(self, generation: int, since: datetime) -> Orders:
        """What changed in the project since the last listing, deleted servers included (an
        untagged ``changes-since``: Nova drops a deleted server's tags, so a tag filter would
        hide exactly the deletions). A server deleted behind osas's back leaves CA's view
        within one incremental sync; the cost follows what changed in the project, not its
        size, and the complete listing stays a safety net. ``since`` is Nova's time, less an
        overlap for the clocks of Nova's own hosts (the one that dates answers and the ones
        that stamp ``updated_at``), which need not agree to the second."""
        since -= timedelta(seconds=self._settings.reconcile.changes_since_overlap)
        wall_before = self._wall_clock()
        listing = await self._cloud.list_changes(since)
        snapshot = self._inventory.snapshot
        changed: list[Server] = []
        gone: list[str] = []
        unowned: list[str] = []
        pool = self._inventory.warm
        warm: list[WarmServer] = []
        not_warm: list[str] = []  # claimed, deleted or changed by hand: out of the pool
        for record in listing.records:
            server = self._marks.claim(record)
            waiting = None if server is not None else self._marks.warm(record)
            if waiting is not None:
                warm.append(waiting)
            elif record.server_id in pool:
                not_warm.append(record.server_id)
            if server is not None and record.status != "DELETED":
                changed.append(server)
            elif record.server_id in snapshot or self._ledger.is_marked(record.server_id):
                if record.status == "DELETED":
                    gone.append(record.server_id)  # its tags and metadata went with it
                else:
                    unowned.append(record.server_id)  # a mark changed by hand
        listed = {record.server_id for record in listing.records}
        # Listed building, or answered by Nova and never listed yet: both may be deleted
        # while Nova still schedules them.
        building = [sid for sid in snapshot.building() if sid not in listed]
        building += [sid for sid in self._ledger.created_unlisted(snapshot) if sid not in listed]
        if building:
            read = await self._read_building(building)
            changed += read.changed
            gone += read.gone
            unowned += read.unowned
        self.problems.observe(changed)
        orders = self._ledger.settle_changes(
            generation, changed, gone, self._clock(), unowned=unowned
        )
        pool.update(warm, not_warm)
        self._since_for_next(listing.nova_time or newest_update(listing), wall_before)
        return orders

    async def _read_building(self, server_ids: list[str]) -> _BuildingRead:
        """The servers listed BUILD that changes-since did not show, read again: a server
        deleted while Nova was still scheduling it can leave no DELETED row (no instance was
        ever made), and would otherwise stay in CA's view until the next complete listing.

        One tagged ``status=BUILD`` listing rather than a GET each: one request however many
        build at once (a scale-up of a hundred), none at all when none does. Then a GET for
        each it no longer shows (it finished building meanwhile, or it is gone), all at once
        within the adapter's own bound on concurrent calls: normally none or a few. A failure
        keeps the server as it was (the next sync reads it again, the complete listing stays
        the safety net) and is logged once while it lasts; it never fails this sync."""
        found = _BuildingRead()
        try:
            listing = await self._cloud.list_building(self._marks.cluster_tag)
        except CloudError as exc:
            self._building_unread(str(exc), len(server_ids))
            return found
        wanted = set(server_ids)
        # A building server new to osas is left out: changes-since shows it.
        shown = {r.server_id: r for r in listing.records if r.server_id in wanted}
        unshown = [server_id for server_id in server_ids if server_id not in shown]
        read, errors = await self._get_each(unshown)
        for server_id in server_ids:  # in order: the same reads settle the same way
            record: ServerRecord | None
            if server_id in shown:
                record = shown[server_id]
            elif server_id in read:
                record = read[server_id]
            else:
                continue  # not read: kept as it was
            found.take(server_id, record, None if record is None else self._marks.claim(record))
        if errors:
            self._building_unread(next(iter(errors.values())), len(errors))
        elif self._building_error is not None:
            logger.info("servers still building are read again")
            self._building_error = None
        return found

    async def _get_each(
        self, server_ids: list[str]
    ) -> tuple[dict[str, ServerRecord | None], dict[str, str]]:
        """A GET of each server, all at once: what Nova answered (None: 404), and why each
        one that failed did."""
        read: dict[str, ServerRecord | None] = {}
        errors: dict[str, str] = {}

        async def get(server_id: str) -> None:
            try:
                read[server_id] = await self._cloud.get_server(server_id)
            except CloudError as exc:
                errors[server_id] = str(exc)

        if server_ids:
            async with anyio.create_task_group() as gets:
                for server_id in server_ids:
                    gets.start_soon(get, server_id)
        return read, errors

    def _building_unread(self, error: str, servers: int) -> None:
        """Said once while reads of building servers fail (a warning: until they work, a
        server deleted while Nova schedules it stays in CA's view), then at debug."""
        if self._building_error is None:
            logger.warning(
                "servers still building cannot be read again; one deleted while Nova "
                "schedules it stays in CA's view until they can",
                error=error,
                servers=servers,
            )
        else:
            logger.debug("servers still building not read again", error=error, servers=servers)
        self._building_error = error

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
            current = self._inventory.cluster.group(spec.group_id)
            if current is None or current.flavor != spec.flavor:
                # Reloaded while fetching: the reload fetched its own flavor, or wants it.
                continue
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
        while True:
            delay = self._settings.reconcile.interval
            failures = self.status.consecutive_failures
            if failures:
                delay = min(delay, self._settings.reconcile.retry_backoff * 2 ** min(failures, 6))
            await self._wait(delay)
            try:
                await self.reconcile_once()
            except CloudError as exc:
                logger.warning(
                    "sync failed",
                    error=str(exc),
                    consecutive_failures=self.status.consecutive_failures,
                )

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
