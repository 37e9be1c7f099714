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
from osas.service.answers import Serialized, refuse

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


def answer_refused(context: Any, error: OsasError) -> Serialized:
    """Set ``error``'s status on the call; the handler returns what this returns (CA sees
    exactly what an abort would give, without an exception through the stack)."""
    return refuse(context, status_of(error), str(error))


S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = TypeVar("Ctx")


def translate_errors(
    method: Callable[[S, Req, Ctx], Awaitable[Resp]],
) -> Callable[[S, Req, Ctx], Awaitable[Resp]]:
    """Wrap an RPC: an osas error answers its status; anything else is INTERNAL, logged with
    its traceback but never shown to the client (it could hold details that are not theirs).
    Both are answered by setting the status (``answers.refuse``), never by raising."""
    rpc = method.__name__

    @functools.wraps(method)
    async def wrapper(self: S, request: Req, context: Ctx) -> Resp:
        try:
            return await method(self, request, context)
        except OsasError as exc:
            return cast("Resp", answer_refused(context, exc))
        except Exception:
            # A bug: its traceback here, its access line (INTERNAL) from the gate.
            logger.exception("rpc failed", rpc=rpc)
            return cast(
                "Resp", refuse(context, grpc.StatusCode.INTERNAL, f"{rpc} failed; see the osas log")
            )

    return wrapper
