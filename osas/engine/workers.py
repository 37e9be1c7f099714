"""Workers: take tasks off the queue and do them against the cloud, recording the outcome."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import structlog

from osas.cloud.errors import CloudError, CloudUnavailable, QuotaExceeded, create_outcome
from osas.cloud.port import Cloud, CreateServerRequest
from osas.domain.inventory import Inventory
from osas.domain.ledger import (
    Created,
    CreateOutcome,
    DeleteOutcome,
    InDoubt,
    NotSent,
    Orders,
    Refused,
)
from osas.domain.servers import ErrorClass, ErrorInfo, OwnershipMarks, ServerRecord, server_name
from osas.domain.specs import ClusterSpec, NodeGroupSpec
from osas.domain.warm import SHELVED, claim_metadata, claimable_by
from osas.election.port import JoinTokenError, JoinTokens
from osas.engine.creates import create_request
from osas.engine.deletes import ServerDeleter
from osas.engine.events import carry_out, log_orders
from osas.engine.metrics import EngineMetrics
from osas.engine.queue import CreateTask, DeleteTask, Task, TaskQueue
from osas.engine.settings import EngineSettings
from osas.engine.userdata import (
    SecretFiles,
    UserDataError,
    mints_unused_tokens,
    read_template,
    template_variables,
    unfilled_hint,
    unfilled_placeholders,
)
from osas.engine.warm import WarmKeeper

logger = structlog.get_logger(__name__)
# The longest wait between two sends of a create that never reached Nova (refused
# credentials can last until an operator fixes them).
_MAX_RETRY_DELAY = 30.0
# Warm servers a create tries to claim before it goes cold (one gone or changed meanwhile).
_CLAIM_TRIES = 3


__all__ = ["Workers"]


class Workers:
    """A pool of workers over one queue. ``handle`` does one task; ``run_workers`` loops.

    Workers do the I/O and report each outcome to the ledger, which says what happens next.
    """

    def __init__(
        self,
        cloud: Cloud,
        inventory: Inventory,
        queue: TaskQueue,
        settings: EngineSettings,
        *,
        deleter: ServerDeleter,
        may_write: Callable[[], bool] = lambda: True,
        metrics: EngineMetrics | None = None,
        join_tokens: JoinTokens | None = None,
    ) -> None:
        self._inventory = inventory
        self._cloud = cloud
        self._deleter = deleter
        # Asked right before every create is sent: only the leader lease's holder sends any.
        self._may_write = may_write
        self._metrics = metrics
        self._ledger = inventory.ledger
        self._queue = queue
        self._settings = settings
        self._marks = OwnershipMarks(inventory.cluster.cluster_name)  # restart-only
        self._draining = anyio.Event()
        self._files = SecretFiles()
        # Per group, the template and variables last checked for placeholders osas leaves as
        # written: each is reported once, not at every create.
        self._checked_templates: dict[str, int] = {}
        self.join_tokens = join_tokens  # set again by a reload that adds the first group
        # Per create that may be sent again, the token minted for it and until when it is
        # used again (half its life): a resend joins with it rather than minting another.
        self._minted: dict[str, tuple[str, float]] = {}
        # Keeps the warm pools and starts claimed servers (set by the place's engine).
        self.keeper: WarmKeeper | None = None

    @property
    def _cluster(self) -> ClusterSpec:
        return self._inventory.cluster

    def report_unfilled_placeholders(self) -> None:
        """Log every ``${name}`` a group's user data would leave as written (a variable
        forgotten in ``user_data_vars``, or a shell variable that needs ``$${name}``), once
        per group and template. Called at start and on reload; creates check again when a
        template file changed."""
        for spec in self._cluster.node_groups:
            self._check_template(spec)

    def _check_template(self, spec: NodeGroupSpec) -> None:
        try:
            read = read_template(spec, self._files)
        except UserDataError:
            return  # each create of the group fails with the reason
        if read is None:
            return
        template, source = read
        variables = template_variables(spec)
        checked = hash((template, tuple(sorted(variables))))
        if self._checked_templates.get(spec.group_id) == checked:
            return
        self._checked_templates[spec.group_id] = checked
        if mints_unused_tokens(spec, template):
            logger.warning(
                "bootstrap_token is set but the user data never says ${bootstrap_token}: each "
                "create mints a token nothing uses",
                node_group=spec.group_id,
                source=source,
            )
        unfilled = unfilled_placeholders(template, variables)
        if unfilled:
            logger.warning(
                "user data leaves placeholders as written",
                node_group=spec.group_id,
                source=source,
                placeholders=[str(placeholder) for placeholder in unfilled],
                fix=unfilled_hint(spec, unfilled),
            )

    def drain(self) -> dict[str, int]:
        """Shutting down: queued deletes are still sent, by more workers than usual, and queued
        creates are dropped (CA asks again). How many creates were dropped, per group."""
        self._draining.set()
        dropped = self._queue.close()
        orders = self._ledger.drop_queued([t.request_id for t in dropped], anyio.current_time())
        log_orders(orders, self._metrics)
        counts: dict[str, int] = {}
        for event in orders.events:
            counts[event.group_id] = counts.get(event.group_id, 0) + 1
        return counts

    async def run_workers(self) -> None:
        """Run ``settings.queue.workers`` workers, plus one that only deletes (so that deletes never
        wait behind slow creates), until the queue is closed and drained."""
        count = self._settings.queue.workers
        async with anyio.create_task_group() as group:
            for index in range(count):
                group.start_soon(self._run_one, index, name=f"osas-worker-{index}")
            group.start_soon(self._run_deleter, count, name="osas-deleter")
            await self._draining.wait()
            for index in range(count + 1, 2 * count + 1):
                group.start_soon(self._run_deleter, index, name=f"osas-deleter-{index}")

    async def _run_deleter(self, index: int) -> None:
        await self._run_one(index, deletes_only=True)

    async def _run_one(self, index: int, *, deletes_only: bool = False) -> None:
        while True:
            try:
                task = await self._queue.get(deletes_only=deletes_only)
            except anyio.EndOfStream:
                logger.debug("worker stopped", worker=index)
                return
            try:
                await self.handle(task)
            except Exception:
                # One bad task must not take the pool down; the reconciler repairs the state.
                logger.exception("task failed unexpectedly", task=repr(task))

    async def handle(self, task: Task) -> None:
        try:
            if isinstance(task, CreateTask):
                await self._create(task)
            else:
                await self._delete(task)
        finally:
            self._queue.done(task)

    async def _backoff(self, attempt: int) -> None:
        await anyio.sleep(
            min(self._settings.reconcile.retry_backoff * 2**attempt, _MAX_RETRY_DELAY)
        )

    def _carry_out(self, orders: Orders) -> None:
        carry_out(orders, self._queue, self._metrics)

    async def _create(self, task: CreateTask) -> None:
        try:
            await self._create_until_done(task)
        finally:
            self._minted.pop(task.request_id, None)

    async def _create_until_done(self, task: CreateTask) -> None:
        log = logger.bind(group=task.group_id, request_id=task.request_id)
        attempt = 0
        # The ledger hands out only creates still wanted: a reload that removed the group
        # cancelled its queued ones.
        while True:
            if not self._may_write():
                # The leader lease is lost (or its renewal overdue): this process stops; the
                # new leader's CA asks again. Never sent, so nothing of it can reach Nova.
                log.warning("not the leader any more: create dropped unsent", count=1)
                now = anyio.current_time()
                self._carry_out(self._ledger.drop_queued([task.request_id], now))
                return
            if self._ledger.create_waits(task.request_id):
                # Sent now, it could land before a DELETE Nova has not taken yet and leave the
                # group beyond max_size in Nova: set aside (no worker waits) until one is.
                log.debug("create waits for its group's deletes to reach Nova")
                self._queue.hold(task)
                return
            if self._ledger.take_create(task.request_id) is None:
                return
            outcome = await self._attempt(task, log)
            if isinstance(outcome, Created):
                log.info("server created", server_id=outcome.server.server_id)
            orders = self._ledger.finish_create(task.request_id, outcome, anyio.current_time())
            self._carry_out(orders)
            if not orders.retry:
                return
            if self._draining.is_set():
                # Between two sends at shutdown: dropped like the queued ones, and said so.
                self._carry_out(self._ledger.drop_queued([task.request_id], anyio.current_time()))
                log.warning(
                    "create dropped at shutdown, never sent; the Cluster Autoscaler asks again",
                    count=1,
                )
                return
            if isinstance(outcome, NotSent) and outcome.paced:
                # The cloud's rate limit: the adapter's pacer times the next send, for every
                # create at once (counted in osas_openstack_requests, not logged per create).
                continue
            refused_credentials = isinstance(outcome, NotSent) and not outcome.counts
            # Refused credentials are said once, by the reconciler, not once per create.
            log.log(
                logging.DEBUG if refused_credentials else logging.INFO,
                "create never reached Nova; sending it again",
                attempt=attempt + 1,
            )
            await self._backoff(attempt)
            attempt += 1

    async def _attempt(self, task: CreateTask, log: structlog.BoundLogger) -> CreateOutcome:
        """One send of a create the ledger handed out, and what came of it."""
        spec = self._cluster.group(task.group_id)
        if spec is None:  # removed between two sends of a create that never reached Nova
            message = f"node group {task.group_id!r} is no longer configured"
            return Refused(ErrorInfo("NodeGroupRemoved", message, ErrorClass.OTHER))
        keeper = self.keeper
        if spec.warm_pool is not None and keeper is not None and keeper.may_claim(task.request_id):
            claimed = await self._claim(task, spec, keeper, log)
            if claimed is not None:
                return claimed
        token = None
        if spec.bootstrap_token is not None:
            minted = await self._join_token(task, spec, spec.bootstrap_token.ttl, log)
            if not isinstance(minted, str):
                return minted
            token = minted
            if not self._may_write():  # the lease may have gone while the token was made
                info = ErrorInfo("NotLeader", "not the leader any more", ErrorClass.OTHER)
                return NotSent(info, counts=False)
        try:
            request = create_request(
                self._cluster, spec, task.request_id, self._files, bootstrap_token=token
            )
            self._check_template(spec)  # the file may have changed since the last create
        except UserDataError as exc:
            # Refused, not sent: CA sees a failed create with this reason and backs off.
            log.error("user data cannot be built; create refused", reason=str(exc))
            return Refused(ErrorInfo("UserDataUnavailable", str(exc), ErrorClass.OTHER))
        return await self._send_create(request)

    async def _claim(
        self, task: CreateTask, spec: NodeGroupSpec, keeper: WarmKeeper, log: structlog.BoundLogger
    ) -> CreateOutcome | None:
        """The create fulfilled by a server of the group's warm pool: its metadata replaced
        in one write (the warm mark off; the request id, the claim mark and what the node
        joins with on), then started by the keeper. None when no warm server could be
        claimed: the create goes cold, at once."""
        pool = self._inventory.warm
        for _ in range(_CLAIM_TRIES):
            server = pool.take(spec.group_id)
            if server is None:
                return None
            started = server.status in SHELVED
            if started and not await keeper.unshelve_for_claim(server, spec):
                pool.release(server.server_id)
                log.info("warm server did not come up; creating cold", server_id=server.server_id)
                return None
            token = await self._claim_token(task, spec, server.name, log)
            if token is not None and not isinstance(token, str):
                pool.release(server.server_id)
                return token
            metadata = claim_metadata(self._marks, spec, task.request_id, time.time(), token)
            still = claimable_by(self._marks, spec.group_id, task.request_id, started=started)
            try:
                written = await self._cloud.replace_metadata_if(server.server_id, metadata, still)
            except CloudUnavailable as exc:
                # The write may have landed: the server stays reserved, and the create waits
                # for a listing to show it (or not) as for any create in doubt.
                keeper.in_doubt(server.server_id)
                log.warning("claim of a warm server in doubt", server_id=server.server_id)
                return InDoubt(f"claim of warm server {server.server_id}: {exc}")
            except CloudError as exc:
                pool.release(server.server_id)
                log.info(
                    "warm server not claimed; creating cold",
                    server_id=server.server_id,
                    reason=str(exc),
                )
                break
            claimed = None if not isinstance(written, ServerRecord) else self._marks.claim(written)
            if claimed is None or claimed.claimed_at is None:
                pool.release(server.server_id)
                continue  # gone, or no longer warm: the next one
            keeper.watch(claimed)
            keeper.count_claim(spec.group_id, "claimed")
            log.info("warm server claimed", server_id=claimed.server_id, status=claimed.status)
            return Created(claimed)
        return None

    async def _claim_token(
        self, task: CreateTask, spec: NodeGroupSpec, name: str, log: structlog.BoundLogger
    ) -> str | CreateOutcome | None:
        """The join token a claimed server gets in its metadata (None for a group without
        ``bootstrap_token``), or why the create cannot go on, as for a cold create."""
        if spec.bootstrap_token is None:
            return None
        minted = await self._join_token(task, spec, spec.bootstrap_token.ttl, log, name=name)
        if isinstance(minted, str) and not self._may_write():
            info = ErrorInfo("NotLeader", "not the leader any more", ErrorClass.OTHER)
            return NotSent(info, counts=False)
        return minted

    async def _join_token(
        self,
        task: CreateTask,
        spec: NodeGroupSpec,
        ttl: float,
        log: structlog.BoundLogger,
        *,
        name: str | None = None,
    ) -> str | CreateOutcome:
        """The token minted for this create (again only once half its life has passed), or
        why the create cannot be sent: Refused when the cluster refused the token (an
        operator must act), NotSent when it did not answer (sent again after a backoff)."""
        now = anyio.current_time()
        kept = self._minted.get(task.request_id)
        if kept is not None and now < kept[1]:
            return kept[0]
        if self.join_tokens is None:
            message = (
                f"node group {spec.group_id!r} has bootstrap_token, but this osas has no "
                "Kubernetes connection to mint tokens with"
            )
            return Refused(ErrorInfo("JoinTokenUnavailable", message, ErrorClass.OTHER))
        # The server it joins: a claimed one keeps the name it was made with.
        name = name or server_name(self._cluster.cluster_name, spec.group_id, task.request_id)
        try:
            token = await self.join_tokens.mint(server_name=name, group_id=spec.group_id, ttl=ttl)
        except JoinTokenError as exc:
            info = ErrorInfo("JoinTokenUnavailable", str(exc), ErrorClass.OTHER)
            if exc.refused:
                log.error("join token refused; create refused", reason=str(exc))
                return Refused(info)
            log.warning("join token not minted; create not sent", reason=str(exc))
            return NotSent(info)
        self._minted[task.request_id] = (token, now + ttl / 2)
        return token

    async def _send_create(self, request: CreateServerRequest) -> CreateOutcome:
        """The create, sent once, and what came of it. Nova has no idempotency key: only an
        answer that proves the request never left allows sending it again."""
        try:
            record = await self._cloud.create_server(request)
        except QuotaExceeded as exc:
            self._inventory.quota.refused()  # the quota read was wrong: read it again
            return create_outcome(exc)
        except CloudError as exc:
            return create_outcome(exc)
        server = self._marks.claim(record)
        if server is None:
            # Only possible if the cloud dropped our marks; never treat the server as ours.
            logger.error("created server lacks ownership marks", server_id=record.server_id)
            return Refused(CloudError("created server lacks ownership marks").error_info())
        return Created(server)

    async def _delete(self, task: DeleteTask) -> None:
        log = logger.bind(group=task.group_id, server_id=task.server_id)
        if not self._may_write():
            # Released or lost the lease: a delete CA asked for is in the promise record,
            # and the next holder sends it; osas's own are found again by its listings.
            log.info("delete left to the next leader")
            return
        outcome = DeleteOutcome.FAILED
        for attempt in range(self._settings.queue.delete_attempts):
            if attempt:
                await self._backoff(attempt - 1)
            try:
                outcome = await self._delete_once(task)
            except CloudUnavailable as exc:
                log.warning("delete attempt failed", attempt=attempt + 1, error=str(exc))
                continue
            except CloudError as exc:
                log.error("delete refused by the cloud", error=str(exc))
            break
        if outcome is DeleteOutcome.SENT:
            log.info("server delete sent")
        elif outcome is DeleteOutcome.NOT_OURS:
            log.error("refusing to delete: server no longer carries this group's marks")
        elif outcome is DeleteOutcome.FAILED:
            log.warning("delete failed; it is sent again later")
        self._carry_out(self._ledger.finish_delete(task.server_id, outcome, anyio.current_time()))
        self._queue.release_held()  # a create waiting for this delete may go now

    async def _delete_once(self, task: DeleteTask) -> DeleteOutcome:
        # Marks changed since the listing: never delete what is not ours.
        return await self._deleter.delete_one(task.server_id, task.group_id)
