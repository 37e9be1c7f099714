"""The one place where osas errors become gRPC statuses. Refusals are logged once, by the
call's access line (``gate``), with the message given here as their reason."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
import structlog

from osas.cloud.errors import CloudError
from osas.domain.errors import (
    InvalidRequest,
    NodeGroupNotFound,
    NodeNotFound,
    NotReady,
    NotSupported,
    OsasError,
    Overloaded,
    PreconditionFailed,
)

logger = structlog.get_logger(__name__)

STATUS_OF_ERROR: dict[type[OsasError], grpc.StatusCode] = {
    NodeGroupNotFound: grpc.StatusCode.NOT_FOUND,
    NodeNotFound: grpc.StatusCode.NOT_FOUND,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    PreconditionFailed: grpc.StatusCode.FAILED_PRECONDITION,
    NotSupported: grpc.StatusCode.UNIMPLEMENTED,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    CloudError: grpc.StatusCode.UNAVAILABLE,
}


def status_of(error: OsasError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_OF_ERROR:
            return STATUS_OF_ERROR[cls]
    return grpc.StatusCode.INTERNAL


def answer_refused(context: Any, error: OsasError) -> None:
    """Set ``error``'s status on the call without raising; the handler then returns any
    message (grpc.aio sends the status, and CA sees exactly what an abort would give). For
    refusals CA meets at every call of a loop (GetOptions' UNIMPLEMENTED, four times per
    node), where an abort's exception through the handler and grpc.aio costs more than the
    answer."""
    context.set_code(status_of(error))
    context.set_details(str(error))


S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = TypeVar("Ctx")


def translate_errors(
    method: Callable[[S, Req, Ctx], Awaitable[Resp]],
) -> Callable[[S, Req, Ctx], Awaitable[Resp]]:
    """Wrap an RPC: osas errors abort with their status; anything else is INTERNAL, logged with
    its traceback but never shown to the client (it could hold details that are not theirs)."""
    rpc = method.__name__

    @functools.wraps(method)
    async def wrapper(self: S, request: Req, context: Ctx) -> Resp:
        aio_context = cast("grpc.aio.ServicerContext[Any, Any]", context)
        try:
            return await method(self, request, context)
        except OsasError as exc:
            await aio_context.abort(status_of(exc), str(exc))
        except Exception:
            # A bug: its traceback here, its access line (INTERNAL) from the gate.
            logger.exception("rpc failed", rpc=rpc)
            await aio_context.abort(grpc.StatusCode.INTERNAL, f"{rpc} failed; see the osas log")

    return wrapper
