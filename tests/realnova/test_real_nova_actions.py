"""Server actions on real Nova (``nox -s nova``), and the same observations on the simulator.

What a warm pool leans on, asked of real Nova 34 with its fake virt driver through unmodified
openstacksdk and real Keystone: os-stop and os-start, pause and unpause, suspend and resume,
shelve and unshelve (the lane leaves Nova's ``[compute] shelved_offload_time`` at its default,
0: a member's shelve offloads at once; shelveOffload itself is an admin's), the 409 for an
action in the wrong state, a replace-all of the metadata (``PUT /servers/{id}/metadata``) in
each state a pool server rests in, ``os-getConsoleOutput`` in those states, and ``/limits``
with a server SHUTOFF and SHELVED_OFFLOADED (the lane leaves ``[quota]
count_usage_from_placement`` at its default, False: legacy counting from the cell database).

Every test runs twice: ``[real]`` against real Nova, ``[sim]`` against the simulator
(``osas.sim``, in process, each action lasting 0.2 s so that its task state can be seen). What
each lane answers is written down side by side where they differ (``REAL`` and ``SIM`` in the
tables below) and once where they agree; docs/testing.md ("Server actions: real Nova against
the simulator") sums it up.

Real Nova's compute host works in a fraction of a second here, about as long as one request
takes: a task state is seen when a poll falls inside it. The real lane's transitions are
therefore checked as an ordered part of Nova's own sequence (nova/compute/manager.py), ending
where it must; the simulator's, whose steps are timed, as the whole sequence it shows.

Skipped where the ``nova`` package is not installed (the main test venv)."""

from __future__ import annotations

import importlib.util
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

if importlib.util.find_spec("nova") is None:
    pytest.skip(
        "real-Nova lane: the nova package is not installed (run `nox -s nova`)",
        allow_module_level=True,
    )

import openstack.config
import openstack.connection
import openstack.exceptions
from realnova.cloud import (
    ADMIN_CLOUD,
    CLOUD,
    IMAGE_NAME,
    NETWORK_NAME,
    NovaOptions,
    RealNovaProcess,
)
from support import sdk_connection

from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova

pytestmark = pytest.mark.realnova

REAL, SIM = "real", "sim"
FLAVOR = "m1.small"  # 1 vCPU, 2048 MiB in both
MICROVERSION = "2.100"  # openstacksdk's ceiling for servers
SIM_ACTION_SECONDS = 0.2  # each simulated action's step: long enough to be seen
# `updated` has whole seconds: an edit this long after the last change is a later second.
SECOND_AND_A_BIT = 1.1

# The fake virt driver's console (nova/virt/fake.py), whatever the guest's state.
FAKE_CONSOLE = "FAKE CONSOLE OUTPUT\nANOTHER\nLAST LINE"
NO_CONSOLE = "Guest does not have a console available."  # Nova's ConsoleNotAvailable

Step = tuple[str, str | None, str]  # status, task state, vm_state

# Each action's steps as Nova's API and compute manager save them (task state set by the API
# before its 202, then the host's own). Shelve: the snapshot's task states come between
# (the fake driver's snapshot sets shelving_image_uploading, libvirt's pending_upload first),
# then vm_state shelved with shelving_offloading at once (shelved_offload_time 0).
STOP = [("ACTIVE", "powering-off", "active"), ("SHUTOFF", None, "stopped")]
START = [("SHUTOFF", "powering-on", "stopped"), ("ACTIVE", None, "active")]
PAUSE = [("ACTIVE", "pausing", "active"), ("PAUSED", None, "paused")]
UNPAUSE = [("PAUSED", "unpausing", "paused"), ("ACTIVE", None, "active")]
SUSPEND = [("ACTIVE", "suspending", "active"), ("SUSPENDED", None, "suspended")]
RESUME = [("SUSPENDED", "resuming", "suspended"), ("ACTIVE", None, "active")]
SNAPSHOT = [
    ("ACTIVE", "shelving_image_pending_upload", "active"),
    ("ACTIVE", "shelving_image_uploading", "active"),
]
OFFLOAD = [
    ("SHELVED", "shelving_offloading", "shelved"),
    ("SHELVED_OFFLOADED", None, "shelved_offloaded"),
]
SHELVE = {
    REAL: [("ACTIVE", "shelving", "active"), *SNAPSHOT, *OFFLOAD],
    SIM: [("ACTIVE", "shelving", "active"), *OFFLOAD],  # no snapshot task states
}
UNSHELVE = [
    ("SHELVED_OFFLOADED", "unshelving", "shelved_offloaded"),  # the conductor schedules it
    ("SHELVED_OFFLOADED", "spawning", "shelved_offloaded"),  # on a host again
    ("ACTIVE", None, "active"),
]

# OS-EXT-STS:power_state at rest. The fake driver's pause and suspend change nothing in its
# guest (still RUNNING, 1); the simulator shows what libvirt reports: PAUSED 3, and SUSPENDED 4
# (a managed save shuts the domain off).
POWER = {
    REAL: {"ACTIVE": 1, "SHUTOFF": 4, "PAUSED": 1, "SUSPENDED": 1, "SHELVED_OFFLOADED": 4},
    SIM: {"ACTIVE": 1, "SHUTOFF": 4, "PAUSED": 3, "SUSPENDED": 4, "SHELVED_OFFLOADED": 4},
}

# os-getConsoleOutput by state: the status and, refused, the message ("{id}": the server's).
# Real: the fake driver answers its fixed text wherever the server has a host. Sim: the
# console of a libvirt guest, there only while its QEMU process runs.
CONSOLE = {
    REAL: {
        "ACTIVE": (200, None),
        "SHUTOFF": (200, None),
        "PAUSED": (200, None),
        "SUSPENDED": (200, None),
        "SHELVED_OFFLOADED": (409, "Instance {id} is not ready"),
    },
    SIM: {
        "ACTIVE": (200, None),
        "SHUTOFF": (404, NO_CONSOLE),
        "PAUSED": (200, None),
        "SUSPENDED": (404, NO_CONSOLE),
        "SHELVED_OFFLOADED": (409, "Instance {id} is not ready"),
    },
}

# /limits (instances, cores, RAM used) with one m1.small in each state. Real: legacy counting,
# an offloaded server still holds its cores and RAM. Sim: placement counting by default.
USAGE = {
    REAL: {"ACTIVE": (1, 1, 2048), "SHUTOFF": (1, 1, 2048), "SHELVED_OFFLOADED": (1, 1, 2048)},
    SIM: {"ACTIVE": (1, 1, 2048), "SHUTOFF": (1, 1, 2048), "SHELVED_OFFLOADED": (1, 0, 0)},
}

# Metadata replace-all: both lanes agree (Nova's update_instance_metadata takes ACTIVE,
# PAUSED, SUSPENDED and STOPPED with no task running).
METADATA_REFUSED = (
    "Cannot 'update metadata' instance {id} while it is in vm_state shelved_offloaded"
)
METADATA = {
    "SHUTOFF": (200, True),  # status, whether `updated` moved (changes-since sees it)
    "PAUSED": (200, True),
    "SUSPENDED": (200, True),
    "SHELVED_OFFLOADED": (409, False),
}


# -- the two lanes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nova(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNovaProcess]:
    with RealNovaProcess(
        NovaOptions(hosts=1), workdir=tmp_path_factory.mktemp("realnova")
    ) as cloud:
        yield cloud


def connect(nova: RealNovaProcess, cloud: str = CLOUD) -> openstack.connection.Connection:
    config = openstack.config.OpenStackConfig(
        config_files=[str(nova.clouds_yaml)], load_envvars=False
    )
    return openstack.connection.Connection(config=config.get_one(cloud=cloud))


@dataclass
class Lane:
    """One cloud as the tests see it: real Nova or the simulator, openstacksdk connected as a
    project member, and the stand-in for an admin's shelveOffload."""

    name: str
    conn: openstack.connection.Connection
    offload_as_admin: Callable[[str], tuple[int, Any]]
    sim: SimulatedOpenStack | None = None
    nova: RealNovaProcess | None = None
    tag: str = field(default_factory=lambda: f"osas-cluster={uuid.uuid4().hex[:10]}")
    made: list[tuple[openstack.connection.Connection, str]] = field(default_factory=list)
    closing: list[openstack.connection.Connection] = field(default_factory=list)

    def boot(self, name: str, conn: openstack.connection.Connection | None = None) -> str:
        """A server of FLAVOR, ACTIVE; its id."""
        conn = conn or self.conn
        server = conn.compute.create_server(
            name=name,
            flavor_id=conn.compute.find_flavor(FLAVOR, ignore_missing=False).id,
            image_id=conn.image.find_image(IMAGE_NAME, ignore_missing=False).id,
            networks=[{"uuid": conn.network.find_network(NETWORK_NAME, ignore_missing=False).id}],
            metadata={"osas-node-group": "workers"},
            tags=[self.tag],
        )
        self.made.append((conn, server.id))
        settle(self, server.id, "ACTIVE", conn=conn)
        return str(server.id)

    def between_polls(self) -> None:
        """Between two polls: real Nova's requests take their own time already."""
        if self.sim is not None:
            time.sleep(0.02)


@pytest.fixture(params=[REAL, SIM])
def lane(request: pytest.FixtureRequest) -> Iterator[Lane]:
    if request.param == REAL:
        nova: RealNovaProcess = request.getfixturevalue("nova")
        conn, admin = connect(nova), connect(nova, ADMIN_CLOUD)

        def offload_real(server_id: str) -> tuple[int, Any]:
            return answer(admin, server_id, {"shelveOffload": None})

        real = Lane(REAL, conn, offload_real, nova=nova, closing=[conn, admin])
        yield real
        cleanup(real)
        return
    fake = FakeNova(build_seconds=0.0)
    for action in ("start", "stop", "pause", "unpause", "suspend", "resume"):
        setattr(fake, f"{action}_seconds", SIM_ACTION_SECONDS)
    for step in ("shelve", "shelve_offload", "unshelve"):
        setattr(fake, f"{step}_seconds", SIM_ACTION_SECONDS)
    with SimulatedOpenStack(fake) as sim:
        conn = sdk_connection(sim)

        def offload_sim(server_id: str) -> tuple[int, Any]:
            # The simulator has one user; its policy switch stands for an admin's token.
            sim.nova.allow_shelve_offload = True
            try:
                return answer(conn, server_id, {"shelveOffload": None})
            finally:
                sim.nova.allow_shelve_offload = False

        simulated = Lane(SIM, conn, offload_sim, sim=sim, closing=[conn])
        yield simulated
        cleanup(simulated)


def cleanup(lane: Lane) -> None:
    for conn, server_id in lane.made:
        conn.compute.delete_server(server_id, ignore_missing=True)
    for conn in lane.closing:
        conn.close()


# -- observing ----------------------------------------------------------------------------------


def look(lane: Lane, server_id: str, conn: openstack.connection.Connection | None = None) -> Any:
    return (conn or lane.conn).compute.get_server(server_id)


def step_of(server: Any) -> Step:
    return (server.status, server.task_state, server.vm_state)


def settle(
    lane: Lane,
    server_id: str,
    status: str,
    *,
    conn: openstack.connection.Connection | None = None,
    timeout: float = 30.0,
) -> list[Step]:
    """Poll the server until it shows ``status`` with no task running; the distinct steps
    seen on the way, in order (the last one is where it settled)."""
    seen: list[Step] = []
    deadline = time.monotonic() + timeout
    while True:
        server = look(lane, server_id, conn)
        assert server.status != "ERROR", server.fault
        step = step_of(server)
        if not seen or seen[-1] != step:
            seen.append(step)
        if (server.status, server.task_state) == (status, None):
            return seen
        assert time.monotonic() < deadline, f"{server_id} never settled in {status}: {seen}"
        lane.between_polls()


def follows(lane: Lane, seen: Sequence[Step], path: Sequence[Step]) -> None:
    """Real Nova: what was seen is an ordered part of Nova's path, ending where it ends (a
    step shorter than a poll can be missed). Simulator: the whole path, each step timed."""
    if lane.name == SIM:
        assert list(seen) == list(path)
        return
    assert seen[-1] == path[-1], seen
    assert all(step in path for step in seen), seen
    positions = [path.index(step) for step in seen]
    assert positions == sorted(positions), seen


def answer(
    conn: openstack.connection.Connection, server_id: str, body: dict[str, Any]
) -> tuple[int, Any]:
    """``POST /servers/{id}/action`` through openstacksdk's session: status and body."""
    response = conn.compute.post(
        f"/servers/{server_id}/action", json=body, microversion=MICROVERSION, raise_exc=False
    )
    return response.status_code, response.json() if response.content else None


def refusal(status: int, message: str) -> dict[str, Any]:
    """Nova's error envelope."""
    kind = {403: "forbidden", 404: "itemNotFound", 409: "conflictingRequest"}[status]
    return {kind: {"code": status, "message": message}}


def note(request: pytest.FixtureRequest, name: str, value: object) -> None:
    """What the test saw, kept in its report's ``user_properties`` (JUnit XML properties)."""
    request.node.user_properties.append((name, value))


def at_rest(lane: Lane, server_id: str, status: str) -> Any:
    server = look(lane, server_id)
    assert (server.status, server.task_state) == (status, None)
    assert server.power_state == POWER[lane.name][status], (status, server.power_state)
    return server


def off_host(lane: Lane, server_id: str, timeout: float = 10.0) -> bool:
    """Whether the server shows no host within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while look(lane, server_id).host_id:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- the actions --------------------------------------------------------------------------------


def test_stop_then_start(lane, request):
    """ACTIVE -> SHUTOFF (powering-off) -> ACTIVE (powering-on), still on its host."""
    server_id = lane.boot("actions-stop")
    lane.conn.compute.stop_server(server_id)
    stopping = settle(lane, server_id, "SHUTOFF")
    follows(lane, stopping, STOP)
    stopped = at_rest(lane, server_id, "SHUTOFF")
    assert stopped.host_id  # still on its host

    lane.conn.compute.start_server(server_id)
    starting = settle(lane, server_id, "ACTIVE")
    follows(lane, starting, START)
    at_rest(lane, server_id, "ACTIVE")
    note(request, "steps", [stopping, starting])


def test_pause_then_unpause(lane, request):
    """ACTIVE -> PAUSED (pausing) -> ACTIVE (unpausing), on its host throughout."""
    there_and_back(lane, request, ("pause_server", PAUSE), ("unpause_server", UNPAUSE), "PAUSED")


def test_suspend_then_resume(lane, request):
    """ACTIVE -> SUSPENDED (suspending) -> ACTIVE (resuming), on its host throughout."""
    there_and_back(
        lane, request, ("suspend_server", SUSPEND), ("resume_server", RESUME), "SUSPENDED"
    )


def there_and_back(
    lane: Lane,
    request: pytest.FixtureRequest,
    there: tuple[str, list[Step]],
    back: tuple[str, list[Step]],
    status: str,
) -> None:
    server_id = lane.boot(f"actions-{status.lower()}")
    getattr(lane.conn.compute, there[0])(server_id)
    going = settle(lane, server_id, status)
    follows(lane, going, there[1])
    held = at_rest(lane, server_id, status)
    assert held.host_id
    getattr(lane.conn.compute, back[0])(server_id)
    coming = settle(lane, server_id, "ACTIVE")
    follows(lane, coming, back[1])
    at_rest(lane, server_id, "ACTIVE")
    note(request, "steps", [going, coming])


def test_shelve_offloads_at_once_then_unshelve(lane, request):
    """A member's shelve ends SHELVED_OFFLOADED with no stop in SHELVED (shelved_offload_time
    0), off its host; shelveOffload is refused to a member by policy (403, before any state
    check) and to an admin in SHELVED_OFFLOADED (409); a start finds no host (409); unshelve
    schedules it again."""
    server_id = lane.boot("actions-shelve")
    lane.conn.compute.shelve_server(server_id)
    shelving = settle(lane, server_id, "SHELVED_OFFLOADED")
    follows(lane, shelving, SHELVE[lane.name])
    assert ("SHELVED", None, "shelved") not in shelving
    at_rest(lane, server_id, "SHELVED_OFFLOADED")
    # Off its host, a moment later: Nova's compute manager saves SHELVED_OFFLOADED, updates
    # its resource tracker, and only then clears the host in a second save.
    assert off_host(lane, server_id)

    policy = "Policy doesn't allow os_compute_api:os-shelve:shelve_offload to be performed."
    assert answer(lane.conn, server_id, {"shelveOffload": None}) == (403, refusal(403, policy))
    with pytest.raises(openstack.exceptions.ForbiddenException):
        lane.conn.compute.shelve_offload_server(server_id)
    again = f"Cannot 'shelveOffload' instance {server_id} while it is in vm_state shelved_offloaded"
    assert lane.offload_as_admin(server_id) == (409, refusal(409, again))
    not_ready = refusal(409, f"Instance {server_id} is not ready")  # check_instance_host
    assert answer(lane.conn, server_id, {"os-start": None}) == (409, not_ready)

    lane.conn.compute.unshelve_server(server_id)
    unshelving = settle(lane, server_id, "ACTIVE")
    follows(lane, unshelving, UNSHELVE)
    assert at_rest(lane, server_id, "ACTIVE").host_id  # on a host again
    note(request, "steps", [shelving, unshelving])


def test_an_action_in_the_wrong_state_is_409(lane):
    """Nova's words for an ACTIVE server asked to start, unpause, resume, unshelve or (as an
    admin) shelveOffload, and for a SHUTOFF one asked to stop or pause; a member's
    shelveOffload is the policy's 403 whatever the state."""
    server_id = lane.boot("actions-409")
    for body, name in (
        ({"os-start": None}, "start"),
        ({"unpause": None}, "unpause"),
        ({"resume": None}, "resume"),
        ({"unshelve": None}, "unshelve"),
    ):
        message = f"Cannot '{name}' instance {server_id} while it is in vm_state active"
        assert answer(lane.conn, server_id, body) == (409, refusal(409, message)), body
    offload = f"Cannot 'shelveOffload' instance {server_id} while it is in vm_state active"
    assert lane.offload_as_admin(server_id) == (409, refusal(409, offload))
    assert answer(lane.conn, server_id, {"shelveOffload": None})[0] == 403
    with pytest.raises(openstack.exceptions.ConflictException, match="vm_state active"):
        lane.conn.compute.start_server(server_id)

    lane.conn.compute.stop_server(server_id)
    settle(lane, server_id, "SHUTOFF")
    for body, name in (({"os-stop": None}, "stop"), ({"pause": None}, "pause")):
        message = f"Cannot '{name}' instance {server_id} while it is in vm_state stopped"
        assert answer(lane.conn, server_id, body) == (409, refusal(409, message)), body


# -- metadata, console, quota by state ----------------------------------------------------------


def walk(lane: Lane, server_id: str, observe: Callable[[str], None]) -> None:
    """Through every state a pool server rests in, ``observe(status)`` in each: SHUTOFF,
    PAUSED, SUSPENDED (each left for ACTIVE again), then SHELVED_OFFLOADED."""
    compute = lane.conn.compute
    for there, back, status in (
        (compute.stop_server, compute.start_server, "SHUTOFF"),
        (compute.pause_server, compute.unpause_server, "PAUSED"),
        (compute.suspend_server, compute.resume_server, "SUSPENDED"),
        (compute.shelve_server, None, "SHELVED_OFFLOADED"),
    ):
        there(server_id)
        settle(lane, server_id, status)
        observe(status)
        if back is not None:
            back(server_id)
            settle(lane, server_id, "ACTIVE")


def changed_since(lane: Lane, since: datetime) -> set[str]:
    listed = lane.conn.compute.servers(
        details=True, tags=lane.tag, changes_since=since.strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    return {server.id for server in listed}


def test_metadata_replace_all_by_state(lane):
    """PUT /servers/{id}/metadata in SHUTOFF, PAUSED, SUSPENDED and SHELVED_OFFLOADED: taken
    (the metadata replaced whole, ``updated`` moved, changes-since sees the server) or 409
    (nothing changed)."""
    server_id = lane.boot("actions-metadata")
    seen: dict[str, tuple[int, bool]] = {}

    def replace_all(status: str) -> None:
        before = look(lane, server_id)
        time.sleep(SECOND_AND_A_BIT)  # `updated` in whole seconds
        later = datetime.fromisoformat(before.updated_at) + timedelta(seconds=1)
        values = {"actions-state": status.lower()}
        response = lane.conn.compute.put(
            f"/servers/{server_id}/metadata", json={"metadata": values}, raise_exc=False
        )
        after = look(lane, server_id)
        moved = after.updated_at != before.updated_at
        assert (server_id in changed_since(lane, later)) == moved
        if response.status_code == 200:
            assert response.json() == {"metadata": values}
            assert after.metadata == values  # replaced whole: the group key is gone
        else:
            message = METADATA_REFUSED.format(id=server_id)
            assert response.json() == refusal(409, message)
            assert after.metadata == before.metadata
        seen[status] = (response.status_code, moved)

    walk(lane, server_id, replace_all)
    assert seen == METADATA


def test_console_output_by_state(lane, request):
    """os-getConsoleOutput in ACTIVE (with ``length``: the last lines, Nova's tail) and in
    each resting state: 200 with the log, or refused."""
    server_id = lane.boot("actions-console")
    seen: dict[str, tuple[int, str | None]] = {}
    outputs: dict[str, str] = {}

    def read(status: str) -> None:
        code, body = answer(lane.conn, server_id, {"os-getConsoleOutput": {}})
        if code == 200:
            outputs[status] = body["output"]
            seen[status] = (code, None)
        else:
            kind = next(iter(body))
            seen[status] = (code, body[kind]["message"].replace(server_id, "{id}"))

    read("ACTIVE")
    tailed = lane.conn.compute.get_server_console_output(server_id, length=1)["output"]
    assert tailed == "\n".join(outputs["ACTIVE"].split("\n")[-1:])  # compute manager's tail
    walk(lane, server_id, read)
    assert seen == CONSOLE[lane.name]
    if lane.name == REAL:
        assert set(outputs.values()) == {FAKE_CONSOLE}
        assert tailed == "LAST LINE"
    else:
        assert f"instance {server_id} is actions-console" in outputs["ACTIVE"]
    note(request, "console", seen)


def test_quota_usage_with_a_server_shutoff_and_offloaded(lane, request):
    """/limits totalInstancesUsed, totalCoresUsed, totalRAMUsed with one m1.small ACTIVE,
    SHUTOFF, then SHELVED_OFFLOADED, in a project of its own. The real lane counts the legacy
    way (its Nova's default); the simulator counts from placement unless told otherwise, and
    then agrees."""
    conn = lane.conn
    if lane.nova is not None:  # a project with nothing else in it
        project = lane.nova.add_project(f"actions{uuid.uuid4().hex[:6]}")
        conn = connect(lane.nova, project["cloud"])
        lane.closing.append(conn)
    server_id = lane.boot("actions-quota", conn)

    def usage() -> tuple[int, int, int]:
        limits = conn.compute.get_limits().absolute
        return (limits.instances_used, limits.total_cores_used, limits.total_ram_used)

    seen = {"ACTIVE": usage()}
    conn.compute.stop_server(server_id)
    settle(lane, server_id, "SHUTOFF", conn=conn)
    seen["SHUTOFF"] = usage()
    conn.compute.shelve_server(server_id)
    settle(lane, server_id, "SHELVED_OFFLOADED", conn=conn)
    seen["SHELVED_OFFLOADED"] = usage()
    assert seen == USAGE[lane.name]
    if lane.sim is not None:  # the simulator's legacy counting is real Nova's default
        lane.sim.nova.quota.count_usage_from_placement = False
        assert usage() == USAGE[REAL]["SHELVED_OFFLOADED"]
    note(request, "usage", seen)
