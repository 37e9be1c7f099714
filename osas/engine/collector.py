"""The engine's state as Prometheus gauges, read from the inventory when Prometheus scrapes,
never kept up to date on every change: servers by group and state, targets and sizes, creates
in hand, queue and workers, inventory age, servers in a problem state."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from osas.domain.inventory import Inventory
from osas.domain.problems import GroupProblem, Problem
from osas.engine.queue import TaskQueue
from osas.engine.reconciler import Reconciler
from osas.engine.status import CREATE_STATES, SERVER_STATES, Census


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


class EngineCollector(Collector):
    """The engine's state, read when Prometheus scrapes (on the event loop, between syncs:
    the inventory is never seen half-updated)."""

    def __init__(
        self,
        *,
        inventory: Inventory,
        queue: TaskQueue,
        reconciler: Reconciler,
        census: Census,
        workers: int,
        clock: Callable[[], float],
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._leading = leading
        self._inventory = inventory
        self._queue = queue
        self._reconciler = reconciler
        self._census = census
        self._workers = workers
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        yield from self._groups()
        yield from self._work()
        inventory = self._inventory
        age = _gauge(
            "osas_inventory_age_seconds",
            "Seconds since the last successful listing of the cloud (absent before the first).",
        )
        seconds = inventory.age(self._clock())
        if seconds is not None:
            age.add_metric([], seconds)
        yield age
        failing = _gauge(
            "osas_reconcile_failing_seconds",
            "Seconds since syncs with OpenStack began failing, the first sync's attempts "
            "included; 0 once one works. The cause: /status (syncs.last_error) and the "
            "status label of osas_openstack_requests_total.",
        )
        since = self._reconciler.status.failing_since
        failing.add_metric([], 0.0 if since is None else self._clock() - since)
        yield failing
        refused = _gauge(
            "osas_credentials_refused",
            "1 while OpenStack refuses osas's credentials (401 after a fresh token): creates "
            "wait, /readyz fails; fix the credentials (an operator's error, not an outage).",
        )
        refused.add_metric([], float(self._reconciler.status.credentials_refused is not None))
        yield refused
        offset = _gauge(
            "osas_nova_clock_offset_seconds",
            "Nova's clock minus osas's, from the Date of Nova's last answer to a listing (whole "
            "seconds, so within about 1 s means equal). osas takes changes-since from Nova's "
            "clock, so an offset loses nothing; it is logged once when over 5 s.",
        )
        measured = self._reconciler.status.nova_clock_offset
        if measured is not None:
            offset.add_metric([], measured)
        yield offset
        leader = _gauge(
            "osas_leader",
            "1 while this osas is the writer (it holds the leader lease, or election is off); "
            "0 on a standby, which answers CA nothing and keeps its inventory warm.",
        )
        leader.add_metric([], float(self._leading()))
        yield leader
        held = _gauge(
            "osas_scale_ups_held_seconds",
            "Seconds until scale-ups may spend headroom again after a start or a takeover "
            "(creates an earlier osas sent may still reach Nova); 0 when they may.",
        )
        held.add_metric([], inventory.ledger.headroom_held(self._clock()) or 0.0)
        yield held
        problems = _gauge(
            "osas_server_problems",
            "Servers in a problem state now (error, build-stuck, delete-stuck, "
            "unconfigured-group, shared-request-id), by node group; osas never deletes them on "
            "its own.",
            ["group", "problem"],
        )
        counts = self._reconciler.problems.counts()
        groups = {spec.group_id for spec in inventory.cluster.node_groups}
        groups.update(group for group, _ in counts)
        for group in sorted(groups):
            for problem in Problem:
                problems.add_metric([group, problem.value], counts.get((group, problem), 0))
        yield problems
        group_problems = _gauge(
            "osas_group_problems",
            "1 while a node group is in a problem (deleted-before-joining: CA deletes its "
            "servers before they join), else 0.",
            ["group", "problem"],
        )
        unjoined = self._reconciler.unjoined.active()
        for group in sorted(groups | unjoined.keys()):
            group_problems.add_metric(
                [group, GroupProblem.DELETED_BEFORE_JOINING.value], int(group in unjoined)
            )
        yield group_problems

    def _groups(self) -> Iterator[Metric]:
        inventory, census = self._inventory, self._census
        minimum = _gauge("osas_node_group_min_size", "min_size of each node group.", ["group"])
        maximum = _gauge("osas_node_group_max_size", "max_size of each node group.", ["group"])
        target = _gauge(
            "osas_node_group_target_size",
            "Target size CA is told: servers not being deleted plus creates in hand.",
            ["group"],
        )
        servers = _gauge(
            "osas_inventory_servers",
            "Servers of each node group by state: running, creating (BUILD), deleting, "
            "error (ERROR).",
            ["group", "state"],
        )
        creates = _gauge(
            "osas_creates_in_hand",
            "Creates not yet shown as servers, by node group and state: queued, sending, "
            "in_doubt, created (Nova answered, not listed yet), failed (reported to CA).",
            ["group", "state"],
        )
        in_doubt = _gauge(
            "osas_creates_in_doubt",
            "Creates sent whose outcome is unknown, never sent again: waiting for a listing "
            "to show their server, or the doubt window to pass.",
            ["group"],
        )
        reported = _gauge(
            "osas_node_group_reported_max_size",
            "The max size CA is told: max_size, bounded by what the project's quota can hold "
            "(target + headroom), and the target while scale-ups are held after a start.",
            ["group"],
        )
        headroom = _gauge(
            "osas_quota_headroom",
            "More servers of each node group the project's quota can hold, per resource "
            "(instances, cores, ram_mib, server_group_members) and in all (servers); absent "
            "while the quota is unread or unlimited.",
            ["group", "resource"],
        )
        now = self._clock()
        for spec in inventory.cluster.node_groups:
            group = spec.group_id
            minimum.add_metric([group], spec.min_size)
            maximum.add_metric([group], spec.max_size)
            reported.add_metric([group], inventory.reported_max(spec, now))
            room = inventory.headroom(group)
            if room.count is not None:
                headroom.add_metric([group, "servers"], room.count)
            for resource, count in room.by_resource.items():
                if count is not None:
                    headroom.add_metric([group, resource], count)
            if inventory.synced:
                target.add_metric([group], inventory.target_size(group))
            states = census.servers(group)
            for state in SERVER_STATES:
                servers.add_metric([group, state], states[state])
            in_hand = census.creates(group)
            for state in CREATE_STATES:
                creates.add_metric([group, state], in_hand[state])
            in_doubt.add_metric([group], in_hand["in_doubt"])
        yield from (minimum, maximum, reported, headroom, target, servers, creates, in_doubt)

    def _work(self) -> Iterator[Metric]:
        queue = self._queue
        depth = _gauge("osas_queue_depth", "Tasks queued, by kind (create, delete).", ["kind"])
        deletes = queue.queued_deletes()
        depth.add_metric(["create"], len(queue) - deletes)
        depth.add_metric(["delete"], deletes)
        yield depth
        capacity = _gauge("osas_queue_capacity", "Tasks the queue holds at most (queue.capacity).")
        capacity.add_metric([], queue.capacity)
        yield capacity
        busy = _gauge("osas_workers_busy", "Tasks being worked on now.")
        busy.add_metric([], queue.in_hand_count() - len(queue))
        yield busy
        workers = _gauge(
            "osas_workers", "Workers (queue.workers), besides the one that only deletes."
        )
        workers.add_metric([], self._workers)
        yield workers
