"""Servers as the cloud reports them, and the ownership marks that make one ours."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum

# Metadata keys and tag prefixes written on every server osas creates.
META_CLUSTER = "osas-cluster"
META_GROUP = "osas-node-group"
META_REQUEST = "osas-request-id"
# On a server prepared for a node group's warm pool while it waits to be claimed: what it was
# prepared from. Such a server is not a node of the group, and never in CA's view.
META_WARM = "osas-warm"
# Beside it, the state the guest is kept in once prepared (the guest reads it: it powers
# itself off for ``shutoff`` and ``shelved_offloaded``).
META_WARM_STATE = "osas-warm-state"
# On a server claimed from a warm pool until it is ACTIVE: when (seconds since the epoch). The
# claim is kept in Nova, so that whoever holds the lease next finishes it or replaces it.
META_CLAIMED = "osas-claimed"
# What a claimed server (and a cold create of a warm-pool group) reads from the metadata
# service at boot: its join token, and the group's labels and taints, in chunks of at most
# 255 characters ("osas-node-labels", "osas-node-labels-2"...).
META_JOIN_TOKEN = "osas-join-token"  # noqa: S105 - a metadata key's name
META_NODE_LABELS = "osas-node-labels"
META_NODE_TAINTS = "osas-node-taints"
TAG_CLUSTER_PREFIX = "osas-cluster="
TAG_REQUEST_PREFIX = "osas-request="


# How much of the request id the name of a server osas makes carries.
NAME_REQUEST_ID_LENGTH = 10


def server_name(cluster_name: str, group_id: str, request_id: str) -> str:
    """Name of the server a create makes; derived from the request id so a retry reuses it."""
    return f"{cluster_name}-{group_id}-{request_id[:NAME_REQUEST_ID_LENGTH]}"


class ErrorClass(IntEnum):
    """InstanceErrorInfo.instanceErrorClass as the Cluster Autoscaler defines it."""

    OUT_OF_RESOURCES = 1
    OTHER = 99


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    code: str
    message: str
    error_class: ErrorClass


@dataclass(frozen=True, slots=True)
class Fault:
    code: int
    message: str


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and a complete
# listing makes one record per server (at 50,000 servers, 50 pages of 1,000 in a worker
# thread that shares the interpreter with CA's calls): a third of reading a page went there.
# Nothing changes a record once made.
@dataclass(slots=True)
class ServerRecord:
    """One server as a cloud listing shows it, before any ownership check."""

    server_id: str
    name: str
    status: str
    metadata: Mapping[str, str]
    tags: frozenset[str]
    task_state: str | None = None
    fault: Fault | None = None
    created: str = ""  # Nova's ISO 8601 ``created``; sorts in time order as text
    updated: str = ""  # Nova's ISO 8601 ``updated``, by the clock of the Nova host that wrote it


@dataclass(frozen=True, slots=True)
class Server:
    """A server that carries this cluster's marks for one node group."""

    server_id: str
    # The name (``name``), kept whole; or, when ``name_given`` (the name osas gives its
    # servers, ``server_name``), only its stem of cluster and group, one string the
    # group's servers share, the rest being the request id's first ten characters: at 50,000
    # servers the names would be 3 MiB of text the request ids already hold.
    name_stem: str
    group_id: str
    status: str
    task_state: str | None
    request_id: str | None
    fault: Fault | None
    # Seconds since the epoch (None when Nova gave no time): a float is a third of the text's
    # bytes, and at 50,000 servers the inventory holds one per server.
    created: float | None = None
    # Claimed from the warm pool and not finished (``META_CLAIMED``): when, since the epoch.
    claimed_at: float | None = None
    name_given: bool = False

    @property
    def name(self) -> str:
        if self.name_given and self.request_id is not None:
            return self.name_stem + self.request_id[:NAME_REQUEST_ID_LENGTH]
        return self.name_stem

    @property
    def is_deleting(self) -> bool:
        return self.status in {"DELETED", "SOFT_DELETED"} or self.task_state == "deleting"

    @property
    def is_starting(self) -> bool:
        """Claimed from a warm pool, and not running yet: CA sees it creating."""
        return self.claimed_at is not None and not (
            self.status == "ACTIVE" and self.task_state is None
        )


@dataclass(frozen=True, slots=True)
class WarmServer:
    """A server of this cluster prepared for a node group and waiting in its warm pool: it
    carries the cluster's marks, the group's and the warm mark. Not a node of the group until
    claimed (the warm mark taken off), so never in CA's view and never counted."""

    server_id: str
    name: str
    group_id: str
    status: str
    task_state: str | None
    prepared_from: str  # the warm mark's value
    created: float | None = None


@dataclass(frozen=True, slots=True)
class OwnershipMarks:
    """The marks that make a server belong to this cluster and one of its node groups."""

    cluster_name: str
    # Made once: a complete listing checks it on every server it shows.
    cluster_tag: str = field(init=False, repr=False, compare=False)
    # Per group, the stem of the names osas gives its servers (``Server.name_stem``).
    _stems: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cluster_tag", f"{TAG_CLUSTER_PREFIX}{self.cluster_name}")

    def metadata(self, group_id: str, request_id: str) -> dict[str, str]:
        return {META_CLUSTER: self.cluster_name, META_GROUP: group_id, META_REQUEST: request_id}

    def tags(self, request_id: str) -> list[str]:
        return [self.cluster_tag, f"{TAG_REQUEST_PREFIX}{request_id}"]

    def claim(self, record: ServerRecord, known: Server | None = None) -> Server | None:
        """The server as ours, or None unless it has the cluster tag and both metadata marks.
        ``known``: the server as the inventory holds it, handed back when the record shows it
        unchanged (Nova never changes a server's ``created``: not compared). A complete
        listing shows every server again, nearly all unchanged: made anew, each would live
        until the listing is applied, for the collector to walk (at 50,000 servers, tens of
        milliseconds a full pass) and for memory to hold twice."""
        metadata = record.metadata
        if metadata.get(META_CLUSTER) != self.cluster_name:
            return None
        if self.cluster_tag not in record.tags:
            return None
        group_id = metadata.get(META_GROUP)
        if not group_id or META_WARM in metadata:
            return None  # a warm server is no node of the group until claimed (``warm``)
        status, request_id = record.status.upper(), metadata.get(META_REQUEST)
        claimed = metadata.get(META_CLAIMED)
        claimed_at = None if claimed is None else _claim_time(claimed)
        if (
            known is not None
            and known.server_id == record.server_id
            and known.status == status
            and known.task_state == record.task_state
            and known.name == record.name
            and known.group_id == group_id
            and known.request_id == request_id
            and known.fault == record.fault
            and known.claimed_at == claimed_at
        ):
            return known
        group_id = sys.intern(group_id)
        stem = self._stem(group_id)
        given = request_id is not None and record.name == stem + request_id[:NAME_REQUEST_ID_LENGTH]
        # Group ids, statuses and task states repeat across thousands of servers: one copy each.
        return Server(
            server_id=record.server_id,
            name_stem=stem if given else record.name,
            name_given=given,
            group_id=group_id,
            status=sys.intern(status),
            task_state=None if record.task_state is None else sys.intern(record.task_state),
            request_id=request_id,
            fault=record.fault,
            created=epoch_seconds(record.created),
            claimed_at=claimed_at,
        )

    def _stem(self, group_id: str) -> str:
        stem = self._stems.get(group_id)
        if stem is None:
            stem = self._stems[group_id] = sys.intern(server_name(self.cluster_name, group_id, ""))
        return stem

    def warm(self, record: ServerRecord) -> WarmServer | None:
        """The server as one of a group's warm pool, or None unless it has the cluster tag,
        both metadata marks and the warm mark."""
        metadata = record.metadata
        prepared_from = metadata.get(META_WARM)
        group_id = metadata.get(META_GROUP)
        if (
            prepared_from is None
            or not group_id
            or metadata.get(META_CLUSTER) != self.cluster_name
            or self.cluster_tag not in record.tags
        ):
            return None
        return WarmServer(
            server_id=record.server_id,
            name=record.name,
            group_id=sys.intern(group_id),
            status=sys.intern(record.status.upper()),
            task_state=None if record.task_state is None else sys.intern(record.task_state),
            prepared_from=prepared_from,
            created=epoch_seconds(record.created),
        )


def _claim_time(text: str) -> float:
    """The claim mark's time; one that is not a number (written by hand) reads as the epoch,
    so that its claim is long overdue rather than never."""
    try:
        when = float(text)
    except ValueError:
        return 0.0
    return when if math.isfinite(when) else 0.0


def epoch_seconds(iso: str) -> float | None:
    """Nova's ISO 8601 time as seconds since the epoch, UTC when it names no zone (None when
    it is not a time)."""
    try:
        when = datetime.fromisoformat(iso)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


# Nova's wording for running out of quota, in every form FACTS.md lists: the synchronous 403/413
# refusals ("Quota exceeded for cores: ...", "Quota exceeded, too many servers in group",
# "Maximum number of ports exceeded") and the ERROR faults of its quota re-check.
_QUOTA_MARKERS = (
    "quota exceeded",
    "quota_exceeded",
    "overlimit",
    "over limit",
    "maximum number of ports exceeded",
    "exceeded maximum number",
    # Nova's port check when the quota is already passed: "The number of defined ports: 2 is
    # over the limit: 1" (403).
    "is over the limit",
    # Cinder's refusals of a boot volume, in the fault of the ERROR server Nova's build
    # abort leaves: "VolumeLimitExceeded: Maximum number of volumes allowed (10) exceeded for
    # quota 'volumes'", "VolumeSizeExceedsAvailableQuota: Requested volume or snapshot exceeds
    # allowed gigabytes quota".
    "exceeded for quota",
    "exceeds allowed gigabytes quota",
)


def is_quota_message(text: str) -> bool:
    """Whether a Nova error text says the project ran out of quota."""
    lowered = text.lower()
    return any(marker in lowered for marker in _QUOTA_MARKERS)


def classify_fault(fault: Fault | None) -> ErrorInfo:
    """Error info for an ERROR server: running out of capacity is class 1, the rest 99."""
    if fault is None:
        return ErrorInfo("ServerError", "server is in ERROR state", ErrorClass.OTHER)
    if "no valid host" in fault.message.lower():
        return ErrorInfo("NoValidHost", fault.message, ErrorClass.OUT_OF_RESOURCES)
    if is_quota_message(fault.message):
        return ErrorInfo("QuotaExceeded", fault.message, ErrorClass.OUT_OF_RESOURCES)
    return ErrorInfo(f"ServerError{fault.code}", fault.message, ErrorClass.OTHER)


@dataclass(frozen=True, slots=True)
class Flavor:
    flavor_id: str
    name: str
    vcpus: int
    ram_mib: int
    disk_gib: int
    ephemeral_gib: int = 0
    extra_specs: Mapping[str, str] | None = None
