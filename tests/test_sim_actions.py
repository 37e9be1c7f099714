"""Server actions on the simulated Nova, driven by unmodified openstacksdk over HTTP.

os-start, os-stop, pause, unpause, suspend, resume, shelve, shelveOffload and unshelve as
Nova's API takes them (nova/api/openstack/compute/servers.py, pause_server.py,
suspend_server.py, shelve.py): 202 with no body, 409 ``conflictingRequest`` in a state the
action does not take (nova/compute/api.py's ``check_instance_state``), 404 for a server that is
not there; the task state while the compute host works (``powering-on``, ``shelving``...), the
status, vm_state and power_state it ends in, each after its own timing; ``updated`` bumped at
every step so that ``changes-since`` sees it; the quota an offloaded server stops holding and
its unshelve re-checks; and the faults a warm pool must survive: a start that fails, one that
stalls, an unshelve refused for quota or finding no host.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import openstack.exceptions
import pytest
from test_sim import (
    SDK_OWN_WARNINGS,
    TAG,
    boot_args,
    boot_from_volume,
    control,
    wait_until,
)

from osas.cloud.port import CreateServerRequest
from osas.sim import SimulatedOpenStack
from osas.sim.model import START_FAILED, FakeNova, NovaRefusal

pytestmark = SDK_OWN_WARNINGS

MICROVERSION = "2.100"


@pytest.fixture
def sim():
    with SimulatedOpenStack(FakeNova(build_seconds=0.0)) as simulated:
        yield simulated


def active(conn, name: str = "n1", **extra) -> str:
    created = conn.compute.create_server(**boot_args(conn, name), tags=[TAG], **extra)
    server = conn.compute.wait_for_server(created, status="ACTIVE", interval=0.05, wait=10)
    return str(server.id)


def state(conn, server_id: str) -> tuple[str, str | None]:
    server = conn.compute.get_server(server_id)
    return server.status, server.task_state


def settles(conn, server_id: str, status: str, timeout: float = 10.0):
    """The server once it shows ``status`` with no task running."""

    def settled():
        server = conn.compute.get_server(server_id)
        return server if (server.status, server.task_state) == (status, None) else None

    return wait_until(settled, f"{server_id} to settle in {status}", timeout)


def action(conn, server_id: str, body: dict, microversion: str = MICROVERSION):
    """The raw answer of ``POST /servers/{id}/action``."""
    return conn.compute.post(
        f"/servers/{server_id}/action",
        json=body,
        microversion=microversion,
        raise_exc=False,
    )


def timings(sim, **values) -> None:
    status, _ = control(sim, "POST", "/_sim/nova", values)
    assert status == 200, values


# -- every action through openstacksdk: states, task states, timings ---------------------------


def test_stop_and_start_run_through_their_task_states_in_their_own_time(sim, conn):
    server_id = active(conn)
    timings(sim, stop_seconds=0.6, start_seconds=0.6)

    answer = action(conn, server_id, {"os-stop": None})
    assert (answer.status_code, answer.content) == (202, b"")
    asked = time.monotonic()
    stopping = conn.compute.get_server(server_id)
    assert (stopping.status, stopping.task_state) == ("ACTIVE", "powering-off")
    assert (stopping.vm_state, stopping.power_state) == ("active", 1)  # still running
    stopped = settles(conn, server_id, "SHUTOFF")
    assert time.monotonic() - asked >= 0.6
    assert (stopped.vm_state, stopped.power_state) == ("stopped", 4)
    assert stopped.host_id  # still on its host
    assert stopped.addresses  # its port kept
    assert stopped.fault is None

    conn.compute.start_server(server_id)
    asked = time.monotonic()
    assert state(conn, server_id) == ("SHUTOFF", "powering-on")
    started = settles(conn, server_id, "ACTIVE")
    assert time.monotonic() - asked >= 0.6
    assert (started.vm_state, started.power_state) == ("active", 1)
    assert sim.calls["compute.servers.action"] == 2


@pytest.mark.parametrize(
    "case",
    [
        {
            "there": ("pause_server", "pause", "pausing"),
            "held": ("PAUSED", "paused", 3),
            "back": ("unpause_server", "unpause", "unpausing"),
        },
        {
            "there": ("suspend_server", "suspend", "suspending"),
            "held": ("SUSPENDED", "suspended", 4),
            "back": ("resume_server", "resume", "resuming"),
        },
    ],
    ids=["pause", "suspend"],
)
def test_pause_and_suspend_and_back(sim, conn, case):
    server_id = active(conn)
    (there, there_timing, there_task) = case["there"]
    (back, back_timing, back_task) = case["back"]
    status, vm_state, power_state = case["held"]
    timings(sim, **{f"{there_timing}_seconds": 0.3, f"{back_timing}_seconds": 0.3})
    getattr(conn.compute, there)(server_id)
    assert state(conn, server_id) == ("ACTIVE", there_task)
    held = settles(conn, server_id, status)
    assert (held.vm_state, held.power_state) == (vm_state, power_state)
    getattr(conn.compute, back)(server_id)
    assert state(conn, server_id) == (status, back_task)
    settles(conn, server_id, "ACTIVE")


def test_shelve_offloads_at_once_by_default_and_unshelve_schedules_again(sim, conn):
    server_id = active(conn)
    timings(sim, shelve_seconds=0.6, shelve_offload_seconds=0.6, unshelve_seconds=1.2)

    conn.compute.shelve_server(server_id)
    assert state(conn, server_id) == ("ACTIVE", "shelving")
    seen = wait_until(
        lambda: state(conn, server_id) == ("SHELVED", "shelving_offloading"), "shelved"
    )
    assert seen
    offloaded = settles(conn, server_id, "SHELVED_OFFLOADED")
    assert (offloaded.vm_state, offloaded.power_state) == ("shelved_offloaded", 4)
    assert offloaded.host_id == ""  # off its host
    assert offloaded.availability_zone == "nova"
    assert offloaded.addresses  # its ports are kept, unbound

    conn.compute.unshelve_server(server_id)
    asked = time.monotonic()
    assert state(conn, server_id) == ("SHELVED_OFFLOADED", "unshelving")  # scheduling
    spawning = wait_until(
        lambda: state(conn, server_id) == ("SHELVED_OFFLOADED", "spawning"), "spawning"
    )
    assert spawning
    assert conn.compute.get_server(server_id).host_id  # on a host again
    settles(conn, server_id, "ACTIVE")
    assert time.monotonic() - asked >= 1.2


def test_shelve_without_offload_then_offload_is_admin_only_unless_the_policy_allows(sim, conn):
    server_id = active(conn)
    timings(sim, shelved_offload_time=-1, start_seconds=0.3)
    conn.compute.shelve_server(server_id)
    shelved = settles(conn, server_id, "SHELVED")
    assert (shelved.vm_state, shelved.power_state) == ("shelved", 4)
    assert shelved.host_id  # still on its host

    with pytest.raises(openstack.exceptions.ForbiddenException) as refused:
        conn.compute.shelve_offload_server(server_id)
    assert "os_compute_api:os-shelve:shelve_offload" in str(refused.value)
    timings(sim, allow_shelve_offload=True)
    conn.compute.shelve_offload_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")

    # Unshelving a server still on its host is a start (Nova's conductor asks for one).
    other = active(conn, "n2")
    conn.compute.shelve_server(other)
    settles(conn, other, "SHELVED")
    conn.compute.unshelve_server(other)
    assert state(conn, other) == ("SHELVED", "powering-on")
    settles(conn, other, "ACTIVE")


def test_a_shelved_server_is_offloaded_after_shelved_offload_time(sim, conn):
    server_id = active(conn)
    timings(sim, shelved_offload_time=0.5)
    conn.compute.shelve_server(server_id)
    assert settles(conn, server_id, "SHELVED")
    shelved = time.monotonic()
    settles(conn, server_id, "SHELVED_OFFLOADED")
    assert time.monotonic() - shelved >= 0.3


def test_a_volume_backed_server_is_offloaded_without_a_snapshot(sim, conn):
    created = conn.compute.create_server(**boot_from_volume(conn, "bfv", 10))
    conn.compute.wait_for_server(created, interval=0.05, wait=10)
    timings(sim, shelve_seconds=30, shelve_offload_seconds=0.3)
    conn.compute.shelve_server(created.id)
    assert state(conn, created.id) == ("ACTIVE", "shelving")
    settles(conn, created.id, "SHELVED_OFFLOADED", timeout=5)  # never SHELVED, no snapshot


def test_openstacksdk_waits_for_each_state(sim, conn):
    server_id = active(conn)
    compute = conn.compute
    for act, status in (
        (compute.stop_server, "SHUTOFF"),
        (compute.start_server, "ACTIVE"),
        (compute.pause_server, "PAUSED"),
        (compute.unpause_server, "ACTIVE"),
        (compute.suspend_server, "SUSPENDED"),
        (compute.resume_server, "ACTIVE"),
        (compute.shelve_server, "SHELVED_OFFLOADED"),
        (compute.unshelve_server, "ACTIVE"),
    ):
        act(server_id)
        server = compute.wait_for_server(
            compute.get_server(server_id), status=status, interval=0.05, wait=10
        )
        assert server.status == status


# -- refusals -----------------------------------------------------------------------------------


def test_an_action_in_the_wrong_state_is_409_in_novas_words(sim, conn):
    server_id = active(conn)
    for body, name in (
        ({"os-start": None}, "start"),
        ({"unpause": None}, "unpause"),
        ({"resume": None}, "resume"),
        ({"unshelve": None}, "unshelve"),
    ):
        answer = action(conn, server_id, body)
        assert answer.status_code == 409, body
        assert answer.json() == {
            "conflictingRequest": {
                "code": 409,
                "message": f"Cannot '{name}' instance {server_id} while it is in vm_state active",
            }
        }
    with pytest.raises(openstack.exceptions.ConflictException, match="vm_state active"):
        conn.compute.start_server(server_id)

    timings(sim, stop_seconds=30)
    conn.compute.stop_server(server_id)
    with pytest.raises(openstack.exceptions.ConflictException) as running:
        conn.compute.pause_server(server_id)  # active, but a task runs
    assert f"Cannot 'pause' instance {server_id} while it is in task_state powering-off" in str(
        running.value
    )
    timings(sim, stop_seconds=0)
    settles(conn, server_id, "SHUTOFF")
    for refused in (conn.compute.stop_server, conn.compute.pause_server):
        with pytest.raises(openstack.exceptions.ConflictException, match="vm_state stopped"):
            refused(server_id)

    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    with pytest.raises(openstack.exceptions.ConflictException) as no_host:
        conn.compute.start_server(server_id)
    assert f"Instance {server_id} is not ready" in str(no_host.value)  # no host to start on
    with pytest.raises(openstack.exceptions.ConflictException, match="vm_state shelved_offl"):
        conn.compute.set_server_metadata(server_id, role="x")

    sim.nova.faults.no_valid_host = 1
    created = conn.compute.create_server(**boot_args(conn, "broken"))
    assert conn.compute.get_server(created.id).status == "ERROR"
    with pytest.raises(openstack.exceptions.ConflictException, match="is not ready"):
        conn.compute.stop_server(created.id)  # ERROR is a state stop takes, but no host


def test_unknown_servers_are_404_and_unknown_bodies_400(sim, conn):
    missing = "5f5a4c4e-0000-4000-8000-000000000000"
    compute = conn.compute
    for act in (
        compute.start_server,
        compute.stop_server,
        compute.pause_server,
        compute.unpause_server,
        compute.suspend_server,
        compute.resume_server,
        compute.shelve_server,
        compute.shelve_offload_server,
        compute.unshelve_server,
    ):
        with pytest.raises(openstack.exceptions.NotFoundException):
            act(missing)
    answer = action(conn, missing, {"os-start": None})
    assert answer.json() == {
        "itemNotFound": {"code": 404, "message": f"Instance {missing} could not be found."}
    }
    # The action is read from the body before the server is looked up, as Nova's WSGI does.
    for body, message in (
        ({"reboot-ish": None}, "There is no such action: reboot-ish"),
        ({"os-start": None, "os-stop": None}, "Malformed request body"),
        ({}, "Malformed request body"),
    ):
        answer = action(conn, missing, body)
        assert answer.status_code == 400, body
        assert answer.json()["badRequest"]["message"] == message


def test_unshelve_bodies_follow_the_microversion(sim, conn):
    server_id = active(conn)
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")

    for body, version, message in (
        ({"unshelve": {}}, "2.77", "'availability_zone' is a required property"),
        ({"unshelve": {"availability_zone": "nova", "host": "h"}}, "2.77", "'host' was unexp"),
        ({"unshelve": {"availability_zone": None}}, "2.77", "is not of type 'string'"),
        ({"unshelve": {"availability_zone": " nova"}}, "2.77", "invalid 'name' value"),
        ({"unshelve": "nova"}, "2.91", "is not of type 'object', 'null'"),
        ({"unshelve": {"zone": "nova"}}, "2.91", "'zone' was unexpected"),
        ({"unshelve": {"availability_zone": "elsewhere"}}, "2.77", "zone is not available"),
    ):
        answer = action(conn, server_id, body, version)
        assert answer.status_code == 400, (body, version)
        assert message in answer.json()["badRequest"]["message"], (body, version)
    answer = action(conn, server_id, {"unshelve": {"host": "compute-1"}}, "2.91")
    assert answer.status_code == 403  # unshelve to a host is an admin's policy
    assert "unshelve_to_host" in answer.json()["forbidden"]["message"]

    # Before 2.77 any value is taken and ignored.
    assert action(conn, server_id, {"unshelve": {"anything": 1}}, "2.76").status_code == 202
    settles(conn, server_id, "ACTIVE")

    # A zone or a host for a server still on its host is a 409 (it is not rescheduled).
    timings(sim, shelved_offload_time=-1)
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED")
    answer = action(conn, server_id, {"unshelve": {"availability_zone": "nova"}}, "2.77")
    assert answer.status_code == 409
    assert (
        'with status "shelved" is not supported' in answer.json()["conflictingRequest"]["message"]
    )
    timings(sim, allow_shelve_offload=True)
    conn.compute.shelve_offload_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    sim.nova.availability_zones.append("az-2")
    conn.compute.unshelve_server(server_id, availability_zone="az-2")  # openstacksdk's 2.91 form
    assert settles(conn, server_id, "ACTIVE").availability_zone == "az-2"
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED")
    conn.compute.shelve_offload_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    conn.compute.unshelve_server(server_id, availability_zone=None)  # unpinned
    assert settles(conn, server_id, "ACTIVE").availability_zone == "nova"


# -- quota per state ----------------------------------------------------------------------------


def test_an_offloaded_server_frees_cores_and_ram_and_its_unshelve_rechecks_them(sim, conn):
    sim.nova.quota.cores = 2  # two m1.small
    first, second = active(conn, "first"), active(conn, "second")
    with pytest.raises(openstack.exceptions.ForbiddenException, match="Quota exceeded for cores"):
        conn.compute.create_server(**boot_args(conn, "third"))

    for act in (conn.compute.stop_server, conn.compute.pause_server):
        # Stopped or paused, a server keeps its place on the host, and its quota.
        target = "SHUTOFF" if act == conn.compute.stop_server else "PAUSED"
        act(first)
        settles(conn, first, target)
        with pytest.raises(openstack.exceptions.ForbiddenException, match="Quota exceeded"):
            conn.compute.create_server(**boot_args(conn, "third"))
        (conn.compute.start_server if target == "SHUTOFF" else conn.compute.unpause_server)(first)
        settles(conn, first, "ACTIVE")

    conn.compute.shelve_server(first)
    settles(conn, first, "SHELVED_OFFLOADED")
    limits = conn.compute.get_limits().absolute
    assert (limits.instances_used, limits.total_cores_used, limits.total_ram_used) == (2, 1, 2048)
    third = active(conn, "third")  # the offloaded server's cores were free

    answer = action(conn, first, {"unshelve": None})
    assert answer.status_code == 403
    assert answer.json() == {
        "forbidden": {"code": 403, "message": "Quota exceeded for resources: ['cores']"}
    }
    with pytest.raises(openstack.exceptions.ForbiddenException, match="Quota exceeded"):
        conn.compute.unshelve_server(first)
    assert state(conn, first) == ("SHELVED_OFFLOADED", None)

    conn.compute.delete_server(third)
    conn.compute.unshelve_server(first)
    settles(conn, first, "ACTIVE")
    assert conn.compute.get_limits().absolute.total_cores_used == 2
    assert second


def test_an_offloaded_server_still_counts_as_an_instance(sim, conn):
    sim.nova.quota.instances = 1
    server_id = active(conn)
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    with pytest.raises(openstack.exceptions.ForbiddenException, match="instances"):
        conn.compute.create_server(**boot_args(conn, "second"))
    conn.compute.unshelve_server(server_id)  # instances are not re-checked: it is counted
    settles(conn, server_id, "ACTIVE")


def test_legacy_counting_keeps_counting_an_offloaded_server(sim, conn):
    status, quota = control(
        sim, "POST", "/_sim/quota", {"count_usage_from_placement": False, "cores": 1}
    )
    assert (status, quota["quota"]["count_usage_from_placement"]) == (200, False)
    sim.nova.faults.unshelve_quota_exceeded = 1  # Nova does not check: not consumed
    server_id = active(conn)
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    assert conn.compute.get_limits().absolute.total_cores_used == 1
    with pytest.raises(openstack.exceptions.ForbiddenException, match="Quota exceeded"):
        conn.compute.create_server(**boot_args(conn, "second"))
    conn.compute.unshelve_server(server_id)
    settles(conn, server_id, "ACTIVE")
    assert sim.nova.faults.unshelve_quota_exceeded == 1
    assert control(sim, "POST", "/_sim/quota", {"count_usage_from_placement": 1})[0] == 400


# -- faults -------------------------------------------------------------------------------------


def test_a_failed_start_leaves_the_server_shutoff_with_its_fault_unseen(sim, conn):
    server_id = active(conn)
    conn.compute.stop_server(server_id)
    settles(conn, server_id, "SHUTOFF")
    status, faults = control(sim, "POST", "/_sim/faults", {"start_fails": 1})
    assert (status, faults["faults"]["start_fails"]) == (200, 1)
    timings(sim, start_seconds=0.3)
    since = datetime.now(UTC) - timedelta(seconds=1)

    conn.compute.start_server(server_id)
    assert state(conn, server_id) == ("SHUTOFF", "powering-on")
    failed = settles(conn, server_id, "SHUTOFF")
    assert failed.fault is None  # Nova's view shows faults on ERROR and DELETED servers only
    assert failed.power_state == 4
    listed = control(sim, "GET", "/_sim/servers")[1]["servers"]
    assert [s["fault"] for s in listed if s["id"] == server_id] == [START_FAILED]
    assert sim.nova.faults.start_fails == 0
    assert sim.nova.find_server(server_id).record().fault is None

    conn.compute.start_server(server_id)  # the next start works
    settles(conn, server_id, "ACTIVE")
    conn.compute.delete_server(server_id)
    deleted = {s.id: s for s in conn.compute.servers(details=True, changes_since=since)}
    assert deleted[server_id].status == "DELETED"
    assert deleted[server_id].fault["message"] == START_FAILED  # the instance's last fault


def test_a_stalled_start_stays_powering_on_until_activated(sim, conn):
    server_id = active(conn)
    conn.compute.stop_server(server_id)
    settles(conn, server_id, "SHUTOFF")
    assert control(sim, "POST", "/_sim/faults", {"start_stalls": 1})[0] == 200
    conn.compute.start_server(server_id)
    time.sleep(0.3)
    assert state(conn, server_id) == ("SHUTOFF", "powering-on")
    with pytest.raises(openstack.exceptions.ConflictException, match="task_state powering-on"):
        conn.compute.start_server(server_id)

    status, answer = control(sim, "POST", "/_sim/activate", {})
    assert (status, answer) == (200, {"activated": []})  # builds only
    assert state(conn, server_id) == ("SHUTOFF", "powering-on")
    status, answer = control(sim, "POST", "/_sim/activate", {"id": server_id})
    assert (status, answer) == (200, {"activated": [server_id]})
    assert state(conn, server_id) == ("ACTIVE", None)


def test_a_stalled_start_can_be_deleted(sim, conn):
    server_id = active(conn)
    conn.compute.stop_server(server_id)
    settles(conn, server_id, "SHUTOFF")
    sim.nova.faults.start_stalls = 1
    timings(sim, delete_seconds=0.3)
    conn.compute.start_server(server_id)
    conn.compute.delete_server(server_id)
    assert state(conn, server_id) == ("SHUTOFF", "deleting")

    def gone() -> bool:
        try:
            conn.compute.get_server(server_id)
        except openstack.exceptions.NotFoundException:
            return True
        return False

    assert wait_until(gone, "the delete")


def test_an_unshelve_that_finds_no_host_leaves_the_server_offloaded(sim, conn):
    sim.nova.quota.cores = 1
    server_id = active(conn)
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    assert control(sim, "POST", "/_sim/faults", {"unshelve_no_valid_host": 1})[0] == 200
    timings(sim, unshelve_seconds=0.4)
    conn.compute.unshelve_server(server_id)
    assert state(conn, server_id) == ("SHELVED_OFFLOADED", "unshelving")
    assert conn.compute.get_limits().absolute.total_cores_used == 1  # claimed while scheduled
    time.sleep(0.5)
    back = conn.compute.get_server(server_id)
    # Nova's conductor clears the task and leaves it there (no ERROR, no fault in the view).
    assert (back.status, back.task_state, back.fault) == ("SHELVED_OFFLOADED", None, None)
    assert conn.compute.get_limits().absolute.total_cores_used == 0
    conn.compute.unshelve_server(server_id)
    settles(conn, server_id, "ACTIVE")


def test_an_unshelve_refused_for_quota_by_the_fault(sim, conn):
    server_id = active(conn)
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    assert control(sim, "POST", "/_sim/faults", {"unshelve_quota_exceeded": 1})[0] == 200
    with pytest.raises(openstack.exceptions.ForbiddenException, match="Quota exceeded"):
        conn.compute.unshelve_server(server_id)
    assert state(conn, server_id) == ("SHELVED_OFFLOADED", None)
    conn.compute.unshelve_server(server_id)
    settles(conn, server_id, "ACTIVE")


# -- changes-since, deletes ---------------------------------------------------------------------


def test_changes_since_sees_every_step_of_every_action(sim, conn):
    """Nova's clock moves a minute ahead before each step; a changes-since half a minute back
    finds the server only if that step stamped ``updated``."""
    server_id = active(conn)
    step = {"seconds": 0.0}
    names = ("stop", "start", "pause", "unpause", "suspend", "resume")
    timings(sim, **{f"{name}_seconds": 0.3 for name in names})
    # Steps that follow one another last longer: each must be seen on its own.
    timings(sim, shelve_seconds=0.6, shelve_offload_seconds=0.6, unshelve_seconds=1.2)

    def changed() -> dict[str, tuple[str, str | None]]:
        since = datetime.now(UTC) + timedelta(seconds=step["seconds"] - 30)
        listed = conn.compute.servers(details=True, changes_since=since.isoformat())
        return {server.id: (server.status, server.task_state) for server in listed}

    def tick() -> None:
        step["seconds"] += 60
        sim.nova.clock_offset = step["seconds"]

    def seen(expected: tuple[str, str | None]) -> None:
        tick()

        def shows() -> bool:
            # Each look may end the step, stamped by the clock now a minute on.
            return changed().get(server_id) == expected

        assert wait_until(shows, f"changes-since to show {expected}")

    compute = conn.compute
    for act, steps in (
        (compute.stop_server, [("ACTIVE", "powering-off"), ("SHUTOFF", None)]),
        (compute.start_server, [("SHUTOFF", "powering-on"), ("ACTIVE", None)]),
        (compute.pause_server, [("ACTIVE", "pausing"), ("PAUSED", None)]),
        (compute.unpause_server, [("PAUSED", "unpausing"), ("ACTIVE", None)]),
        (compute.suspend_server, [("ACTIVE", "suspending"), ("SUSPENDED", None)]),
        (compute.resume_server, [("SUSPENDED", "resuming"), ("ACTIVE", None)]),
        (
            compute.shelve_server,
            [
                ("ACTIVE", "shelving"),
                ("SHELVED", "shelving_offloading"),
                ("SHELVED_OFFLOADED", None),
            ],
        ),
        (
            compute.unshelve_server,
            [
                ("SHELVED_OFFLOADED", "unshelving"),
                ("SHELVED_OFFLOADED", "spawning"),
                ("ACTIVE", None),
            ],
        ),
    ):
        tick()
        act(server_id)
        assert changed()[server_id] == steps[0]  # the API's own stamp
        for expected in steps[1:]:
            seen(expected)


def test_a_delete_cancels_the_action_and_an_offloaded_server_goes_at_once(sim, conn):
    timings(sim, stop_seconds=30, delete_seconds=0.3)
    stopping = active(conn, "stopping")
    conn.compute.stop_server(stopping)
    conn.compute.delete_server(stopping)
    assert state(conn, stopping) == ("ACTIVE", "deleting")
    timings(sim, stop_seconds=0)

    offloaded = active(conn, "offloaded")
    conn.compute.shelve_server(offloaded)
    settles(conn, offloaded, "SHELVED_OFFLOADED")
    timings(sim, delete_seconds=30)
    conn.compute.delete_server(offloaded)  # no host to ask: Nova's API deletes it itself
    with pytest.raises(openstack.exceptions.NotFoundException):
        conn.compute.get_server(offloaded)


# -- the control API and the model in process ---------------------------------------------------


def test_control_api_sets_the_action_timings_and_faults(sim):
    values = {
        "start_seconds": 2.5,
        "stop_seconds": 1,
        "pause_seconds": 0.5,
        "unpause_seconds": 0.5,
        "suspend_seconds": 3,
        "resume_seconds": 3,
        "shelve_seconds": 20,
        "shelve_offload_seconds": 5,
        "unshelve_seconds": 40,
        "shelved_offload_time": -1,
        "allow_shelve_offload": True,
    }
    status, answer = control(sim, "POST", "/_sim/nova", values)
    assert status == 200
    assert {name: answer["nova"][name] for name in values} == values
    assert control(sim, "GET", "/_sim/nova")[1]["nova"]["unshelve_seconds"] == 40
    for bad in (
        {"start_seconds": -1},
        {"stop_seconds": "slow"},
        {"shelved_offload_time": -2},
        {"allow_shelve_offload": "yes"},
        {"reboot_seconds": 1},
    ):
        assert control(sim, "POST", "/_sim/nova", bad)[0] == 400, bad
    faults = {
        "start_fails": 2,
        "start_stalls": 1,
        "unshelve_quota_exceeded": 3,
        "unshelve_no_valid_host": 1,
    }
    status, answer = control(sim, "POST", "/_sim/faults", faults)
    assert status == 200
    assert {name: answer["faults"][name] for name in faults} == faults
    for bad in ({"start_fails": -1}, {"start_stalls": 0.5}, {"unshelve_no_valid_host": True}):
        assert control(sim, "POST", "/_sim/faults", bad)[0] == 400, bad


def test_the_model_takes_the_actions_in_process():
    """What an in-process cloud (the tests' FakeCloud) calls: NovaRefusal with Nova's status
    and message, the states and a record that hides a failed start's fault."""
    nova = FakeNova(build_seconds=0.0)
    server = nova.create_server(
        CreateServerRequest(
            name="s", flavor="m1.small", image="i", networks=(), metadata={}, tags=()
        )
    )
    server_id = server.server_id
    nova.server_action(server_id, "os-stop")
    assert nova.get_server(server_id).status == "SHUTOFF"
    with pytest.raises(NovaRefusal) as refused:
        nova.server_action(server_id, "os-stop")
    assert refused.value.status == 409
    with pytest.raises(NovaRefusal) as unknown:
        nova.server_action(server_id, "reboot")
    assert unknown.value.status == 400
    with pytest.raises(NovaRefusal) as missing:
        nova.server_action("nothing", "os-start")
    assert missing.value.status == 404
    nova.faults.start_fails = 1
    nova.server_action(server_id, "os-start")
    failed = nova.get_server(server_id)
    assert (failed.status, failed.task_state, failed.fault.message) == (
        "SHUTOFF",
        None,
        "libvirtError",
    )
    assert failed.record().fault is None
    nova.server_action(server_id, "shelve")
    assert nova.usage()["cores"] == 0
    nova.quota.cores = 0
    with pytest.raises(NovaRefusal) as over:
        nova.unshelve_server(server_id)
    assert (over.value.status, str(over.value)) == (
        403,
        "Quota exceeded for resources: ['cores']",
    )
    assert nova.calls["servers.action.unshelve"] == 1
