"""Blocking calls run in daemon threads, awaited from the event loop.

openstacksdk is synchronous and a call can block for its whole ``api_timeout`` (or longer, on a
stalled connection). anyio's and asyncio's worker threads are joined when the interpreter exits,
so a single stuck call would hold a stopping process past its grace period. Here a cancelled
caller abandons its call at once, and the thread running it never keeps the process alive.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class _Job(Generic[T]):
    __slots__ = ("function", "future")

    def __init__(self, function: Callable[[], T]) -> None:
        self.function = function
        self.future: Future[T] = Future()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # the caller gave up before a thread got to it
        try:
            result = self.function()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


class DaemonThreads:
    """At most ``size`` calls at once, each in a daemon thread; started on first use."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[_Job[object] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    async def run(self, function: Callable[[], T]) -> T:
        """``function()`` in one of the threads; cancelling the caller abandons the call."""
        job = _Job(function)
        self._start_threads()
        self._jobs.put(job)  # type: ignore[arg-type]
        return await asyncio.wrap_future(job.future)

    def _start_threads(self) -> None:
        with self._lock:
            while len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"{self._name}-{len(self._threads)}",
                    daemon=True,
                )
                thread.start()
                self._threads.append(thread)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.run()
            # An idle thread must not keep its last call, and so its result (a listing of
            # 50,000 servers), alive until it gets another one.
            job = None

    def close(self) -> None:
        """Let idle threads end; a thread still in a call ends when the call returns."""
        with self._lock:
            for _ in self._threads:
                self._jobs.put(None)
            self._threads.clear()
