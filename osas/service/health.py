"""The health service of the plaintext probe port.

That port needs no credentials, so anyone who reaches it may call it. ``Check`` is what
kubelet's ``grpc:`` probes call; it is unary and answered at once, and the server runs without
a cap on concurrent calls that could lock it out. ``Watch`` streams stay open as long as the
client wants, so they are bounded on their own: past ``watch_limit`` open streams a new one is
refused with RESOURCE_EXHAUSTED, and ``Check`` answers all the same.
"""

from __future__ import annotations

from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2

logger = structlog.get_logger(__name__)

WATCH_LIMIT = 8


# grpc_health ships no types, and its aio servicer is not in the stubs.
class ProbeHealthServicer(health.aio.HealthServicer):  # type: ignore[misc,name-defined]
    """grpc's own health servicer, with ``Watch`` streams bounded apart from ``Check``."""

    def __init__(self, watch_limit: int = WATCH_LIMIT) -> None:
        super().__init__()
        self._watch_limit = watch_limit
        self.watching = 0

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        if self.watching >= self._watch_limit:
            # Debug only: anyone can call this port, and a warning per refusal would let them
            # flood the log.
            logger.debug("health watch refused", open_watches=self.watching)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {self._watch_limit} health watches at once; Check is always answered",
            )
        self.watching += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watching -= 1
