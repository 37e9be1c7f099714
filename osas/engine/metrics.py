"""What the engine counts where things happen: the ledger's events and delete orders
(``events.py`` carries out every ``Orders``), each sync, each problem a server enters. The state
itself (servers, targets, queue...) is read at scrape time: ``osas.engine.collector``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from osas.domain.ledger import DeleteReason, EventKind, Orders
from osas.domain.problems import GroupProblem, GroupProblemChange, Problem, ProblemChange
from osas.domain.specs import ClusterSpec

# The ledger's events that end a create, and the result they count as.
_CREATE_RESULTS = {
    EventKind.CREATE_SETTLED: "created",
    EventKind.CREATE_FAILED: "failed",
    EventKind.CREATE_GIVEN_UP: "given_up",
    EventKind.CREATE_VANISHED: "vanished",
    EventKind.CREATE_DROPPED: "dropped",
    EventKind.CREATE_CANCELLED: "cancelled",
}
SYNC_KINDS = ("full", "incremental")
# From an empty incremental listing to a complete one of 50,000 servers.
_SYNC_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class EngineMetrics:
    """Counters and histograms the engine moves; their labelled children for the configured
    groups exist from the start, so that they read 0 rather than nothing."""

    def __init__(self, registry: CollectorRegistry, cluster: ClusterSpec) -> None:
        self.creates_requested = Counter(
            "osas_creates_requested",
            "Creates accepted from NodeGroupIncreaseSize, by node group.",
            ["group"],
            registry=registry,
        )
        self.creates = Counter(
            "osas_creates",
            "Creates finished, by node group and result: created (a listing showed the "
            "server), failed, given_up (in doubt past the window), vanished, dropped "
            "(queued at shutdown), cancelled (unsent when a reload lowered max_size or "
            "removed the group).",
            ["group", "result"],
            registry=registry,
        )
        self.create_failures = Counter(
            "osas_create_failures",
            "Creates reported failed to CA, by node group, error class (1 out of resources, "
            "99 other) and error code.",
            ["group", "error_class", "code"],
            registry=registry,
        )
        self.delete_orders = Counter(
            "osas_delete_orders",
            "Servers osas set out to delete, by node group and reason: requested and "
            "given-up (by CA), orphan and duplicate (on its own initiative, only of requests "
            "this process sent), resend.",
            ["group", "reason"],
            registry=registry,
        )
        self.ledger_events = Counter(
            "osas_ledger_events",
            "Events of the create/delete lifecycle, by node group and event (the log "
            "events of the same name).",
            ["group", "event"],
            registry=registry,
        )
        self.sync_duration = Histogram(
            "osas_reconcile_duration_seconds",
            "Successful syncs with OpenStack, by place (cloud, region) and kind (full, "
            "incremental).",
            ["cloud", "region", "kind"],
            buckets=_SYNC_BUCKETS,
            registry=registry,
        )
        self.sync_failures = Counter(
            "osas_reconcile_failures",
            "Syncs with OpenStack that failed, by place (cloud, region) and kind (full, "
            "incremental).",
            ["cloud", "region", "kind"],
            registry=registry,
        )
        self.problems_detected = Counter(
            "osas_server_problems_detected",
            "Times a server entered a problem state: error, build-stuck, delete-stuck, "
            "unconfigured-group, shared-request-id.",
            ["problem"],
            registry=registry,
        )
        self.deleted_before_joining = Counter(
            "osas_servers_deleted_before_joining",
            "Servers CA deleted as never registered (its fake nodes for unregistered "
            "instances), by node group.",
            ["group"],
            registry=registry,
        )
        self.group_problems_detected = Counter(
            "osas_group_problems_detected",
            "Times a node group entered a problem: deleted-before-joining.",
            ["group", "problem"],
            registry=registry,
        )
        self.warm_claims = Counter(
            "osas_warm_claims",
            "Creates and their warm servers, by node group and outcome: claimed (a warm "
            "server took the create), replaced (a claimed server did not start in time, or "
            "its start failed: a cold create took its place).",
            ["group", "outcome"],
            registry=registry,
        )
        self.warm_refills = Counter(
            "osas_warm_refills",
            "Servers created to fill each node group's warm pool.",
            ["group"],
            registry=registry,
        )
        self.warm_recycled = Counter(
            "osas_warm_recycled",
            "Warm servers deleted, by node group and reason: stale (prepared from another "
            "image, flavor, user data or template), aged (past max_age), failed, "
            "prepare-timeout, unconfigured (its group has no pool).",
            ["group", "reason"],
            registry=registry,
        )
        self.warm_wanted = Gauge(
            "osas_warm_pool_wanted",
            "Servers each node group's warm pool should hold now (its size, at most max_size "
            "less the target).",
            ["group"],
            registry=registry,
        )
        self.warm_ready = Gauge(
            "osas_warm_pool_ready",
            "Servers of each node group's warm pool ready to be claimed.",
            ["group"],
            registry=registry,
        )
        self.warm_unfilled = Gauge(
            "osas_warm_pool_unfilled",
            "1 while a node group's warm pool is short and cannot be filled (the reason is "
            "in /status and the log), else 0.",
            ["group"],
            registry=registry,
        )
        for problem in Problem:
            self.problems_detected.labels(problem.value)
        self.add_groups(cluster)

    def record_warm_pool(self, group: str, wanted: int, ready: int, why_not: str | None) -> None:
        self.warm_wanted.labels(group).set(wanted)
        self.warm_ready.labels(group).set(ready)
        self.warm_unfilled.labels(group).set(1 if why_not is not None and ready < wanted else 0)

    def add_place(self, place: tuple[str, str]) -> None:
        """Series for a place's syncs (cloud, region), so that they read 0 rather than nothing."""
        for kind in SYNC_KINDS:
            self.sync_duration.labels(*place, kind)
            self.sync_failures.labels(*place, kind)

    def add_groups(self, cluster: ClusterSpec) -> None:
        """Series for every configured group, so that they read 0 rather than nothing."""
        for spec in cluster.node_groups:
            group = spec.group_id
            self.creates_requested.labels(group)
            for result in _CREATE_RESULTS.values():
                self.creates.labels(group, result)
            for reason in DeleteReason:
                self.delete_orders.labels(group, reason.value)
            for event in EventKind:
                self.ledger_events.labels(group, event.value)
            self.deleted_before_joining.labels(group)
            for group_problem in GroupProblem:
                self.group_problems_detected.labels(group, group_problem.value)

    def record_orders(self, orders: Orders) -> None:
        for event in orders.events:
            group = event.group_id
            self.ledger_events.labels(group, event.kind.value).inc()
            result = _CREATE_RESULTS.get(event.kind)
            if result is not None:
                self.creates.labels(group, result).inc()
            error = event.error
            if error is not None:
                error_class = str(int(error.error_class))
                self.create_failures.labels(group, error_class, error.code).inc()
        for order in orders.deletes:
            self.delete_orders.labels(order.group_id, order.reason.value).inc()

    def record_sync(self, place: tuple[str, str], *, full: bool, seconds: float | None) -> None:
        """A sync of ``place`` (cloud, region) that took ``seconds``, or failed (None)."""
        kind = SYNC_KINDS[0] if full else SYNC_KINDS[1]
        if seconds is None:
            self.sync_failures.labels(*place, kind).inc()
        else:
            self.sync_duration.labels(*place, kind).observe(seconds)

    def record_problems(self, changes: Iterable[ProblemChange]) -> None:
        for change in changes:
            if change.started:
                self.problems_detected.labels(change.problem.value).inc()

    def record_group_problems(self, changes: Iterable[GroupProblemChange]) -> None:
        for change in changes:
            if change.started:
                self.group_problems_detected.labels(change.group_id, change.problem.value).inc()
