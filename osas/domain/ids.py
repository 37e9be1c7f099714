"""Identifiers: provider ids, placeholder ids, names, and the parsing of nodes CA sends."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from osas.domain.errors import InvalidRequest
from osas.domain.limits import NodeInfo, check_node

# DNS-label shaped: safe in server names, Nova tags (no "/" or ","), metadata and placeholder ids.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH = 40
_NAME_RE = re.compile(NAME_PATTERN)
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_REQUEST_ID_RE = re.compile(r"^[0-9a-f]{32}$")

PROVIDER_ID_SCHEME = "openstack://"
PLACEHOLDER_SCHEME = "osas://"


def is_valid_name(value: str) -> bool:
    """Whether ``value`` can serve as a cluster name or node-group id."""
    return len(value) <= NAME_MAX_LENGTH and _NAME_RE.fullmatch(value) is not None


def is_server_uuid(value: str) -> bool:
    return _UUID_RE.fullmatch(value) is not None


def is_request_id(value: str) -> bool:
    return _REQUEST_ID_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class ProviderIdFormat:
    """How this cluster's nodes spell ``spec.providerID``.

    cloud-provider-openstack writes ``openstack:///<uuid>``, or ``openstack://<region>/<uuid>``
    with OS_CCM_REGIONAL. Instance ids must equal the node's provider id exactly, so one form is
    configured and used both ways.
    """

    region: str = ""
    _prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Parsed once per NodeGroupForNode call: built once.
        object.__setattr__(self, "_prefix", f"{PROVIDER_ID_SCHEME}{self.region}/")

    def format(self, server_id: str) -> str:
        return f"{self._prefix}{server_id}"

    def suffix(self, provider_id: str) -> str:
        """What follows this cluster's prefix in ``provider_id``, unchecked ("" without it)."""
        prefix = self._prefix
        return provider_id[len(prefix) :] if provider_id.startswith(prefix) else ""

    def parse(self, provider_id: str) -> str | None:
        """The server uuid in ``provider_id``, or None when it is not of this cluster's form."""
        server_id = self.suffix(provider_id)  # "" without the prefix: never a uuid
        return server_id if is_server_uuid(server_id) else None


def placeholder_id(group_id: str, request_id: str) -> str:
    """The stable instance id of a create that has no server (yet, or ever)."""
    return f"{PLACEHOLDER_SCHEME}{group_id}/{request_id}"


def parse_placeholder_id(value: str) -> tuple[str, str] | None:
    """``(group_id, request_id)`` of a placeholder id, or None."""
    if not value.startswith(PLACEHOLDER_SCHEME):
        return None
    group_id, sep, request_id = value.removeprefix(PLACEHOLDER_SCHEME).partition("/")
    if not sep or not is_valid_name(group_id) or not is_request_id(request_id):
        return None
    return group_id, request_id


@dataclass(frozen=True, slots=True)
class ServerNode:
    """A node CA named by the provider id of one of our servers."""

    server_id: str


@dataclass(frozen=True, slots=True)
class PlaceholderNode:
    """A fake node CA made from a placeholder instance id."""

    group_id: str
    request_id: str


@dataclass(frozen=True, slots=True)
class NamedNode:
    """A node without provider id yet (cloud-provider-openstack has not set it)."""

    name: str


NodeRef = ServerNode | PlaceholderNode | NamedNode


def parse_node(name: str, provider_id: str, ids: ProviderIdFormat) -> NodeRef:
    """Turn a node from a DeleteNodes request into what it refers to; malformed input raises."""
    check_node(NodeInfo(name, provider_id))
    if provider_id:
        placeholder = parse_placeholder_id(provider_id)
        if placeholder is not None:
            return PlaceholderNode(*placeholder)
        server_id = ids.parse(provider_id)
        if server_id is None:
            raise InvalidRequest(
                f"provider id {provider_id!r} is neither {ids.format('<server-uuid>')!r} "
                f"nor a placeholder id {placeholder_id('<group>', '<request-id>')!r}"
            )
        return ServerNode(server_id)
    if not name:
        raise InvalidRequest("node has neither a name nor a provider id")
    return NamedNode(name)
