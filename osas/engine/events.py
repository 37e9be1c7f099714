"""The ledger's orders carried out: its deletes queued, and its events told to the operator,
one log line each, at a level that says whether anyone needs to look, and counted. Servers
entering and leaving a problem state are told here too."""

from __future__ import annotations

import logging
from collections.abc import Container

import structlog

from osas.domain.ledger import DeleteReason, EventKind, Orders
from osas.domain.problems import GROUP_PROBLEM_ADVICE, GroupProblemChange, ProblemChange
from osas.engine.metrics import EngineMetrics
from osas.engine.queue import TaskQueue, delete_tasks

logger = structlog.get_logger("osas.ledger")

_EVENT_LEVELS: dict[EventKind, int] = {
    EventKind.CREATE_IN_DOUBT: logging.WARNING,
    EventKind.CREATE_FAILED: logging.WARNING,
    EventKind.CREATE_SETTLED: logging.INFO,
    EventKind.CREATE_GIVEN_UP: logging.WARNING,
    EventKind.CREATE_VANISHED: logging.WARNING,
    EventKind.CREATE_DROPPED: logging.DEBUG,  # counted in one shutdown warning instead
    EventKind.SERVER_DELETED: logging.INFO,
    EventKind.DELETE_REFUSED: logging.ERROR,
    EventKind.CREATE_CANCELLED: logging.WARNING,
    EventKind.STRAY_ADOPTED: logging.WARNING,
    EventKind.ABOVE_MAX_KEPT: logging.WARNING,
    EventKind.SHARED_REQUEST_KEPT: logging.WARNING,
    EventKind.UNKNOWN_PLACEHOLDER: logging.INFO,
    EventKind.DELETE_NOT_SENT: logging.WARNING,
    # A person took the server out of the cluster's hands (or it never was ours): told once.
    EventKind.MARKS_LOST: logging.WARNING,
    EventKind.CREATE_INHERITED: logging.INFO,
    EventKind.INHERITED_CREATE_LAPSED: logging.INFO,
    EventKind.DELETE_INHERITED: logging.INFO,
    EventKind.CLAIM_REPLACED: logging.WARNING,
}

_DELETE_LEVELS: dict[DeleteReason, int] = {
    DeleteReason.REQUESTED: logging.DEBUG,  # the scale-down line says it already
    DeleteReason.GIVEN_UP: logging.INFO,
    DeleteReason.ORPHAN: logging.WARNING,
    DeleteReason.DUPLICATE: logging.WARNING,
    DeleteReason.RESEND: logging.INFO,
    DeleteReason.CLAIM_FAILED: logging.WARNING,
}


def log_orders(orders: Orders, metrics: EngineMetrics | None = None) -> None:
    if metrics is not None:
        metrics.record_orders(orders)
    for event in orders.events:
        logger.log(
            _EVENT_LEVELS[event.kind],
            event.kind.value,
            group=event.group_id,
            request_id=event.request_id,
            server_id=event.server_id,
            detail=event.detail or None,
        )
    for order in orders.deletes:
        logger.log(
            _DELETE_LEVELS[order.reason],
            "deleting server",
            reason=order.reason.value,
            group=order.group_id,
            server_id=order.server_id,
        )


def carry_out(
    orders: Orders,
    queue: TaskQueue,
    metrics: EngineMetrics | None = None,
    *,
    sent_by_caller: Container[str] = (),
) -> None:
    """Log and count what the ledger said, and queue its deletes (those not in hand already,
    and not of the servers the caller sends itself)."""
    log_orders(orders, metrics)
    queued = [order for order in orders.deletes if order.server_id not in sent_by_caller]
    left_out = queue.put_new(delete_tasks(queued))
    if left_out:
        # Marked deleting all the same: the ledger sends them again after delete_retry_after.
        logger.warning("queue full; deletes postponed", servers=len(left_out))


def _tell(change: ProblemChange | GroupProblemChange, what: str, **about: object) -> None:
    """A problem begun (warning: someone should look) or over (info)."""
    fields = {"problem": change.problem.value, "group": change.group_id, **about}
    if change.started:
        logger.warning(what, **fields, detail=change.detail)
    else:
        over = what + " over"
        logger.info(over, **fields, detail=change.detail, lasted_seconds=round(change.lasted))


def log_problems(changes: list[ProblemChange], metrics: EngineMetrics | None = None) -> None:
    """One line when a server enters a problem state, one when it leaves it."""
    if metrics is not None:
        metrics.record_problems(changes)
    for change in changes:
        _tell(change, "server problem", server_id=change.server_id)


def log_group_problems(
    changes: list[GroupProblemChange], metrics: EngineMetrics | None = None
) -> None:
    """One line when a node group enters a problem, one when it leaves it."""
    if metrics is not None:
        metrics.record_group_problems(changes)
    for change in changes:
        if change.started:
            advice = GROUP_PROBLEM_ADVICE[change.problem]
            _tell(change, "node group problem", servers=change.servers, advice=advice)
        else:
            _tell(change, "node group problem")
