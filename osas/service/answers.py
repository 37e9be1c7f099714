"""What a handler returns: an answer serialised once, and the status a refusal sets.

grpc.aio sends whatever a handler returns through the method's response serializer, which
calls ``SerializeToString``: a ``Serialized`` gives its stored bytes back. A refusal is answered
by setting its status on the call and returning ``NO_MESSAGE`` (grpc.aio sends the status and
discards the message): an ``abort`` raises through every layer of the handler and grpc.aio, and
costs more than the answer of the cheapest read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


class Serialized:
    """An answer serialised once and sent as is, as many times as it stays true."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # the name protobuf messages answer to
        return self.data


NO_MESSAGE = Serialized(b"")  # beside a non-OK status; grpc.aio never serialises it


def refuse(context: Any, code: grpc.StatusCode, details: str) -> Serialized:
    """Set a refusal's status on the call; the handler returns what this returns."""
    context.set_code(code)
    context.set_details(details)
    return NO_MESSAGE


class StandingAnswers:
    """Answers that stand for the same request bytes while the configuration they were
    decided from stays in force: GetOptions', which CA asks four times per node per loop with
    the same bytes (its request has no map, so Go marshals the same defaults alike each time),
    and which the configuration alone decides (UNIMPLEMENTED for a group without overrides,
    CA's defaults with the group's overrides otherwise). The gate finds one by the bytes alone,
    before anything is decoded: in the server, each microsecond of Python a call costs several
    (cold caches between grpc.aio's C calls; docs/BENCHMARKS.md).

    Only what no access line is written for is kept: OK and UNIMPLEMENTED. A method given
    standing answers must answer OK with a ``Serialized`` only what its request bytes and the
    configuration decide."""

    __slots__ = ("_answering", "_basis", "_by_request", "_limit")

    def __init__(
        self,
        basis: Callable[[], object],
        answering: Callable[[], bool],
        *,
        limit: int = 1024,
    ) -> None:
        self._basis = basis  # the configuration in force (a new object on each reload)
        self._answering = answering  # False while the server may not answer (not ready...)
        self._by_request: dict[bytes, tuple[object, grpc.StatusCode, str, Serialized]] = {}
        self._limit = limit  # distinct requests kept: one per node group and set of defaults

    def basis(self) -> object:
        return self._basis()

    def get(self, raw: bytes) -> tuple[grpc.StatusCode, str, Serialized] | None:
        """The status, details and answer standing for these bytes, or None: never decided,
        decided under another configuration, or the server may not answer now."""
        kept = self._by_request.get(raw)
        if kept is None or kept[0] is not self._basis() or not self._answering():
            return None
        return kept[1], kept[2], kept[3]

    def keep(
        self, raw: bytes, basis: object, code: grpc.StatusCode, details: str, answer: Serialized
    ) -> None:
        if len(self._by_request) >= self._limit:
            self._by_request.clear()
        self._by_request[raw] = (basis, code, details, answer)
