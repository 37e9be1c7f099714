"""What the service records: every CloudProvider call (counted by ``RpcGate``), and, read
at scrape time, readiness, certificate rotations refused and what osas is built of."""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# From an answer out of a cache (tens of microseconds) to CA's 5 s deadline.
_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


@dataclass(frozen=True, slots=True)
class MethodMetrics:
    """One method's series, made once: a call only increments them."""

    started: Counter
    handled: dict[grpc.StatusCode, Counter]
    latency: Histogram


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry, methods: Iterable[str]) -> None:
        started = Counter(
            "osas_grpc_server_started",
            "CloudProvider calls started, by method.",
            ["method"],
            registry=registry,
        )
        handled = Counter(
            "osas_grpc_server_handled",
            "CloudProvider calls finished, by method and gRPC status code.",
            ["method", "code"],
            registry=registry,
        )
        latency = Histogram(
            "osas_grpc_server_handling_seconds",
            "How long CloudProvider calls took to answer, by method.",
            ["method"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.methods = {
            method: MethodMetrics(
                started.labels(method),
                {code: handled.labels(method, code.name) for code in grpc.StatusCode},
                latency.labels(method),
            )
            for method in methods
        }


class ServiceCollector(Collector):
    """Readiness and refused certificate rotations, read when scraped."""

    def __init__(
        self, readiness: Callable[[], str | None], rejected_reloads: Callable[[], int]
    ) -> None:
        self._readiness = readiness
        self._rejected_reloads = rejected_reloads

    def collect(self) -> Iterator[Metric]:
        ready = GaugeMetricFamily(
            "osas_ready",
            "1 when /readyz answers 200: first sync done, inventory younger than "
            "reconcile.max_inventory_age, not shutting down.",
        )
        ready.add_metric([], 0 if self._readiness() else 1)
        yield ready
        yield CounterMetricFamily(
            "osas_tls_reloads_rejected",
            "Rotated certificate files refused (expired, not yet valid, key not matching, "
            "tls.server_names not covered); the previous set keeps serving.",
            value=self._rejected_reloads(),
        )


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def register_build_info(registry: CollectorRegistry, version: str) -> None:
    info = Info("osas_build", "What this osas is built of.", registry=registry)
    info.info(
        {
            "version": version,
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "openstacksdk": _version("openstacksdk"),
        }
    )
