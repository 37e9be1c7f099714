"""``FakeCloud``: the ``Cloud`` port in process, over the simulator's ``FakeNova``, with latency
and 5xx injected per call: the tests' fake, which no configuration can point ``osas serve``
at. It translates the model's refusals into osas's cloud errors in one place, as the OpenStack
adapter does Nova's."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import anyio

from osas.cloud.errors import (
    CloudError,
    CloudUnavailable,
    CreateInDoubt,
    QuotaExceeded,
    RequestRejected,
)
from osas.cloud.port import CreateServerRequest, Reference, ServerListing
from osas.domain.quota import Allowance, ProjectQuota
from osas.domain.servers import Flavor, ServerRecord, is_quota_message
from osas.domain.specs import NodeGroupSpec
from osas.sim.model import FakeNova, NovaRefusal

_QUOTA_STATUSES = (403, 413)


def _translate(refusal: NovaRefusal) -> CloudError:
    message = str(refusal)
    if refusal.status in _QUOTA_STATUSES and is_quota_message(message):
        return QuotaExceeded(message)
    return RequestRejected(message, refusal.status)


@dataclass
class FakeCloud:
    """The ``Cloud`` port over a ``FakeNova``, with latency and 5xx injected per call."""

    nova: FakeNova = field(default_factory=FakeNova)
    seed: int = 0
    region_name: str = ""  # what ``region`` answers: the fake names none unless told
    _random: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)  # noqa: S311 - fault injection, not security

    async def _call(self) -> None:
        faults = self.nova.faults
        if faults.latency:
            await anyio.sleep(faults.latency)
        if faults.error_rate and self._random.random() < faults.error_rate:
            raise CloudUnavailable("503 Service Unavailable (injected)")

    def _listing(self, tags: list[str], changes_since: datetime | None) -> ServerListing:
        """A listing as Nova answers it, with Nova's clock when it answered (its Date)."""
        nova = self.nova
        with nova.lock:
            now = nova.clock()
            servers = nova.list_servers(tags=tags, changes_since=changes_since)
            return ServerListing([server.record() for server in servers], now)

    async def list_servers(
        self, tag: str, *, changes_since: datetime | None = None
    ) -> ServerListing:
        await self._call()
        return self._listing([tag], changes_since)

    async def list_server_pages(
        self, tag: str, *, changes_since: datetime | None = None
    ) -> AsyncIterator[ServerListing]:
        yield await self.list_servers(tag, changes_since=changes_since)

    async def list_building(self, tag: str) -> ServerListing:
        await self._call()
        with self.nova.lock:
            servers = self.nova.list_servers(tags=[tag], status="BUILD")
            return ServerListing([server.record() for server in servers], None)

    async def list_changes(self, since: datetime) -> ServerListing:
        await self._call()
        return self._listing([], since)

    async def get_server(self, server_id: str) -> ServerRecord | None:
        await self._call()
        server = self.nova.get_server(server_id)
        return None if server is None else server.record()

    async def create_server(self, request: CreateServerRequest) -> ServerRecord:
        await self._call()
        stall = self.nova.faults.create_stall
        if stall > 0:
            await anyio.sleep(stall)  # a stalled Nova API worker: stored late all the same
        nova = self.nova
        with nova.lock:
            try:
                server = nova.create_server(request)
            except NovaRefusal as refusal:
                raise _translate(refusal) from refusal
            record = server.record()
            if nova.take_fault("dropped_create_connections"):
                raise CreateInDoubt(
                    "the connection dropped after the server was created (injected)"
                )
            if nova.take_fault("lost_create_responses"):
                status = nova.faults.lost_create_status
                raise CreateInDoubt(f"{status} after the server was created (injected)")
        return record

    async def delete_server(self, server_id: str) -> None:
        await self._call()
        self.nova.delete_server(server_id)

    async def delete_server_if(
        self, server_id: str, still: Callable[[ServerRecord], bool]
    ) -> bool | None:
        await self._call()
        server = self.nova.get_server(server_id)
        if server is None:
            return None
        if not still(server.record()):
            return False
        self.nova.delete_server(server_id)
        return True

    async def replace_metadata_if(
        self, server_id: str, metadata: Mapping[str, str], still: Callable[[ServerRecord], bool]
    ) -> ServerRecord | bool | None:
        await self._call()
        server = self.nova.get_server(server_id)
        if server is None:
            return None
        record = server.record()
        if not still(record):
            return False
        try:
            written = self.nova.set_metadata(server_id, metadata, replace=True)
        except NovaRefusal as refusal:
            raise _translate(refusal) from refusal
        return replace(record, metadata=written)

    async def server_action(self, server_id: str, action: str) -> None:
        await self._call()
        try:
            self.nova.server_action(server_id, action)
        except NovaRefusal as refusal:
            raise _translate(refusal) from refusal

    async def console_output(self, server_id: str, lines: int) -> str:
        await self._call()
        try:
            return self.nova.console_output(server_id, lines)
        except NovaRefusal as refusal:
            raise _translate(refusal) from refusal

    async def get_flavor(self, name_or_id: str) -> Flavor | None:
        await self._call()
        flavor = self.nova.find_flavor(name_or_id)
        return None if flavor is None else replace(flavor)

    async def get_quota(
        self, server_groups: Sequence[str], *, volumes: bool = False
    ) -> ProjectQuota:
        del volumes  # Nova's quotas only: the tests of Neutron's and Cinder's go over HTTP
        await self._call()
        nova = self.nova
        with nova.lock:
            usage, quota = nova.usage(), nova.quota
            members = {}
            for name in server_groups:
                group = nova.find_server_group(name)
                if group is not None:
                    used = len(nova.server_group_members(group))
                    members[name] = Allowance(quota.server_group_members, used)
            return ProjectQuota(
                instances=Allowance(nova.instance_limit(), usage["instances"]),
                cores=Allowance(quota.cores, usage["cores"]),
                ram_mib=Allowance(quota.ram, usage["ram"]),
                server_group_members=members,
            )

    def reload_credentials(self) -> list[str]:
        return []  # no files: the fake takes no credentials

    def retrying(self) -> str | None:
        return None  # the fake fails a call at once, never tries it again

    def region(self) -> str:
        return self.region_name

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
