"""The configuration file's schema: every key, its type, its limits, its default (read from
the value class it becomes, see ``convert``) and the checks across keys. Validation only:
loading is ``loading``'s, what a reload may change is ``reload``'s."""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_settings import (
    BaseSettings,
    SettingsConfigDict,
)

from osas.cloud.openstack_settings import OpenStackAuth, OpenStackSettings
from osas.config.convert import as_values, default_duration, default_of
from osas.domain.ids import NAME_MAX_LENGTH, NAME_PATTERN
from osas.domain.ledger import LedgerSettings
from osas.domain.limits import MAX_GROUP_SIZE
from osas.domain.servers import (
    META_CLAIMED,
    META_CLUSTER,
    META_GROUP,
    META_JOIN_TOKEN,
    META_NODE_LABELS,
    META_NODE_TAINTS,
    META_REQUEST,
    META_WARM,
    META_WARM_STATE,
)
from osas.domain.specs import (
    BootstrapTokenSpec,
    ClusterSpec,
    GpuSpec,
    NodeGroupSpec,
    Pricing,
    TaintEffect,
    WarmPoolSpec,
    WarmState,
)
from osas.election.port import ElectionSettings, default_identity, lease_name_for
from osas.engine.settings import EngineSettings, QueueSettings, ReconcileSettings
from osas.service.settings import ServerSettings, TransportSettings

ENV_PREFIX = "OSAS_"
# Seconds ("90", "1.5"), or hours, minutes and seconds in that order ("1h30m", "45s"). One
# pattern for osas and for the JSON schema (Go's RE2 as Helm runs it): ASCII, no lookaround.
# At most 9 digits before the point (31 years of seconds), so that no text overflows a
# timedelta where the schema could not see it; a number is bounded alike.
_SPACE = r"[ \t\n\r\f\v]*"
_AMOUNT = r"[0-9]{1,9}(?:\.[0-9]+)?"
DURATION_PATTERN = (
    rf"^{_SPACE}(?:([0-9]{{1,9}}(?:\.[0-9]*)?|\.[0-9]+)|"
    rf"(?:({_AMOUNT})h)?(?:({_AMOUNT})m)?(?:({_AMOUNT})s)?){_SPACE}$"
)
_DURATION_LIMIT = 999_999_999  # seconds, either way
_DURATION_RE = re.compile(DURATION_PATTERN)
_LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_DNS_NAME_RE = re.compile(rf"^(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*$")
# A name or an address, as the validator of tls.server_names takes them, for the JSON schema
# (no lookahead: the length is a maxLength). An IPv4 address is a DNS name by this pattern.
_H16 = "[0-9A-Fa-f]{1,4}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LS32 = rf"(?:{_H16}:{_H16}|{_OCTET}(?:\.{_OCTET}){{3}})"
_IPV6_TAILS = (
    rf"(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16}:){{4}}{_LS32}",
    rf"(?:{_H16}:){{3}}{_LS32}",
    rf"(?:{_H16}:){{2}}{_LS32}",
    rf"{_H16}:{_LS32}",
    _LS32,
    _H16,
    "",
)
# RFC 3986's IPv6address (n groups before "::", then its tail), and Python's "%scope".
_IPV6_PATTERN = (
    rf"^(?:(?:{_H16}:){{6}}{_LS32}|::{_IPV6_TAILS[0]}|"
    + "|".join(
        rf"(?:(?:{_H16}:){{0,{n - 1}}}{_H16})?::{tail}"
        for n, tail in enumerate(_IPV6_TAILS[1:], start=1)
    )
    + ")(?:%[^%]+)?$"
)
_SERVER_NAME_SCHEMA: JsonDict = {
    "anyOf": [
        {"pattern": rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$", "maxLength": 253},
        {"pattern": _IPV6_PATTERN},
    ],
    "type": "string",
}
ADDRESS_PATTERN = r"^(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):(\d{1,5})$"
_ADDRESS_RE = re.compile(ADDRESS_PATTERN)
# The same with the port's range (a validator below says it in words): for the JSON schema.
_PORT = r"(?:[0-9]{1,4}|[0-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_ADDRESS_IN_RANGE = rf"^(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):{_PORT}$"
# A client identity osas may allow: a name in its certificate.
CLIENT_PATTERN = r"^(dns|uri|cn):\S+$"
# Nova caps user data at 65535 bytes once base64-encoded, and metadata items at 255 bytes.
_USER_DATA_MAX = 65535
_METADATA_ITEM_MAX = 255
_PORT_MAX = 65535
_RESERVED_METADATA = frozenset(
    {
        META_CLUSTER,
        META_GROUP,
        META_REQUEST,
        META_WARM,
        META_WARM_STATE,
        META_CLAIMED,
        META_JOIN_TOKEN,
        *(
            f"{key}{suffix}"
            for key in (META_NODE_LABELS, META_NODE_TAINTS)
            for suffix in ("", "-2", "-3", "-4")
        ),
    }
)
# The user data variables osas fills in itself.
_BUILTIN_VARS = frozenset({"server_name", "node_group", "cluster_name", "bootstrap_token"})
# A minted join token lives at least this long (a server takes minutes to build and join) and
# at most as long as kubeadm's own default token.
_TOKEN_TTL_MIN = timedelta(minutes=2)
_TOKEN_TTL_MAX = timedelta(hours=24)


def _none_of(names: frozenset[str]) -> JsonDict:
    """JSON schema: any text but these."""
    return {"not": {"enum": [name for name in sorted(names)]}}  # noqa: C416 - typed as JSON


class KeyClash(ValueError):
    """A check across keys that blames one key: ``key`` is where the problem is and ``first``
    the key it clashes with, each under the model that raises it, so that the message can
    point at both (``loading`` adds their lines) rather than at the model as a whole."""

    def __init__(
        self, message: str, *, key: tuple[int | str, ...], first: tuple[int | str, ...]
    ) -> None:
        super().__init__(message)
        self.key = key
        self.first = first


def _parse_duration(value: Any) -> Any:
    """Accept 90, "90", "90s", "5m", "1h30m" as well as what pydantic takes for a timedelta."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h30m)")  # noqa: TRY004
    try:
        if isinstance(value, str):
            match = _DURATION_RE.fullmatch(value)
            if match is None or not any(match.groups()):
                raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h30m)")
            plain, hours, minutes, seconds = (float(part or 0) for part in match.groups())
            return timedelta(hours=hours, minutes=minutes, seconds=plain + seconds)
        if isinstance(value, int | float):
            if not -_DURATION_LIMIT <= value <= _DURATION_LIMIT:
                raise ValueError(f"duration out of range: {value!r} (at most {_DURATION_LIMIT}s)")
            return timedelta(seconds=value)
    except OverflowError as exc:
        raise ValueError(f"duration out of range: {value!r}") from exc
    return value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be positive")
    return value


def _duration_schema(*, positive: bool) -> dict[str, Any]:
    """A duration in JSON schema: a number of seconds or a text osas parses; at least one digit
    in it, a non-zero one where it must be positive (the number's bound is the same rule)."""
    schema: dict[str, Any] = {
        "type": ["string", "number"],
        "pattern": DURATION_PATTERN,
        "minimum": -_DURATION_LIMIT,
        "maximum": _DURATION_LIMIT,
        "allOf": [{"pattern": "[1-9]" if positive else "[0-9]"}],
        "description": "30s, 5m, 1h30m, or seconds" + (", more than 0" if positive else ""),
    }
    if positive:
        schema["exclusiveMinimum"] = 0
    return schema


Duration = Annotated[
    timedelta, BeforeValidator(_parse_duration), WithJsonSchema(_duration_schema(positive=False))
]
PositiveDuration = Annotated[
    timedelta,
    BeforeValidator(_parse_duration),
    AfterValidator(_positive),
    WithJsonSchema(_duration_schema(positive=True)),
]
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsConfig(_Strict):
    cert_file: Path
    key_file: Path
    client_ca_file: Path
    # Client identities allowed to call: "dns:NAME", "uri:URI" (SANs) or "cn:NAME".
    allowed_clients: list[Annotated[str, Field(pattern=CLIENT_PATTERN)]] = []
    # The names CA dials (the host of its address): the server certificate must cover each,
    # at start, in check-config and on every rotation.
    server_names: list[str] = Field([], json_schema_extra={"items": _SERVER_NAME_SCHEMA})

    @field_validator("server_names")
    @classmethod
    def _names_or_addresses(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _is_ip(name) and not _DNS_NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is neither a DNS name nor an IP address")
        return names


class TransportConfig(_Strict):
    max_concurrent_rpcs: int = Field(
        default_of(TransportSettings, "max_concurrent_rpcs"), ge=1, le=10_000
    )
    max_connection_age: PositiveDuration = default_duration(TransportSettings, "max_connection_age")
    max_connection_age_grace: Duration = default_duration(
        TransportSettings, "max_connection_age_grace"
    )
    keepalive_time: PositiveDuration = default_duration(TransportSettings, "keepalive_time")
    keepalive_timeout: PositiveDuration = default_duration(TransportSettings, "keepalive_timeout")
    # asyncio's is the fallback should uvloop ever misbehave.
    event_loop: Literal["uvloop", "asyncio"] = default_of(TransportSettings, "event_loop")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenStackConfig(_Strict):
    cloud: str | None = None  # an entry of clouds.yaml
    # The clouds.yaml that entry is read from, alone (see GroupOpenStackConfig.clouds_file).
    clouds_file: Path | None = None
    auth: OpenStackAuth | None = None
    region_name: str | None = None
    interface: Literal["public", "internal", "admin"] | None = None
    verify: bool = True
    cacert: Path | None = None
    api_timeout: PositiveDuration = default_duration(OpenStackSettings, "api_timeout")
    concurrency: int = Field(default_of(OpenStackSettings, "concurrency"), ge=1, le=32)
    rate_limit: float = Field(
        default_of(OpenStackSettings, "rate_limit"), gt=0, le=1000, description="calls per second"
    )
    attempts: int = Field(default_of(OpenStackSettings, "attempts"), ge=1, le=10)

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.cloud and self.auth:
            raise ValueError("give either 'cloud' (clouds.yaml) or 'auth', not both")
        if self.clouds_file and not self.cloud:
            raise ValueError("clouds_file goes with 'cloud', the entry to read from it")
        return self


class GroupOpenStackConfig(_Strict):
    """Where a node group lives when it is not where ``openstack`` says: another region of the
    same cloud (``region_name`` alone), or another cloud (a clouds.yaml entry, or an ``auth``
    block), with its TLS and interface of its own. The rest (timeouts, pace, attempts) is the
    top-level block's, applied to each place apart."""

    cloud: str | None = None  # an entry of clouds.yaml
    # The clouds.yaml that entry is read from, alone (no OS_* variables, no other clouds.yaml;
    # a secure.yaml beside it is read with it): each cloud's credentials in a Secret of its own.
    clouds_file: Path | None = None
    auth: OpenStackAuth | None = None
    region_name: str | None = None
    interface: Literal["public", "internal", "admin"] | None = None
    verify: bool | None = None
    cacert: Path | None = None
    # The region in the provider ids of this place's nodes, when cloud-provider-openstack runs
    # regional here; by default the top-level provider_id_region.
    provider_id_region: str | None = Field(None, pattern=r"^[^/\s]*$")

    @model_validator(mode="after")
    def _says_where(self) -> Self:
        if self.cloud and self.auth:
            raise ValueError("give either 'cloud' (clouds.yaml) or 'auth', not both")
        if self.clouds_file and not self.cloud:
            raise ValueError("clouds_file goes with 'cloud', the entry to read from it")
        if not (self.cloud or self.auth or self.region_name):
            raise ValueError(
                "name the group's cloud ('cloud' or 'auth'), its 'region_name', or both; "
                "without this block the group lives where 'openstack' says"
            )
        other_cloud = bool(self.cloud or self.auth)
        if not other_cloud and (self.verify is not None or self.cacert or self.interface):
            raise ValueError(
                "verify, cacert and interface go with another cloud ('cloud' or 'auth'); "
                "another region of the same cloud takes them from 'openstack'"
            )
        return self


class ReconcileConfig(_Strict):
    interval: PositiveDuration = default_duration(ReconcileSettings, "interval")
    full_resync_interval: Duration = default_duration(ReconcileSettings, "full_resync_interval")
    max_inventory_age: Duration = default_duration(ReconcileSettings, "max_inventory_age")
    retry_backoff: PositiveDuration = default_duration(ReconcileSettings, "retry_backoff")
    # A delete that failed for good is sent again when the server is still listed this long after.
    delete_retry_after: PositiveDuration = default_duration(LedgerSettings, "delete_retry_after")
    # A create whose outcome is unknown (timeout, 5xx, lost answer) is never sent again; if no
    # server of it is listed within this window it is reported failed. Longer than
    # openstack.api_timeout plus the longest Nova may take to store a server it was sent.
    create_doubt_window: PositiveDuration = default_duration(LedgerSettings, "create_doubt_window")
    # Servers in BUILD, or being deleted, longer than these are reported (logs, metrics,
    # /status); osas never deletes them on its own.
    stuck_build_after: PositiveDuration = default_duration(ReconcileSettings, "stuck_build_after")
    stuck_delete_after: PositiveDuration = default_duration(ReconcileSettings, "stuck_delete_after")
    # After a start (or taking the leader lease), creates an earlier osas sent may still be in
    # Nova's API for up to create_doubt_window: scale-ups wait that long. Only where no other
    # osas can ever have sent creates for this cluster (a test's fresh cloud) is false safe.
    hold_after_start: bool = default_of(ReconcileSettings, "hold_after_start")
    # The project's quota is read this often (and after every quota refusal): each group's max
    # size as CA sees it is what the quota can still hold. 0 turns the reads off.
    quota_interval: Duration = default_duration(ReconcileSettings, "quota_interval")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.full_resync_interval < self.interval:
            raise ValueError("full_resync_interval must not be shorter than interval")
        if self.max_inventory_age <= self.interval:
            raise ValueError("max_inventory_age must be longer than interval")
        return self


_K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_K8S_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a namespace, a Service


class LeaderElectionConfig(_Strict):
    """One writer per cluster, elected through a coordination.k8s.io/v1 Lease."""

    enabled: bool = default_of(ElectionSettings, "enabled")
    # "" -> osas-<cluster_name>; fixed, not per namespace, so that a copy elsewhere competes.
    lease_name: str = Field(
        default_of(ElectionSettings, "lease_name"),
        max_length=253,
        json_schema_extra={"pattern": f"^({_K8S_NAME_RE.pattern.strip('^$')})?$"},
    )
    lease_namespace: str = Field(
        default_of(ElectionSettings, "lease_namespace"), pattern=_K8S_LABEL_RE.pattern
    )
    identity: str = Field(default_of(ElectionSettings, "identity"), max_length=253)
    lease_duration: PositiveDuration = default_duration(ElectionSettings, "lease_duration")
    renew_deadline: PositiveDuration = default_duration(ElectionSettings, "renew_deadline")
    retry_period: PositiveDuration = default_duration(ElectionSettings, "retry_period")
    kubeconfig: Path | None = None  # None: the pod's service account
    # The Service CA dials: the holder publishes itself as its only endpoint ("" publishes
    # nothing, outside Kubernetes). Its namespace: "" is $POD_NAMESPACE.
    service_name: str = Field(default_of(ElectionSettings, "service_name"), max_length=63)
    service_namespace: str = Field(default_of(ElectionSettings, "service_namespace"), max_length=63)

    @field_validator("lease_name")
    @classmethod
    def _lease_name(cls, value: str) -> str:
        if value and not _K8S_NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a Kubernetes object name (lowercase, digits, -, .)")
        return value

    @model_validator(mode="after")
    def _fenced(self) -> Self:
        # A holder stops writing (renew_deadline) before anyone may take over (lease_duration).
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "retry_period < renew_deadline < lease_duration must hold: a holder that cannot "
                "renew stops writing before the lease can pass to another"
            )
        return self


class QueueConfig(_Strict):
    capacity: int = Field(default_of(QueueSettings, "capacity"), ge=1, le=100_000)
    workers: int = Field(default_of(QueueSettings, "workers"), ge=1, le=64)


class TaintConfig(_Strict):
    key: str = Field(pattern=_LABEL_KEY_RE.pattern)
    value: str = Field("", pattern=_LABEL_VALUE_RE.pattern)
    effect: TaintEffect


class GpuConfig(_Strict):
    count: int = Field(ge=1, le=64)
    type: str = Field(min_length=1, pattern=_LABEL_VALUE_RE.pattern)
    resource: str = Field(default_of(GpuSpec, "resource"), pattern=_LABEL_KEY_RE.pattern)


class BootVolumeConfig(_Strict):
    size_gib: int = Field(alias="size", ge=1, le=65536, description="GiB")
    volume_type: str | None = Field(None, alias="type")


class BootstrapTokenConfig(_Strict):
    ttl: PositiveDuration = Field(
        default_duration(BootstrapTokenSpec, "ttl"),
        description="how long each server's token joins: past its build and join, 2m to 24h",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not _TOKEN_TTL_MIN <= self.ttl <= _TOKEN_TTL_MAX:
            raise ValueError(
                f"bootstrap_token.ttl must be between 2m and 24h, not "
                f"{self.ttl.total_seconds():g}s: long enough for a server to build and join, "
                "short enough that user data read later joins nothing"
            )
        return self


class WarmPoolConfig(_Strict):
    size: int | None = Field(
        None, ge=0, le=MAX_GROUP_SIZE, description="default: up to max_size - target"
    )
    state: WarmState = default_of(WarmPoolSpec, "state")
    max_age: PositiveDuration = default_duration(WarmPoolSpec, "max_age")
    start_timeout: PositiveDuration = default_duration(WarmPoolSpec, "start_timeout")
    prepare_timeout: PositiveDuration = default_duration(WarmPoolSpec, "prepare_timeout")


class OptionsConfig(_Strict):
    scale_down_utilization_threshold: float | None = Field(None, ge=0, le=1)
    scale_down_gpu_utilization_threshold: float | None = Field(None, ge=0, le=1)
    # Positive: CA uses an answer verbatim, and a 0 there deletes new nodes at once.
    scale_down_unneeded_time: PositiveDuration | None = None
    scale_down_unready_time: PositiveDuration | None = None
    max_node_provision_time: PositiveDuration | None = None
    zero_or_max_node_scaling: bool | None = None
    ignore_daemonsets_utilization: bool | None = None


class NodeGroupConfig(_Strict):
    group_id: Name = Field(alias="id")
    min_size: int = Field(ge=0, le=MAX_GROUP_SIZE)
    max_size: int = Field(ge=0, le=MAX_GROUP_SIZE)
    flavor: str = Field(min_length=1)
    image: str = Field(min_length=1)
    networks: list[str] = Field(min_length=1)
    key_name: str | None = None
    security_groups: list[str] = []
    availability_zone: str | None = None
    server_group: str | None = None
    user_data: str | None = Field(None, repr=False)  # may hold bootstrap tokens
    # Or the template in a file (a mounted Secret), read at each create; and variables whose
    # values are files' contents: ${join_token} <- /etc/osas/bootstrap/token.
    user_data_file: Path | None = None
    user_data_vars: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Path] = Field(
        {}, json_schema_extra={"propertyNames": _none_of(_BUILTIN_VARS)}
    )
    user_data_format: Literal["text", "json"] = default_of(NodeGroupSpec, "user_data_format")
    # A kubeadm bootstrap token minted per server at its create: ${bootstrap_token}.
    bootstrap_token: BootstrapTokenConfig | None = None
    boot_volume: BootVolumeConfig | None = None
    metadata: dict[str, str] = Field(
        {},
        json_schema_extra={
            "propertyNames": {
                "minLength": 1,
                "maxLength": _METADATA_ITEM_MAX,
                **_none_of(_RESERVED_METADATA),
            },
            "additionalProperties": {"type": "string", "maxLength": _METADATA_ITEM_MAX},
        },
    )
    labels: dict[str, str] = Field(
        {},
        json_schema_extra={
            "propertyNames": {"pattern": _LABEL_KEY_RE.pattern},
            "additionalProperties": {"type": "string", "pattern": _LABEL_VALUE_RE.pattern},
        },
    )
    taints: list[TaintConfig] = []
    gpu: GpuConfig | None = None
    options: OptionsConfig = OptionsConfig()
    # Servers prepared once and kept stopped, claimed by IncreaseSize before a cold create.
    warm_pool: WarmPoolConfig | None = None
    price_per_hour: float | None = Field(None, ge=0)
    max_pods: int = Field(default_of(NodeGroupSpec, "max_pods"), ge=1, le=10_000)
    architecture: Literal["amd64", "arm64", "ppc64le", "s390x"] = default_of(
        NodeGroupSpec, "architecture"
    )
    # Where the group's servers live, when not where the top-level ``openstack`` says.
    openstack: GroupOpenStackConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.min_size > self.max_size:
            raise ValueError(f"min_size {self.min_size} is greater than max_size {self.max_size}")
        if self.user_data is not None:
            encoded = len(base64.b64encode(self.user_data.encode()))
            if encoded > _USER_DATA_MAX:
                raise ValueError(
                    f"user_data is {encoded} bytes base64-encoded; Nova accepts {_USER_DATA_MAX}"
                )
        self._check_user_data_sources()
        reserved = _RESERVED_METADATA & self.metadata.keys()
        if reserved:
            raise ValueError(f"metadata keys {sorted(reserved)} are osas's ownership marks")
        for key, value in self.metadata.items():
            if not key or len(key) > _METADATA_ITEM_MAX or len(value) > _METADATA_ITEM_MAX:
                raise ValueError(f"metadata {key!r}: keys and values are 1 to 255 characters")
        for key, value in self.labels.items():
            if not _LABEL_KEY_RE.fullmatch(key) or not _LABEL_VALUE_RE.fullmatch(value):
                raise ValueError(f"label {key!r}={value!r} is not a valid Kubernetes label")
        if self.warm_pool is not None:
            self._check_warm_pool(self.warm_pool)
        return self

    def _check_warm_pool(self, pool: WarmPoolConfig) -> None:
        if pool.size is not None and pool.size > self.max_size:
            raise ValueError(
                f"warm_pool.size {pool.size} is greater than max_size {self.max_size}: a warm "
                "server beyond it could never be claimed"
            )
        if self.user_data is None and self.user_data_file is None:
            raise ValueError(
                "warm_pool needs user data that prepares a server and stops it (user_data or "
                "user_data_file; docs/install.md#kubeadm-with-a-warm-pool)"
            )
        items = [f"{k}={v}" for k, v in self.labels.items()]
        items += [f"{t.key}={t.value}:{t.effect}" for t in self.taints]
        for item in items:
            if len(item) > _METADATA_ITEM_MAX:
                raise ValueError(
                    f"{item[:40]}...: with warm_pool each label and taint reaches the node in "
                    f"server metadata, at most {_METADATA_ITEM_MAX} characters each"
                )

    def _check_user_data_sources(self) -> None:
        if self.user_data is not None and self.user_data_file is not None:
            raise ValueError("give either user_data or user_data_file, not both")
        if self.user_data_vars and self.user_data is None and self.user_data_file is None:
            raise ValueError("user_data_vars needs a template: user_data or user_data_file")
        builtin = sorted(set(self.user_data_vars) & _BUILTIN_VARS)
        if builtin:
            raise ValueError(f"user_data_vars {builtin} are filled in by osas itself")
        if self.bootstrap_token is not None:
            self._check_bootstrap_token(self.bootstrap_token)
        if self.user_data_format == "json" and self.user_data is not None:
            try:
                json.loads(self.user_data)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"user_data is not JSON (user_data_format: json): {exc.msg} at line "
                    f"{exc.lineno}, column {exc.colno}"
                ) from None

    def _check_bootstrap_token(self, token: BootstrapTokenConfig) -> None:
        if self.user_data is None and self.user_data_file is None:
            raise ValueError(
                "bootstrap_token needs a template to fill ${bootstrap_token} in: user_data or "
                "user_data_file"
            )
        says_token = self.user_data is not None and "${bootstrap_token}" in self.user_data
        if self.warm_pool is not None:
            if says_token:
                raise ValueError(
                    "with warm_pool the join token reaches a server at its claim, in its "
                    "metadata (osas-join-token), not in its user data, which a warm server is "
                    "prepared with long before: the template must not say ${bootstrap_token}"
                )
        elif self.user_data is not None and not says_token:
            raise ValueError(
                "bootstrap_token is set but user_data never says ${bootstrap_token}: every "
                "create would mint a token nothing uses"
            )
        provision = self.options.max_node_provision_time
        if provision is not None and token.ttl < provision:
            raise ValueError(
                f"bootstrap_token.ttl ({token.ttl.total_seconds():g}s) is shorter than "
                f"options.max_node_provision_time ({provision.total_seconds():g}s): a server "
                "that joins late but in time for CA would find its token expired"
            )


class PricingConfig(_Strict):
    cpu_per_hour: float = Field(ge=0)
    memory_gib_per_hour: float = Field(ge=0)
    gpu_per_hour: float = Field(default_of(Pricing, "gpu_per_hour"), ge=0)


class OsasConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    cluster_name: Name
    listen: str = Field(
        "0.0.0.0:8086",
        pattern=_ADDRESS_RE.pattern,
        json_schema_extra={"pattern": _ADDRESS_IN_RANGE},
    )
    health_listen: str = Field(
        "0.0.0.0:8087",
        pattern=_ADDRESS_RE.pattern,
        json_schema_extra={"pattern": _ADDRESS_IN_RANGE},
    )
    # Plain HTTP: /metrics, /healthz, /readyz, /status. Off unless set.
    metrics_listen: str | None = Field(
        None, pattern=_ADDRESS_RE.pattern, json_schema_extra={"pattern": _ADDRESS_IN_RANGE}
    )
    tls: TlsConfig | None = None
    insecure: bool = False
    # Plaintext on an address other hosts can reach needs this second, explicit choice.
    insecure_non_loopback: bool = False
    transport: TransportConfig = TransportConfig()
    # Retired: osas runs against OpenStack only (the in-memory cloud is the tests' own).
    # "openstack" still loads, so that files written for earlier releases do; serve warns.
    cloud_backend: Literal["openstack"] | None = None
    openstack: OpenStackConfig = OpenStackConfig()
    provider_id_region: str = Field("", pattern=r"^[^/\s]*$")
    gpu_label: str = Field(default_of(ClusterSpec, "gpu_label"), pattern=_LABEL_KEY_RE.pattern)
    gpu_types: list[str] = []
    pricing: PricingConfig | None = None
    reconcile: ReconcileConfig = ReconcileConfig()
    queue: QueueConfig = QueueConfig()
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    shutdown_grace: Duration = Field(
        default_duration(ServerSettings, "shutdown_grace"), json_schema_extra={"minimum": 0}
    )
    node_groups: list[NodeGroupConfig] = Field(min_length=1)

    @field_validator("cloud_backend", mode="before")
    @classmethod
    def _openstack_only(cls, value: Any) -> Any:
        if value is not None and value != "openstack":
            raise ValueError(
                f"{value!r} is no longer offered: osas runs against OpenStack only (the "
                "in-memory cloud is for osas's own tests); remove cloud_backend"
            )
        return value

    @field_validator("listen", "health_listen", "metrics_listen")
    @classmethod
    def _port_in_range(cls, value: str | None) -> str | None:
        if value is None:
            return value
        port = int(value.rpartition(":")[2])
        if port > _PORT_MAX:
            raise ValueError(f"{value!r}: port {port} is above {_PORT_MAX}")
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.shutdown_grace < timedelta(0):
            raise ValueError("shutdown_grace must not be negative")
        if self.tls is not None and self.insecure:
            raise ValueError("both 'tls' and 'insecure: true' are set; choose one")
        if self.tls is None and not self.insecure:
            raise ValueError("'tls' is required (or set 'insecure: true' to serve plaintext)")
        if self.insecure and not self.insecure_non_loopback and not _is_loopback(self.listen):
            raise ValueError(
                f"listen {self.listen} is not a loopback address: serving plaintext there "
                "also needs 'insecure_non_loopback: true'"
            )
        window = self.reconcile.create_doubt_window.total_seconds()
        timeout = self.openstack.api_timeout.total_seconds()
        if window <= timeout:
            raise ValueError(
                f"reconcile.create_doubt_window ({window:g}s) must be longer than "
                f"openstack.api_timeout ({timeout:g}s): Nova may still store a create after "
                "the client gave up waiting for it"
            )
        if self.listen == self.health_listen and not self.listen.endswith(":0"):
            raise ValueError("listen and health_listen must differ")
        if self.metrics_listen in {self.listen, self.health_listen} and not str(
            self.metrics_listen
        ).endswith(":0"):
            raise ValueError("metrics_listen must differ from listen and health_listen")
        # Where the groups live, resolved once here so that a contradiction is refused on load.
        from osas.config.places import places_of  # noqa: PLC0415 - it reads this very model

        places_of(self)
        seen: dict[str, int] = {}
        for index, group in enumerate(self.node_groups):
            first = seen.setdefault(group.group_id, index)
            if first != index:
                raise KeyClash(
                    f"duplicate node group id {group.group_id!r}",
                    key=("node_groups", index, "id"),
                    first=("node_groups", first, "id"),
                )
        return self

    # -- the value classes the parts run on (``convert``) ---------------------------------------

    def cluster_spec(self) -> ClusterSpec:
        return as_values(ClusterSpec, self)

    def engine_settings(self) -> EngineSettings:
        return as_values(EngineSettings, self)

    def ledger_settings(self) -> LedgerSettings:
        return as_values(LedgerSettings, self.reconcile)

    def openstack_settings(self) -> OpenStackSettings:
        # The one value derived across blocks: the adapter's retries back off as the engine's.
        backoff = self.reconcile.retry_backoff.total_seconds()
        return as_values(OpenStackSettings, self.openstack, backoff=backoff)

    def server_settings(self) -> ServerSettings:
        return as_values(ServerSettings, self)

    def election_settings(self) -> ElectionSettings:
        # The lease's name and this replica's identity have defaults only known here, and
        # the endpoint the holder publishes is the port it serves CA on.
        block = self.leader_election
        return dataclasses.replace(
            as_values(ElectionSettings, block),
            lease_name=block.lease_name or lease_name_for(self.cluster_name),
            identity=block.identity or default_identity(),
            endpoint_port=int(self.listen.rpartition(":")[2]) if block.service_name else 0,
        )
