"""The simulator's model of Nova, in memory, with hooks to inject the faults real clouds have.

``FakeNova`` models what osas relies on from Nova: tags and metadata on servers, BUILD turning
ACTIVE, ERROR servers with a fault, deletes that keep a server ACTIVE with task_state
``deleting`` for ``delete_seconds``, deleted servers kept for ``changes-since`` but stripped of
their tags, keypairs, server groups, quotas refused with Nova's own wording (``NovaRefusal``),
paging. The simulated OpenStack serves it over HTTP (``osas.sim.server``), and
The tests' ``FakeCloud`` (tests/fake_cloud.py) is an in-process ``Cloud`` over it.

Besides Nova's own quotas, ``Quota`` holds those of the services a create leans on: Neutron's
``ports`` (Nova's API asks Neutron before it accepts a create, and refuses one whose new ports
would not fit with 403 "Maximum number of ports exceeded") and Cinder's ``volumes`` and
``gigabytes`` (checked only when the compute host makes a boot volume, after the API accepted
the create: over either, the build is aborted and the server ends ERROR with Cinder's refusal in
its fault, ``VolumeLimitExceeded`` or ``VolumeSizeExceedsAvailableQuota``). ``usage()`` counts
them as those services do: ports and volumes belong to servers whose build reached a host and
did not fail, plus the ports Neutron's registry holds when the simulator wires it in.

``Faults`` also reproduces what real Nova does under load: creates stored only after the client
gave up (``create_stall``), the conductor's quota re-check that turns concurrent creates into
ERROR servers with a 413 fault after the API accepted them (``quota_recheck_seconds``), paged
listings that repeat a server (``repeated_pages``) or miss one (``skipped_servers``), "Maximum
number of ports exceeded" (``ports_exceeded``), and answers lost or connections dropped after
a create was stored (``lost_create_responses``, ``lost_create_status``,
``dropped_create_connections``), and a public cloud's rate limit in front of the API
(``create_rate``, ``request_rate``: 429 with ``Retry-After``).

Server actions (``server_action``, ``unshelve_server``) follow Nova's compute API: os-start,
os-stop, pause, unpause, suspend, resume, shelve, shelveOffload and unshelve, each accepted only
in the vm states Nova's ``check_instance_state`` lists and with no task running (409 otherwise,
in Nova's words), each setting its task state at once (``powering-on``, ``shelving``...) and
ending after its own timing (``start_seconds``, ``shelve_seconds``...), with ``updated`` bumped
at every step. ``shelve`` offloads at once as Nova's ``shelved_offload_time`` of 0 does (or
later, or never); a SHELVED_OFFLOADED server keeps counting against ``instances`` but, with
``Quota.count_usage_from_placement`` (placement counting, or unified limits), no longer against
cores and RAM, so its unshelve re-checks them (403 "Quota exceeded for resources") and is
scheduled again (``unshelve_no_valid_host``: back to SHELVED_OFFLOADED, as Nova's conductor
leaves it). A failed start (``start_fails``) leaves the server SHUTOFF with its fault recorded,
as Nova's ``reverts_task_state`` and ``wrap_instance_fault`` do; a stalled one
(``start_stalls``) stays ``powering-on`` until ``activate`` names it.

Every server runs a guest (``osas.sim.guest``): osas's user data at each boot, and the console
log ``console_output`` reads as Nova's ``os-getConsoleOutput`` does. The guest reads the
metadata when it boots. A server whose metadata carries ``osas-warm`` then prepares, prints
``osas-warm-prepared`` after ``warm_prepare_seconds`` and, if its ``osas-warm-state`` is
shutoff or absent, powers itself off: Nova's power-state sync records power state 4 and stops
it (``powering-off``, then SHUTOFF after ``stop_seconds``), as for ``os-stop``. The preparation
runs once per disk; a later boot with the warm mark prints the marker after the same time,
waits as long again and reads the metadata a second time (the real script waits 20 s, the
metadata service caching its answers): still warm, it powers off (a warm server started by
mistake goes back to SHUTOFF); claimed meanwhile, it joins and stays ACTIVE. In a pool kept
paused, suspended or shelved_offloaded the guest stays up, idle, with the marker on its
console, and joins when it runs without the mark (an offloaded one is unshelved still warm,
prints the marker again and waits for its claim). One started without the mark (claimed)
stays ACTIVE and joins: ``osas-node-joined`` on its console, once per disk.
``warm_prepare_hangs``: a preparation that never ends. Servers without the mark behave as they
did: their guest only writes a console.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import re
import threading
import uuid
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Concatenate, ParamSpec, TypeVar

from osas.cloud.port import CreateServerRequest
from osas.domain.servers import Fault, Flavor, ServerRecord
from osas.sim.guest import CONSOLE_NOT_AVAILABLE, WARM_MARK, Guest, seeded_guest, tail

NO_VALID_HOST = "No valid host was found. There are not enough hosts available."
GROUP_MEMBERS_EXCEEDED = "Quota exceeded, too many servers in group"
PORTS_EXCEEDED = "Maximum number of ports exceeded"  # Nova's PortLimitExceeded
# Cinder's refusals as a compute host's volume create meets them (cinderclient's OverLimit, its
# message prefixed with the exception's name by Cinder's API), inside Nova's BuildAbortException.
BUILD_ABORTED = "Build of instance {server_id} aborted: {reason}"
VOLUMES_EXCEEDED = (
    "VolumeLimitExceeded: Maximum number of volumes allowed ({allowed}) exceeded for quota "
    "'volumes'."
)
GIGABYTES_EXCEEDED = (
    "VolumeSizeExceedsAvailableQuota: Requested volume or snapshot exceeds allowed gigabytes "
    "quota. Requested {requested}G, quota is {quota}G and {consumed}G has been consumed."
)
# Reads of one server kept for the DELETE that may follow (``FakeNova.deletes_asked``).
_READS_KEPT = 10_000
SCHEDULING = "scheduling"  # the task state of a new server, as Nova sets it at once
# vm states (by status) in which Nova lets a server's metadata change, with no task running.
_METADATA_STATES = {"ACTIVE", "PAUSED", "SUSPENDED", "SHUTOFF"}
OFFLOADED = "SHELVED_OFFLOADED"
# A non-Nova exception's fault carries its class name alone (nova.compute.utils'
# exception_to_dict): what libvirt's power_on failing leaves on the instance.
START_FAILED = "libvirtError"


class NovaRefusal(Exception):
    """Nova refused a request: the status and message its API answers with. The HTTP simulator
    renders it in Nova's envelope; the tests' in-process cloud translates it as an adapter would."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_FLAVORS = (
    Flavor("f-small", "m1.small", vcpus=1, ram_mib=2048, disk_gib=20),
    Flavor("f-medium", "m1.medium", vcpus=2, ram_mib=4096, disk_gib=40),
    Flavor("f-large", "m1.large", vcpus=4, ram_mib=8192, disk_gib=80),
    Flavor(
        "f-gpu",
        "g1.xlarge",
        vcpus=8,
        ram_mib=32768,
        disk_gib=100,
        extra_specs={"resources:VGPU": "1"},
    ),
)


@dataclass(slots=True)
class FakeServer:
    server_id: str
    name: str
    flavor_id: str
    image: str
    networks: tuple[str, ...]
    metadata: dict[str, str]
    tags: set[str]
    created_at: datetime
    updated_at: datetime
    status: str = "BUILD"
    task_state: str | None = SCHEDULING
    fault: Fault | None = None
    user_data: str | None = None
    key_name: str | None = None
    availability_zone: str | None = None
    server_group: str | None = None
    security_groups: tuple[str, ...] = ()
    boot_volume_gib: int | None = None
    # When the delete was asked, by the real clock: Nova's deletes and builds finish by
    # events, not by comparing its (possibly jumping) clock, so their timing never uses it.
    deleting_since: datetime | None = None
    fault_created: datetime | None = None
    config_drive: bool = False
    # With Faults.quota_recheck_seconds: when the conductor re-checks the quota (real clock).
    # Until then the server is BUILD/scheduling and the API's own quota check does not count it.
    scheduling_until: datetime | None = None
    started: datetime | None = None  # when it was created, by the real clock
    # A server action under way (os-start, shelve...): the step it is at, when that step began
    # (real clock), and what the injected faults decided for it when it was asked.
    phase: str | None = None
    phase_since: datetime | None = None
    outcome: str | None = None
    # SHELVED, waiting for Nova's periodic offload (shelved_offload_time > 0; real clock).
    shelved_since: datetime | None = None
    # What runs inside: osas's user data at every boot, and the console log (osas.sim.guest).
    guest: Guest = field(default_factory=Guest)

    def record(self) -> ServerRecord:
        return ServerRecord(
            server_id=self.server_id,
            name=self.name,
            status=self.status,
            # Nova reads a deleted server's metadata as empty (its rows are soft-deleted).
            metadata={} if self.status == "DELETED" else dict(self.metadata),
            tags=frozenset(self.tags),
            task_state=self.task_state,
            # Nova's API shows a fault only on ERROR and DELETED servers (a failed start's
            # fault stays on the SHUTOFF server unseen).
            fault=self.fault if self.status in _FAULT_STATUSES else None,
        )


@dataclass(slots=True)
class Faults:
    """What goes wrong, and how often. Counters (ints) are consumed one create (or one listing
    page, or one server action) at a time; floats are settings that hold until changed."""

    error_rate: float = 0.0  # share of calls that fail as a 5xx would
    latency: float = 0.0  # seconds added to every call
    quota_exceeded: int = 0  # next creates refused synchronously with 403 "Quota exceeded"
    no_valid_host: int = 0  # next creates accepted, then ERROR with a NoValidHost fault
    lost_create_responses: int = 0  # next creates succeed but the answer is lost (5xx)
    lost_create_status: int = 502  # the status of a lost answer (503: keystoneauth resends)
    dropped_create_connections: int = 0  # next creates stored, then the connection is closed
    create_stall: float = 0.0  # every create is stored and answered only after this long
    delete_stall: float = 0.0  # every DELETE reaches Nova (and is answered) only after this long
    quota_recheck_seconds: float = 0.0  # scheduling window before the conductor's quota re-check
    repeated_pages: int = 0  # next pages asked with a marker start with the marker's server
    skipped_servers: int = 0  # next listing pages leave out their first server (Nova can)
    ports_exceeded: int = 0  # next creates refused with 403 "Maximum number of ports exceeded"
    start_fails: int = 0  # next starts end back in SHUTOFF (SHELVED) with a fault recorded
    start_stalls: int = 0  # next starts stay powering-on until ``activate`` names the server
    warm_prepare_hangs: int = 0  # next warm guests' preparations never end (no marker, no poweroff)
    # next unshelves of a SHELVED_OFFLOADED server refused with 403 "Quota exceeded" (only
    # where Nova checks: with Quota.count_usage_from_placement), or that find no host
    unshelve_quota_exceeded: int = 0
    unshelve_no_valid_host: int = 0
    max_servers: int | None = None  # the project's instance quota
    # A server deleted while Nova is still scheduling it vanishes whole, leaving no DELETED
    # row for changes-since (real Nova deletes the build request; no instance ever existed).
    deletes_while_scheduling_vanish: bool = False
    # A rate limit in front of the API (as public clouds run one), per second: above it the
    # request is answered 429 with Retry-After and never reaches Nova. 0 is no limit.
    create_rate: float = 0.0  # server creates (POST /servers)
    request_rate: float = 0.0  # every compute request
    rate_limit_status: int = 429  # 503: a limiter that answers 503 with Retry-After


@dataclass(slots=True)
class Quota:
    """The project's quotas that bear on a create; None is unlimited (the services' -1). Nova's
    own defaults are 10 instances, 20 cores and 50 GiB of RAM, Neutron's 500 ports, Cinder's 10
    volumes and 1000 GiB; the fake starts unlimited so large tests can run."""

    instances: int | None = None
    cores: int | None = None
    ram: int | None = None  # MiB
    metadata_items: int = 128
    key_pairs: int = 100
    server_groups: int = 10
    server_group_members: int = 10  # the hidden cap that breaks the 11th node of a group
    ports: int | None = None  # Neutron's
    volumes: int | None = None  # Cinder's
    gigabytes: int | None = None  # Cinder's, GiB of volumes
    # Nova's [quota] count_usage_from_placement (or unified limits): cores and RAM counted from
    # placement, where a SHELVED_OFFLOADED server holds none, so its unshelve re-checks them.
    # False is Nova's legacy counting (its default) from the cell databases: every live server
    # counts its flavor, and unshelve checks nothing.
    count_usage_from_placement: bool = True


@dataclass(slots=True)
class FakeKeypair:
    name: str
    public_key: str
    created_at: datetime
    key_type: str = "ssh"

    @property
    def fingerprint(self) -> str:
        digest = hashlib.md5(self.public_key.encode(), usedforsecurity=False).hexdigest()
        return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


@dataclass(slots=True)
class FakeServerGroup:
    group_id: str
    name: str
    policy: str
    rules: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ServerFilter:
    """The list filters Nova applies server-side, with Nova's semantics: ``tags`` needs every
    tag, ``tags_any`` one of them, ``not_tags`` excludes servers carrying all of its tags,
    ``not_tags_any`` those carrying any."""

    tags: frozenset[str] = frozenset()
    tags_any: frozenset[str] = frozenset()
    not_tags: frozenset[str] = frozenset()
    not_tags_any: frozenset[str] = frozenset()
    changes_since: datetime | None = None
    changes_before: datetime | None = None
    name: re.Pattern[str] | None = None
    status: str | None = None

    def matches(self, server: FakeServer) -> bool:
        return (
            self._matches_time(server) and self._matches_tags(server) and self._matches_rest(server)
        )

    def _matches_time(self, server: FakeServer) -> bool:
        if self.changes_since is None and self.changes_before is None:
            # Only a changes-since/-before query lifts Nova's deleted=False.
            return server.status != "DELETED"
        if self.changes_since is not None and server.updated_at < self.changes_since:
            return False
        return self.changes_before is None or server.updated_at <= self.changes_before

    def _matches_tags(self, server: FakeServer) -> bool:
        tags = server.tags
        if self.tags and not self.tags <= tags:
            return False
        if self.tags_any and not self.tags_any & tags:
            return False
        if self.not_tags and self.not_tags <= tags:
            return False
        return not (self.not_tags_any and self.not_tags_any & tags)

    def _matches_rest(self, server: FakeServer) -> bool:
        if self.name is not None and not self.name.search(server.name):
            return False
        return self.status is None or server.status == self.status


def _locked(method: Callable[Concatenate[FakeNova, P], R]) -> Callable[Concatenate[FakeNova, P], R]:
    """Run a FakeNova method under its lock: the simulator calls it from many threads."""

    @functools.wraps(method)
    def guarded(nova: FakeNova, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with nova.lock:
            return method(nova, *args, **kwargs)

    return guarded


@dataclass(frozen=True, slots=True)
class DeleteAsked:
    """A DELETE of a server that reached Nova's API, with the server's metadata and tags as
    the last read of that server alone (``GET /servers/{id}``) before it showed them; None when
    no such read came first. Nova has no conditional delete: a mark removed after that read
    and before the DELETE lands does not stop it."""

    server_id: str
    read_metadata: Mapping[str, str] | None
    read_tags: frozenset[str] | None


class FakeNova:
    """Nova's server model in memory; synchronous, so the HTTP simulator can serve it too.

    Every public method takes ``lock`` (re-entrant), so tests may read and seed the model while
    the simulator serves it; hold the lock yourself for several steps that must not interleave.
    """

    def __init__(
        self,
        *,
        flavors: Iterable[Flavor] = DEFAULT_FLAVORS,
        build_seconds: float | None = None,
        delete_seconds: float = 0.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.flavors = {flavor.flavor_id: flavor for flavor in flavors}
        self.build_seconds = build_seconds  # None: servers stay BUILD until activate()
        self.delete_seconds = delete_seconds
        # How long each server action runs on its compute host (real clock, read while the step
        # runs; 0: done at the next look). A SHELVED_OFFLOADED server's unshelve is scheduled
        # for the first half of unshelve_seconds and spawns for the second; a SHELVED one's
        # unshelve is a start (start_seconds, and the start faults).
        self.start_seconds = 0.0
        self.stop_seconds = 0.0
        self.pause_seconds = 0.0
        self.unpause_seconds = 0.0
        self.suspend_seconds = 0.0
        self.resume_seconds = 0.0
        self.shelve_seconds = 0.0  # power off and snapshot (a boot volume needs none)
        self.shelve_offload_seconds = 0.0  # off the host (also a volume-backed shelve)
        self.unshelve_seconds = 0.0
        # Nova's option: 0 offloads a shelved server at once, more waits that many seconds
        # (Nova's periodic task looks every shelved_poll_interval), negative never offloads.
        self.shelved_offload_time = 0.0
        # Nova's default policy lets only admins shelveOffload; the simulator's user is none.
        self.allow_shelve_offload = False
        # How long a warm guest's boot script runs before it prints its marker (and powers
        # itself off, in a pool kept shut off): real clock, counted from the boot. A later
        # warm boot of such a pool waits as long again before it reads the metadata again.
        self.warm_prepare_seconds = 0.2
        # Nova's [serial_console] enabled: the console log of a server whose guest is not
        # running is read too (the last run's), where by default Nova answers 404.
        self.serial_console = False
        self._base_clock = clock or (lambda: datetime.now(UTC))
        # How far Nova's clock is off the real one (negative: behind); Nova stamps
        # `updated_at`, judges `changes-since` and writes its answers' Date by it.
        self.clock_offset = 0.0
        self.lock = threading.RLock()
        self.faults = Faults()
        self.quota = Quota()
        self.calls: Counter[str] = Counter()
        self.keypairs: dict[str, FakeKeypair] = {}
        self.server_groups: dict[str, FakeServerGroup] = {}
        self.availability_zones: list[str] = ["nova"]
        # The device id of every port Neutron's registry holds ("" when unbound), for the port
        # quota: the simulator wires its Neutron in. Without it (the in-process FakeCloud) only
        # the ports Nova makes for its servers count.
        self.registry_ports: Callable[[], Iterable[str]] = tuple
        self._servers: dict[str, FakeServer] = {}
        # Servers time may still change (building, scheduling, being deleted), so that letting
        # time pass costs what is in flight, not the whole cloud; and every server in listing
        # order, kept until a server is added (created_at and ids never change).
        self._unsettled: dict[str, FakeServer] = {}
        self._listing_order: list[FakeServer] | None = None
        # What the last read of each server alone showed of its marks, and every DELETE the
        # API took with the read before it (the last 10,000: a long-running simulator).
        self._last_read: dict[str, tuple[dict[str, str], frozenset[str]]] = {}
        self.deletes_asked: deque[DeleteAsked] = deque(maxlen=10_000)

    @property
    def clock(self) -> Callable[[], datetime]:
        """Nova's clock: the one set (the real one by default), off by ``clock_offset``."""
        return self._now

    @clock.setter
    def clock(self, clock: Callable[[], datetime]) -> None:
        self._base_clock = clock

    def _now(self) -> datetime:
        return self._base_clock() + timedelta(seconds=self.clock_offset)

    # -- inspection for tests --------------------------------------------------------------------

    @_locked
    def live_servers(self) -> list[FakeServer]:
        self._advance()
        return [s for s in self._servers.values() if s.status != "DELETED"]

    @_locked
    def activate(self, server_id: str | None = None) -> None:
        """Finish the build of one server, or of every server in BUILD. A server still waiting
        for the quota re-check has it now, and may end ERROR instead. A server named by id
        also finishes the action it runs (a stalled start too, as Nova's compute host retries
        a start left ``powering-on`` when it restarts); one bound to fail fails now."""
        now = self.clock()
        self._advance()
        named = self._servers.get(server_id) if server_id is not None else None
        if named is not None and named.phase is not None:
            if named.outcome == "stalls":
                named.outcome = None
            self._advance_action(named, None, now)
        for server in list(self._servers.values()):
            if server.status != "BUILD" or server_id not in {None, server.server_id}:
                continue
            if _scheduling(server):
                self._recheck_quota(server, now)
            if server.status == "BUILD":
                self._finish_build(server, now, self._base_clock())

    @_locked
    def seed(
        self,
        *,
        name: str,
        metadata: Mapping[str, str] | None = None,
        tags: Iterable[str] = (),
        status: str = "ACTIVE",
        flavor_id: str = "f-small",
        image: str = "image",
        networks: Iterable[str] = (),
        server_group: str | None = None,
        fault: Fault | None = None,
    ) -> FakeServer:
        """A server made behind osas's back: by hand, by another tool or another cluster."""
        server = self._new_server(
            name,
            flavor_id=flavor_id,
            image=image,
            networks=tuple(networks),
            metadata=metadata or {},
            tags=tags,
        )
        server.status = status
        server.task_state = None
        server.server_group = server_group
        server.guest = seeded_guest(server.metadata, status)
        if fault is not None:
            server.fault, server.fault_created = fault, server.created_at
        if status == "DELETED":
            # As Nova leaves it: tags hard-deleted with the instance.
            server.deleting_since = server.created_at
            server.tags.clear()
        return server

    @_locked
    def console_lines(self, server_id: str) -> list[str]:
        """Every line of a server's console log, whatever state it is in (not an API call)."""
        self._advance()
        server = self._servers[server_id]
        return server.guest.log_lines(server.name, server_id)

    @_locked
    def all_servers(self) -> list[FakeServer]:
        """Every server the model remembers, deleted ones included (not an API call)."""
        self._advance()
        return list(self._servers.values())

    @_locked
    def find_server(self, server_id: str) -> FakeServer | None:
        """One server, deleted or not, without counting a call (for markers and inspection)."""
        self._advance()
        return self._servers.get(server_id)

    @_locked
    def usage(self) -> dict[str, int]:
        """What the live servers consume of the project's quotas. Nova's (instances, cores, ram)
        count ERROR and scheduling servers: they hold Nova's quota until deleted. Neutron's
        ``ports`` and Cinder's ``volumes`` and ``gigabytes`` count only servers holding their
        ports and boot volume (``_holds_resources``), plus the ports of Neutron's registry
        (``registry_ports``) not bound to one of those."""
        return self._usage_of(self.live_servers())

    def _usage_of(self, servers: Iterable[FakeServer]) -> dict[str, int]:
        """Every server counts one instance; its flavor's cores and RAM unless it is
        SHELVED_OFFLOADED with no unshelve under way and usage is counted from placement."""
        servers = list(servers)
        placement = self.quota.count_usage_from_placement
        flavors = [
            self.flavors.get(server.flavor_id)
            for server in servers
            if not (placement and _offloaded(server))
        ]
        holding = [server for server in servers if _holds_resources(server)]
        held = {server.server_id for server in holding}
        volumes = [s.boot_volume_gib for s in holding if s.boot_volume_gib is not None]
        return {
            "instances": len(servers),
            "cores": sum(flavor.vcpus for flavor in flavors if flavor is not None),
            "ram": sum(flavor.ram_mib for flavor in flavors if flavor is not None),
            # One port per network a server is on (a port it was given is one of them).
            "ports": sum(len(server.networks) for server in holding)
            + sum(1 for device in self.registry_ports() if device not in held),
            "volumes": len(volumes),
            "gigabytes": sum(volumes),
        }

    def _quota_limits(self) -> dict[str, int | None]:
        return {
            "instances": self.instance_limit(),
            "cores": self.quota.cores,
            "ram": self.quota.ram,
        }

    @_locked
    def take_fault(self, name: str) -> bool:
        """Consume one of a ``Faults`` counter; False when it is at zero."""
        left = getattr(self.faults, name)
        if left <= 0:
            return False
        setattr(self.faults, name, left - 1)
        return True

    @_locked
    def instance_limit(self) -> int | None:
        """The instance quota: the smaller of ``quota.instances`` and ``faults.max_servers``."""
        limits = [n for n in (self.quota.instances, self.faults.max_servers) if n is not None]
        return min(limits) if limits else None

    @_locked
    def add_keypair(self, name: str, public_key: str | None = None) -> FakeKeypair:
        key = public_key or f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA{name} {name}@osas-sim"
        keypair = FakeKeypair(name=name, public_key=key, created_at=self.clock())
        self.keypairs[name] = keypair
        return keypair

    @_locked
    def add_server_group(
        self,
        name: str,
        *,
        policy: str = "anti-affinity",
        rules: Mapping[str, int] | None = None,
        group_id: str | None = None,
    ) -> FakeServerGroup:
        group_id = group_id or str(uuid.uuid4())
        group = FakeServerGroup(group_id, name, policy, dict(rules or {}))
        self.server_groups[group.group_id] = group
        return group

    @_locked
    def find_server_group(self, name_or_id: str) -> FakeServerGroup | None:
        if name_or_id in self.server_groups:
            return self.server_groups[name_or_id]
        return next((g for g in self.server_groups.values() if g.name == name_or_id), None)

    @_locked
    def server_group_members(self, group: FakeServerGroup) -> list[str]:
        """Live servers placed in the group, whether it was named by id (HTTP) or name (fake)."""
        return [
            server.server_id
            for server in self.live_servers()
            if server.server_group in {group.group_id, group.name}
        ]

    # -- the API -----------------------------------------------------------------------------

    @_locked
    def find_flavor(self, name_or_id: str) -> Flavor | None:
        self.calls["flavors.get"] += 1
        if name_or_id in self.flavors:
            return self.flavors[name_or_id]
        for flavor in self.flavors.values():
            if flavor.name == name_or_id:
                return flavor
        return None

    @_locked
    def list_servers(
        self,
        *,
        tags: Sequence[str] = (),
        tags_any: Sequence[str] = (),
        not_tags: Sequence[str] = (),
        not_tags_any: Sequence[str] = (),
        changes_since: datetime | None = None,
        changes_before: datetime | None = None,
        name: str | None = None,
        status: str | None = None,
    ) -> list[FakeServer]:
        """Newest first, as Nova sorts. Deleted servers appear only with changes-since or
        changes-before, and never with a tag filter, because Nova hard-deletes a server's tags
        when it is destroyed. ``name`` is a regular expression searched anywhere in the name."""
        self.calls["servers.list"] += 1
        self._advance()
        try:
            name_pattern = None if name is None else re.compile(name)
        except re.error as exc:
            raise NovaRefusal(f"Invalid regular expression for name: {exc}", 400) from exc
        wanted = ServerFilter(
            tags=frozenset(tags),
            tags_any=frozenset(tags_any),
            not_tags=frozenset(not_tags),
            not_tags_any=frozenset(not_tags_any),
            changes_since=changes_since,
            changes_before=changes_before,
            name=name_pattern,
            status=None if status is None else status.upper(),
        )
        if self._listing_order is None:
            self._listing_order = sorted(self._servers.values(), key=_listing_order, reverse=True)
        if wanted == ServerFilter(tags=wanted.tags):
            # The listing osas makes most: only live servers, by tag (what matches() does).
            wanted_tags = wanted.tags
            order = self._listing_order
            return [s for s in order if s.status != "DELETED" and wanted_tags <= s.tags]
        return [server for server in self._listing_order if wanted.matches(server)]

    @_locked
    def page_of(
        self, servers: Sequence[FakeServer], *, limit: int | None, marker: str | None
    ) -> list[FakeServer]:
        """One page of a listing, as Nova cuts it: the servers that sort after ``marker``.

        The marker may be a server the filters exclude, or a deleted one (Nova looks it up with
        deleted rows); one Nova never had is a 400, with Nova's message. While
        ``faults.repeated_pages`` lasts, a page starts with the marker's own server again if it
        is in ``servers``, as real Nova's pages can repeat a server while builds are in flight."""
        start = 0
        if marker is not None:
            anchor = self._servers.get(marker)
            if anchor is None:
                raise NovaRefusal(f"marker [{marker}] not found", 400)
            anchor_key = _listing_order(anchor)
            # The first server that sorts after the marker (servers run from the largest key).
            after = True  # bisect finds the first index where "sorts after" holds
            start = bisect.bisect_left(
                range(len(servers)), after, key=lambda i: _listing_order(servers[i]) < anchor_key
            )
            repeat = start > 0 and servers[start - 1].server_id == marker
            if repeat and self.take_fault("repeated_pages"):
                start -= 1
        if start < len(servers) and self.take_fault("skipped_servers"):
            # Real Nova's paged listings can miss a server while builds are in flight (seen
            # in the real-Nova lane): the page leaves its first server out, still full.
            start += 1
        end = len(servers) if limit is None else start + limit
        return list(servers[start:end])

    @_locked
    def get_server(self, server_id: str) -> FakeServer | None:
        self.calls["servers.get"] += 1
        self._advance()
        server = self._servers.get(server_id)
        return None if server is None or server.status == "DELETED" else server

    @_locked
    def show_server(self, server_id: str) -> FakeServer | None:
        """``get_server`` as the API's read of one server: what it shows of the marks is kept
        for the DELETE that may follow (``deletes_asked``)."""
        server = self.get_server(server_id)
        if server is not None:
            self._last_read.pop(server_id, None)  # the newest read last, the oldest dropped
            self._last_read[server_id] = (dict(server.metadata), frozenset(server.tags))
            if len(self._last_read) > _READS_KEPT:
                del self._last_read[next(iter(self._last_read))]
        return server

    @_locked
    def delete_asked(self, server_id: str) -> bool:
        """``delete_server`` as the API's DELETE, recorded with the read before it when it
        found the server (a DELETE sent again, its first answer lost, shares that read)."""
        read = self._last_read.get(server_id)
        deleted = self.delete_server(server_id)
        if deleted:
            self.deletes_asked.append(
                DeleteAsked(server_id, *(read if read is not None else (None, None)))
            )
        return deleted

    @_locked
    def create_server(self, request: CreateServerRequest, *, ports_given: int = 0) -> FakeServer:
        """Create as Nova's API does. ``ports_given``: how many of the request's networks are
        existing ports it names (Neutron makes no new port for those)."""
        self.calls["servers.create"] += 1
        flavor = self.find_flavor(request.flavor)
        if flavor is None:
            raise NovaRefusal(f"Flavor {request.flavor} could not be found.", 400)
        self._check_quota(request, flavor, new_ports=len(request.networks) - ports_given)
        server = self._new_server(
            request.name,
            flavor_id=flavor.flavor_id,
            image=request.image,
            networks=tuple(request.networks),
            metadata=request.metadata,
            tags=request.tags,
        )
        server.user_data = request.user_data
        server.key_name = request.key_name
        server.availability_zone = request.availability_zone
        server.server_group = request.server_group
        server.security_groups = tuple(request.security_groups)
        server.boot_volume_gib = request.boot_volume.size_gib if request.boot_volume else None
        if self.take_fault("no_valid_host"):
            # Nova buries it in cell0 as ERROR, tags and metadata kept.
            server.status, server.task_state = "ERROR", None
            server.fault, server.fault_created = Fault(500, NO_VALID_HOST), server.created_at
        elif self.faults.quota_recheck_seconds > 0:
            window = timedelta(seconds=self.faults.quota_recheck_seconds)
            server.scheduling_until = (server.started or server.created_at) + window
        else:
            self._make_boot_volume(server, server.created_at)
        return server

    def _check_quota(self, request: CreateServerRequest, flavor: Flavor, *, new_ports: int) -> None:
        """Refuse a create the way Nova's API does: 403 before anything is built. Servers still
        scheduling are not counted: Nova's API races past them, its conductor re-checks."""
        quota = self.quota
        if len(request.metadata) > quota.metadata_items:
            raise NovaRefusal(_metadata_limit_message(quota.metadata_items), 403)
        if self.take_fault("ports_exceeded"):
            # Neutron's port quota, checked while Nova validates the networks, before its own.
            raise NovaRefusal(PORTS_EXCEEDED, 403)
        used = self._usage_of(s for s in self.live_servers() if not _scheduling(s))
        self._check_port_quota(new_ports, used["ports"])
        limits = self._quota_limits()
        instance_limit = limits["instances"]
        if self.take_fault("quota_exceeded"):
            limit = instance_limit if instance_limit is not None else used["instances"]
            raise NovaRefusal(
                f"Quota exceeded for instances: Requested 1, but already used "
                f"{used['instances']} of {limit} instances",
                403,
            )
        requested = _requested(flavor)
        overs = sorted(
            resource
            for resource, limit in limits.items()
            if limit is not None and used[resource] + requested[resource] > limit
        )
        if overs:
            raise NovaRefusal(_over_quota_message(overs, requested, used, limits), 403)
        if request.server_group is not None:
            members = sum(
                1 for server in self.live_servers() if server.server_group == request.server_group
            )
            if members >= quota.server_group_members:
                raise NovaRefusal(GROUP_MEMBERS_EXCEEDED, 403)

    def _check_port_quota(self, new_ports: int, used: int) -> None:
        """Nova's API validates the networks with Neutron: when the create needs new ports it
        reads the port quota and counts the project's ports, and refuses (403) a create whose
        ports would not fit, with its own wording when the project is already past the quota.
        Servers still scheduling have no ports yet, so concurrent creates can pass this check
        together; the compute host's port create that Neutron would then refuse is not
        simulated."""
        limit = self.quota.ports
        if new_ports <= 0 or limit is None:
            return
        if used > limit:
            raise NovaRefusal(
                f"The number of defined ports: {used} is over the limit: {limit}", 403
            )
        if used + new_ports > limit:
            raise NovaRefusal(PORTS_EXCEEDED, 403)

    @_locked
    def delete_server(self, server_id: str) -> bool:
        """False when there was no such server (Nova's 404)."""
        self.calls["servers.delete"] += 1
        self._advance()
        server = self._servers.get(server_id)
        if server is None or server.status == "DELETED":
            return False
        if (
            self.faults.deletes_while_scheduling_vanish
            and server.status == "BUILD"
            and server.task_state == SCHEDULING
        ):
            del self._servers[server_id]
            self._unsettled.pop(server_id, None)
            self._listing_order = None
            return True
        # No host to ask: Nova's API deletes a shelved offloaded server itself, at once.
        local = server.status == OFFLOADED and not has_host(server)
        # The compute host's action, if any, finds the task state changed and gives up.
        server.phase = server.phase_since = server.outcome = server.shelved_since = None
        if server.deleting_since is None:
            server.deleting_since = self._base_clock()
            server.task_state = "deleting"
            server.updated_at = self.clock()
            self._unsettled[server_id] = server
            if local:
                server.status, server.task_state = "DELETED", None
                server.tags.clear()
        self._advance()
        return True

    # -- server actions ---------------------------------------------------------------------------

    @_locked
    def server_action(self, server_id: str, action: str) -> None:
        """Ask for one of Nova's server actions by the key of its request body (``os-start``,
        ``os-stop``, ``pause``, ``unpause``, ``suspend``, ``resume``, ``shelve``,
        ``shelveOffload``, ``unshelve``), as Nova's API takes it: NovaRefusal with Nova's
        status and message (404, 409 in the wrong state, 403 for the policy or the quota),
        else the task state is set (``updated`` bumped) and the compute host's work runs on
        by the timings. ``unshelve`` here is ``unshelve_server`` with no zone or host."""
        if action == "unshelve":
            self.unshelve_server(server_id)
            return
        kind = SERVER_ACTIONS.get(action)
        if kind is None:
            raise NovaRefusal(f"There is no such action: {action}", 400)
        self.calls[f"servers.action.{action}"] += 1
        # Nova's controller asks the policy before the compute API checks the state.
        policy = None if action != "shelveOffload" or self.allow_shelve_offload else action
        server = self._server_for_action(server_id, kind, refused_by_policy=policy)
        outcome = None
        if action == "os-start":
            outcome = self._start_outcome()
        first = _FIRST_PHASE[action]
        if action == "shelve" and server.boot_volume_gib is not None:
            first = "shelve-volume"  # no snapshot: Nova's API offloads a volume-backed server
        self._begin(server, first, outcome)

    @_locked
    def unshelve_server(
        self,
        server_id: str,
        *,
        availability_zone: str | None = None,
        zone_given: bool = False,
        host: str | None = None,
    ) -> None:
        """Unshelve as Nova's API does. A SHELVED server is started again on its host; a
        SHELVED_OFFLOADED one has its cores and RAM checked first (with placement counting:
        403 "Quota exceeded for resources: [...]"), then is scheduled again, optionally to
        ``availability_zone`` (``zone_given``: None unpins it; microversion 2.77, 2.91) and
        spawned. A zone or host for a server that is not offloaded is a 409; a host is an
        admin's choice (403 for the simulator's user)."""
        self.calls["servers.action.unshelve"] += 1
        server = self._server_for_action(server_id, SERVER_ACTIONS["unshelve"])
        offloaded = server.status == OFFLOADED
        if offloaded:
            self._check_unshelve_quota(server)
        if (zone_given or host) and not offloaded:
            raise NovaRefusal(
                f"Specifying an availability zone or a host when unshelving server "
                f'"{server_id}" with status "{_VM_STATES[server.status]}" is not supported. '
                "The server status must be SHELVED_OFFLOADED.",
                409,
            )
        if zone_given and availability_zone and availability_zone not in self.availability_zones:
            raise NovaRefusal("The requested availability zone is not available", 400)
        if host:
            raise NovaRefusal(
                "Policy doesn't allow os_compute_api:os-shelve:unshelve_to_host to be performed.",
                403,
            )
        if zone_given:
            server.availability_zone = availability_zone
        if offloaded:
            outcome = "no_valid_host" if self.take_fault("unshelve_no_valid_host") else None
            self._begin(server, "unshelve", outcome)
        else:
            self._begin(server, "unshelve-shelved", self._start_outcome())

    @_locked
    def console_output(self, server_id: str, length: int | None = None) -> str:
        """``os-getConsoleOutput`` as Nova answers it, ``length`` checked by its schema (an
        integer from -1, or None): the log's tail by Nova's compute manager (``guest.tail``:
        None is all of it). Refused with Nova's status and message: 404 for a server that is
        not there; 409 "Instance <id> is not ready" for one with no host (scheduling, ERROR,
        SHELVED_OFFLOADED), as the compute API's ``check_instance_host`` says; 404 "Instance
        <id> could not be found." while a build or an unshelve spawns it (libvirt has no
        domain yet); 404 "Guest does not have a console available." when its guest does not
        run (SHUTOFF, SUSPENDED, SHELVED, powering on, or powered off by itself), as the libvirt
        driver finds no pty in the definition of a domain that is not running, unless
        ``serial_console``."""
        self.calls["servers.action.os-getConsoleOutput"] += 1
        server = self._live(server_id)
        if not has_host(server):
            raise NovaRefusal(f"Instance {server_id} is not ready", 409)
        if server.status in {"BUILD", OFFLOADED}:
            raise NovaRefusal(f"Instance {server_id} could not be found.", 404)
        guest = server.guest
        if not guest.running and not self.serial_console:
            raise NovaRefusal(CONSOLE_NOT_AVAILABLE, 404)
        return tail(guest.log(server.name, server_id), length)

    def _server_for_action(
        self, server_id: str, kind: ServerAction, *, refused_by_policy: str | None = None
    ) -> FakeServer:
        """The server, if Nova's API would act on it now: found (404), allowed by the policy
        (403), then its ``check_instance_host`` (start, stop) and ``check_instance_state``
        (the vm state, then no task running): 409."""
        server = self._live(server_id)
        if refused_by_policy is not None:
            rule = {"shelveOffload": "os-shelve:shelve_offload"}[refused_by_policy]
            raise NovaRefusal(f"Policy doesn't allow os_compute_api:{rule} to be performed.", 403)
        if kind.needs_host and not has_host(server):
            raise NovaRefusal(f"Instance {server_id} is not ready", 409)
        return _in_state(server, kind.allowed, kind.name)

    def _start_outcome(self) -> str | None:
        if self.take_fault("start_stalls"):
            return "stalls"
        return "fails" if self.take_fault("start_fails") else None

    def _check_unshelve_quota(self, server: FakeServer) -> None:
        """Nova's API re-checks cores and RAM for an offloaded server when usage comes from
        placement (it holds none there); legacy counting never stopped counting them."""
        if not self.quota.count_usage_from_placement:
            return
        if self.take_fault("unshelve_quota_exceeded"):
            raise NovaRefusal("Quota exceeded for resources: ['cores']", 403)
        used = self._usage_of(s for s in self.live_servers() if not _scheduling(s))
        requested = _requested(self.flavors.get(server.flavor_id))
        limits = self._quota_limits()
        overs = [
            resource
            for resource in ("cores", "ram")
            if (limit := limits[resource]) is not None
            and used[resource] + requested[resource] > limit
        ]
        if overs:
            raise NovaRefusal(f"Quota exceeded for resources: {overs!r}", 403)

    def _begin(self, server: FakeServer, phase: str, outcome: str | None) -> None:
        """Nova's API sets the task state and hands the rest to the conductor or the host."""
        server.phase, server.phase_since, server.outcome = phase, self._base_clock(), outcome
        server.shelved_since = None
        server.task_state = _PHASES[phase][0]
        server.updated_at = self.clock()
        self._unsettled[server.server_id] = server

    def _phase_seconds(self, server: FakeServer) -> float | None:
        """How long the server's current step lasts; None while a stalled start holds it."""
        phase = server.phase
        if phase is None or (phase == "start" and server.outcome == "stalls"):
            return None
        _, timing, share = _PHASES[phase]
        return 0.0 if timing is None else float(getattr(self, timing)) * share

    def _advance_action(self, server: FakeServer, real: datetime | None, now: datetime) -> None:
        """End every step of the server's action that is due by ``real`` (None: every step
        now, as ``activate`` asks), each step starting when the one before it ended; then
        Nova's periodic offload of a server shelved long enough."""
        while True:
            seconds = self._phase_seconds(server)
            if seconds is not None and server.phase_since is not None:
                due = server.phase_since + timedelta(seconds=seconds)
                if real is not None and real < due:
                    return
                self._end_phase(server, due if real is not None else self._base_clock(), now)
                continue
            wait = self.shelved_offload_time
            since = server.shelved_since
            if real is None or server.phase is not None or since is None or wait <= 0:
                return
            due = since + timedelta(seconds=wait)
            if real < due:
                return
            server.shelved_since = None
            server.phase, server.phase_since, server.outcome = "offload", due, None
            server.task_state, server.updated_at = _PHASES["offload"][0], now

    def _end_phase(self, server: FakeServer, ended: datetime, now: datetime) -> None:
        """One step of an action done, as Nova's conductor or compute host saves it."""
        phase, outcome = server.phase, server.outcome
        following: str | None = None
        if phase == "start" and outcome == "fails":
            # reverts_task_state clears the task; wrap_instance_fault records the fault.
            server.fault, server.fault_created = Fault(500, START_FAILED), now
        elif phase == "shelve":
            server.status = "SHELVED"
            if self.shelved_offload_time == 0:
                following = "offload"
            elif self.shelved_offload_time > 0:
                server.shelved_since = ended
        elif phase == "unshelve-shelved":
            following = "start"  # the conductor asks the host to start it again
        elif phase == "unshelve":
            # NoValidHost: the conductor clears the task and leaves it offloaded.
            following = None if outcome == "no_valid_host" else "spawn"
        elif phase is not None:
            server.status = _PHASE_ENDS[phase]
        server.updated_at = now
        if following is None:
            server.phase = server.phase_since = server.outcome = None
            server.task_state = None
        else:
            server.phase, server.phase_since = following, ended
            server.task_state = _PHASES[following][0]
        self._guest_after(server, phase, outcome, ended)

    def _guest_after(
        self, server: FakeServer, phase: str | None, outcome: str | None, ended: datetime
    ) -> None:
        """What the end of an action's step does to the guest: a power-on boots it, a power-off
        or shelve ends it, a suspend saves it and its resume restores it, an unpause lets it
        run on; a guest that runs again looks at the metadata (claimed while paused)."""
        guest = server.guest
        if phase in {"start", "spawn"} and outcome is None:
            self._boot_guest(server, ended)
        elif phase in {"stop", "shelve", "shelve-volume", "offload"}:
            guest.halt()
        elif phase == "suspend":
            guest.freeze()
        elif phase == "resume":
            guest.thaw()
        if phase in {"unpause", "resume"}:
            _guest_looks(server)

    @_locked
    def set_metadata(
        self, server_id: str, values: Mapping[str, str], *, replace: bool = False
    ) -> dict[str, str]:
        """Merge ``values`` into a server's metadata (or replace it all), as Nova's metadata API
        does: only in a stable state with no task running (409 otherwise), within the
        metadata_items quota (403). Setting bumps ``updated_at``; the merged metadata is
        returned. NovaRefusal carries Nova's status and message."""
        self.calls["servers.metadata.set"] += 1
        server = self._server_for_metadata(server_id, "update metadata")
        merged = dict(values) if replace else {**server.metadata, **values}
        if len(merged) > self.quota.metadata_items:
            raise NovaRefusal(_metadata_limit_message(self.quota.metadata_items), 403)
        server.metadata = merged
        server.updated_at = self.clock()
        _guest_looks(server)
        return dict(merged)

    @_locked
    def delete_metadata_key(self, server_id: str, key: str) -> None:
        """Remove one key (404 if the server does not have it). Unlike a set, Nova deletes the
        row alone and leaves the server's ``updated_at`` as it was."""
        self.calls["servers.metadata.delete"] += 1
        server = self._live(server_id)
        if key not in server.metadata:
            raise NovaRefusal("Metadata item was not found", 404)
        _in_state(server, _METADATA_STATES, "delete metadata")
        del server.metadata[key]
        _guest_looks(server)

    def _live(self, server_id: str) -> FakeServer:
        """The server as Nova's API finds it now (404 when it is not, or deleted)."""
        self._advance()
        server = self._servers.get(server_id)
        if server is None or server.status == "DELETED":
            raise NovaRefusal(f"Instance {server_id} could not be found.", 404)
        return server

    def _server_for_metadata(self, server_id: str, action: str) -> FakeServer:
        server = self._live(server_id)
        return _in_state(server, _METADATA_STATES, action)

    def _new_server(
        self,
        name: str,
        *,
        flavor_id: str,
        image: str,
        networks: tuple[str, ...],
        metadata: Mapping[str, str],
        tags: Iterable[str],
    ) -> FakeServer:
        now = self.clock()
        server = FakeServer(
            server_id=str(uuid.uuid4()),
            name=name,
            flavor_id=flavor_id,
            image=image,
            networks=networks,
            metadata=dict(metadata),
            tags=set(tags),
            created_at=now,
            updated_at=now,
            started=self._base_clock(),
        )
        self._servers[server.server_id] = server
        self._unsettled[server.server_id] = server
        self._listing_order = None
        return server

    def _advance(self) -> None:
        """Let time do what Nova does on its own: re-check quotas after scheduling, finish
        builds and deletions. Durations run on the real clock; what Nova stamps (``updated``)
        carries Nova's own."""
        real, now = self._base_clock(), self.clock()
        pending = list(self._unsettled.values())
        due = [
            server
            for server in pending
            if _scheduling(server)
            and server.scheduling_until is not None
            and real >= server.scheduling_until
        ]
        for server in due:
            self._recheck_quota(server, now)
        for server in pending:
            # build_seconds counts from the end of scheduling when there is a re-check window.
            build_start = server.scheduling_until or server.started or server.created_at
            if (
                server.status == "BUILD"
                and not _scheduling(server)
                and self.build_seconds is not None
                and real - build_start >= timedelta(seconds=self.build_seconds)
            ):
                self._finish_build(server, now, build_start + timedelta(seconds=self.build_seconds))
            if (
                server.deleting_since is not None
                and server.status != "DELETED"
                and real - server.deleting_since >= timedelta(seconds=self.delete_seconds)
            ):
                server.status, server.task_state, server.updated_at = "DELETED", None, now
                server.tags.clear()
                server.guest.halt()
            if server.phase is not None or server.shelved_since is not None:
                self._advance_action(server, real, now)
            self._advance_guest(server, real, now)
            if (
                server.status != "BUILD"
                and server.phase is None
                and server.shelved_since is None
                and (server.deleting_since is None or server.status == "DELETED")
                and server.guest.due is None
            ):
                del self._unsettled[server.server_id]  # nothing left for time to do

    def _finish_build(self, server: FakeServer, now: datetime, booted: datetime) -> None:
        """The build ends (``booted``, real clock) with the guest booting."""
        server.status, server.updated_at = "ACTIVE", now
        # A server deleted while it was building is still being deleted.
        server.task_state = "deleting" if server.deleting_since is not None else None
        self._boot_guest(server, booted)

    # -- the guest ----------------------------------------------------------------------------

    def _boot_guest(self, server: FakeServer, at: datetime) -> None:
        """The server's QEMU process starts at ``at`` (real clock) and its guest boots."""
        guest = server.guest
        guest.boot(
            server.metadata,
            at,
            seconds=self.warm_prepare_seconds,
            # Asked of a boot that prepares only, so that the fault is spent on one.
            hangs=not guest.prepared
            and WARM_MARK in server.metadata
            and self.take_fault("warm_prepare_hangs"),
        )

    def _advance_guest(self, server: FakeServer, real: datetime, now: datetime) -> None:
        """The guest's boot script ends its warm steps (the preparation; on a later boot of a
        pool kept shut off, the wait before it reads the metadata again, as long again) once
        each is due and the guest runs with no task under way (paused, or while Nova acts on
        it, it waits). A guest that then powers itself off leaves its instance ACTIVE with its
        domain shut down; Nova's power-state sync calls its stop API for it, as for
        ``os-stop``: ``powering-off``, then SHUTOFF (vm_state stopped, power_state 4) after
        ``stop_seconds``, ``updated`` bumped at each."""
        guest = server.guest
        if server.status == "DELETED":
            guest.halt()
            return
        while guest.running and server.status == "ACTIVE" and server.task_state is None:
            due = guest.due
            if due is None or real < due:
                return
            if guest.finish_warm_step(
                server.metadata, due, recheck_seconds=self.warm_prepare_seconds
            ):
                self._begin(server, "stop", None)
                server.phase_since = due
                self._advance_action(server, real, now)
                return
            _guest_looks(server)  # idle, and claimed while it prepared: it joins at once

    def _recheck_quota(self, server: FakeServer, now: datetime) -> None:
        """Nova's conductor re-checks the quota once the instance exists, counting every live
        server, this one included: over a limit, the server becomes ERROR with a 413 fault.
        Like Nova (deltas of zero), the message reports the limit as the usage."""
        limits = self._quota_limits()
        used = self._usage_of(s for s in self._servers.values() if s.status != "DELETED")
        overs = sorted(
            resource
            for resource, limit in limits.items()
            if limit is not None and used[resource] > limit
        )
        if not overs:
            server.task_state = "spawning"
            self._make_boot_volume(server, now)
            return
        message = _over_quota_message(
            overs, _requested(self.flavors.get(server.flavor_id)), limits, limits
        )
        server.status, server.task_state, server.updated_at = "ERROR", None, now
        server.fault, server.fault_created = Fault(413, message), now

    def _make_boot_volume(self, server: FakeServer, now: datetime) -> None:
        """The compute host makes a boot-from-volume server's volume as its build begins, and
        Cinder reserves its quota then (gigabytes checked before volumes, as Cinder sorts them).
        Refused, Nova aborts the build: the server turns ERROR with a 500 fault carrying
        Cinder's message, its ports freed, no volume made."""
        size = server.boot_volume_gib
        if size is None:
            return
        others = (s for s in self._servers.values() if s.status != "DELETED" and s is not server)
        used = self._usage_of(others)
        quota, reason = self.quota, None
        if quota.gigabytes is not None and used["gigabytes"] + size > quota.gigabytes:
            reason = GIGABYTES_EXCEEDED.format(
                requested=size, quota=quota.gigabytes, consumed=used["gigabytes"]
            )
        elif quota.volumes is not None and used["volumes"] + 1 > quota.volumes:
            reason = VOLUMES_EXCEEDED.format(allowed=quota.volumes)
        if reason is None:
            return
        message = BUILD_ABORTED.format(server_id=server.server_id, reason=reason)
        server.status, server.task_state, server.updated_at = "ERROR", None, now
        server.fault, server.fault_created = Fault(500, message), now


_VM_STATES = {"BUILD": "building", "ACTIVE": "active", "ERROR": "error", "DELETED": "deleted"}
_VM_STATES |= {"SHUTOFF": "stopped", "PAUSED": "paused", "SUSPENDED": "suspended"}
_VM_STATES |= {"SHELVED": "shelved", OFFLOADED: "shelved_offloaded"}
VM_STATES: Mapping[str, str] = _VM_STATES  # Nova's vm_state behind each status
_FAULT_STATUSES = frozenset({"ERROR", "DELETED"})  # the statuses Nova's view shows a fault on


@dataclass(frozen=True, slots=True)
class ServerAction:
    """One of Nova's server actions as its API checks it (nova/compute/api.py)."""

    name: str  # as Nova's 409 names it
    allowed: frozenset[str]  # the statuses (vm states) it is accepted in, with no task running
    needs_host: bool = False  # start and stop first check that the server has a host


def _action(name: str, *allowed: str, needs_host: bool = False) -> ServerAction:
    return ServerAction(name, frozenset(allowed), needs_host)


# By the key of the request body; the states from Nova's check_instance_state decorators.
SERVER_ACTIONS: Mapping[str, ServerAction] = {
    "os-start": _action("start", "SHUTOFF", needs_host=True),
    "os-stop": _action("stop", "ACTIVE", "ERROR", needs_host=True),
    "pause": _action("pause", "ACTIVE"),
    "unpause": _action("unpause", "PAUSED"),
    "suspend": _action("suspend", "ACTIVE"),
    "resume": _action("resume", "SUSPENDED"),
    "shelve": _action("shelve", "ACTIVE", "SHUTOFF", "PAUSED", "SUSPENDED"),
    "shelveOffload": _action("shelveOffload", "SHELVED"),
    "unshelve": _action("unshelve", "SHELVED", OFFLOADED),
}
# The steps an action runs through: (task state, the FakeNova timing it lasts, share of it).
_PHASES: Mapping[str, tuple[str, str | None, float]] = {
    "start": ("powering-on", "start_seconds", 1.0),
    "stop": ("powering-off", "stop_seconds", 1.0),
    "pause": ("pausing", "pause_seconds", 1.0),
    "unpause": ("unpausing", "unpause_seconds", 1.0),
    "suspend": ("suspending", "suspend_seconds", 1.0),
    "resume": ("resuming", "resume_seconds", 1.0),
    "shelve": ("shelving", "shelve_seconds", 1.0),
    "shelve-volume": ("shelving", "shelve_offload_seconds", 1.0),
    "offload": ("shelving_offloading", "shelve_offload_seconds", 1.0),
    "unshelve-shelved": ("unshelving", None, 1.0),
    "unshelve": ("unshelving", "unshelve_seconds", 0.5),  # the conductor schedules it
    "spawn": ("spawning", "unshelve_seconds", 0.5),  # the host fetches the image and boots
}
_FIRST_PHASE = {
    "os-start": "start",
    "os-stop": "stop",
    "pause": "pause",
    "unpause": "unpause",
    "suspend": "suspend",
    "resume": "resume",
    "shelve": "shelve",
    "shelveOffload": "offload",
}
# Where the steps that simply end leave the server.
_PHASE_ENDS = {
    "start": "ACTIVE",
    "stop": "SHUTOFF",
    "pause": "PAUSED",
    "unpause": "ACTIVE",
    "suspend": "SUSPENDED",
    "resume": "ACTIVE",
    "shelve-volume": OFFLOADED,
    "offload": OFFLOADED,
    "spawn": "ACTIVE",
}


def _guest_looks(server: FakeServer) -> None:
    """A guest left idle in a running server (not paused) notices its metadata now."""
    if server.status == "ACTIVE":
        server.guest.sees(server.metadata)


def _offloaded(server: FakeServer) -> bool:
    """SHELVED_OFFLOADED with no unshelve under way: no host, no allocation in placement."""
    return server.status == OFFLOADED and server.task_state is None


def has_host(server: FakeServer) -> bool:
    """Whether Nova has the server on a compute host (``instance.host`` set): not while it is
    scheduled, not in ERROR (cell0, or its host cleared when its build failed), not when
    offloaded until its unshelve spawns it."""
    if server.status == "BUILD":
        return server.task_state != SCHEDULING
    if server.status == OFFLOADED:
        return server.task_state == "spawning"
    return server.status not in {"ERROR", "DELETED"}


def _scheduling(server: FakeServer) -> bool:
    """Whether the server still waits for the conductor's quota re-check."""
    return server.scheduling_until is not None and server.task_state == SCHEDULING


def _holds_resources(server: FakeServer) -> bool:
    """Whether a live server holds ports in Neutron and its boot volume in Cinder: from when
    its build reaches a host until it is deleted. An ERROR server holds none: Nova never made
    them (NoValidHost, the quota re-check) or freed them when it aborted the build."""
    return server.status != "ERROR" and not _scheduling(server)


def _requested(flavor: Flavor | None) -> dict[str, int]:
    return {
        "instances": 1,
        "cores": flavor.vcpus if flavor else 0,
        "ram": flavor.ram_mib if flavor else 0,
    }


def _over_quota_message(
    overs: Sequence[str],
    requested: Mapping[str, int | None],
    used: Mapping[str, int | None],
    limits: Mapping[str, int | None],
) -> str:
    """Nova's TooManyInstances text: every resource over quota in one message, sorted."""

    def joined(values: Mapping[str, int | None]) -> str:
        return ", ".join(str(values[resource]) for resource in overs)

    names = ", ".join(overs)
    return (
        f"Quota exceeded for {names}: Requested {joined(requested)}, but already used "
        f"{joined(used)} of {joined(limits)} {names}"
    )


def _metadata_limit_message(allowed: int) -> str:
    return f"Maximum number of metadata items exceeds {allowed}"  # Nova's MetadataLimitExceeded


def _listing_order(server: FakeServer) -> tuple[datetime, str]:
    """Nova's default sort key (created_at, then id); listings run from the largest down."""
    return server.created_at, server.server_id


def _in_state(server: FakeServer, allowed: Container[str], action: str) -> FakeServer:
    """The server, when ``action`` may act on it: in one of the ``allowed`` states, with no
    task running; else Nova's 409, naming the state that refuses it."""
    if server.status not in allowed:
        state = ("vm_state", _VM_STATES.get(server.status, server.status.lower()))
    elif server.task_state is not None:
        state = ("task_state", server.task_state)
    else:
        return server
    raise NovaRefusal(
        f"Cannot '{action}' instance {server.server_id} while it is in {state[0]} {state[1]}",
        409,
    )
