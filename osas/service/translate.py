"""Conversions between protocol messages and domain values."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from decimal import Decimal

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError

from osas.domain.errors import InvalidRequest
from osas.domain.inventory import Instance
from osas.domain.limits import MAX_ERROR_MESSAGE_LENGTH, NodeInfo
from osas.domain.options import AutoscalingOptions
from osas.domain.pricing import effective_requests
from osas.domain.specs import NodeGroupSpec
from osas.domain.template import NodeTemplate
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import k8s_pb2 as k8s

_NANOS_PER_SECOND = 1_000_000_000
# Durations CA sends are minutes; anything negative or beyond this is not a real default.
_LONGEST_DURATION = timedelta(days=3650)


def node_info(node: pb.ExternalGrpcNode) -> NodeInfo:
    # The request's own maps, not copies: NodeGroupForNode comes once per node per loop, and
    # copying a protobuf map goes through Python's Mapping machinery item by item. The
    # fingerprint is serialised in C with the maps sorted (``CheckedNodes``).
    fingerprint = hash(node.SerializeToString(deterministic=True))
    return NodeInfo(node.name, node.providerID, node.labels, node.annotations, fingerprint)


def node_group(spec: NodeGroupSpec, max_size: int) -> pb.NodeGroup:
    """A node group as CA sees it, with the max size osas reports now (see
    ``Controller.reported_max``)."""
    return pb.NodeGroup(
        id=spec.group_id, minSize=spec.min_size, maxSize=max_size, debug=spec.debug()
    )


def instance(item: Instance) -> pb.Instance:
    status = pb.InstanceStatus(instanceState=int(item.state))  # type: ignore[arg-type]
    if item.error is not None:
        status.errorInfo.CopyFrom(
            pb.InstanceErrorInfo(
                errorCode=item.error.code,
                errorMessage=item.error.message[:MAX_ERROR_MESSAGE_LENGTH],
                instanceErrorClass=int(item.error.error_class),
            )
        )
    return pb.Instance(id=item.instance_id, status=status)


def node_bytes(template: NodeTemplate) -> bytes:
    """The template as a serialised Kubernetes v1.Node."""
    node = k8s.Node()
    node.metadata.name = template.name
    node.metadata.labels.update(template.labels)
    for taint in template.taints:
        node.spec.taints.add(key=taint.key, value=taint.value, effect=str(taint.effect))
    for name, value in template.capacity.items():
        node.status.capacity[name].string = value
    for name, value in template.allocatable.items():
        node.status.allocatable[name].string = value
    node.status.conditions.add(
        type="Ready", status="True", reason="KubeletReady", message="template node"
    )
    node.status.nodeInfo.operatingSystem = template.operating_system
    node.status.nodeInfo.architecture = template.architecture
    return node.SerializeToString(deterministic=True)


def template_response(template: NodeTemplate) -> pb.NodeGroupTemplateNodeInfoResponse:
    # CA <= 1.34.1 reads field 1, 1.34.2+ prefers field 2: the same bytes serve both.
    data = node_bytes(template)
    return pb.NodeGroupTemplateNodeInfoResponse(nodeInfo=data, nodeBytes=data)


def _duration(options: pb.NodeGroupAutoscalingOptions, new: str, legacy: str) -> timedelta:
    try:
        if options.HasField(new):
            value: Duration = getattr(options, new)
            duration = value.ToTimedelta()
        else:
            nanos: int = getattr(options, legacy).duration
            duration = timedelta(microseconds=nanos // 1000)
    except (OverflowError, ValueError) as exc:
        raise InvalidRequest(f"default {new} is out of range") from exc
    if not timedelta(0) <= duration <= _LONGEST_DURATION:
        raise InvalidRequest(f"default {new} is out of range: {duration}")
    return duration


def options_from(message: pb.NodeGroupAutoscalingOptions) -> AutoscalingOptions:
    """CA's defaults from the request: 1.35+ sends durations in 8-10, older CA in 3-5."""
    return AutoscalingOptions(
        scale_down_utilization_threshold=message.scaleDownUtilizationThreshold,
        scale_down_gpu_utilization_threshold=message.scaleDownGpuUtilizationThreshold,
        scale_down_unneeded_time=_duration(
            message, "scaleDownUnneededDuration", "scaleDownUnneededTime"
        ),
        scale_down_unready_time=_duration(
            message, "scaleDownUnreadyDuration", "scaleDownUnreadyTime"
        ),
        max_node_provision_time=_duration(
            message, "MaxNodeProvisionDuration", "MaxNodeProvisionTime"
        ),
        zero_or_max_node_scaling=message.zeroOrMaxNodeScaling,
        ignore_daemonsets_utilization=message.ignoreDaemonSetsUtilization,
    )


def _legacy(value: timedelta) -> pb.LegacyDuration:
    return pb.LegacyDuration(duration=round(value.total_seconds() * _NANOS_PER_SECOND))


def _new(value: timedelta) -> Duration:
    duration = Duration()
    duration.FromTimedelta(value)
    return duration


def options_message(options: AutoscalingOptions) -> pb.NodeGroupAutoscalingOptions:
    """Every field filled, legacy durations too: CA <= 1.34 dereferences them unchecked."""
    return pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=options.scale_down_utilization_threshold,
        scaleDownGpuUtilizationThreshold=options.scale_down_gpu_utilization_threshold,
        scaleDownUnneededTime=_legacy(options.scale_down_unneeded_time),
        scaleDownUnreadyTime=_legacy(options.scale_down_unready_time),
        MaxNodeProvisionTime=_legacy(options.max_node_provision_time),
        zeroOrMaxNodeScaling=options.zero_or_max_node_scaling,
        ignoreDaemonSetsUtilization=options.ignore_daemonsets_utilization,
        scaleDownUnneededDuration=_new(options.scale_down_unneeded_time),
        scaleDownUnreadyDuration=_new(options.scale_down_unready_time),
        MaxNodeProvisionDuration=_new(options.max_node_provision_time),
    )


def price_period(
    message: pb.PricingNodePriceRequest | pb.PricingPodPriceRequest,
) -> tuple[float, float]:
    """[start, end] in epoch seconds, from the 1.35+ timestamps or the legacy times."""
    if message.HasField("startTimestamp") and message.HasField("endTimestamp"):
        start = message.startTimestamp.seconds + message.startTimestamp.nanos / 1e9
        end = message.endTimestamp.seconds + message.endTimestamp.nanos / 1e9
        return start, end
    if message.HasField("startTime") and message.HasField("endTime"):
        return float(message.startTime.seconds), float(message.endTime.seconds)
    raise InvalidRequest("price request carries no start and end time")


def pod_requests(message: pb.PricingPodPriceRequest) -> dict[str, Decimal]:
    data = message.pod_bytes or message.pod
    if not data:
        raise InvalidRequest("price request carries no pod")
    pod = k8s.Pod()
    try:
        pod.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidRequest("pod is not a serialised Kubernetes Pod") from exc

    def requests(container: k8s.Container) -> dict[str, str]:
        return _quantities(container.resources.requests.items())

    return effective_requests(
        [requests(c) for c in pod.spec.containers],
        [requests(c) for c in pod.spec.initContainers],
        _quantities(pod.spec.overhead.items()),
    )


def _quantities(items: Iterable[tuple[str, k8s.Quantity]]) -> dict[str, str]:
    """A resource map of a decoded Pod. Kubernetes' messages are proto2, where a string that is
    not UTF-8 still decodes (as bytes, or an error when read): refuse those here."""
    try:
        result = {name: quantity.string for name, quantity in items}
    except UnicodeDecodeError as exc:
        raise InvalidRequest("pod resource names are not UTF-8") from exc
    if not all(isinstance(v, str) and isinstance(k, str) for k, v in result.items()):
        raise InvalidRequest("pod resource quantities are not UTF-8")
    return result
