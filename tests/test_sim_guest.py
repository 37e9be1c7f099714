"""The guest inside the simulated servers, and their console log, through unmodified openstacksdk.

The guest plays osas's user data as the warm-pool contract has it (issue 36): a server booted
with the warm mark (``osas-warm``) prepares, prints ``osas-warm-prepared`` on its console after
``warm_prepare_seconds``, and powers itself off if its ``osas-warm-state`` is shutoff or
absent; Nova's power-state sync then stops it (SHUTOFF, vm_state stopped, power_state 4,
``updated`` bumped). A later warm boot of such a server reads the metadata again as long
after the marker before it powers off, and joins if claimed by then. Kept paused, suspended
or shelved_offloaded, it stays up with the marker and waits for its claim (an offloaded one is
unshelved still warm and waits again). Claimed (the mark gone), it joins: ``osas-node-joined``.
A preparation can hang (``warm_prepare_hangs``).

The console is ``os-getConsoleOutput`` as Nova answers it (nova/api/openstack/compute/
console_output.py, the compute API's ``check_instance_host``, the compute manager's tail and
the libvirt driver's pty console): 200 ``{"output": ...}`` while the guest runs, 409 "Instance
<id> is not ready" with no host, 404 "Guest does not have a console available." when the
guest does not run, 400 for a length Nova's schema refuses.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import openstack.exceptions
import pytest
from test_sim import SDK_OWN_WARNINGS, TAG, boot_args, control, wait_until

from osas.cloud.port import CreateServerRequest
from osas.sim import SimulatedOpenStack
from osas.sim.guest import JOINED_LINE, PREPARED_LINE
from osas.sim.model import FakeNova, NovaRefusal

pytestmark = SDK_OWN_WARNINGS

NOT_AVAILABLE = "Guest does not have a console available."


@pytest.fixture
def sim():
    with SimulatedOpenStack(FakeNova(build_seconds=0.0)) as simulated:
        yield simulated


def warm(state: str | None = "shutoff") -> dict[str, str]:
    """The metadata osas gives a server it creates to refill a pool."""
    metadata = {"osas-cluster": "prod", "osas-node-group": "big", "osas-warm": "fp-1"}
    if state is not None:
        metadata["osas-warm-state"] = state
    return metadata


def claimed() -> dict[str, str]:
    """The metadata osas puts on a warm server it claims: the warm mark and state gone."""
    return {"osas-cluster": "prod", "osas-node-group": "big", "osas-claimed": "1700000000"}


def claim(conn, server_id: str) -> None:
    """Replace all the server's metadata (``PUT /servers/{id}/metadata``), as osas claims."""
    answer = conn.compute.put(
        f"/servers/{server_id}/metadata", json={"metadata": claimed()}, raise_exc=False
    )
    assert answer.status_code == 200, answer.text


def create(conn, name: str = "n1", metadata: dict[str, str] | None = None) -> str:
    created = conn.compute.create_server(
        **boot_args(conn, name), tags=[TAG], metadata=metadata or {}
    )
    server = conn.compute.wait_for_server(created, status="ACTIVE", interval=0.05, wait=10)
    return str(server.id)


def settles(conn, server_id: str, status: str, timeout: float = 10.0):
    def settled():
        server = conn.compute.get_server(server_id)
        return server if (server.status, server.task_state) == (status, None) else None

    return wait_until(settled, f"{server_id} to settle in {status}", timeout)


def console(conn, server_id: str, body: dict | None = None):
    """The raw answer of ``os-getConsoleOutput`` (``body`` its value; {} by default)."""
    return conn.compute.post(
        f"/servers/{server_id}/action",
        json={"os-getConsoleOutput": {} if body is None else body},
        microversion="2.100",
        raise_exc=False,
    )


def output(conn, server_id: str, length: int | None = None) -> str:
    """The console log through openstacksdk's own call."""
    return str(conn.compute.get_server_console_output(server_id, length=length)["output"])


def timings(sim, **values) -> None:
    status, _ = control(sim, "POST", "/_sim/nova", values)
    assert status == 200, values


def logged(sim, server_id: str) -> list[str]:
    """Every line of the server's console log, read in the model whatever its state."""
    return sim.nova.console_lines(server_id)


# -- the warm guest -----------------------------------------------------------------------------


def test_a_warm_server_prepares_then_powers_itself_off(sim, conn):
    timings(sim, warm_prepare_seconds=1.0)
    server_id = create(conn, "warm", warm("shutoff"))
    booted = time.monotonic()
    assert PREPARED_LINE not in output(conn, server_id)  # still preparing
    assert output(conn, server_id).startswith("[    0.000000] Linux version")
    sim.nova.clock_offset = 60  # Nova's clock a minute on: changes-since sees what it stamps

    off = settles(conn, server_id, "SHUTOFF")
    assert time.monotonic() - booted >= 0.5
    assert (off.vm_state, off.power_state, off.task_state) == ("stopped", 4, None)
    since = datetime.now(UTC) + timedelta(seconds=30)
    changed = {s.id: s.status for s in conn.compute.servers(details=True, changes_since=since)}
    assert changed == {server_id: "SHUTOFF"}  # Nova's sync stamped `updated`
    assert logged(sim, server_id)[-3] == PREPARED_LINE  # then the power-down lines

    # Its guest does not run: libvirt's pty console is gone, Nova answers 404.
    answer = console(conn, server_id)
    assert answer.status_code == 404
    assert answer.json() == {"itemNotFound": {"code": 404, "message": NOT_AVAILABLE}}
    with pytest.raises(openstack.exceptions.NotFoundException, match="console available"):
        output(conn, server_id)
    # With Nova's serial console the last run's log is read: the marker, then the power-down.
    timings(sim, serial_console=True)
    lines = output(conn, server_id).splitlines()
    assert PREPARED_LINE in lines
    assert lines[-1].endswith("reboot: Power down")


def test_nova_stops_a_server_whose_guest_powered_off_as_for_os_stop(sim, conn):
    timings(sim, warm_prepare_seconds=0.2, stop_seconds=0.8)
    server_id = create(conn, "warm", warm(None))  # no osas-warm-state: powers off too

    def stopping():
        server = conn.compute.get_server(server_id)
        return server if server.task_state == "powering-off" else None

    server = wait_until(stopping, "Nova's stop after the guest's poweroff")
    # Nova's power-state sync saved the domain's power state before it called stop.
    assert (server.status, server.vm_state, server.power_state) == ("ACTIVE", "active", 4)
    assert console(conn, server_id).status_code == 404  # the guest is off already
    with pytest.raises(openstack.exceptions.ConflictException, match="task_state powering-off"):
        conn.compute.pause_server(server_id)
    settles(conn, server_id, "SHUTOFF")


@pytest.mark.parametrize(
    "case",
    [
        ("paused", "pause_server", "unpause_server", "PAUSED"),
        ("suspended", "suspend_server", "resume_server", "SUSPENDED"),
    ],
    ids=["paused", "suspended"],
)
def test_a_guest_kept_paused_or_suspended_stays_up_with_the_marker(sim, conn, case):
    state, hold, back, held = case
    timings(sim, warm_prepare_seconds=0.2)
    server_id = create(conn, "warm", warm(state))
    seen = wait_until(lambda: PREPARED_LINE in output(conn, server_id), "the marker")
    assert seen
    time.sleep(0.4)
    server = conn.compute.get_server(server_id)
    assert (server.status, server.task_state, server.power_state) == ("ACTIVE", None, 1)
    assert output(conn, server_id).endswith(f"\n{PREPARED_LINE}\n")

    getattr(conn.compute, hold)(server_id)  # osas saw the marker: it pauses or suspends it
    settles(conn, server_id, held)
    readable = console(conn, server_id)
    if held == "PAUSED":  # a paused QEMU keeps its console
        assert readable.json()["output"].endswith(f"{PREPARED_LINE}\n")
    else:  # a suspended one was saved and ended
        assert (readable.status_code, readable.json()["itemNotFound"]["message"]) == (
            404,
            NOT_AVAILABLE,
        )

    claim(conn, server_id)
    assert JOINED_LINE not in logged(sim, server_id)  # it does not run: it cannot see it yet
    getattr(conn.compute, back)(server_id)
    settles(conn, server_id, "ACTIVE")
    joined = output(conn, server_id)
    if held == "PAUSED":
        assert joined.endswith(f"{PREPARED_LINE}\n{JOINED_LINE}\n")
    else:  # resumed by a new QEMU process: virtlogd started the log afresh
        assert joined == f"{JOINED_LINE}\n"


def test_a_claimed_server_started_stays_active_and_joins_once(sim, conn):
    timings(sim, warm_prepare_seconds=0.2)
    server_id = create(conn, "warm", warm("shutoff"))
    settles(conn, server_id, "SHUTOFF")
    claim(conn, server_id)
    conn.compute.start_server(server_id)
    settles(conn, server_id, "ACTIVE")
    lines = output(conn, server_id).splitlines()
    assert lines[0].startswith("[    0.000000] Linux version")  # a new boot's log only
    assert PREPARED_LINE not in lines
    assert lines[-1] == JOINED_LINE
    time.sleep(0.5)
    assert conn.compute.get_server(server_id).status == "ACTIVE"  # and it stays up

    # Joined once: kubelet.conf is on its disk, a later boot does nothing more.
    conn.compute.stop_server(server_id)
    settles(conn, server_id, "SHUTOFF")
    conn.compute.start_server(server_id)
    settles(conn, server_id, "ACTIVE")
    assert JOINED_LINE not in output(conn, server_id)


def test_a_warm_server_started_again_prints_the_marker_and_powers_off_again(sim, conn):
    """Prepared already, still warm: the marker after warm_prepare_seconds, then as long again
    before its second read of the metadata, still warm: it powers off."""
    timings(sim, warm_prepare_seconds=0.8)
    server_id = create(conn, "warm", warm("shutoff"))
    settles(conn, server_id, "SHUTOFF")
    assert sim.nova.find_server(server_id).guest.prepared

    conn.compute.start_server(server_id)  # still warm: prepared already, it powers off again
    settles(conn, server_id, "ACTIVE")
    started = time.monotonic()
    assert PREPARED_LINE not in output(conn, server_id)
    wait_until(lambda: PREPARED_LINE in output(conn, server_id), "the marker")
    server = conn.compute.get_server(server_id)  # waiting for its second read
    assert (server.status, server.task_state, server.power_state) == ("ACTIVE", None, 1)
    assert output(conn, server_id).endswith(f"\n{PREPARED_LINE}\n")
    settles(conn, server_id, "SHUTOFF")
    assert time.monotonic() - started >= 1.2
    assert logged(sim, server_id).count(PREPARED_LINE) == 1  # the log of this boot alone
    assert logged(sim, server_id)[-1].endswith("reboot: Power down")


def test_the_guest_acts_on_the_metadata_it_read_at_boot(sim, conn):
    """A server claimed while its guest still prepares powers off all the same: the guest read
    the metadata when it booted."""
    timings(sim, warm_prepare_seconds=1.0)
    server_id = create(conn, "warm", warm("shutoff"))
    claim(conn, server_id)
    assert conn.compute.get_server(server_id).status == "ACTIVE"  # claimed while preparing
    settles(conn, server_id, "SHUTOFF")
    conn.compute.start_server(server_id)  # the next boot reads the claim
    settles(conn, server_id, "ACTIVE")
    assert output(conn, server_id).endswith(f"{JOINED_LINE}\n")


def test_a_preparation_that_hangs_never_prints_nor_powers_off(sim, conn):
    timings(sim, warm_prepare_seconds=0.2)
    status, faults = control(sim, "POST", "/_sim/faults", {"warm_prepare_hangs": 1})
    assert (status, faults["faults"]["warm_prepare_hangs"]) == (200, 1)
    hung = create(conn, "hung", warm("shutoff"))
    fine = create(conn, "fine", warm("shutoff"))  # the fault was spent on the first
    settles(conn, fine, "SHUTOFF")
    time.sleep(0.5)
    server = conn.compute.get_server(hung)
    assert (server.status, server.task_state) == ("ACTIVE", None)
    assert PREPARED_LINE not in output(conn, hung)
    assert sim.nova.faults.warm_prepare_hangs == 0

    # Stopped and started, it prepares again (no marker file yet), and this time it ends.
    conn.compute.stop_server(hung)
    settles(conn, hung, "SHUTOFF")
    conn.compute.start_server(hung)
    settles(conn, hung, "SHUTOFF")
    assert sim.nova.find_server(hung).guest.prepared


def test_servers_without_the_warm_mark_behave_as_before(sim, conn):
    timings(sim, warm_prepare_seconds=0.1)
    server_id = create(conn, "cold", {"osas-cluster": "prod"})
    before = conn.compute.get_server(server_id)
    time.sleep(0.4)
    after = conn.compute.get_server(server_id)
    assert (after.status, after.task_state, after.power_state) == ("ACTIVE", None, 1)
    assert after.updated_at == before.updated_at
    assert output(conn, server_id).endswith(f"{JOINED_LINE}\n")  # a cold create joins
    for act, status in (
        (conn.compute.pause_server, "PAUSED"),
        (conn.compute.unpause_server, "ACTIVE"),
        (conn.compute.stop_server, "SHUTOFF"),
        (conn.compute.start_server, "ACTIVE"),
    ):
        act(server_id)
        settles(conn, server_id, status)
    time.sleep(0.3)
    assert conn.compute.get_server(server_id).status == "ACTIVE"


# -- the console --------------------------------------------------------------------------------


def test_console_output_is_tailed_as_novas_compute_manager_does(sim, conn):
    server_id = create(conn)
    whole = output(conn, server_id)
    lines = whole.split("\n")
    assert whole.endswith("\n")  # every line ended
    assert lines[-1] == ""
    assert len(lines) >= 5
    assert console(conn, server_id).json() == {"output": whole}
    assert output(conn, server_id, None) == whole
    # The log split at newlines, the last N pieces: a log ending with a newline gives N - 1
    # lines and the empty piece after the last.
    assert output(conn, server_id, 3) == "\n".join(lines[-3:])
    assert output(conn, server_id, 3) == f"{lines[-3]}\n{lines[-2]}\n"
    assert output(conn, server_id, 1) == ""
    assert output(conn, server_id, 0) == ""
    assert output(conn, server_id, 1000) == whole
    # -1, "unlimited" in Nova's schema, is sliced from -(-1): every line but the first.
    assert output(conn, server_id, -1) == "\n".join(lines[1:])
    assert console(conn, server_id, {"length": "2"}).json() == {"output": f"{lines[-2]}\n"}
    assert console(conn, server_id, {"length": None}).json() == {"output": whole}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"length": -2}, "Value: -2. -2 is less than the minimum of -1"),
        ({"length": 2.5}, "2.5 is not of type 'integer', 'string', 'null'"),
        ({"length": True}, "True is not of type 'integer', 'string', 'null'"),
        ({"length": "NaN"}, "'NaN' does not match '^-?[0-9]+$'"),
        ({"length": 3, "lines": 3}, "Additional properties are not allowed ('lines' was"),
        (None, "None is not of type 'object'"),
    ],
)
def test_console_output_lengths_nova_refuses_are_400(sim, conn, body, message):
    def ask(server_id: str):
        return conn.compute.post(
            f"/servers/{server_id}/action",
            json={"os-getConsoleOutput": body},
            microversion="2.100",
            raise_exc=False,
        )

    answer = ask(create(conn))
    assert answer.status_code == 400
    assert message in answer.json()["badRequest"]["message"]
    # Nova's schema is checked before the server is looked up.
    assert ask("5f5a4c4e-0000-4000-8000-000000000000").status_code == 400


def test_console_output_answers_in_the_states_nova_answers_it(sim, conn):
    server_id = create(conn)
    missing = "5f5a4c4e-0000-4000-8000-000000000000"
    assert console(conn, missing).json() == {
        "itemNotFound": {"code": 404, "message": f"Instance {missing} could not be found."}
    }

    # No host: the compute API's check_instance_host refuses with 409.
    sim.nova.faults.no_valid_host = 1
    broken = conn.compute.create_server(**boot_args(conn, "broken"))
    answer = console(conn, broken.id)
    assert answer.status_code == 409
    assert answer.json() == {
        "conflictingRequest": {"code": 409, "message": f"Instance {broken.id} is not ready"}
    }
    with pytest.raises(openstack.exceptions.ConflictException, match="is not ready"):
        output(conn, broken.id)
    timings(sim, build_seconds=None)
    scheduling = conn.compute.create_server(**boot_args(conn, "scheduling"))
    assert console(conn, scheduling.id).status_code == 409
    timings(sim, build_seconds=0)

    # On its host, readable while its guest runs, paused included; not stopped nor suspended.
    for act, status, readable in (
        (conn.compute.pause_server, "PAUSED", True),
        (conn.compute.unpause_server, "ACTIVE", True),
        (conn.compute.suspend_server, "SUSPENDED", False),
        (conn.compute.resume_server, "ACTIVE", True),
        (conn.compute.stop_server, "SHUTOFF", False),
        (conn.compute.start_server, "ACTIVE", True),
    ):
        act(server_id)
        settles(conn, server_id, status)
        answer = console(conn, server_id)
        if readable:
            assert answer.status_code == 200, status
        else:
            assert answer.json() == {"itemNotFound": {"code": 404, "message": NOT_AVAILABLE}}

    timings(sim, shelved_offload_time=-1)
    conn.compute.shelve_server(server_id)
    settles(conn, server_id, "SHELVED")
    assert console(conn, server_id).status_code == 404  # on its host, powered off
    timings(sim, allow_shelve_offload=True, unshelve_seconds=30)
    conn.compute.shelve_offload_server(server_id)
    settles(conn, server_id, "SHELVED_OFFLOADED")
    assert console(conn, server_id).status_code == 409  # off its host
    conn.compute.unshelve_server(server_id)
    assert console(conn, server_id).status_code == 409  # scheduled again
    conn.compute.delete_server(server_id)
    assert console(conn, server_id).status_code == 404


# -- the control API and the model in process ---------------------------------------------------


def test_control_api_sets_the_guest_timing_and_the_serial_console(sim):
    values = {"warm_prepare_seconds": 1.5, "serial_console": True}
    status, answer = control(sim, "POST", "/_sim/nova", values)
    assert status == 200
    assert {name: answer["nova"][name] for name in values} == values
    defaults = control(sim, "POST", "/_sim/nova", {"warm_prepare_seconds": 0.2})[1]["nova"]
    assert defaults["warm_prepare_seconds"] == 0.2
    assert FakeNova().warm_prepare_seconds == 0.2
    assert FakeNova().serial_console is False
    for bad in ({"warm_prepare_seconds": -1}, {"serial_console": "yes"}):
        assert control(sim, "POST", "/_sim/nova", bad)[0] == 400, bad
    assert control(sim, "POST", "/_sim/faults", {"warm_prepare_hangs": 0.5})[0] == 400


def test_the_model_runs_the_guest_in_process():
    """What an in-process cloud (the tests' FakeCloud) sees: with no time to prepare, a warm
    server is SHUTOFF at the first look, and its console refused with Nova's status."""
    nova = FakeNova(build_seconds=0.0)
    nova.warm_prepare_seconds = 0.0

    def made(metadata: dict[str, str]) -> str:
        request = CreateServerRequest(
            name="s", flavor="m1.small", image="i", networks=(), metadata=metadata, tags=()
        )
        return nova.create_server(request).server_id

    warm_id, cold_id = made(warm("shutoff")), made({})
    assert nova.get_server(warm_id).status == "SHUTOFF"
    with pytest.raises(NovaRefusal) as refused:
        nova.console_output(warm_id)
    assert (refused.value.status, str(refused.value)) == (404, NOT_AVAILABLE)
    assert nova.get_server(cold_id).status == "ACTIVE"
    assert nova.console_output(cold_id, 2) == f"{JOINED_LINE}\n"
    assert nova.calls["servers.action.os-getConsoleOutput"] == 2

    # A seeded server is past its boot script: a warm one running is idle, prepared.
    seeded = nova.seed(name="w", metadata=warm("paused"), status="ACTIVE")
    assert nova.console_output(seeded.server_id).endswith(f"{PREPARED_LINE}\n")
    nova.set_metadata(seeded.server_id, claimed(), replace=True)
    assert nova.console_output(seeded.server_id).endswith(f"{JOINED_LINE}\n")
    assert nova.get_server(seeded.server_id).status == "ACTIVE"


def test_an_offloaded_pools_guest_waits_up_and_joins_once_unshelved_and_claimed(sim, conn):
    """Kept shelved_offloaded, the guest no longer powers itself off: it stays up with the
    marker and osas shelves it. Nova refuses metadata writes on a shelved server, so osas
    unshelves it for a claim: the guest boots again with the warm mark on, prints the marker
    again (no preparation) and waits; once its metadata is replaced it joins."""
    timings(sim, warm_prepare_seconds=0.2)
    server_id = create(conn, "warm", warm("shelved_offloaded"))
    wait_until(lambda: PREPARED_LINE in output(conn, server_id), "the marker")
    time.sleep(0.5)  # longer than a preparation and a second read together
    server = conn.compute.get_server(server_id)
    assert (server.status, server.task_state, server.power_state) == ("ACTIVE", None, 1)
    assert output(conn, server_id).endswith(f"\n{PREPARED_LINE}\n")  # up, waiting to be shelved
    conn.compute.shelve_server(server_id)  # osas saw the marker
    settles(conn, server_id, "SHELVED_OFFLOADED")
    with pytest.raises(openstack.exceptions.ConflictException):  # no claim written there
        conn.compute.set_server_metadata(server_id, **claimed())

    conn.compute.unshelve_server(server_id)  # a claim: up first, still warm
    settles(conn, server_id, "ACTIVE")
    wait_until(lambda: PREPARED_LINE in output(conn, server_id), "the marker again")
    time.sleep(0.5)
    server = conn.compute.get_server(server_id)
    assert (server.status, server.task_state) == ("ACTIVE", None)  # it waits, it does not stop
    lines = output(conn, server_id).splitlines()
    assert lines[0].startswith("[    0.000000] Linux version")  # the unshelve's boot
    assert lines[-1] == PREPARED_LINE
    assert lines.count(PREPARED_LINE) == 1
    claim(conn, server_id)  # osas writes the claim once the server runs
    wait_until(lambda: JOINED_LINE in output(conn, server_id), "the join")
    assert output(conn, server_id).endswith(f"{PREPARED_LINE}\n{JOINED_LINE}\n")
    time.sleep(0.3)
    assert conn.compute.get_server(server_id).status == "ACTIVE"


def test_a_warm_boot_that_finds_itself_claimed_on_its_second_read_joins(sim, conn):
    """Started while its metadata still said warm (the real script may read that from the
    metadata service's cache right after a claim), the guest prints the marker and waits
    before its second read; the claim lands meanwhile: it joins instead of powering off."""
    timings(sim, warm_prepare_seconds=1.0)
    server_id = create(conn, "warm", warm("shutoff"))
    settles(conn, server_id, "SHUTOFF")
    conn.compute.start_server(server_id)  # started while still warm: it read the mark at boot
    settles(conn, server_id, "ACTIVE")
    wait_until(lambda: PREPARED_LINE in output(conn, server_id), "the marker")
    claim(conn, server_id)  # the claim lands before its second read
    assert JOINED_LINE not in output(conn, server_id)  # it has not read again yet
    wait_until(lambda: JOINED_LINE in output(conn, server_id), "the join")
    assert output(conn, server_id).endswith(f"{PREPARED_LINE}\n{JOINED_LINE}\n")
    time.sleep(0.5)
    server = conn.compute.get_server(server_id)
    assert (server.status, server.task_state, server.power_state) == ("ACTIVE", None, 1)


class ManualClock:
    """A clock the test moves: the model's durations run on it."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.mark.parametrize("claimed_in_time", [True, False], ids=["claimed", "still-warm"])
def test_a_later_warm_boot_reads_the_metadata_again_before_it_powers_off(claimed_in_time):
    """In process, on a clock of the test's: the boot that prepared powers off at once; a
    later warm boot prints the marker, waits warm_prepare_seconds more, then powers off if
    its second read still shows the warm mark, or joins if the claim replaced it by then."""
    clock = ManualClock()
    nova = FakeNova(build_seconds=0.0, clock=clock)
    nova.warm_prepare_seconds = 10.0
    request = CreateServerRequest(
        name="w", flavor="m1.small", image="i", networks=(), metadata=warm("shutoff"), tags=()
    )
    server_id = nova.create_server(request).server_id
    clock.wait(10)
    assert nova.get_server(server_id).status == "SHUTOFF"  # the first boot: off at once

    nova.server_action(server_id, "os-start")  # a start while the metadata still says warm
    assert nova.get_server(server_id).status == "ACTIVE"
    clock.wait(10)
    assert nova.console_lines(server_id)[-1] == PREPARED_LINE  # the marker, no preparation
    clock.wait(9)
    assert nova.get_server(server_id).status == "ACTIVE"  # waiting for its second read
    if claimed_in_time:
        nova.set_metadata(server_id, claimed(), replace=True)
    clock.wait(1)
    server = nova.get_server(server_id)
    if claimed_in_time:
        assert (server.status, server.task_state) == ("ACTIVE", None)
        assert nova.console_lines(server_id)[-2:] == [PREPARED_LINE, JOINED_LINE]
        clock.wait(60)
        assert nova.get_server(server_id).status == "ACTIVE"
    else:
        assert server.status == "SHUTOFF"
        assert nova.console_lines(server_id)[-1].endswith("reboot: Power down")
        assert JOINED_LINE not in nova.console_lines(server_id)
