"""Prices for the price expander, from the configured table, and Kubernetes quantities."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation

from osas.domain.errors import InvalidRequest, NotSupported
from osas.domain.servers import Flavor
from osas.domain.specs import NodeGroupSpec, Pricing

_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_GIB = Decimal(2) ** 30
_QUANTITY_MAX = Decimal(10) ** 24
_SECONDS_PER_HOUR = 3600.0


def parse_quantity(value: str) -> Decimal:
    """A Kubernetes resource quantity ("500m", "2Gi", "1e3") as a number."""
    match = _QUANTITY_RE.fullmatch(value.strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise InvalidRequest(f"not a Kubernetes quantity: {value[:40]!r}")
    try:
        number = Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
        # Exponents beyond any real resource overflow later arithmetic: refuse them here.
        float(number)
    except (ArithmeticError, InvalidOperation) as exc:
        raise InvalidRequest(f"not a usable Kubernetes quantity: {value[:40]!r}") from exc
    if not number.is_finite() or abs(number) > _QUANTITY_MAX:
        raise InvalidRequest(f"quantity out of range: {value[:40]!r}")
    return number


def _hours(start: float, end: float) -> float:
    if end < start:
        raise InvalidRequest("price period ends before it starts")
    return (end - start) / _SECONDS_PER_HOUR


def node_price(
    spec: NodeGroupSpec, flavor: Flavor | None, pricing: Pricing | None, start: float, end: float
) -> float:
    """Price of one node of ``spec`` over [start, end] (epoch seconds)."""
    hours = _hours(start, end)
    if spec.price_per_hour is not None:
        return spec.price_per_hour * hours
    if pricing is None or flavor is None:
        raise NotSupported(f"no price configured for node group {spec.group_id!r}")
    gpus = spec.gpu.count if spec.gpu else 0
    per_hour = (
        flavor.vcpus * pricing.cpu_per_hour
        + flavor.ram_mib / 1024 * pricing.memory_gib_per_hour
        + gpus * pricing.gpu_per_hour
    )
    return per_hour * hours


def effective_requests(
    containers: Sequence[Mapping[str, str]],
    init_containers: Sequence[Mapping[str, str]] = (),
    overhead: Mapping[str, str] | None = None,
) -> dict[str, Decimal]:
    """What the scheduler reserves for a pod: the containers' sum or the largest init
    container, whichever is more, per resource, plus the pod overhead."""
    total: dict[str, Decimal] = {}
    for requests in containers:
        for name, value in requests.items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(value)
    for requests in init_containers:
        for name, value in requests.items():
            total[name] = max(total.get(name, Decimal(0)), parse_quantity(value))
    for name, value in (overhead or {}).items():
        total[name] = total.get(name, Decimal(0)) + parse_quantity(value)
    return total


def pod_price(
    pricing: Pricing | None,
    requests: Mapping[str, Decimal],
    gpu_resource: str,
    start: float,
    end: float,
) -> float:
    """Price of what a pod requests over [start, end] (epoch seconds)."""
    if pricing is None:
        raise NotSupported("no pricing table configured")
    hours = _hours(start, end)
    zero = Decimal(0)
    per_hour = (
        float(requests.get("cpu", zero)) * pricing.cpu_per_hour
        + float(requests.get("memory", zero) / _GIB) * pricing.memory_gib_per_hour
        + float(requests.get(gpu_resource, zero)) * pricing.gpu_per_hour
    )
    return per_hour * hours
