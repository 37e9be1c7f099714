"""The pace of requests to the cloud: never faster than configured, slower while it asks.

Public clouds put a rate limit in front of their APIs and answer 429 (or 503) with
``Retry-After`` above it. ``Pacer`` spaces every request osas sends by ``1 / rate`` (so no burst
ever exceeds the rate, unlike a bucket that lets a second's worth through at once), holds every
request back until a ``Retry-After`` has passed, and adapts: each refusal takes the pace down
by a fifth (once per second however many requests were refused together), and after
``RECOVERY`` seconds without one the pace rises again by a tenth per second, up to the
configured rate. So a cloud that allows less than osas's ``rate_limit`` is met near its own
pace (``osas bench``: a burst against a cloud allowing 5 creates a second), with a few 429s
when osas probes upwards, and none of them is ever a failure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import anyio

__all__ = ["MAX_RETRY_AFTER", "RECOVERY", "Pacer"]

RECOVERY = 3.0  # seconds without a refusal before the pace rises again
MAX_RETRY_AFTER = 60.0  # a longer Retry-After is taken as this (a misconfigured limiter)
_FLOOR = 0.2  # requests per second: the slowest pace a run of refusals can bring
_RISE = 1.1  # the pace's growth per quiet second
_FALL = 0.8  # the pace kept after a refusal (once per second)


class Pacer:
    """One pace for every request of one cloud adapter (one event loop)."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ceiling = rate
        self._rate = rate
        self._floor = min(_FLOOR, rate)
        self._clock = clock
        self._next = -math.inf  # the earliest instant of the next request
        self._not_before = -math.inf  # a Retry-After in force
        self._slowed_at = -math.inf
        self._raised_at = -math.inf

    @property
    def rate(self) -> float:
        """Requests per second, now."""
        return self._rate

    def held_for(self) -> float:
        """Seconds a request asked now would wait."""
        return max(0.0, max(self._next, self._not_before) - self._clock())

    async def wait_turn(self) -> None:
        """Returns at this caller's turn. Whoever wakes first at a free instant takes it; the
        others sleep again, so a pace lowered or a Retry-After set meanwhile holds for all."""
        while True:
            now = self._clock()
            turn = max(self._next, self._not_before)
            if turn <= now:
                self._next = max(now, self._next) + 1.0 / self._rate
                return
            await anyio.sleep(turn - now)

    def refused(self, retry_after: float | None) -> None:
        """The cloud answered "too many requests": nothing more before ``retry_after`` (or
        one interval at the lowered pace), and a slower pace."""
        now = self._clock()
        if now - self._slowed_at >= 1.0:
            self._rate = max(self._floor, self._rate * _FALL)
            self._slowed_at = now
        wait = 1.0 / self._rate if retry_after is None else min(retry_after, MAX_RETRY_AFTER)
        self._not_before = max(self._not_before, now + wait)

    def answered(self) -> None:
        """A request went through: after ``RECOVERY`` quiet seconds, the pace rises again."""
        if self._rate >= self._ceiling:
            return
        now = self._clock()
        if now - self._slowed_at >= RECOVERY and now - self._raised_at >= 1.0:
            self._rate = min(self._ceiling, self._rate * _RISE)
            self._raised_at = now
