"""An in-memory Nova and a ``Cloud`` over it, with hooks to inject the faults real clouds have.

``FakeNova`` models what osas relies on from Nova: tags and metadata on servers, BUILD turning
ACTIVE, ERROR servers with a fault, deleted servers kept for ``changes-since`` but stripped of
their tags, quotas refused with Nova's own wording. ``FakeCloud`` is the port adapter tests and
the demo run against; the simulated OpenStack serves the same model over HTTP.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import anyio

from osas.cloud.errors import CloudUnavailable, QuotaExceeded, RequestRejected
from osas.cloud.port import CreateServerRequest
from osas.domain.servers import Fault, Flavor, ServerRecord

NO_VALID_HOST = "No valid host was found. There are not enough hosts available."

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


class FakeNova:
    """Nova's server model in memory; synchronous, so the HTTP simulator can serve it too."""

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
        self.faults = Faults()
        self.calls: Counter[str] = Counter()
        self._servers: dict[str, FakeServer] = {}

    # -- inspection for tests --------------------------------------------------------------------

    def live_servers(self) -> list[FakeServer]:
        self._advance()
        return [s for s in self._servers.values() if s.status != "DELETED"]

    def activate(self, server_id: str | None = None) -> None:
        """Finish the build of one server, or of every server in BUILD."""
        now = self.clock()
        for server in self._servers.values():
            if server.status == "BUILD" and server_id in {None, server.server_id}:
                server.status, server.task_state, server.updated_at = "ACTIVE", None, now

    def seed(
        self,
        *,
        name: str,
        metadata: Mapping[str, str] | None = None,
        tags: Iterable[str] = (),
        status: str = "ACTIVE",
        flavor_id: str = "f-small",
    ) -> FakeServer:
        """A server made behind osas's back: by hand, by another tool or another cluster."""
        server = self._new_server(
            name,
            flavor_id=flavor_id,
            image="image",
            networks=(),
            metadata=metadata or {},
            tags=tags,
        )
        server.status = status
        server.task_state = None
        return server

    # -- the API -----------------------------------------------------------------------------

    def find_flavor(self, name_or_id: str) -> Flavor | None:
        self.calls["flavors.get"] += 1
        if name_or_id in self.flavors:
            return self.flavors[name_or_id]
        for flavor in self.flavors.values():
            if flavor.name == name_or_id:
                return flavor
        return None

    def list_servers(
        self,
        *,
        tags: Sequence[str] = (),
        tags_any: Sequence[str] = (),
        changes_since: datetime | None = None,
    ) -> list[FakeServer]:
        """Newest first, as Nova sorts. Deleted servers appear only with changes-since, and never
        with a tag filter, because Nova hard-deletes a server's tags when it is destroyed."""
        self.calls["servers.list"] += 1
        self._advance()
        result = []
        for server in self._servers.values():
            if server.status == "DELETED" and changes_since is None:
                continue
            if changes_since is not None and server.updated_at < changes_since:
                continue
            if tags and not set(tags) <= server.tags:
                continue
            if tags_any and not set(tags_any) & server.tags:
                continue
            result.append(server)
        result.sort(key=lambda s: (s.created_at, s.server_id), reverse=True)
        return result

    def get_server(self, server_id: str) -> FakeServer | None:
        self.calls["servers.get"] += 1
        self._advance()
        server = self._servers.get(server_id)
        return None if server is None or server.status == "DELETED" else server

    def create_server(self, request: CreateServerRequest) -> FakeServer:
        self.calls["servers.create"] += 1
        flavor = self.find_flavor(request.flavor)
        if flavor is None:
            raise RequestRejected(f"Flavor {request.flavor} could not be found.", 400)
        faults = self.faults
        live = len(self.live_servers())
        if faults.quota_exceeded > 0 or (
            faults.max_servers is not None and live >= faults.max_servers
        ):
            faults.quota_exceeded = max(0, faults.quota_exceeded - 1)
            limit = faults.max_servers if faults.max_servers is not None else live
            raise QuotaExceeded(
                f"Quota exceeded for instances: Requested 1, but already used {live} of "
                f"{limit} instances"
            )
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
        if faults.no_valid_host > 0:
            faults.no_valid_host -= 1
            # Nova buries it in cell0 as ERROR, tags and metadata kept.
            server.status, server.task_state = "ERROR", None
            server.fault = Fault(500, NO_VALID_HOST)
        return server

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

    async def close(self) -> None:
        return None
