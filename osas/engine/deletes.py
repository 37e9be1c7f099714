"""Deleting servers: the fresh read of their marks, and the DELETE itself.

The workers send every delete the ledger orders (CA's, once the promise record holds them;
orphans, duplicates, resends; an earlier holder's, after a takeover), one server at a time,
each after a fresh read: a server that lost this cluster's marks since the listing is never
deleted.

With no record kept outside the process (election off), an OK to DeleteNodes could be kept
only in this process's memory, lost by a kill -9 between the answer and the DELETE. There
the call sends CA's deletes itself before it answers: it reads every server first (all of
them still ours, or the request is refused whole and changes nothing), then sends every
DELETE at once, and answers OK only for what Nova accepted (``read_marks``, ``send_all``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from osas.cloud.errors import CloudError
from osas.cloud.port import Cloud
from osas.domain.ledger import DeleteOutcome
from osas.domain.servers import OwnershipMarks, ServerRecord


@dataclass(frozen=True, slots=True)
class MarksRead:
    """A fresh read of servers about to be deleted."""

    ours: tuple[str, ...] = ()  # still carrying this cluster's marks for the group
    gone: tuple[str, ...] = ()  # Nova no longer has them
    unowned: tuple[str, ...] = ()  # a mark removed or changed: never deleted
    failed: dict[str, str] | None = None  # server id -> why it could not be read


class ServerDeleter:
    """Fresh reads and DELETEs through the cloud port; ``may_write`` is asked right before
    every DELETE (a process that no longer holds the leader lease sends none)."""

    def __init__(self, cloud: Cloud, marks: OwnershipMarks, may_write: Callable[[], bool]) -> None:
        self._cloud = cloud
        self._marks = marks
        self._may_write = may_write

    async def delete_one(self, server_id: str, group_id: str) -> DeleteOutcome:
        """Read the server, and delete it if it is still this group's (and this process
        still writes), with nothing of osas's in between. Raises CloudError."""
        refused = DeleteOutcome.NOT_OURS

        def still(record: ServerRecord) -> bool:
            nonlocal refused
            server = self._marks.claim(record)
            if server is None or server.group_id != group_id:
                refused = DeleteOutcome.NOT_OURS
                return False
            if not self._may_write():
                refused = DeleteOutcome.FAILED  # not the writer (any more): never sent
                return False
            return True

        sent = await self._cloud.delete_server_if(server_id, still)
        if sent is None:
            return DeleteOutcome.GONE
        return DeleteOutcome.SENT if sent else refused

    async def _send(self, server_id: str) -> DeleteOutcome:
        if not self._may_write():
            return DeleteOutcome.FAILED  # not the writer (any more): never sent
        await self._cloud.delete_server(server_id)
        return DeleteOutcome.SENT

    async def read_marks(
        self, server_ids: Sequence[str], group_id: str, budget: float
    ) -> MarksRead:
        """Every server read at once (the cloud adapter bounds how many calls run), within
        ``budget`` seconds."""
        ours: list[str] = []
        gone: list[str] = []
        unowned: list[str] = []
        failed: dict[str, str] = dict.fromkeys(
            server_ids, f"no answer from Nova within {budget:.1f}s"
        )

        async def read(server_id: str) -> None:
            try:
                record = await self._cloud.get_server(server_id)
            except CloudError as exc:
                failed[server_id] = str(exc)
                return
            del failed[server_id]
            if record is None:
                gone.append(server_id)
                return
            server = self._marks.claim(record)
            if server is None or server.group_id != group_id:
                unowned.append(server_id)
            else:
                ours.append(server_id)

        with anyio.move_on_after(budget if math.isfinite(budget) else None):
            async with anyio.create_task_group() as reads:
                for server_id in server_ids:
                    reads.start_soon(read, server_id)
        return MarksRead(tuple(ours), tuple(gone), tuple(unowned), failed or None)

    async def send_all(
        self, server_ids: Sequence[str], budget: float
    ) -> dict[str, DeleteOutcome | str]:
        """A DELETE for each server at once, within ``budget`` seconds: per server, what came
        of it, or why it is not known to have reached Nova (a failure, or the budget over:
        the thread may still send it, but nothing may be promised of it)."""
        results: dict[str, DeleteOutcome | str] = dict.fromkeys(
            server_ids, f"no answer from Nova within {budget:.1f}s"
        )

        async def send(server_id: str) -> None:
            try:
                results[server_id] = await self._send(server_id)
            except CloudError as exc:
                results[server_id] = str(exc)

        with anyio.move_on_after(budget if math.isfinite(budget) else None):
            async with anyio.create_task_group() as sends:
                for server_id in server_ids:
                    sends.start_soon(send, server_id)
        return results
