"""The bounded queue between RPCs that accept work and workers that do it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import anyio

from osas.domain.errors import Overloaded
from osas.domain.ledger import DeleteOrder


@dataclass(frozen=True, slots=True)
class CreateTask:
    request_id: str
    group_id: str


@dataclass(frozen=True, slots=True)
class DeleteTask:
    server_id: str
    group_id: str


Task = CreateTask | DeleteTask


def delete_tasks(orders: Iterable[DeleteOrder]) -> list[DeleteTask]:
    return [DeleteTask(order.server_id, order.group_id) for order in orders]


class TaskQueue:
    """A bounded queue of tasks; a batch goes in whole or not at all.

    Deletes go before creates: they are cheap, free quota, and must all be sent at shutdown.
    Every task queued or being worked on is "in hand", so that nothing is queued twice. A
    create that must wait (for its group's deletes to reach Nova) is held aside, still in hand
    and counted, and queued again by ``release_held``: it takes no worker while it waits.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._deletes: deque[DeleteTask] = deque()
        self._creates: deque[CreateTask] = deque()
        self._held: dict[CreateTask, None] = {}  # in the order they were held
        self._in_hand: set[Task] = set()
        self._changed = anyio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._deletes) + len(self._creates) + len(self._held)

    @property
    def room(self) -> int:
        return self.capacity - len(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def in_hand(self, task: Task) -> bool:
        return task in self._in_hand

    def in_hand_count(self) -> int:
        """Tasks queued or being worked on."""
        return len(self._in_hand)

    def queued_deletes(self) -> int:
        return len(self._deletes)

    def ensure_room(self, count: int) -> None:
        if count > self.room:
            raise Overloaded(
                f"task queue is full ({len(self)} of {self.capacity} queued); "
                f"no room for {count} more"
            )

    def put_new(self, tasks: Sequence[Task]) -> list[Task]:
        """Queue the tasks not in hand already, as many as there is room for; those left out."""
        fresh = [task for task in dict.fromkeys(tasks) if task not in self._in_hand]
        room = max(self.room, 0)
        self.put_all(fresh[:room])
        return fresh[room:]

    def put_all(self, tasks: Sequence[Task]) -> None:
        """Queue every task, or raise Overloaded having queued none. Once closed, only deletes
        are taken."""
        self.ensure_room(len(tasks))
        if self._closed and any(isinstance(task, CreateTask) for task in tasks):
            raise Overloaded("shutting down: no new creates are accepted")
        for task in tasks:
            if isinstance(task, DeleteTask):
                self._deletes.append(task)
            else:
                self._creates.append(task)
        self._in_hand.update(tasks)
        if tasks:
            self._wake()

    async def get(self, *, deletes_only: bool = False) -> Task:
        """The next task, a delete if there is one; raises ``anyio.EndOfStream`` once closed
        and drained."""
        while True:
            if self._deletes:
                return self._deletes.popleft()
            if self._creates and not deletes_only:
                return self._creates.popleft()
            if self._closed:
                raise anyio.EndOfStream
            changed = self._changed
            await changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def done(self, task: Task) -> None:
        if task not in self._held:
            self._in_hand.discard(task)

    def hold(self, task: CreateTask) -> None:
        """A create taken from the queue that must wait: set aside, in hand, until released."""
        self._held[task] = None

    def release_held(self) -> None:
        """Queue the held creates again, first among the creates (they were taken before the
        others), for a worker to look at them again."""
        if not self._held:
            return
        tasks = list(self._held)
        self._held.clear()
        if self._closed:
            return  # ``close`` returned them already
        self._creates.extendleft(reversed(tasks))
        self._wake()

    def close(self) -> list[CreateTask]:
        """No more creates: queued ones are taken out and returned; queued deletes stay for the
        workers to send before they stop."""
        self._closed = True
        creates = [*self._held, *self._creates]
        self._held.clear()
        self._creates.clear()
        self._in_hand.difference_update(creates)
        self._wake()
        return creates
