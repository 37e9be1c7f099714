"""What a new node of a group would look like, for the Cluster Autoscaler's scale-from-zero."""

from __future__ import annotations

from dataclasses import dataclass

from osas.domain.servers import Flavor
from osas.domain.specs import ClusterSpec, NodeGroupSpec, Taint

LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
# Older schedulers and node selectors still use the beta names; real kubelets set both.
LABEL_BETA_OS = "beta.kubernetes.io/os"
LABEL_BETA_ARCH = "beta.kubernetes.io/arch"
LABEL_BETA_INSTANCE_TYPE = "beta.kubernetes.io/instance-type"


@dataclass(frozen=True, slots=True)
class NodeTemplate:
    name: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    operating_system: str
    architecture: str


def build_template(
    cluster: ClusterSpec, spec: NodeGroupSpec, flavor: Flavor, *, region: str = ""
) -> NodeTemplate:
    """The node a server of ``spec`` would register as, built from its flavor and config; in
    ``region`` (the OpenStack region, which cloud-provider-openstack puts on every node it
    initialises, as it puts the availability zone), when known."""
    name = f"{cluster.cluster_name}-{spec.group_id}-template"
    disk_gib = spec.boot_volume.size_gib if spec.boot_volume else flavor.disk_gib
    capacity = {
        "cpu": str(flavor.vcpus),
        "memory": f"{flavor.ram_mib}Mi",
        "ephemeral-storage": f"{disk_gib + flavor.ephemeral_gib}Gi",
        "pods": str(spec.max_pods),
    }
    labels = {
        LABEL_OS: "linux",
        LABEL_BETA_OS: "linux",
        LABEL_ARCH: spec.architecture,
        LABEL_BETA_ARCH: spec.architecture,
        LABEL_INSTANCE_TYPE: flavor.name,
        LABEL_BETA_INSTANCE_TYPE: flavor.name,
        LABEL_HOSTNAME: name,
    }
    if spec.availability_zone:
        labels[LABEL_ZONE] = spec.availability_zone
    if region:
        labels[LABEL_REGION] = region
    if spec.gpu is not None:
        capacity[spec.gpu.resource] = str(spec.gpu.count)
        labels[cluster.gpu_label] = spec.gpu.type
    labels.update(spec.labels)
    return NodeTemplate(
        name=name,
        labels=labels,
        taints=spec.taints,
        capacity=capacity,
        allocatable=dict(capacity),
        operating_system="linux",
        architecture=spec.architecture,
    )
