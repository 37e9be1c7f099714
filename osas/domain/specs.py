"""What the operator configured: the cluster and its node groups, as plain immutable values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from osas.domain.ids import ProviderIdFormat


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: TaintEffect


@dataclass(frozen=True, slots=True)
class GpuSpec:
    count: int
    type: str
    resource: str = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class BootVolume:
    size_gib: int
    volume_type: str | None = None


@dataclass(frozen=True, slots=True)
class BootstrapTokenSpec:
    """A kubeadm bootstrap token minted for each server at its create, valid for ``ttl``
    seconds from then: past the server's build and join, not its life."""

    ttl: float = 1800.0


class WarmState(StrEnum):
    """The state a warm pool keeps its servers in, and what each costs (docs/configuration.md):
    every one holds an instance of the quota; all but ``shelved_offloaded`` hold their cores,
    RAM and place on a host, so that starting one needs no scheduling."""

    SHUTOFF = "shutoff"
    PAUSED = "paused"
    SUSPENDED = "suspended"
    SHELVED_OFFLOADED = "shelved_offloaded"

    @property
    def holds_compute(self) -> bool:
        """Whether a server waiting in this state keeps its cores, RAM and host."""
        return self is not WarmState.SHELVED_OFFLOADED


@dataclass(frozen=True, slots=True)
class WarmPoolSpec:
    """A node group's warm pool: servers prepared once and kept in ``state``, claimed by
    IncreaseSize before any cold create."""

    size: int | None = None  # None: up to max_size - target
    state: WarmState = WarmState.SHUTOFF
    max_age: float = 7 * 24 * 3600.0  # older prepared servers are replaced
    # A claimed server not ACTIVE this long after its claim is replaced by a cold create.
    start_timeout: float = 120.0
    # A server still preparing this long after its create is replaced.
    prepare_timeout: float = 1800.0


@dataclass(frozen=True, slots=True)
class OptionOverrides:
    """Per-group autoscaling options; None keeps the Cluster Autoscaler's own default."""

    scale_down_utilization_threshold: float | None = None
    scale_down_gpu_utilization_threshold: float | None = None
    scale_down_unneeded_time: timedelta | None = None
    scale_down_unready_time: timedelta | None = None
    max_node_provision_time: timedelta | None = None
    zero_or_max_node_scaling: bool | None = None
    ignore_daemonsets_utilization: bool | None = None

    def is_empty(self) -> bool:
        # Asked at every GetOptions, once per node per CA loop: one comparison, not a walk.
        return self == _NO_OVERRIDES


_NO_OVERRIDES = OptionOverrides()


@dataclass(frozen=True, slots=True)
class NodeGroupSpec:
    """One node group: its size bounds and how to build and describe its servers."""

    group_id: str
    min_size: int
    max_size: int
    flavor: str
    image: str
    networks: tuple[str, ...]
    key_name: str | None = None
    security_groups: tuple[str, ...] = ()
    availability_zone: str | None = None
    server_group: str | None = None
    user_data: str | None = field(default=None, repr=False)  # may hold bootstrap tokens
    # Or a template read from this file at each create (a mounted Secret), and variables whose
    # values are read from files: name -> path. Paths only here; the engine reads them.
    user_data_file: str | None = None
    user_data_vars: Mapping[str, str] = field(default_factory=dict)
    user_data_format: str = "text"  # "json": placeholders are filled in JSON strings only
    # A join token of its own for each server, filled in as ${bootstrap_token}.
    bootstrap_token: BootstrapTokenSpec | None = None
    boot_volume: BootVolume | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu: GpuSpec | None = None
    options: OptionOverrides = field(default_factory=OptionOverrides)
    warm_pool: WarmPoolSpec | None = None
    price_per_hour: float | None = None
    max_pods: int = 110
    architecture: str = "amd64"

    def debug(self) -> str:
        """The short description CA logs; it must never hold secrets (user data is left out)."""
        return (
            f"{self.group_id} [{self.min_size}..{self.max_size}] flavor={self.flavor} "
            f"image={self.image}"
        )


@dataclass(frozen=True, slots=True)
class Pricing:
    """Prices per hour for the price expander; a pod costs what it requests."""

    cpu_per_hour: float
    memory_gib_per_hour: float
    gpu_per_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    cluster_name: str
    node_groups: tuple[NodeGroupSpec, ...]
    # The region in the nodes' provider ids (cloud-provider-openstack's OS_CCM_REGIONAL).
    provider_id_region: str = ""
    gpu_label: str = "nvidia.com/gpu.product"
    gpu_types: tuple[str, ...] = ()
    pricing: Pricing | None = None
    # How provider ids are spelt, from the region: built once, parsed on every call.
    provider_ids: ProviderIdFormat = field(init=False, repr=False, compare=False)
    # The groups by id, the first of an id winning (ids are unique once validated): found on
    # every NodeGroupForNode.
    _by_id: Mapping[str, NodeGroupSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "provider_ids", ProviderIdFormat(self.provider_id_region))
        by_id = {spec.group_id: spec for spec in reversed(self.node_groups)}
        object.__setattr__(self, "_by_id", by_id)

    def group(self, group_id: str) -> NodeGroupSpec | None:
        return self._by_id.get(group_id)
