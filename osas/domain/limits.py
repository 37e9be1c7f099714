"""Bounds on what a request may carry. Real Cluster Autoscaler requests stay far inside them;
anything past them is refused whole before it reaches a decision."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from osas.domain.errors import InvalidRequest

# CA deletes at most --max-scale-down-parallelism / --max-empty-bulk-delete nodes at once.
MAX_NODES_PER_REQUEST = 1000
# Kubernetes object names and provider ids.
MAX_NODE_ID_LENGTH = 253
MAX_GROUP_ID_LENGTH = 63
# Kubernetes itself bounds labels (63-character values) and annotations (256 KiB in all).
MAX_MAP_ENTRIES = 512
MAX_KEY_LENGTH = 317
MAX_LABEL_VALUE_LENGTH = 63
MAX_ANNOTATIONS_BYTES = 256 * 1024
# Answers must stay under the 4 MiB CA accepts. NodeGroupNodes is the only one that grows:
# max_size is capped at 10,000 and each instance carries at most an id (< 100 bytes) and an
# error message cut to this length, so even 12,000 instances with errors fit.
MAX_GROUP_SIZE = 10_000
MAX_ERROR_MESSAGE_LENGTH = 200

_NOTHING: Mapping[str, str] = MappingProxyType({})  # no labels or annotations


class NodeInfo(NamedTuple):
    """A Kubernetes node as CA describes it in a request. A named tuple: made once per
    NodeGroupForNode, it costs half a frozen dataclass."""

    name: str
    provider_id: str
    labels: Mapping[str, str] = _NOTHING
    annotations: Mapping[str, str] = _NOTHING
    # The hash of the whole description serialised canonically (map entries sorted), when the
    # caller made one: the same for the same node whatever order its maps came in.
    fingerprint: int | None = None


def check_group_id(group_id: str) -> None:
    if len(group_id) > MAX_GROUP_ID_LENGTH:
        raise InvalidRequest(f"node group id longer than {MAX_GROUP_ID_LENGTH} characters")


def check_node(node: NodeInfo) -> None:
    """Refuse a node whose description no Kubernetes API server would have accepted. CA asks
    NodeGroupForNode for every node on every loop: each bound is checked over a map's keys or
    values at once (``max(map(len, ...))``), never entry by entry in Python."""
    if len(node.name) > MAX_NODE_ID_LENGTH or len(node.provider_id) > MAX_NODE_ID_LENGTH:
        raise InvalidRequest(f"node name or provider id longer than {MAX_NODE_ID_LENGTH}")
    labels, annotations = node.labels, node.annotations
    for kind, values in (("labels", labels), ("annotations", annotations)):
        if len(values) > MAX_MAP_ENTRIES:
            raise InvalidRequest(f"node has more than {MAX_MAP_ENTRIES} {kind}")
        if values and max(map(len, values)) > MAX_KEY_LENGTH:
            raise InvalidRequest(f"node has {kind} keys longer than {MAX_KEY_LENGTH}")
    if labels and max(map(len, labels.values())) > MAX_LABEL_VALUE_LENGTH:
        raise InvalidRequest(f"node has label values longer than {MAX_LABEL_VALUE_LENGTH}")
    if annotations:
        characters = sum(map(len, annotations)) + sum(map(len, annotations.values()))
        # UTF-8 takes at most 4 bytes a character: encode only when that could pass the bound.
        if characters * 4 > MAX_ANNOTATIONS_BYTES:
            size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
            if size > MAX_ANNOTATIONS_BYTES:
                raise InvalidRequest(f"node annotations exceed {MAX_ANNOTATIONS_BYTES} bytes")


class CheckedNodes:
    """``check_node``, remembered per node name by the description's ``fingerprint``. CA asks
    NodeGroupForNode for every node on every loop with the same description (its maps in
    a new order each time: Go's map order is random), and reading a node's labels and
    annotations out of the request costs more than the rest of the call. A description that
    changes, or comes without a fingerprint, is checked again. Only a changed description
    whose 64-bit hash (SipHash, keyed per process) equals the last passed one's would pass
    unchecked: about one chance in 10^19 per change, for a node that can only be read."""

    __slots__ = ("_limit", "_passed")

    def __init__(self, *, limit: int = 100_000) -> None:
        self._passed: dict[str, int] = {}  # node name -> fingerprint of what passed
        self._limit = limit  # names remembered: more than a cluster has nodes

    def check(self, node: NodeInfo) -> None:
        fingerprint = node.fingerprint
        if fingerprint is not None and self._passed.get(node.name) == fingerprint:
            return
        check_node(node)
        if fingerprint is not None:
            if len(self._passed) >= self._limit:
                self._passed.clear()
            self._passed[node.name] = fingerprint


def check_nodes(nodes: list[NodeInfo]) -> None:
    if len(nodes) > MAX_NODES_PER_REQUEST:
        raise InvalidRequest(
            f"{len(nodes)} nodes in one request; at most {MAX_NODES_PER_REQUEST} are accepted"
        )
    for node in nodes:
        check_node(node)
