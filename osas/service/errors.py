"""The one place where osas errors become gRPC statuses (the gate calls it for every method).
Refusals are logged once, by the call's access line (``gate``), with the message given here as
their reason."""

from __future__ import annotations

from typing import Any

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


def answer_failed(context: Any, method: str, error: Exception) -> Serialized:
    """A bug in answering ``method``: its traceback logged here (the call's access line says
    INTERNAL), never shown to the client, which could read details that are not theirs.
    """
    logger.error("rpc failed", rpc=method, exc_info=error)
    return refuse(context, grpc.StatusCode.INTERNAL, f"{method} failed; see the osas log")
