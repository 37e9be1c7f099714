"""The warm pools' keeper: fills each group's pool in the background, takes prepared servers
into the state they wait in, replaces the stale, aged and failed ones, and sees each claimed
server through its start (or replaces it with a cold create).

Decisions are the domain's (``osas.domain.warm``: what is ready, what to recycle, what a pool
needs; ``Ledger.replace_claim``); this module does the I/O, one pass at a time
(``keep_once``, which tests call), plus one task per claimed server while it starts. It acts
only while this process may write (it holds the leader Lease), and never takes headroom a
scale-up of CA's needs: refills wait while any create CA asked for is in hand.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc
import structlog

from osas.cloud.errors import CloudError, QuotaExceeded, RequestRejected
from osas.cloud.port import Cloud
from osas.domain.inventory import Inventory
from osas.domain.servers import OwnershipMarks, Server, ServerRecord, WarmServer
from osas.domain.specs import NodeGroupSpec, WarmPoolSpec
from osas.domain.warm import (
    PREPARED_MARKER,
    RULES,
    SHELVED,
    STARTABLE,
    PoolPlan,
    RecycleReason,
    finished_metadata,
    plan_pool,
    prepare_overdue,
    resume_action,
    still_claimed,
    still_warm,
)
from osas.engine.creates import create_request
from osas.engine.events import carry_out
from osas.engine.metrics import EngineMetrics
from osas.engine.queue import CreateTask, TaskQueue
from osas.engine.userdata import SecretFiles, UserDataError, warm_fingerprint

logger = structlog.get_logger(__name__)

__all__ = ["PoolState", "WarmKeeper"]

# Reads of a starting server: the first this soon, then twice as far apart up to the last
# (a burst of claims must not take the cloud's rate limit from the listings).
_POLL = 1.0
_POLL_MAX = 5.0
# At most this many creates and deletes per group and pass: a pool fills at the cloud's pace.
_PER_PASS = 3
# Lines of a console log read for the preparation's marker.
_CONSOLE_LINES = 50
# A refill Nova answered is counted as refilling until a listing shows its server, or this
# long (seconds): one whose answer was lost may never appear.
_REFILL_PATIENCE = 600.0


@dataclass(frozen=True, slots=True)
class PoolState:
    """One group's pool as the last pass saw it, for ``/status``, metrics and alerts."""

    wanted: int
    ready: int
    preparing: int
    refilling: int
    why_not: str | None  # why the pool is short and not filling, or None


@dataclass(slots=True)
class _Refill:
    group_id: str
    sent_at: float


class WarmKeeper:
    """Keeps one place's warm pools. ``run_warm_pools`` loops; ``keep_once`` is one pass."""

    def __init__(
        self,
        cloud: Cloud,
        inventory: Inventory,
        queue: TaskQueue,
        *,
        may_write: Callable[[], bool],
        keep_promises: Callable[[float | None], Awaitable[None]],
        interval: float = 10.0,
        metrics: EngineMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # Passes follow the reconciler's pace: each judges what the last listing showed.
        self._interval = interval
        self._poll = min(_POLL, interval)
        self._cloud = cloud
        self._inventory = inventory
        self._queue = queue
        self._may_write = may_write
        self._keep_promises = keep_promises
        self._metrics = metrics
        self._wall = wall_clock
        self._marks = OwnershipMarks(inventory.cluster.cluster_name)
        self._files = SecretFiles()
        self._refills: dict[str, _Refill] = {}  # server id (or request id in doubt) -> refill
        self._recycling: set[str] = set()
        self._watching: set[str] = set()
        self._cold: set[str] = set()  # request ids of creates that must not claim
        self._failed: set[str] = set()  # warm servers that did not come up for a claim
        self._doubt: dict[str, float] = {}  # reserved servers whose claim is in doubt -> until
        self._tasks: anyio.abc.TaskGroup | None = None
        self._pending: list[tuple[Server, bool]] = []  # claimed before the loop ran
        # Claims this process finished that a listing may still show open.
        self._finished: set[str] = set()
        self.states: dict[str, PoolState] = {}

    # -- what the workers ask and tell ---------------------------------------------------------

    def may_claim(self, request_id: str) -> bool:
        """Whether a create may take a warm server (not one replacing a failed claim)."""
        return request_id not in self._cold

    def watch(self, server: Server, *, fresh: bool = True) -> None:
        """A claimed server started, and seen through its start, from now on. ``fresh``: as
        Nova answered the claim's write (else as a listing showed it: read again first)."""
        if server.server_id in self._watching:
            return
        self._watching.add(server.server_id)
        if self._tasks is None:
            self._pending.append((server, fresh))
        else:
            self._tasks.start_soon(functools.partial(self._see_through, server, fresh=fresh))

    async def unshelve_for_claim(self, server: WarmServer, spec: NodeGroupSpec) -> bool:
        """A shelved warm server brought up for a claim (Nova refuses metadata writes while it
        is shelved): True once ACTIVE, its guest waiting for the claim's metadata. False when
        Nova refused or failed the unshelve (quota, no valid host) or it took longer than
        ``start_timeout``: the server is then recycled, and the create goes cold."""
        server_id = server.server_id
        timeout = spec.warm_pool.start_timeout if spec.warm_pool is not None else 0.0
        if not await self._act(server_id, "unshelve"):
            return False
        deadline = anyio.current_time() + timeout
        async for record in self._reads(server_id):
            if record is None:
                return False
            if record.task_state is None and record.status == "ACTIVE":
                return True
            if record.task_state is None and record.status in SHELVED | {"ERROR"}:
                break  # the unshelve failed (Nova leaves it offloaded, or ERROR)
            if anyio.current_time() >= deadline:
                break
        self._failed.add(server_id)
        return False

    async def _reads(
        self, server_id: str, *, at_once: bool = False
    ) -> AsyncGenerator[ServerRecord | None, None]:
        """The server read again and again (None once Nova no longer has it), the first soon
        (``at_once``: now), then twice as far apart up to ``_POLL_MAX``: a burst of claims
        must not take the cloud's rate limit from the listings. A read that fails is skipped."""
        pause = 0.0 if at_once else self._poll
        while True:
            await anyio.sleep(pause)
            pause = min(2 * max(pause, self._poll / 2), _POLL_MAX)
            try:
                record = await self._cloud.get_server(server_id)
            except CloudError:
                continue
            yield record

    def in_doubt(self, server_id: str) -> None:
        """A claim's write may have landed: the server stays out of every claim and recycle
        for a doubt window; a listing shows it claimed (it leaves the pool) or not."""
        window = self._inventory.ledger.settings.create_doubt_window
        self._doubt[server_id] = anyio.current_time() + window

    def count_claim(self, group_id: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.warm_claims.labels(group_id, outcome).inc()

    # -- the loop ----------------------------------------------------------------------------

    async def run_warm_pools(self) -> None:
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            while True:
                for server, fresh in self._pending:
                    tasks.start_soon(functools.partial(self._see_through, server, fresh=fresh))
                self._pending.clear()
                try:
                    await self.keep_once()
                except Exception:
                    # A pass that failed is done again at the next; the pools wait meanwhile.
                    logger.exception("warm pool pass failed")
                await anyio.sleep(self._interval)

    async def keep_once(self) -> None:
        """One pass: claimed servers watched, then every group's pool kept."""
        inventory = self._inventory
        if not inventory.synced or not self._may_write():
            return
        self._release_doubts()
        claimed = inventory.snapshot.claimed()
        self._finished &= {server.server_id for server in claimed}
        for server in claimed:
            server_id = server.server_id
            if (
                server_id not in self._watching
                and server_id not in self._finished
                and not inventory.ledger.is_marked(server_id)
            ):
                # An earlier holder's claim, or one whose watch ended early: Nova read first.
                self.watch(server, fresh=False)
        cluster = inventory.cluster
        configured = {spec.group_id for spec in cluster.node_groups}
        for spec in cluster.node_groups:
            await self._keep_group(spec)
        for group_id in {s.group_id for s in self._strays(configured)}:
            await self._recycle_unconfigured(group_id)

    def _release_doubts(self) -> None:
        now = anyio.current_time()
        for server_id, until in list(self._doubt.items()):
            if now >= until:
                del self._doubt[server_id]
                self._inventory.warm.release(server_id)

    def _strays(self, configured: set[str]) -> list[WarmServer]:
        pool = self._inventory.warm
        return [s for g in pool.groups() if g not in configured for s in pool.of_group(g)]

    async def _recycle_unconfigured(self, group_id: str) -> None:
        for server in self._inventory.warm.of_group(group_id)[:_PER_PASS]:
            await self._recycle(group_id, server.server_id, RecycleReason.UNCONFIGURED)

    # -- one group's pool ----------------------------------------------------------------------

    async def _keep_group(self, spec: NodeGroupSpec) -> None:
        inventory, pool = self._inventory, self._inventory.warm
        group_id = spec.group_id
        fingerprint = ""
        if spec.warm_pool is not None:
            try:
                fingerprint = warm_fingerprint(spec, self._files)
            except UserDataError as exc:
                pool.use(group_id, "", None)
                self._set_state(group_id, PoolState(0, 0, 0, 0, str(exc)))
                return
        pool.use(group_id, fingerprint, None if spec.warm_pool is None else spec.warm_pool.state)
        servers = pool.of_group(group_id)
        if spec.warm_pool is None and not servers:
            self.states.pop(group_id, None)
            return
        now = self._wall()
        self._forget_refills(group_id, now)
        refilling = sum(1 for r in self._refills.values() if r.group_id == group_id)
        plan = plan_pool(
            spec,
            servers,
            fingerprint,
            inventory.target_size(group_id),
            now,
            busy=pool.reserved | self._recycling | self._doubt.keys(),
            refilling=refilling,
            claims_coming=inventory.ledger.queued(group_id),
        )
        for server, reason in plan.recycle[:_PER_PASS]:
            await self._recycle(group_id, server.server_id, reason)
        for server in servers:
            if server.server_id in self._failed and server.server_id not in pool.reserved:
                self._failed.discard(server.server_id)
                await self._recycle(group_id, server.server_id, RecycleReason.FAILED)
        if spec.warm_pool is None:
            return
        await self._settle(spec, plan)
        why_not = await self._refill(spec, plan, fingerprint)
        self._set_state(
            group_id,
            PoolState(
                plan.wanted,
                len(plan.ready),
                len(plan.preparing),
                sum(1 for r in self._refills.values() if r.group_id == group_id),
                why_not,
            ),
        )

    def _set_state(self, group_id: str, state: PoolState) -> None:
        self.states[group_id] = state
        if self._metrics is not None:
            self._metrics.record_warm_pool(group_id, state.wanted, state.ready, state.why_not)

    def _forget_refills(self, group_id: str, now: float) -> None:
        pool = self._inventory.warm
        for key, refill in list(self._refills.items()):
            if refill.group_id == group_id and (
                key in pool or now - refill.sent_at > _REFILL_PATIENCE
            ):
                del self._refills[key]

    async def _settle(self, spec: NodeGroupSpec, plan: PoolPlan) -> None:
        """Prepared servers taken into the state the pool keeps them in; those whose
        preparation hung (no marker past ``prepare_timeout``) recycled."""
        pool = spec.warm_pool
        if pool is None:
            return
        action = RULES[pool.state].settle
        if action is None:
            return
        for server in plan.watch[:_PER_PASS]:
            try:
                console = await self._cloud.console_output(server.server_id, _CONSOLE_LINES)
            except CloudError as exc:
                # Unread, nothing is known of its preparation: judged again at the next pass.
                logger.debug("console log unread", server_id=server.server_id, reason=str(exc))
                continue
            if PREPARED_MARKER in console:
                await self._act(server.server_id, action)
            elif prepare_overdue(pool, server, console, self._wall()):
                await self._recycle(spec.group_id, server.server_id, RecycleReason.PREPARE_TIMEOUT)

    async def _act(self, server_id: str, action: str) -> bool:
        try:
            await self._cloud.server_action(server_id, action)
        except CloudError as exc:
            # A task running on it (409) or Nova busy: the next pass sees it again.
            logger.info(
                "server action not taken", server_id=server_id, action=action, reason=str(exc)
            )
            return False
        return True

    async def _refill(self, spec: NodeGroupSpec, plan: PoolPlan, fingerprint: str) -> str | None:
        """Creates to fill the pool, at most a few a pass; why not, when the pool is short
        and none can go."""
        if not plan.missing:
            return None
        inventory, group_id = self._inventory, spec.group_id
        in_hand = inventory.ledger.creates_in_hand()
        if in_hand:
            return "the Cluster Autoscaler's scale-ups come first (creates in hand)"
        if inventory.ledger.headroom_held(anyio.current_time()) is not None:
            return "scale-ups are held after a start or takeover"
        room = inventory.headroom(group_id)
        count = min(plan.missing, _PER_PASS)
        if room.count is not None:
            if room.count < 1:
                return f"the project's quota has no room ({room.limiting()} is the limit)"
            count = min(count, room.count)
        for _ in range(count):
            why_not = await self._refill_one(spec, fingerprint)
            if why_not is not None:
                return why_not
        return None

    async def _refill_one(self, spec: NodeGroupSpec, fingerprint: str) -> str | None:
        request_id = uuid.uuid4().hex
        try:
            request = create_request(
                self._inventory.cluster, spec, request_id, self._files, warm_from=fingerprint
            )
        except UserDataError as exc:
            return str(exc)
        now = self._wall()
        try:
            record = await self._cloud.create_server(request)
        except QuotaExceeded as exc:
            self._inventory.quota.refused()
            return f"Nova refused a refill for quota: {exc}"
        except RequestRejected as exc:
            return f"Nova refused a refill: {exc}"
        except CloudError as exc:
            # Perhaps made: counted as refilling until it shows or the patience runs out.
            self._refills[request_id] = _Refill(spec.group_id, now)
            return f"a refill's outcome is unknown: {exc}"
        self._inventory.quota.spend(spec.group_id, 1)
        self._refills[record.server_id] = _Refill(spec.group_id, now)
        logger.info("warm pool refill sent", group=spec.group_id, server_id=record.server_id)
        if self._metrics is not None:
            self._metrics.warm_refills.labels(spec.group_id).inc()
        return None

    async def _recycle(self, group_id: str, server_id: str, reason: RecycleReason) -> None:
        """A warm server deleted, after a fresh read shows it still waiting in the pool."""
        self._recycling.add(server_id)
        try:
            deleted = await self._cloud.delete_server_if(
                server_id, still_warm(self._marks, group_id)
            )
        except CloudError as exc:
            logger.info("warm server not recycled yet", server_id=server_id, reason=str(exc))
            self._recycling.discard(server_id)
            return
        if deleted is False:
            logger.warning("warm server changed before its recycle; left", server_id=server_id)
        else:
            logger.info(
                "warm server recycled", group=group_id, server_id=server_id, reason=reason.value
            )
            if self._metrics is not None:
                self._metrics.warm_recycled.labels(group_id, reason.value).inc()
        # Kept out of the next passes until a listing shows it deleting or gone.
        self._inventory.warm.update((), (server_id,))
        self._recycling.discard(server_id)

    # -- claimed servers -----------------------------------------------------------------------

    async def _see_through(self, server: Server, *, fresh: bool = False) -> None:
        """Start a claimed server and follow it until ACTIVE (then its claim is finished), or
        until its start fails or ``start_timeout`` passes since the claim (then a cold create
        takes its place). The claim time is Nova's record of it: any holder can do this.
        ``fresh``: ``server`` is as Nova answered the claim's write just now; else it is the
        inventory's, a listing old at best (a claim finished since may still show), and Nova is
        read first: nothing is decided on it."""
        server_id, group_id = server.server_id, server.group_id
        spec = self._inventory.cluster.group(group_id)
        # A group whose pool was switched off meanwhile: its claims keep the default's time.
        pool = spec.warm_pool if spec is not None and spec.warm_pool is not None else WarmPoolSpec()
        # The claim mark holds whole seconds: a second more, never a second early.
        deadline = (server.claimed_at or 0.0) + pool.start_timeout + 1.0
        reason = f"not ACTIVE within start_timeout ({pool.start_timeout:g}s) of its claim"
        started = False
        reads = self._reads(server_id, at_once=not fresh)
        try:
            current: Server | None = server
            if not fresh:
                current = await self._claimed_now(reads)
            while current is not None and self._may_write():
                status, task = current.status, current.task_state
                if status == "ACTIVE" and task is None:
                    await self._finish(server_id, group_id)
                    return
                if status == "ERROR":
                    reason = "ERROR after its claim"
                    break
                if self._wall() >= deadline:
                    break
                if task is None and status in STARTABLE:
                    if started:
                        reason = f"its start failed (back to {status})"
                        break
                    action = resume_action(status)
                    if action is not None:
                        started = await self._act(server_id, action)
                current = await self._claimed_now(reads)
            else:
                # Gone, not ours, finished by someone else; or not the writer any more: the
                # next holder sees it through.
                return
            await self._replace(server_id, group_id, reason)
        except Exception:
            # The server stays claimed in Nova: the next pass takes it up again.
            logger.exception("watch of a claimed server failed", server_id=server_id)
        finally:
            await reads.aclose()
            self._watching.discard(server_id)

    async def _claimed_now(self, reads: AsyncGenerator[ServerRecord | None, None]) -> Server | None:
        """The server as the next read shows it, while it is still claimed for its group
        (None: gone, not ours any more, or its claim finished)."""
        record = await anext(reads)
        claimed = None if record is None else self._marks.claim(record)
        return None if claimed is None or claimed.claimed_at is None else claimed

    async def _finish(self, server_id: str, group_id: str) -> None:
        """The claim is over: the claim mark and the join token taken off its metadata."""
        try:
            record = await self._cloud.get_server(server_id)
            if record is None:
                return
            written = await self._cloud.replace_metadata_if(
                server_id, finished_metadata(record.metadata), still_claimed(self._marks, group_id)
            )
        except CloudError as exc:
            # It runs; the next pass finishes the claim.
            logger.info("claim not finished yet", server_id=server_id, reason=str(exc))
            return
        if written is None or written is False:
            return  # gone, or no longer claimed and running (finished by someone else)
        self._finished.add(server_id)
        logger.info("claimed server started", group=group_id, server_id=server_id)

    async def _replace(self, server_id: str, group_id: str, reason: str) -> None:
        """A cold create in place of a claimed server that did not start: both in the
        promise record before the server is deleted."""
        ledger = self._inventory.ledger
        now = anyio.current_time()
        replaced = ledger.replace_claim(server_id, reason, now)
        if replaced is None:
            return
        request_id, orders = replaced
        self._cold.add(request_id)
        self.count_claim(group_id, "replaced")
        try:
            await self._keep_promises(None)
        except Exception as exc:  # noqa: BLE001 - the record is written again with the next promise
            logger.warning(
                "promise record not written before a claim's replacement", reason=str(exc)
            )
        carry_out(orders, self._queue, self._metrics)
        left_out = self._queue.put_new([CreateTask(request_id, group_id)])
        if left_out:
            carry_out(
                ledger.drop_queued([request_id], anyio.current_time()), self._queue, self._metrics
            )
