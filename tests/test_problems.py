"""The problem watch, without I/O: servers that need a person are reported once when they
enter a problem state and once when they leave it, and never acted on."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from osas.domain.problems import (
    FAKE_NODE_REASON,
    GroupProblem,
    GroupProblemChange,
    JoinSettings,
    JoinWatch,
    Problem,
    ProblemSettings,
    ProblemWatch,
    is_fake_node,
    never_registered,
)
from osas.domain.servers import Fault, Server
from osas.domain.snapshot import Snapshot

T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
CONFIGURED = frozenset({"workers"})
SETTINGS = ProblemSettings(stuck_build_after=1800.0, stuck_delete_after=600.0)


def server(server_id: str, status: str = "ACTIVE", group: str = "workers", **changes) -> Server:
    made = Server(
        server_id=server_id,
        name_stem=f"testc-{group}-{server_id}",
        group_id=group,
        status=status,
        task_state=None,
        request_id=None,
        fault=None,
        created=T0,
    )
    return replace(made, **changes)


class World:
    """A snapshot that listings change, and the watch reviewing it as the reconciler does."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self.watch = ProblemWatch(SETTINGS)
        self.marked: set[str] = set()

    def listing(self, *servers: Server, gone: tuple[str, ...] = ()) -> None:
        self.snapshot.apply_changes(servers, gone, 0.0)
        self.watch.observe(servers)

    def review(self, at: float) -> list[tuple[str, str, bool]]:
        changes = self.watch.review(self.snapshot, self.marked, CONFIGURED, T0 + at)
        return [(c.problem.value, c.server_id, c.started) for c in changes]


def test_healthy_servers_are_no_problem():
    world = World()
    world.listing(server("a"), server("b", "BUILD"))
    assert world.review(0) == []
    assert world.review(1000) == []
    assert world.watch.counts() == {}


def test_an_error_server_is_told_once_on_entering_and_once_on_leaving():
    world = World()
    fault = Fault(500, "No valid host was found. There are not enough hosts available.")
    world.listing(server("a", "ERROR", fault=fault))
    changes = world.watch.review(world.snapshot, world.marked, CONFIGURED, T0)
    assert [(c.problem, c.server_id, c.started) for c in changes] == [(Problem.ERROR, "a", True)]
    assert changes[0].detail.startswith("NoValidHost: No valid host")
    assert world.review(60) == []  # still in ERROR: nothing new to say
    assert world.watch.counts() == {("workers", Problem.ERROR): 1}
    world.listing(gone=("a",))
    assert world.review(120) == [("error", "a", False)]
    assert world.review(180) == []
    assert world.watch.counts() == {}


def test_build_is_stuck_only_past_the_threshold_counted_from_novas_created_time():
    world = World()
    world.listing(server("a", "BUILD"))
    assert world.review(1799) == []
    assert world.review(1800) == [("build-stuck", "a", True)]
    assert world.review(2400) == []
    world.listing(server("a", "ACTIVE"))
    changes = world.watch.review(world.snapshot, world.marked, CONFIGURED, T0 + 2500)
    assert [(c.problem.value, c.started, c.detail) for c in changes] == [
        ("build-stuck", False, "now ACTIVE")
    ]
    assert changes[0].lasted == 700


def test_a_server_found_in_build_long_after_its_creation_is_stuck_at_once():
    """After a restart, the server's own creation time counts, not when osas first saw it."""
    world = World()
    world.listing(server("a", "BUILD"))
    assert world.review(4 * 3600) == [("build-stuck", "a", True)]


def test_a_delete_that_does_not_finish_is_stuck_until_the_server_goes():
    world = World()
    world.listing(server("a"))
    world.marked.add("a")  # the ledger marked it deleting
    assert world.review(0) == []
    assert world.review(599) == []
    assert world.review(600) == [("delete-stuck", "a", True)]
    assert world.review(900) == []
    world.listing(gone=("a",))
    world.marked.discard("a")
    assert world.review(960) == [("delete-stuck", "a", False)]


def test_novas_own_deleting_state_counts_as_being_deleted():
    world = World()
    world.listing(server("a", task_state="deleting"))
    assert world.review(0) == []
    assert world.review(700) == [("delete-stuck", "a", True)]


def test_a_server_of_a_group_not_configured_is_told_once_and_left_alone():
    world = World()
    world.listing(server("a", group="retired"), server("b", group="retired", status="BUILD"))
    assert world.review(0) == [
        ("unconfigured-group", "a", True),
        ("unconfigured-group", "b", True),
    ]
    assert world.review(10) == []
    assert world.watch.counts() == {("retired", Problem.UNCONFIGURED_GROUP): 2}
    assert "a" in world.snapshot  # never removed by the watch
    world.listing(gone=("a", "b"))
    assert world.review(20) == [
        ("unconfigured-group", "a", False),
        ("unconfigured-group", "b", False),
    ]


def test_one_server_can_be_in_two_states_each_told_on_its_own():
    world = World()
    world.listing(server("a", "ERROR"))
    assert world.review(0) == [("error", "a", True)]
    world.marked.add("a")  # CA deletes it, and the delete never finishes
    assert world.review(10) == []
    assert world.review(610) == [("delete-stuck", "a", True)]
    assert world.watch.counts() == {
        ("workers", Problem.ERROR): 1,
        ("workers", Problem.DELETE_STUCK): 1,
    }


def test_a_server_forgotten_without_a_listing_leaves_its_state():
    """Nova's 404 on delete removes a server from the snapshot between listings."""
    world = World()
    world.listing(server("a", "ERROR"))
    assert world.review(0) == [("error", "a", True)]
    world.snapshot.forget("a")
    assert world.review(5) == [("error", "a", False)]


def test_healthy_servers_are_not_looked_at_again():
    """The review costs what is building, failing or being deleted, not the cluster size."""
    world = World()
    world.listing(*(server(f"s{i}") for i in range(1000)), server("b", "BUILD"))
    world.review(0)
    assert world.watch._candidates == {"b"}


# -- a node group whose servers CA deletes before they join -------------------------------------

JOIN = JoinSettings(threshold=3, window=7200.0)
BEFORE_JOINING = GroupProblem.DELETED_BEFORE_JOINING


def made(server_id: str, at: float) -> Server:
    """A server Nova created ``at`` seconds after T0."""
    return server(server_id, created=T0 + at)


def told(changes: list[GroupProblemChange]) -> list[tuple[str, bool, int]]:
    return [(c.group_id, c.started, c.servers) for c in changes]


def test_the_third_server_deleted_before_joining_makes_the_groups_problem_once():
    watch = JoinWatch(JOIN)
    assert watch.deleted_unjoined("workers", [made("a", 0)], T0 + 900) == (1, [])
    assert watch.deleted_unjoined("workers", [made("a", 0)], T0 + 910) == (0, [])  # CA again
    assert watch.deleted_unjoined("workers", [made("b", 900)], T0 + 1800) == (1, [])
    assert watch.active() == {}
    added, changes = watch.deleted_unjoined("workers", [made("c", 1800)], T0 + 2700)
    assert (added, told(changes)) == (1, [("workers", True, 3)])
    assert changes[0].problem is BEFORE_JOINING
    assert changes[0].detail == (
        "3 servers deleted by CA before they joined within 2h, none created since has joined"
    )
    assert watch.active() == {"workers": (3, T0 + 2700)}
    # Still going on: nothing new to tell.
    assert watch.deleted_unjoined("workers", [made("d", 2700)], T0 + 3600) == (1, [])
    assert watch.active() == {"workers": (4, T0 + 2700)}
    assert watch.active().keys() == {"workers"}
    assert not watch.watching("gpu")


def test_a_server_created_after_them_joining_ends_it_an_older_one_does_not():
    watch = JoinWatch(JOIN)
    watch.deleted_unjoined("workers", [made("a", 100), made("b", 100), made("c", 200)], T0 + 1000)
    assert watch.active() == {"workers": (3, T0 + 1000)}
    # Nodes that joined before the trouble began are asked about every loop: no news.
    assert watch.joined("workers", made("old", -3600), T0 + 1010) == []
    assert watch.joined("workers", made("older", 99), T0 + 1020) == []
    # A server created with the first two (the same second) joined: they are no evidence.
    changes = watch.joined("workers", made("sibling", 100), T0 + 1030)
    assert told(changes) == [("workers", False, 1)]
    assert changes[0].detail == "server sibling joined"
    assert changes[0].lasted == 30
    assert watch.active() == {}
    assert watch.watching("workers")  # c is still counted
    assert told(watch.joined("workers", made("e", 300), T0 + 1040)) == []
    assert not watch.watching("workers")  # nothing left to watch for


def test_a_server_osas_had_not_listed_counts_from_its_deletion():
    """A server known by its id alone (created, not yet listed): created before CA deleted
    it, so a join of a server created after that deletion ends it, an earlier one does not."""
    watch = JoinWatch(JoinSettings(threshold=1, window=7200.0))
    assert told(watch.deleted_unjoined("workers", ["unlisted"], T0 + 600)[1]) == [
        ("workers", True, 1)
    ]
    assert watch.joined("workers", made("x", 500), T0 + 700) == []
    assert told(watch.joined("workers", made("y", 650), T0 + 800)) == [("workers", False, 0)]


def test_the_problem_ends_when_the_deletions_age_past_the_window():
    watch = JoinWatch(JOIN)
    watch.deleted_unjoined("workers", [made("a", 0)], T0 + 100)
    watch.deleted_unjoined("workers", [made("b", 0), made("c", 0)], T0 + 1000)
    configured = {"workers"}
    assert watch.review(configured, T0 + 7299) == []
    changes = watch.review(configured, T0 + 7300)  # a's deletion is 2h old: 2 left
    assert told(changes) == [("workers", False, 2)]
    assert changes[0].detail == "fewer than 3 deleted before joining in the last 2h"
    assert watch.watching("workers")
    assert watch.review(configured, T0 + 8200) == []  # below the threshold already
    assert not watch.watching("workers")


def test_a_group_no_longer_configured_leaves_its_problem():
    watch = JoinWatch(JOIN)
    watch.deleted_unjoined("retired", [made("a", 0), made("b", 0), made("c", 0)], T0)
    assert watch.review({"retired"}, T0 + 1) == []
    changes = watch.review({"workers"}, T0 + 2)
    assert [(c.group_id, c.started, c.detail) for c in changes] == [
        ("retired", False, "node group no longer configured")
    ]
    assert watch.active() == {}


def test_cas_fake_nodes_are_told_apart_by_its_annotation():
    assert never_registered({FAKE_NODE_REASON: "unregistered"})
    assert not never_registered({FAKE_NODE_REASON: "create-error"})
    assert not never_registered({"node.alpha.kubernetes.io/ttl": "0"})
    assert is_fake_node({FAKE_NODE_REASON: "create-error"})
    assert not is_fake_node({})


def test_the_problems_that_hold_are_listed_with_since_when_and_why():
    """What /status shows of each server needing a person: by problem, the longest-standing
    first, with the review that first saw it and the reason logged then."""
    world = World()
    fault = Fault(500, "No valid host was found.")
    world.listing(server("b", "BUILD"), server("e", "ERROR", fault=fault))
    world.review(1800)  # b stuck, e in error
    world.listing(server("a", "BUILD", created=T0 - 60))
    world.listing(server("s", group="retired"))
    world.review(1900)  # a stuck too, later than b; s of a group not configured
    listed = [
        (entry.problem.value, entry.server_id, entry.group_id, entry.since - T0, entry.detail)
        for entry in world.watch.listed()
    ]
    assert listed == [
        ("error", "e", "workers", 1800, "NoValidHost: No valid host was found."),
        ("build-stuck", "b", "workers", 1800, STUCK_BUILD),
        ("build-stuck", "a", "workers", 1900, STUCK_BUILD),
        ("unconfigured-group", "s", "retired", 1900, "node group 'retired'"),
    ]
    world.listing(server("b", "ACTIVE"), gone=("e",))
    world.review(2000)
    assert [entry.server_id for entry in world.watch.listed()] == ["a", "s"]


STUCK_BUILD = "in BUILD longer than reconcile.stuck_build_after (30m)"
