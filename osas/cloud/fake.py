"""An in-memory Nova and a ``Cloud`` over it, with hooks to inject the faults real clouds have.

``FakeNova`` models what osas relies on from Nova: tags and metadata on servers, BUILD turning
ACTIVE, ERROR servers with a fault, deleted servers kept for ``changes-since`` but stripped of
their tags, quotas refused with Nova's own wording. ``FakeCloud`` is the port adapter tests and
the demo run against; the simulated OpenStack serves the same model over HTTP.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Concatenate, ParamSpec, TypeVar

import anyio

from osas.cloud.errors import CloudUnavailable, QuotaExceeded, RequestRejected
from osas.cloud.port import CreateServerRequest, Reference
from osas.domain.servers import Fault, Flavor, ServerRecord
from osas.domain.specs import NodeGroupSpec

NO_VALID_HOST = "No valid host was found. There are not enough hosts available."
GROUP_MEMBERS_EXCEEDED = "Quota exceeded, too many servers in group"

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
    task_state: str | None = "spawning"
    fault: Fault | None = None
    user_data: str | None = None
    key_name: str | None = None
    availability_zone: str | None = None
    server_group: str | None = None
    security_groups: tuple[str, ...] = ()
    boot_volume_gib: int | None = None
    deleting_since: datetime | None = None
    fault_created: datetime | None = None
    config_drive: bool = False

    def record(self) -> ServerRecord:
        return ServerRecord(
            server_id=self.server_id,
            name=self.name,
            status=self.status,
            metadata=dict(self.metadata),
            tags=frozenset(self.tags),
            task_state=self.task_state,
            fault=self.fault,
        )


@dataclass(slots=True)
class Faults:
    """What goes wrong, and how often. Counters are consumed one create at a time."""

    error_rate: float = 0.0  # share of calls that fail as a 5xx would
    latency: float = 0.0  # seconds added to every call
    quota_exceeded: int = 0  # next creates refused synchronously with 403 "Quota exceeded"
    no_valid_host: int = 0  # next creates accepted, then ERROR with a NoValidHost fault
    lost_create_responses: int = 0  # next creates succeed but the answer is lost (5xx)
    max_servers: int | None = None  # the project's instance quota


@dataclass(slots=True)
class Quota:
    """The project's Nova quotas; None is unlimited (Nova's -1). Nova's own defaults are 10
    instances, 20 cores and 50 GiB of RAM; the fake starts unlimited so large tests can run."""

    instances: int | None = None
    cores: int | None = None
    ram: int | None = None  # MiB
    metadata_items: int = 128
    key_pairs: int = 100
    server_groups: int = 10
    server_group_members: int = 10  # the hidden cap that breaks the 11th node of a group


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
        self.clock = clock or (lambda: datetime.now(UTC))
        self.lock = threading.RLock()
        self.faults = Faults()
        self.quota = Quota()
        self.calls: Counter[str] = Counter()
        self.keypairs: dict[str, FakeKeypair] = {}
        self.server_groups: dict[str, FakeServerGroup] = {}
        self.availability_zones: list[str] = ["nova"]
        self._servers: dict[str, FakeServer] = {}

    # -- inspection for tests --------------------------------------------------------------------

    @_locked
    def live_servers(self) -> list[FakeServer]:
        self._advance()
        return [s for s in self._servers.values() if s.status != "DELETED"]

    @_locked
    def activate(self, server_id: str | None = None) -> None:
        """Finish the build of one server, or of every server in BUILD."""
        now = self.clock()
        for server in self._servers.values():
            if server.status == "BUILD" and server_id in {None, server.server_id}:
                server.status, server.task_state, server.updated_at = "ACTIVE", None, now

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
        if fault is not None:
            server.fault, server.fault_created = fault, server.created_at
        if status == "DELETED":
            # As Nova leaves it: tags hard-deleted with the instance.
            server.deleting_since = server.created_at
            server.tags.clear()
        return server

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
        """What the live servers consume of the project's quota, as Nova counts it."""
        live = self.live_servers()
        flavors = [self.flavors.get(server.flavor_id) for server in live]
        return {
            "instances": len(live),
            "cores": sum(flavor.vcpus for flavor in flavors if flavor is not None),
            "ram": sum(flavor.ram_mib for flavor in flavors if flavor is not None),
        }

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
            raise RequestRejected(f"Invalid regular expression for name: {exc}", 400) from exc
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
        result = [server for server in self._servers.values() if wanted.matches(server)]
        result.sort(key=_listing_order, reverse=True)
        return result

    @_locked
    def page_of(
        self, servers: Sequence[FakeServer], *, limit: int | None, marker: str | None
    ) -> list[FakeServer]:
        """One page of a listing, as Nova cuts it: the servers that sort after ``marker``.

        The marker may be a server the filters exclude, or a deleted one (Nova looks it up with
        deleted rows); one Nova never had is a 400, with Nova's message."""
        start = 0
        if marker is not None:
            anchor = self._servers.get(marker)
            if anchor is None:
                raise RequestRejected(f"marker [{marker}] not found", 400)
            anchor_key = _listing_order(anchor)
            start = next(
                (i for i, s in enumerate(servers) if _listing_order(s) < anchor_key), len(servers)
            )
        end = len(servers) if limit is None else start + limit
        return list(servers[start:end])

    @_locked
    def get_server(self, server_id: str) -> FakeServer | None:
        self.calls["servers.get"] += 1
        self._advance()
        server = self._servers.get(server_id)
        return None if server is None or server.status == "DELETED" else server

    @_locked
    def create_server(self, request: CreateServerRequest) -> FakeServer:
        self.calls["servers.create"] += 1
        flavor = self.find_flavor(request.flavor)
        if flavor is None:
            raise RequestRejected(f"Flavor {request.flavor} could not be found.", 400)
        self._check_quota(request, flavor)
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
        faults = self.faults
        if faults.no_valid_host > 0:
            faults.no_valid_host -= 1
            # Nova buries it in cell0 as ERROR, tags and metadata kept.
            server.status, server.task_state = "ERROR", None
            server.fault, server.fault_created = Fault(500, NO_VALID_HOST), server.created_at
        return server

    def _check_quota(self, request: CreateServerRequest, flavor: Flavor) -> None:
        """Refuse a create the way Nova's API does: 403 before anything is built."""
        quota, faults = self.quota, self.faults
        if len(request.metadata) > quota.metadata_items:
            raise RequestRejected(
                f"Maximum number of metadata items exceeds {quota.metadata_items}", 403
            )
        used = self.usage()
        instance_limit = self.instance_limit()
        if faults.quota_exceeded > 0:
            faults.quota_exceeded -= 1
            limit = instance_limit if instance_limit is not None else used["instances"]
            raise QuotaExceeded(
                f"Quota exceeded for instances: Requested 1, but already used "
                f"{used['instances']} of {limit} instances"
            )
        requested = {"instances": 1, "cores": flavor.vcpus, "ram": flavor.ram_mib}
        limits = {"instances": instance_limit, "cores": quota.cores, "ram": quota.ram}
        overs = sorted(
            resource
            for resource, limit in limits.items()
            if limit is not None and used[resource] + requested[resource] > limit
        )
        if overs:
            # Nova names every resource over quota in one message, in sorted order.
            def joined(values: Mapping[str, int | None]) -> str:
                return ", ".join(str(values[resource]) for resource in overs)

            raise QuotaExceeded(
                f"Quota exceeded for {', '.join(overs)}: Requested {joined(requested)}, but "
                f"already used {joined(used)} of {joined(limits)} {', '.join(overs)}"
            )
        if request.server_group is not None:
            members = sum(
                1 for server in self.live_servers() if server.server_group == request.server_group
            )
            if members >= quota.server_group_members:
                raise QuotaExceeded(GROUP_MEMBERS_EXCEEDED)

    @_locked
    def delete_server(self, server_id: str) -> bool:
        """False when there was no such server (Nova's 404)."""
        self.calls["servers.delete"] += 1
        self._advance()
        server = self._servers.get(server_id)
        if server is None or server.status == "DELETED":
            return False
        if server.deleting_since is None:
            server.deleting_since = self.clock()
            server.task_state = "deleting"
            server.updated_at = server.deleting_since
        self._advance()
        return True

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
        )
        self._servers[server.server_id] = server
        return server

    def _advance(self) -> None:
        """Let time do what Nova does on its own: finish builds and deletions."""
        now = self.clock()
        for server in self._servers.values():
            if (
                server.status == "BUILD"
                and self.build_seconds is not None
                and now - server.created_at >= timedelta(seconds=self.build_seconds)
            ):
                server.status, server.task_state, server.updated_at = "ACTIVE", None, now
            if (
                server.deleting_since is not None
                and server.status != "DELETED"
                and now - server.deleting_since >= timedelta(seconds=self.delete_seconds)
            ):
                server.status, server.task_state, server.updated_at = "DELETED", None, now
                server.tags.clear()


def _listing_order(server: FakeServer) -> tuple[datetime, str]:
    """Nova's default sort key (created_at, then id); listings run from the largest down."""
    return server.created_at, server.server_id


@dataclass
class FakeCloud:
    """The ``Cloud`` port over a ``FakeNova``, with latency and 5xx injected per call."""

    nova: FakeNova = field(default_factory=FakeNova)
    seed: int = 0
    _random: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)  # noqa: S311 - fault injection, not security

    async def _call(self) -> None:
        faults = self.nova.faults
        if faults.latency:
            await anyio.sleep(faults.latency)
        if faults.error_rate and self._random.random() < faults.error_rate:
            raise CloudUnavailable("503 Service Unavailable (injected)")

    async def list_servers(
        self, tag: str, *, changes_since: datetime | None = None
    ) -> list[ServerRecord]:
        await self._call()
        servers = self.nova.list_servers(tags=[tag], changes_since=changes_since)
        return [server.record() for server in servers]

    async def get_server(self, server_id: str) -> ServerRecord | None:
        await self._call()
        server = self.nova.get_server(server_id)
        return None if server is None else server.record()

    async def create_server(self, request: CreateServerRequest) -> ServerRecord:
        await self._call()
        server = self.nova.create_server(request)
        faults = self.nova.faults
        if faults.lost_create_responses > 0:
            faults.lost_create_responses -= 1
            raise CloudUnavailable("502 Bad Gateway after the server was created (injected)")
        return server.record()

    async def delete_server(self, server_id: str) -> None:
        await self._call()
        self.nova.delete_server(server_id)

    async def get_flavor(self, name_or_id: str) -> Flavor | None:
        await self._call()
        flavor = self.nova.find_flavor(name_or_id)
        return None if flavor is None else replace(flavor)

    async def resolve(self, spec: NodeGroupSpec) -> list[Reference]:
        """Only flavors are modelled here; every other name is taken as found."""
        await self._call()
        flavor = self.nova.find_flavor(spec.flavor)
        references = [Reference("flavor", spec.flavor, flavor.flavor_id if flavor else None)]
        references.append(Reference("image", spec.image, spec.image))
        references += [Reference("network", name, name) for name in spec.networks]
        return references

    async def verify(self) -> str:
        await self._call()
        return "in-memory fake cloud"

    async def close(self) -> None:
        return None
