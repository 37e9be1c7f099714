"""The bounded queue between RPCs that accept work and workers that do it."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from osas.domain.errors import Overloaded


@dataclass(frozen=True, slots=True)
class CreateTask:
    request_id: str
    group_id: str


@dataclass(frozen=True, slots=True)
class DeleteTask:
    server_id: str
    group_id: str


Task = CreateTask | DeleteTask


class TaskQueue:
    """A bounded FIFO of tasks; a batch goes in whole or not at all.

    Every task queued or being worked on is "in hand", so that nothing is queued twice.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[Task] = deque()
        self._in_hand: set[Task] = set()
        self._not_empty = anyio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    @property
    def room(self) -> int:
        return 0 if self._closed else self.capacity - len(self._items)

    def in_hand(self, task: Task) -> bool:
        return task in self._in_hand

    def in_hand_count(self) -> int:
        """Tasks queued or being worked on."""
        return len(self._in_hand)

    def ensure_room(self, count: int) -> None:
        if self._closed:
            raise Overloaded("shutting down: no new work is accepted")
        if count > self.room:
            raise Overloaded(
                f"task queue is full ({len(self)} of {self.capacity} queued); "
                f"no room for {count} more"
            )

    def put_all(self, tasks: Sequence[Task]) -> None:
        """Queue every task, or raise Overloaded having queued none."""
        self.ensure_room(len(tasks))
        self._items.extend(tasks)
        self._in_hand.update(tasks)
        if self._items:
            self._not_empty.set()

    async def get(self) -> Task:
        """The next task; raises ``anyio.EndOfStream`` once closed and drained."""
        while not self._items:
            if self._closed:
                raise anyio.EndOfStream
            await self._not_empty.wait()
        return self._take()

    def _take(self) -> Task:
        task = self._items.popleft()
        if not self._items and not self._closed:
            self._not_empty = anyio.Event()
        return task

    def done(self, task: Task) -> None:
        self._in_hand.discard(task)

    def close(self) -> None:
        """No more tasks; workers drain what is queued and stop."""
        self._closed = True
        self._not_empty.set()
