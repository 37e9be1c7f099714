"""Workers: take tasks off the queue and do them against the cloud, recording the outcome."""

from __future__ import annotations

from string import Template

import anyio
import structlog

from osas.cloud.errors import CloudError, CloudUnavailable
from osas.cloud.port import Cloud, CreateServerRequest
from osas.domain.ids import server_name
from osas.domain.inventory import Inventory
from osas.domain.servers import TAG_REQUEST_PREFIX, OwnershipMarks, ServerRecord
from osas.domain.specs import ClusterSpec, NodeGroupSpec
from osas.engine.queue import CreateTask, DeleteTask, Task, TaskQueue
from osas.engine.settings import EngineSettings

logger = structlog.get_logger(__name__)


def render_user_data(template: str, *, cluster_name: str, group_id: str, name: str) -> str:
    """User data for one server: ``${server_name}``, ``${node_group}`` and ``${cluster_name}``
    are filled in, anything else that looks like a placeholder is left as written."""
    return Template(template).safe_substitute(
        server_name=name, node_group=group_id, cluster_name=cluster_name
    )


def create_request(
    cluster: ClusterSpec, spec: NodeGroupSpec, request_id: str
) -> CreateServerRequest:
    marks = OwnershipMarks(cluster.cluster_name)
    name = server_name(cluster.cluster_name, spec.group_id, request_id)
    user_data = None
    if spec.user_data is not None:
        user_data = render_user_data(
            spec.user_data, cluster_name=cluster.cluster_name, group_id=spec.group_id, name=name
        )
    return CreateServerRequest(
        name=name,
        flavor=spec.flavor,
        image=spec.image,
        networks=spec.networks,
        # Ownership marks last: operator metadata can never forge or erase them.
        metadata={**spec.metadata, **marks.metadata(spec.group_id, request_id)},
        tags=marks.tags(request_id),
        user_data=user_data,
        key_name=spec.key_name,
        security_groups=spec.security_groups,
        availability_zone=spec.availability_zone,
        server_group=spec.server_group,
        boot_volume=spec.boot_volume,
    )


class Workers:
    """A pool of workers over one queue. ``handle`` does one task; ``run_workers`` loops."""

    def __init__(
        self,
        cluster: ClusterSpec,
        cloud: Cloud,
        inventory: Inventory,
        queue: TaskQueue,
        settings: EngineSettings,
    ) -> None:
        self._cluster = cluster
        self._cloud = cloud
        self._inventory = inventory
        self._queue = queue
        self._settings = settings
        self._marks = OwnershipMarks(cluster.cluster_name)
        self._draining = False

    def drain(self) -> None:
        """Shutting down: queued deletes are still done, queued creates are dropped (CA sees the
        target fall after a restart and asks again; nothing half-made is left behind)."""
        self._draining = True
        self._queue.close()

    async def run_workers(self) -> None:
        """Run ``settings.workers`` workers until the queue is closed and drained."""
        async with anyio.create_task_group() as group:
            for index in range(self._settings.workers):
                group.start_soon(self._run_one, index, name=f"osas-worker-{index}")

    async def _run_one(self, index: int) -> None:
        while True:
            try:
                task = await self._queue.get()
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
        await anyio.sleep(self._settings.retry_backoff * 2**attempt)

    async def _create(self, task: CreateTask) -> None:
        log = logger.bind(group=task.group_id, request_id=task.request_id)
        if self._draining:
            log.info("queued create dropped at shutdown")
            self._inventory.cancel_create(task.request_id, anyio.current_time())
            return
        create = self._inventory.start_create(task.request_id)
        spec = self._cluster.group(task.group_id)
        if create is None or spec is None:
            log.info("create cancelled before it was sent")
            return
        record = await self._submit_create(create_request(self._cluster, spec, task.request_id))
        if isinstance(record, CloudError):
            log.warning("create failed", error=str(record), code=record.code)
            self._inventory.create_failed(
                task.request_id, record.error_info(), anyio.current_time()
            )
            return
        server = self._marks.claim(record)
        if server is None:
            # Only possible if the cloud dropped our marks; never treat the server as ours.
            log.error("created server lacks ownership marks", server_id=record.server_id)
            error = CloudError("created server lacks ownership marks").error_info()
            self._inventory.create_failed(task.request_id, error, anyio.current_time())
            return
        log.info("server created", server_id=server.server_id, name=server.name)
        self._inventory.create_succeeded(task.request_id, server)
        if create.doomed:
            log.info("create was given up while in flight; deleting its server")
            self._inventory.mark_deleting([server.server_id], anyio.current_time())
            if self._queue.room:
                self._queue.put_all([DeleteTask(server.server_id, task.group_id)])

    async def _submit_create(self, request: CreateServerRequest) -> ServerRecord | CloudError:
        """The created server, or the error that ends this create.

        Nova has no idempotency key: after an answer that may hide a success, look the request
        id tag up before sending the create again, so a retry never makes a second server.
        """
        request_tag = next(tag for tag in request.tags if tag.startswith(TAG_REQUEST_PREFIX))
        last_error: CloudError = CloudUnavailable("no attempt made")
        for attempt in range(self._settings.create_attempts):
            if attempt:
                await self._backoff(attempt - 1)
                try:
                    found = await self._cloud.list_servers(request_tag)
                except CloudError as exc:
                    # Unknown whether the last try worked: do not risk a duplicate.
                    return exc
                if found:
                    return found[0]
            try:
                return await self._cloud.create_server(request)
            except CloudUnavailable as exc:
                last_error = exc
            except CloudError as exc:
                return exc
        return last_error

    async def _delete(self, task: DeleteTask) -> None:
        log = logger.bind(group=task.group_id, server_id=task.server_id)
        for attempt in range(self._settings.delete_attempts):
            if attempt:
                await self._backoff(attempt - 1)
            try:
                record = await self._cloud.get_server(task.server_id)
                if record is None:
                    log.info("server already gone")
                    self._inventory.forget_server(task.server_id, anyio.current_time())
                    return
                server = self._marks.claim(record)
                if server is None or server.group_id != task.group_id:
                    # Marks changed since the inventory saw it: never delete what is not ours.
                    log.error("refusing to delete: server no longer carries this group's marks")
                    return
                await self._cloud.delete_server(task.server_id)
            except CloudUnavailable as exc:
                log.warning("delete attempt failed", attempt=attempt + 1, error=str(exc))
            except CloudError as exc:
                log.error("delete refused by the cloud", error=str(exc))
                return
            else:
                log.info("server delete sent")
                return
        log.warning("delete failed; the reconciler will send it again")
