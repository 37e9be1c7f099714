"""The engine's state as Prometheus gauges, read from the inventory when Prometheus scrapes,
never kept up to date on every change: servers by group and state, targets and sizes, creates
in hand, queue and workers, inventory age, servers in a problem state."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from osas.domain.problems import GroupProblem, Problem
from osas.engine.status import CREATE_STATES, SERVER_STATES, PlaceSources

# The labels of what is said per place (a cloud and region): each has its own listing,
# clock, pace, quota and queue.
PLACE_LABELS = ["cloud", "region"]


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


class EngineCollector(Collector):
    """The engine's state, read when Prometheus scrapes (on the event loop, between syncs:
    the inventory is never seen half-updated)."""

    def __init__(
        self,
        *,
        places: Sequence[PlaceSources],
        workers: int,
        clock: Callable[[], float],
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._leading = leading
        self._places = tuple(places)
        self._workers = workers
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        yield from self._groups()
        yield from self._work()
        now = self._clock()
        age = _gauge(
            "osas_inventory_age_seconds",
            "Seconds since the last successful listing of each place's cloud and region "
            "(absent before its first).",
            PLACE_LABELS,
        )
        failing = _gauge(
            "osas_reconcile_failing_seconds",
            "Seconds since syncs with each place's OpenStack began failing, the first sync's "
            "attempts included; 0 once one works. The cause: /status (places[].syncs."
            "last_error) and the status label of osas_openstack_requests_total.",
            PLACE_LABELS,
        )
        refused = _gauge(
            "osas_credentials_refused",
            "1 while a place's OpenStack refuses osas's credentials (401 after a fresh token): "
            "its creates wait; fix the credentials (an operator's error, not an outage).",
            PLACE_LABELS,
        )
        offset = _gauge(
            "osas_nova_clock_offset_seconds",
            "Each place's Nova clock minus osas's, from the Date of Nova's last answer to a "
            "listing (whole seconds, so within about 1 s means equal). osas takes "
            "changes-since from Nova's clock, so an offset loses nothing; it is logged once "
            "when over 5 s.",
            PLACE_LABELS,
        )
        held = _gauge(
            "osas_scale_ups_held_seconds",
            "Seconds until scale-ups in a place may spend headroom again after a start or a "
            "takeover (creates an earlier osas sent may still reach Nova); 0 when they may.",
            PLACE_LABELS,
        )
        for place in self._places:
            where = [place.cloud, place.region]
            status = place.reconciler.status
            seconds = place.inventory.age(now)
            if seconds is not None:
                age.add_metric(where, seconds)
            since = status.failing_since
            failing.add_metric(where, 0.0 if since is None else now - since)
            refused.add_metric(where, float(status.credentials_refused is not None))
            if status.nova_clock_offset is not None:
                offset.add_metric(where, status.nova_clock_offset)
            held.add_metric(where, place.inventory.ledger.headroom_held(now) or 0.0)
        yield from (age, failing, refused, offset)
        leader = _gauge(
            "osas_leader",
            "1 while this osas is the writer (it holds the leader lease, or election is off); "
            "0 on a standby, which answers CA nothing and keeps its inventory warm.",
        )
        leader.add_metric([], float(self._leading()))
        yield leader
        yield held
        problems = _gauge(
            "osas_server_problems",
            "Servers in a problem state now (error, build-stuck, delete-stuck, "
            "unconfigured-group, shared-request-id), by node group; osas never deletes them on "
            "its own.",
            ["group", "problem"],
        )
        counts: dict[tuple[str, Problem], int] = {}
        groups: set[str] = set()
        unjoined: dict[str, object] = {}
        for place in self._places:
            counts.update(place.reconciler.problems.counts())
            groups.update(spec.group_id for spec in place.inventory.cluster.node_groups)
            unjoined.update(place.reconciler.unjoined.active())
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
        for group in sorted(groups | unjoined.keys()):
            group_problems.add_metric(
                [group, GroupProblem.DELETED_BEFORE_JOINING.value], int(group in unjoined)
            )
        yield group_problems

    def _groups(self) -> Iterator[Metric]:
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
        warm = _gauge(
            "osas_warm_pool_servers",
            "Servers prepared for each node group and waiting in its warm pool, by Nova's "
            "status (SHUTOFF, BUILD...): never in CA's view nor in osas_inventory_servers.",
            ["group", "status"],
        )
        place_of = _gauge(
            "osas_node_group_place",
            "1 for the cloud and region each node group lives in (join on group to say "
            "where a group's figures come from).",
            ["group", *PLACE_LABELS],
        )
        now = self._clock()
        for place in self._places:
            inventory, census = place.inventory, place.census
            for spec in inventory.cluster.node_groups:
                group = spec.group_id
                place_of.add_metric([group, place.cloud, place.region], 1)
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
                for status, count in inventory.warm.census(group).items():
                    warm.add_metric([group, status], count)
        yield from (minimum, maximum, reported, headroom, target, servers, creates, in_doubt)
        yield warm
        yield place_of

    def _work(self) -> Iterator[Metric]:
        depth = _gauge(
            "osas_queue_depth",
            "Tasks queued in each place, by kind (create, delete).",
            [*PLACE_LABELS, "kind"],
        )
        capacity = _gauge(
            "osas_queue_capacity",
            "Tasks each place's queue holds at most (queue.capacity).",
            PLACE_LABELS,
        )
        busy = _gauge("osas_workers_busy", "Tasks being worked on now, per place.", PLACE_LABELS)
        for place in self._places:
            queue, where = place.queue, [place.cloud, place.region]
            deletes = queue.queued_deletes()
            depth.add_metric([*where, "create"], len(queue) - deletes)
            depth.add_metric([*where, "delete"], deletes)
            capacity.add_metric(where, queue.capacity)
            busy.add_metric(where, queue.in_hand_count() - len(queue))
        yield from (depth, capacity, busy)
        workers = _gauge(
            "osas_workers", "Workers (queue.workers), besides the one that only deletes."
        )
        workers.add_metric([], self._workers)
        yield workers
