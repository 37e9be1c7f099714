"""Configuration: a YAML file (``--config`` or ``OSAS_CONFIG``) overridden by ``OSAS_*``
environment variables (``__`` between nested keys), validated whole before anything starts."""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import os
import re
import types
import typing
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from osas.cloud.openstack_settings import OpenStackAuth, OpenStackSettings
from osas.domain.ids import NAME_MAX_LENGTH, NAME_PATTERN, ProviderIdFormat
from osas.domain.ledger import LedgerSettings
from osas.domain.limits import MAX_GROUP_SIZE
from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST
from osas.domain.specs import (
    ClusterSpec,
    GpuSpec,
    NodeGroupSpec,
    Pricing,
    TaintEffect,
)
from osas.engine.settings import EngineSettings
from osas.service.settings import ServerSettings, TlsFiles, TransportSettings

ENV_PREFIX = "OSAS_"
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")
_LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_DNS_NAME_RE = re.compile(rf"^(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*$")
_ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):(\d{1,5})$")
# Nova caps user data at 65535 bytes once base64-encoded, and metadata items at 255 bytes.
_USER_DATA_MAX = 65535
_METADATA_ITEM_MAX = 255
_PORT_MAX = 65535
_RESERVED_METADATA = frozenset({META_CLUSTER, META_GROUP, META_REQUEST})
_Value = TypeVar("_Value")


# What a reload applies without a restart: the node groups and what CA reads of them. The rest
# (listen addresses, TLS paths — their files rotate anyway —, OpenStack, intervals, queue,
# cluster name, provider id form) would be unsafe or meaningless to change under a running
# process.
RELOADABLE = frozenset({"node_groups", "gpu_label", "gpu_types", "pricing"})


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, the key and the reason."""


def _parse_duration(value: Any) -> Any:
    """Accept 90, "90", "90s", "5m", "1h30m" as well as what pydantic takes for a timedelta."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h30m)")  # noqa: TRY004
    try:
        if isinstance(value, str):
            text = value.strip()
            if text.replace(".", "", 1).isdigit():
                return timedelta(seconds=float(text))
            match = _DURATION_RE.fullmatch(text)
            if match and text:
                hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
                return timedelta(hours=hours, minutes=minutes, seconds=seconds)
            raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h30m)")
        if isinstance(value, int | float):
            return timedelta(seconds=value)
    except OverflowError as exc:
        raise ValueError(f"duration out of range: {value!r}") from exc
    return value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be positive")
    return value


Duration = Annotated[timedelta, BeforeValidator(_parse_duration)]
PositiveDuration = Annotated[timedelta, BeforeValidator(_parse_duration), AfterValidator(_positive)]
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)]


def _default(cls: type[Any], name: str) -> Any:
    """The default a value class gives ``name``: each default is written once, where the value
    is defined (the engine, cloud, server and domain settings), and the file schema reads it."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            break
    raise LookupError(f"{cls.__name__}.{name} has no default")


def _default_duration(cls: type[Any], name: str) -> timedelta:
    """A default the value class holds in seconds, as the file's duration."""
    return timedelta(seconds=_default(cls, name))


def _as_value(value: Any, hint: Any) -> Any:
    """A validated configuration value as the plain value ``hint`` asks for: a model as the
    value class of the same field names, lists as tuples, paths as text, durations as
    seconds where the value class counts seconds."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
        origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        # A block the file validates straight into its value class (openstack.auth) is one.
        return value if isinstance(value, hint) else _as_dataclass(hint, value)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_as_value(element, item) for element in value)
    if origin in (Mapping, dict):
        item = typing.get_args(hint)[1]
        return {key: _as_value(element, item) for key, element in value.items()}
    return _as_scalar(value, hint)


def _as_scalar(value: Any, hint: Any) -> Any:
    if hint is str and isinstance(value, Path):
        return str(value)
    if hint is float and isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _as_dataclass(cls: type[_Value], model: BaseModel) -> _Value:
    """Build ``cls`` from the model's fields of the same names, so that none is copied by hand
    or forgotten; a field the file does not offer keeps the class's default (a test lists
    which those are)."""
    hints = typing.get_type_hints(cls)
    offered = type(model).model_fields
    return cls(
        **{
            item.name: _as_value(getattr(model, item.name), hints[item.name])
            for item in dataclasses.fields(cls)  # type: ignore[arg-type]
            if item.name in offered
        }
    )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsConfig(_Strict):
    cert_file: Path
    key_file: Path
    client_ca_file: Path
    # Client identities allowed to call: "dns:NAME", "uri:URI" (SANs) or "cn:NAME".
    allowed_clients: list[Annotated[str, Field(pattern=r"^(dns|uri|cn):\S+$")]] = []
    # The names CA dials (the host of its address): the server certificate must cover each,
    # at start, in check-config and on every rotation.
    server_names: list[str] = []

    @field_validator("server_names")
    @classmethod
    def _names_or_addresses(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _is_ip(name) and not _DNS_NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is neither a DNS name nor an IP address")
        return names


class TransportConfig(_Strict):
    max_concurrent_rpcs: int = Field(
        _default(TransportSettings, "max_concurrent_rpcs"), ge=1, le=10_000
    )
    max_connection_age: PositiveDuration = _default_duration(
        TransportSettings, "max_connection_age"
    )
    max_connection_age_grace: Duration = _default_duration(
        TransportSettings, "max_connection_age_grace"
    )
    keepalive_time: PositiveDuration = _default_duration(TransportSettings, "keepalive_time")
    keepalive_timeout: PositiveDuration = _default_duration(TransportSettings, "keepalive_timeout")

    def settings(self) -> TransportSettings:
        return _as_dataclass(TransportSettings, self)


def _seconds(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value


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
    auth: OpenStackAuth | None = None
    region_name: str | None = None
    interface: Literal["public", "internal", "admin"] | None = None
    verify: bool = True
    cacert: Path | None = None
    api_timeout: PositiveDuration = _default_duration(OpenStackSettings, "api_timeout")
    concurrency: int = Field(_default(OpenStackSettings, "concurrency"), ge=1, le=32)
    rate_limit: float = Field(
        _default(OpenStackSettings, "rate_limit"), gt=0, le=1000, description="calls per second"
    )
    attempts: int = Field(_default(OpenStackSettings, "attempts"), ge=1, le=10)

    def settings(self, backoff: timedelta) -> OpenStackSettings:
        values = _as_dataclass(OpenStackSettings, self)
        return dataclasses.replace(values, backoff=backoff.total_seconds())

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.cloud and self.auth:
            raise ValueError("give either 'cloud' (clouds.yaml) or 'auth', not both")
        return self


class ReconcileConfig(_Strict):
    interval: PositiveDuration = _default_duration(EngineSettings, "reconcile_interval")
    full_resync_interval: Duration = _default_duration(EngineSettings, "full_resync_interval")
    max_inventory_age: Duration = _default_duration(EngineSettings, "max_inventory_age")
    retry_backoff: PositiveDuration = _default_duration(EngineSettings, "retry_backoff")
    # A delete that failed for good is sent again when the server is still listed this long after.
    delete_retry_after: PositiveDuration = _default_duration(LedgerSettings, "delete_retry_after")
    # A create whose outcome is unknown (timeout, 5xx, lost answer) is never sent again; if no
    # server of it is listed within this window it is reported failed. Longer than
    # openstack.api_timeout plus the longest Nova may take to store a server it was sent.
    create_doubt_window: PositiveDuration = _default_duration(LedgerSettings, "doubt_window")
    # Servers in BUILD, or being deleted, longer than these are reported (logs, metrics,
    # /status); osas never deletes them on its own.
    stuck_build_after: PositiveDuration = _default_duration(EngineSettings, "stuck_build_after")
    stuck_delete_after: PositiveDuration = _default_duration(EngineSettings, "stuck_delete_after")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.full_resync_interval < self.interval:
            raise ValueError("full_resync_interval must not be shorter than interval")
        if self.max_inventory_age <= self.interval:
            raise ValueError("max_inventory_age must be longer than interval")
        return self


class QueueConfig(_Strict):
    capacity: int = Field(_default(EngineSettings, "queue_capacity"), ge=1, le=100_000)
    workers: int = Field(_default(EngineSettings, "workers"), ge=1, le=64)


class TaintConfig(_Strict):
    key: str = Field(pattern=_LABEL_KEY_RE.pattern)
    value: str = Field("", pattern=_LABEL_VALUE_RE.pattern)
    effect: TaintEffect


class GpuConfig(_Strict):
    count: int = Field(ge=1, le=64)
    type: str = Field(min_length=1, pattern=_LABEL_VALUE_RE.pattern)
    resource: str = Field(_default(GpuSpec, "resource"), pattern=_LABEL_KEY_RE.pattern)


class BootVolumeConfig(_Strict):
    size_gib: int = Field(alias="size", ge=1, le=65536, description="GiB")
    volume_type: str | None = Field(None, alias="type")


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
    user_data_vars: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Path] = {}
    user_data_format: Literal["text", "json"] = _default(NodeGroupSpec, "user_data_format")
    boot_volume: BootVolumeConfig | None = None
    metadata: dict[str, str] = {}
    labels: dict[str, str] = {}
    taints: list[TaintConfig] = []
    gpu: GpuConfig | None = None
    options: OptionsConfig = OptionsConfig()
    price_per_hour: float | None = Field(None, ge=0)
    max_pods: int = Field(_default(NodeGroupSpec, "max_pods"), ge=1, le=10_000)
    architecture: Literal["amd64", "arm64", "ppc64le", "s390x"] = _default(
        NodeGroupSpec, "architecture"
    )

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
        return self

    def _check_user_data_sources(self) -> None:
        if self.user_data is not None and self.user_data_file is not None:
            raise ValueError("give either user_data or user_data_file, not both")
        if self.user_data_vars and self.user_data is None and self.user_data_file is None:
            raise ValueError("user_data_vars needs a template: user_data or user_data_file")
        builtin = sorted(set(self.user_data_vars) & {"server_name", "node_group", "cluster_name"})
        if builtin:
            raise ValueError(f"user_data_vars {builtin} are filled in by osas itself")
        if self.user_data_format == "json" and self.user_data is not None:
            try:
                json.loads(self.user_data)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"user_data is not JSON (user_data_format: json): {exc.msg} at line "
                    f"{exc.lineno}, column {exc.colno}"
                ) from None

    def spec(self) -> NodeGroupSpec:
        return _as_dataclass(NodeGroupSpec, self)


class PricingConfig(_Strict):
    cpu_per_hour: float = Field(ge=0)
    memory_gib_per_hour: float = Field(ge=0)
    gpu_per_hour: float = Field(_default(Pricing, "gpu_per_hour"), ge=0)


class OsasConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    cluster_name: Name
    listen: str = Field("0.0.0.0:8086", pattern=_ADDRESS_RE.pattern)
    health_listen: str = Field("0.0.0.0:8087", pattern=_ADDRESS_RE.pattern)
    # Plain HTTP: /metrics, /healthz, /readyz, /status. Off unless set.
    metrics_listen: str | None = Field(None, pattern=_ADDRESS_RE.pattern)
    tls: TlsConfig | None = None
    insecure: bool = False
    # Plaintext on an address other hosts can reach needs this second, explicit choice.
    insecure_non_loopback: bool = False
    transport: TransportConfig = TransportConfig()
    cloud_backend: Literal["openstack", "fake"] = "openstack"
    openstack: OpenStackConfig = OpenStackConfig()
    provider_id_region: str = Field("", pattern=r"^[^/\s]*$")
    gpu_label: str = Field(_default(ClusterSpec, "gpu_label"), pattern=_LABEL_KEY_RE.pattern)
    gpu_types: list[str] = []
    pricing: PricingConfig | None = None
    reconcile: ReconcileConfig = ReconcileConfig()
    queue: QueueConfig = QueueConfig()
    shutdown_grace: Duration = _default_duration(ServerSettings, "shutdown_grace")
    node_groups: list[NodeGroupConfig] = Field(min_length=1)

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
        seen: set[str] = set()
        for group in self.node_groups:
            if group.group_id in seen:
                raise ValueError(f"duplicate node group id {group.group_id!r}")
            seen.add(group.group_id)
        return self

    def restart_only_changes(self, other: OsasConfig) -> list[str]:
        """The top-level keys ``other`` changes that a reload cannot apply (only
        ``RELOADABLE`` keys can): listen addresses, TLS paths, OpenStack, intervals..."""
        names = [name for name in type(self).model_fields if name not in RELOADABLE]
        return [name for name in names if getattr(self, name) != getattr(other, name)]

    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec(
            cluster_name=self.cluster_name,
            node_groups=tuple(group.spec() for group in self.node_groups),
            provider_ids=ProviderIdFormat(self.provider_id_region),
            gpu_label=self.gpu_label,
            gpu_types=tuple(self.gpu_types),
            pricing=_as_dataclass(Pricing, self.pricing) if self.pricing else None,
        )

    def engine_settings(self) -> EngineSettings:
        return EngineSettings(
            queue_capacity=self.queue.capacity,
            workers=self.queue.workers,
            reconcile_interval=self.reconcile.interval.total_seconds(),
            full_resync_interval=self.reconcile.full_resync_interval.total_seconds(),
            max_inventory_age=self.reconcile.max_inventory_age.total_seconds(),
            retry_backoff=self.reconcile.retry_backoff.total_seconds(),
            stuck_build_after=self.reconcile.stuck_build_after.total_seconds(),
            stuck_delete_after=self.reconcile.stuck_delete_after.total_seconds(),
        )

    def ledger_settings(self) -> LedgerSettings:
        return LedgerSettings(
            doubt_window=self.reconcile.create_doubt_window.total_seconds(),
            delete_retry_after=self.reconcile.delete_retry_after.total_seconds(),
        )

    def openstack_settings(self) -> OpenStackSettings:
        return self.openstack.settings(self.reconcile.retry_backoff)

    def summary(self) -> dict[str, Any]:
        """The effective settings an operator needs to tell what runs, for one log event at
        start. Built key by key, never dumped, so that no secret or user data can slip in."""
        tls = self.tls
        openstack = self.openstack
        auth = openstack.auth
        if auth is not None:
            cloud: dict[str, Any] = {
                "auth_type": (
                    "v3applicationcredential" if auth.application_credential_id else "password"
                ),
                "auth_url": auth.auth_url,
                "username": auth.username,
                "project": auth.project_name or auth.project_id,
                "application_credential_id": auth.application_credential_id,
            }
        else:
            cloud = {"cloud": openstack.cloud or "(OS_CLOUD or the OS_* variables)"}
        cloud.update(
            region_name=openstack.region_name,
            interface=openstack.interface,
            verify=openstack.verify,
            api_timeout=openstack.api_timeout.total_seconds(),
            concurrency=openstack.concurrency,
            rate_limit=openstack.rate_limit,
            attempts=openstack.attempts,
        )
        reconcile = self.reconcile
        return {
            "cluster_name": self.cluster_name,
            "listen": self.listen,
            "health_listen": self.health_listen,
            "metrics_listen": self.metrics_listen,
            "tls": (
                {
                    "cert_file": str(tls.cert_file),
                    "key_file": str(tls.key_file),
                    "client_ca_file": str(tls.client_ca_file),
                    "server_names": list(tls.server_names),
                    "allowed_clients": list(tls.allowed_clients),
                }
                if tls
                else "off (insecure: true)"
            ),
            "cloud_backend": self.cloud_backend,
            "openstack": {key: value for key, value in cloud.items() if value is not None},
            "reconcile": {
                name: _seconds(getattr(reconcile, name)) for name in type(reconcile).model_fields
            },
            "queue": {"capacity": self.queue.capacity, "workers": self.queue.workers},
            "shutdown_grace": self.shutdown_grace.total_seconds(),
            "node_groups": [
                {
                    "id": group.group_id,
                    "min_size": group.min_size,
                    "max_size": group.max_size,
                    "flavor": group.flavor,
                    "image": group.image,
                }
                for group in self.node_groups
            ],
        }

    def server_settings(self) -> ServerSettings:
        tls = self.tls
        return ServerSettings(
            listen=self.listen,
            health_listen=self.health_listen,
            metrics_listen=self.metrics_listen,
            tls=(
                TlsFiles(
                    tls.cert_file,
                    tls.key_file,
                    tls.client_ca_file,
                    allowed_clients=tuple(tls.allowed_clients),
                    server_names=tuple(tls.server_names),
                )
                if tls
                else None
            ),
            shutdown_grace=self.shutdown_grace.total_seconds(),
            transport=self.transport.settings(),
        )


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # noqa: ARG002 - signature set by pydantic-settings
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._data


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    odd = [key for key in data if not isinstance(key, str)]
    if odd:
        # YAML reads `on:` as True and `1:` as 1; quote such keys to mean the words.
        raise ConfigError(f"{path}: {odd[0]!r}: keys must be strings (quote them)")
    return data


# What kind of mistake each YAML error class means, in words that quote nothing of the file.
_YAML_PROBLEMS: tuple[tuple[type[yaml.YAMLError], str], ...] = (
    (yaml.scanner.ScannerError, "a token cannot be read (an unclosed quote, a tab, a stray ':')"),
    (yaml.parser.ParserError, "the structure does not parse (indentation, a missing ':' or '-')"),
    (yaml.composer.ComposerError, "an alias or document does not fit"),
    (yaml.constructor.ConstructorError, "a value cannot be built (an unknown tag)"),
    (yaml.reader.ReaderError, "a character YAML does not allow"),
)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where the YAML breaks and what kind of mistake it is. Never yaml's own message: it
    quotes the offending line, which may be the one holding a password."""
    kind = next((text for cls, text in _YAML_PROBLEMS if isinstance(exc, cls)), "")
    problem = getattr(exc, "problem_mark", None)
    context = getattr(exc, "context_mark", None)
    where = f" at {_position(problem)}" if problem else ""
    if context and (not problem or context.line != problem.line):
        # An unclosed quote is noticed where the file ends; where it opened is the useful part.
        where += f" (in what starts at {_position(context)})"
    return f"not valid YAML{where}" + (f": {kind}" if kind else "")


def _position(mark: yaml.Mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _where(loc: tuple[int | str, ...], data: dict[str, Any]) -> str:
    """``node_groups[1](gpu).min_size`` rather than ``node_groups.1.min_size``."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            node = node[item] if isinstance(node, list) and item < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                label += f"({node['id']})"
            parts.append(label)
        else:
            parts.append(f".{item}" if parts else item)
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"


def load_config(path: Path) -> OsasConfig:
    """Read and validate the configuration. Problems with single keys are all reported at once
    in ConfigError; checks across keys (duplicate ids, tls vs insecure) follow once the keys
    themselves are valid."""
    data = _read_yaml(path)

    class _FromFile(OsasConfig):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,  # noqa: ARG003
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003
            file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            # Environment first: OSAS_* variables override the file.
            return (env_settings, _YamlSource(settings_cls, data))

    try:
        return _FromFile()
    except SettingsError as exc:
        raise ConfigError(f"{path}: an {ENV_PREFIX}* variable cannot be parsed: {exc}") from exc
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            reason = err["msg"].removeprefix("Value error, ")
            problems.append(f"{path}: {_where(loc, data)}: {reason}{_env_hint(loc)}")
        raise ConfigError("\n".join(problems)) from exc


def _env_hint(loc: tuple[int | str, ...]) -> str:
    """Say so when the offending key was set from the environment, not the file."""
    if not loc or not isinstance(loc[0], str):
        return ""
    prefix = f"{ENV_PREFIX}{loc[0].upper()}"
    names = sorted(name for name in os.environ if name == prefix or name.startswith(prefix + "__"))
    return f" (from {', '.join(names)})" if names else ""
