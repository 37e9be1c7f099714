"""The gate every CloudProvider call passes: admitted under the concurrency cap, counted,
timed, given a request id, and logged when it matters.

``RpcGate`` wraps each method's handler once. A call beyond ``transport.max_concurrent_rpcs``
in progress is refused RESOURCE_EXHAUSTED. Each call is counted in series made once per method
and status code. Each call that writes an access line (below) gets a request id, sent back in
the trailing metadata ``x-request-id``; a mutating call's is also bound to its log context from
the start, so that any line logged during the call carries it. The reads that answer OK or
UNIMPLEMENTED get none: no line names them, and trailing metadata on every call costs some
10% of the server's CPU for CA's loop (docs/BENCHMARKS.md).

One access line (event ``rpc``) is written per mutating call (IncreaseSize, DeleteNodes,
DecreaseTargetSize, Cleanup) and per refused call, with method, group, code, duration, request
id, the reason of a refusal, and whatever the controller bound to the call's log context (the
delta, the target it left...). The reads CA makes per node and per loop (NodeGroupForNode,
TargetSize, GetOptions, Refresh...) are only counted, and so is UNIMPLEMENTED, which only means
"keep your defaults" (CA asks GetOptions four times per node per loop).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import grpc
import structlog
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from structlog.contextvars import bind_contextvars, get_contextvars

from osas.domain.errors import OsasError
from osas.service.answers import NO_MESSAGE, Serialized, StandingAnswers, refuse
from osas.service.errors import answer_failed, answer_refused
from osas.service.metrics import MethodMetrics, RpcMetrics

logger = structlog.get_logger("osas.access")

REQUEST_ID_KEY = "x-request-id"
# Calls that change something (and CA's rare Cleanup): always worth a line.
LOGGED_METHODS = frozenset(
    {"NodeGroupIncreaseSize", "NodeGroupDeleteNodes", "NodeGroupDecreaseTargetSize", "Cleanup"}
)
_FAULTS = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
# A read that succeeded, or answered UNIMPLEMENTED ("keep your defaults", four times per node
# per loop): counted, never logged.
_OK, _UNIMPLEMENTED = grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED
_perf_counter = time.perf_counter  # read twice a call: one global, not a global and its attribute

if TYPE_CHECKING:
    # Generic only in the type stubs.
    Behavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
    SyncBehavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]
    # Whether the calling client may be answered at all (``tls.allowed_clients``).
    Admits = Callable[[grpc.aio.ServicerContext[Any, Any]], bool]
    Handler = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
    Screen = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Message | None]


def _level(code: grpc.StatusCode) -> int:
    if code is grpc.StatusCode.OK:
        return logging.INFO
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return logging.DEBUG
    return logging.ERROR if code in _FAULTS else logging.WARNING


@dataclass(slots=True)
class _Method:
    name: str
    metrics: MethodMetrics
    logged: bool
    request_class: type[Message]
    has_group: bool


class RequestIds:
    """Short unique ids: a random prefix per process and a counter (no entropy per call)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):08x}"


class RpcGate:
    """Admits (under the concurrency cap), counts, times and logs the unary methods of one
    service. ``wrap`` wraps a method's behaviour once, when the handlers are built: not a gRPC
    interceptor, whose per-call chain of awaits costs more than a read from the inventory."""

    def __init__(
        self, service: ServiceDescriptor, metrics: RpcMetrics, *, max_concurrent: int = 256
    ) -> None:
        self._ids = RequestIds()
        # Calls in progress, capped here rather than by grpc.aio's maximum_concurrent_rpcs,
        # which costs some 8% of a NodeGroupForNode round trip (docs/BENCHMARKS.md).
        self._max_concurrent = max_concurrent
        self.in_flight = 0
        self._methods: dict[str, _Method] = {}
        for method in service.methods:
            request_class = message_factory.GetMessageClass(method.input_type)
            self._methods[method.name] = _Method(
                name=method.name,
                metrics=metrics.methods[method.name],
                logged=method.name in LOGGED_METHODS,
                request_class=request_class,
                has_group="id" in method.input_type.fields_by_name,
            )

    def _send_request_id(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """A new request id, sent back in the call's trailing metadata."""
        request_id = self._ids.next()
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        return request_id

    def _bind_request_id(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """A mutating call's request id, sent back and bound to its log context from the
        start, so that every line logged during the call carries it."""
        request_id = self._send_request_id(context)
        bind_contextvars(request_id=request_id)
        return request_id

    def _over_cap(self, context: grpc.aio.ServicerContext[Any, Any]) -> Message | None:
        """Refuse a call beyond the concurrency cap: its status set, no request (a screen's
        refusal, in the screen's terms)."""
        refuse(
            context,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"more than {self._max_concurrent} calls at once (transport.max_concurrent_rpcs);"
            " try again",
        )
        return None

    def _finished(
        self,
        method: _Method,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        *,
        code: grpc.StatusCode,
        begun: float,
        request_id: str | None,
    ) -> None:
        """Count and time the call; write its access line when it has one (a refused read
        gets its request id here, so that its answer and its line share it)."""
        seconds = _perf_counter() - begun
        method.metrics.finished(code, seconds)
        # By identity: a status code is an Enum, whose hash is a call of Python code.
        if method.logged or not (code is _OK or code is _UNIMPLEMENTED):
            _log(
                method,
                request=request,
                context=context,
                code=code,
                seconds=seconds,
                request_id=request_id or self._send_request_id(context),
            )

    def wrap(
        self,
        name: str,
        screen: Screen,
        behavior: Behavior | SyncBehavior,
        standing: StandingAnswers | None = None,
        admits: Admits | None = None,
    ) -> Handler:
        """One method's handler: the call admitted, its request screened and decoded
        (``screen``), answered by ``behavior`` (the servicer's method) with its osas errors
        turned into statuses (``errors``), counted, timed and logged. One coroutine a call:
        each layer more costs microseconds of CPU on every call CA makes, so a method that
        never waits is a plain function, called without a coroutine of its own. With
        ``standing`` (``answers.StandingAnswers``), the method's OK and UNIMPLEMENTED answers
        are kept by their request bytes and given again from them alone: admitted, counted and
        timed still, and only to a client ``admits`` lets in (the allow list; the screen
        refuses the others, every time)."""
        method = self._methods[name]
        answer_of, waits = _answering(name, behavior)

        async def gated(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            begun = _perf_counter()
            method.metrics.started += 1
            request_id = self._bind_request_id(context) if method.logged else None
            code = _OK
            request: Any = raw  # decoded when it passes the screen
            self.in_flight += 1
            try:
                # Over the cap, refused; else screened (None: refused, its status set).
                decoded = (
                    self._over_cap(context)
                    if self.in_flight > self._max_concurrent
                    else screen(raw, context)
                )
                if decoded is None:
                    answer = NO_MESSAGE  # refused, its status set
                else:
                    request = decoded
                    answer = answer_of(decoded, context)
                    if waits:
                        answer = await answer
                # Every refusal sets its status and returns (``answers.refuse``).
                code = context.code() or code
            except grpc.aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception:
                code = grpc.StatusCode.UNKNOWN
                raise
            else:
                return answer
            finally:
                self.in_flight -= 1
                # Before the handler returns: grpc.aio sends the status after it.
                self._finished(
                    method, request, context, code=code, begun=begun, request_id=request_id
                )

        if standing is None:
            return gated
        return self._standing_first(method, gated, standing, admits or _everyone)

    def _standing_first(
        self, method: _Method, gated: Handler, standing: StandingAnswers, admits: Admits
    ) -> Handler:
        """``gated``, behind the answers standing for their request bytes."""
        series = method.metrics

        async def standing_first(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if self.in_flight < self._max_concurrent and admits(context):
                kept = standing.get(raw)
                if kept is not None:
                    begun = _perf_counter()
                    series.started += 1
                    code, details, answer = kept
                    if code is not _OK:
                        context.set_code(code)
                        context.set_details(details)
                    series.finished(code, _perf_counter() - begun)
                    return answer
            basis = standing.basis()  # before the answer is decided: a reload may follow it
            answer = await gated(raw, context)
            code = context.code()
            # Only the answers no line is written for: OK (a serialised one) and UNIMPLEMENTED.
            if code is _UNIMPLEMENTED:
                standing.keep(raw, basis, code, context.details() or "", NO_MESSAGE)
            elif code is None and isinstance(answer, Serialized):
                standing.keep(raw, basis, _OK, "", answer)
            return answer

        return standing_first


def _everyone(context: grpc.aio.ServicerContext[Any, Any]) -> bool:  # noqa: ARG001 - Admits
    """No allow list: every client the TLS handshake let in."""
    return True


def _answering(name: str, behavior: Behavior | SyncBehavior) -> tuple[SyncBehavior, bool]:
    """``behavior`` with its osas errors set as statuses (``errors.answer_refused``) and
    anything else answered INTERNAL (``errors.answer_failed``), and whether what it gives must
    be awaited. A behaviour that never waits is called as a plain function, with no coroutine
    of its own: the gate's is the one coroutine of its call."""
    if inspect.iscoroutinefunction(behavior):
        waiting = cast("Behavior", behavior)

        async def answer_waiting(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                return await waiting(request, context)
            except OsasError as exc:
                return answer_refused(context, exc)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug: INTERNAL, traceback logged
                return answer_failed(context, name, exc)

        return answer_waiting, True

    def answer_now(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return behavior(request, context)
        except OsasError as exc:
            return answer_refused(context, exc)
        except Exception as exc:  # noqa: BLE001 - a bug: INTERNAL, traceback logged
            return answer_failed(context, name, exc)

    return answer_now, False


def _group(method: _Method, request: Any) -> str | None:
    """The node group a request names; decoded again only for the calls that are logged."""
    if not method.has_group:
        return None
    try:
        message = (
            method.request_class.FromString(request) if isinstance(request, bytes) else request
        )
    except DecodeError:
        return None
    return str(getattr(message, "id", "")) or None


def _log(
    method: _Method,
    *,
    request: Any,
    context: grpc.aio.ServicerContext[Any, Any],
    code: grpc.StatusCode,
    seconds: float,
    request_id: str,
) -> None:
    # Passed explicitly (not left to the log processors) so that every renderer sees them.
    fields: dict[str, Any] = get_contextvars()
    fields.update(
        method=method.name,
        group=_group(method, request),
        code=code.name,
        duration_ms=round(seconds * 1000, 3),
        request_id=request_id,
    )
    if code is not grpc.StatusCode.OK:
        fields["reason"] = context.details() or None
    logger.log(_level(code), "rpc", **fields)
