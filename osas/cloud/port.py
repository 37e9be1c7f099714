"""The narrow interface the engine uses to reach the cloud."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from osas.domain.quota import ProjectQuota
from osas.domain.servers import Flavor, ServerRecord
from osas.domain.specs import BootVolume, NodeGroupSpec


@dataclass(frozen=True, slots=True)
class CreateServerRequest:
    """Everything one create needs; names of resources are resolved by the adapter."""

    name: str
    flavor: str
    image: str
    networks: Sequence[str]
    metadata: Mapping[str, str]
    tags: Sequence[str]
    user_data: str | None = None  # plain text; the adapter encodes it the way Nova wants
    key_name: str | None = None
    security_groups: Sequence[str] = ()
    availability_zone: str | None = None
    server_group: str | None = None
    boot_volume: BootVolume | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ServerListing:
    """Servers a listing showed, and Nova's own clock when it answered.

    ``nova_time`` is what the next ``changes-since`` is taken from: Nova compares that filter
    with its own ``updated_at``, so a value from osas's clock would miss every change while the
    two clocks disagree. It is the ``Date`` header of the listing's first answer (before any
    server of the listing was read), None when Nova sent none."""

    records: list[ServerRecord]
    nova_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class Reference:
    """One thing a node group names in the cloud (flavor, image, network...), resolved."""

    kind: str
    name: str
    resource_id: str | None  # None: not found
    detail: str = ""

    @property
    def found(self) -> bool:
        return self.resource_id is not None


# What ``Cloud.verify`` waits for, as osas says it while no answer comes.
VERIFY_WAITS_FOR = "the cloud's check (a Keystone token, Nova's versions)"


class Cloud(Protocol):
    """The cloud as osas sees it. Every method may raise ``osas.cloud.errors.CloudError``."""

    async def list_servers(
        self, tag: str, *, changes_since: datetime | None = None
    ) -> ServerListing:
        """Servers carrying ``tag``, with their details; with ``changes_since``, only those
        updated since then (by Nova's clock)."""
        ...

    def list_server_pages(
        self, tag: str, *, changes_since: datetime | None = None
    ) -> AsyncIterator[ServerListing]:
        """The same listing page by page, as the cloud pages it: a caller that keeps only what
        it needs of each page never holds the whole listing. Each page carries the Nova time
        of its own answer."""
        ...

    async def list_building(self, tag: str) -> ServerListing:
        """Servers carrying ``tag`` that Nova shows building (``status=BUILD``)."""
        ...

    async def list_changes(self, since: datetime) -> ServerListing:
        """Every server of the project updated since ``since`` (Nova's clock), deleted ones
        included: Nova lists deleted servers under ``changes-since`` only without a tag
        filter (their tags are gone with them, and their metadata reads empty), so this is
        how deletions are seen, at a cost of what changed in the project, not of its size."""
        ...

    async def get_server(self, server_id: str) -> ServerRecord | None:
        """One server, None when Nova no longer has it."""
        ...

    async def create_server(self, request: CreateServerRequest) -> ServerRecord: ...

    async def delete_server(self, server_id: str) -> None:
        """Delete a server; one that is already gone is success."""
        ...

    async def delete_server_if(
        self, server_id: str, still: Callable[[ServerRecord], bool]
    ) -> bool | None:
        """Read the server and delete it only if ``still(record)`` says so, in one go: no
        task of osas's runs between the read and the DELETE (``still`` may run on another
        thread). None when Nova no longer has it, False when ``still`` refused, True once
        the DELETE was accepted."""
        ...

    async def replace_metadata_if(
        self, server_id: str, metadata: Mapping[str, str], still: Callable[[ServerRecord], bool]
    ) -> ServerRecord | bool | None:
        """Read the server and replace all its metadata with ``metadata`` only if
        ``still(record)`` says so, in one go (as ``delete_server_if``): the server as it is
        then, with its new metadata; None when Nova no longer has it, False when ``still``
        refused. Nova refuses the write (409) while a task runs on the server."""
        ...

    async def server_action(self, server_id: str, action: str) -> None:
        """A server action without arguments (``os-start``, ``unpause``, ``resume``,
        ``unshelve``, ``shelve``, ``pause``, ``suspend``), sent once."""
        ...

    async def console_output(self, server_id: str, lines: int) -> str:
        """The last ``lines`` lines of the server's console log."""
        ...

    async def get_flavor(self, name_or_id: str) -> Flavor | None: ...

    async def get_quota(
        self, server_groups: Sequence[str], *, volumes: bool = False
    ) -> ProjectQuota:
        """The project's compute limits and usage (Nova's ``/limits``), the members of each
        of ``server_groups`` (names or ids; one that does not exist is left out), Neutron's
        port quota and, with ``volumes``, Cinder's volume quota. Neutron's and Cinder's are
        read when they can be; what cannot is in ``unread`` and bounds nothing."""

    async def resolve(self, spec: NodeGroupSpec) -> list[Reference]:
        """Every cloud resource ``spec`` names, looked up (for ``osas check-config``)."""
        ...

    def reload_credentials(self) -> list[str]:
        """Read the files the credentials come from again, at once: those that changed (the
        next call authenticates with them). The adapter also does this by itself."""
        ...

    def retrying(self) -> str | None:
        """Why a call in progress is being tried again (a refused connection, a 503...), while
        one is: a sync that has not failed yet may already be failing."""
        ...

    def region(self) -> str:
        """The region the adapter reaches, as its configuration resolves it (osas's, a
        clouds.yaml entry's, OS_REGION_NAME); "" until ``verify`` has resolved it, and for a
        cloud that names none."""
        ...

    async def verify(self) -> str:
        """Check that the cloud can be used as osas needs it; a short description of it.
        Raises ``CloudConfigurationError`` when it cannot (e.g. a compute microversion < 2.52)."""
        ...

    async def close(self) -> None: ...
