"""Bounds on what a request may carry. Real Cluster Autoscaler requests stay far inside them;
anything past them is refused whole before it reaches a decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A Kubernetes node as CA describes it in a request."""

    name: str
    provider_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


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


def check_nodes(nodes: list[NodeInfo]) -> None:
    if len(nodes) > MAX_NODES_PER_REQUEST:
        raise InvalidRequest(
            f"{len(nodes)} nodes in one request; at most {MAX_NODES_PER_REQUEST} are accepted"
        )
    for node in nodes:
        check_node(node)
