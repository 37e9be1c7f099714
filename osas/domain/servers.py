"""Servers as the cloud reports them, and the ownership marks that make one ours."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

# Metadata keys and tag prefixes written on every server osas creates.
META_CLUSTER = "osas-cluster"
META_GROUP = "osas-node-group"
META_REQUEST = "osas-request-id"
TAG_CLUSTER_PREFIX = "osas-cluster="
TAG_REQUEST_PREFIX = "osas-request="


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


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """One server as a cloud listing shows it, before any ownership check."""

    server_id: str
    name: str
    status: str
    metadata: Mapping[str, str]
    tags: frozenset[str]
    task_state: str | None = None
    fault: Fault | None = None


@dataclass(frozen=True, slots=True)
class Server:
    """A server that carries this cluster's marks for one node group."""

    server_id: str
    name: str
    group_id: str
    status: str
    task_state: str | None
    request_id: str | None
    fault: Fault | None

    @property
    def is_deleting(self) -> bool:
        return self.status in {"DELETED", "SOFT_DELETED"} or self.task_state == "deleting"


@dataclass(frozen=True, slots=True)
class OwnershipMarks:
    """The marks that make a server belong to this cluster and one of its node groups."""

    cluster_name: str

    @property
    def cluster_tag(self) -> str:
        return f"{TAG_CLUSTER_PREFIX}{self.cluster_name}"

    def metadata(self, group_id: str, request_id: str) -> dict[str, str]:
        return {META_CLUSTER: self.cluster_name, META_GROUP: group_id, META_REQUEST: request_id}

    def tags(self, request_id: str) -> list[str]:
        return [self.cluster_tag, f"{TAG_REQUEST_PREFIX}{request_id}"]

    def claim(self, record: ServerRecord) -> Server | None:
        """The server as ours, or None unless it has the cluster tag and both metadata marks."""
        if record.metadata.get(META_CLUSTER) != self.cluster_name:
            return None
        if self.cluster_tag not in record.tags:
            return None
        group_id = record.metadata.get(META_GROUP)
        if not group_id:
            return None
        return Server(
            server_id=record.server_id,
            name=record.name,
            group_id=group_id,
            status=record.status.upper(),
            task_state=record.task_state,
            request_id=record.metadata.get(META_REQUEST),
            fault=record.fault,
        )


_OUT_OF_RESOURCES_MARKERS = ("quota exceeded", "no valid host", "exceeded maximum number")


def classify_fault(fault: Fault | None) -> ErrorInfo:
    """Error info for an ERROR server: running out of capacity is class 1, the rest 99."""
    if fault is None:
        return ErrorInfo("ServerError", "server is in ERROR state", ErrorClass.OTHER)
    text = fault.message.lower()
    if "no valid host" in text:
        return ErrorInfo("NoValidHost", fault.message, ErrorClass.OUT_OF_RESOURCES)
    if any(marker in text for marker in _OUT_OF_RESOURCES_MARKERS):
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
