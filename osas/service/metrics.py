"""What the service records: every CloudProvider call (counted by ``RpcGate``), and, read
at scrape time, readiness, certificate rotations refused and what osas is built of."""

from __future__ import annotations

import bisect
import importlib.metadata
import itertools
import platform
from collections.abc import Callable, Iterable, Iterator

import grpc
from prometheus_client import CollectorRegistry, Info
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from osas.service.tls import ClientIdentity

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


_OK, _UNIMPLEMENTED = grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED


class MethodMetrics:
    """One method's series as plain numbers, read only when scraped (``RpcMetrics.collect``).
    A call adds to them on the event loop's thread, in some 0.3 µs: prometheus_client's
    locked Counter and Histogram cost 2 µs a call, and CA calls about five times per node per
    loop."""

    __slots__ = ("buckets", "handled", "ok", "seconds", "started", "unimplemented")

    def __init__(self) -> None:
        self.started = 0
        # The two answers of nearly every call counted apart: a status code is an Enum, whose
        # hash, for a dictionary, is a call of Python code.
        self.ok = 0
        self.unimplemented = 0
        self.handled = dict.fromkeys(grpc.StatusCode, 0)  # every other code
        self.buckets = [0] * (len(_BUCKETS) + 1)  # the last one is +Inf's alone
        self.seconds = 0.0

    def finished(self, code: grpc.StatusCode, seconds: float) -> None:
        if code is _OK:
            self.ok += 1
        elif code is _UNIMPLEMENTED:
            self.unimplemented += 1
        else:
            self.handled[code] += 1
        # Prometheus's buckets are inclusive: the first bound at or above the value.
        self.buckets[bisect.bisect_left(_BUCKETS, seconds)] += 1
        self.seconds += seconds

    def counts(self) -> dict[grpc.StatusCode, int]:
        """Calls finished, by status code."""
        counts = dict(self.handled)
        counts[_OK] += self.ok
        counts[_UNIMPLEMENTED] += self.unimplemented
        return counts


class RpcMetrics(Collector):
    """Every CloudProvider method's calls: started, handled by status code, and how long they
    took, under the names and labels of prometheus_client's Counter and Histogram."""

    def __init__(self, registry: CollectorRegistry, methods: Iterable[str]) -> None:
        self.methods = {method: MethodMetrics() for method in methods}
        # An allowed client's name -> when the certificate it last presented anew expires.
        self.client_certificates: dict[str, float] = {}
        registry.register(self)

    def client_certificate_seen(self, identity: ClientIdentity) -> None:
        """A client presented a certificate not seen before (``ClientAllowList``)."""
        names = identity.names()
        if names and identity.not_after is not None:
            self.client_certificates[names[0]] = identity.not_after.timestamp()

    def collect(self) -> Iterator[Metric]:
        started = CounterMetricFamily(
            "osas_grpc_server_started",
            "CloudProvider calls started, by method.",
            labels=["method"],
        )
        handled = CounterMetricFamily(
            "osas_grpc_server_handled",
            "CloudProvider calls finished, by method and gRPC status code.",
            labels=["method", "code"],
        )
        latency = HistogramMetricFamily(
            "osas_grpc_server_handling_seconds",
            "How long CloudProvider calls took to answer, by method.",
            labels=["method"],
        )
        expiry = GaugeMetricFamily(
            "osas_client_certificate_expiry_timestamp_seconds",
            "When the certificate an allowed client (the Cluster Autoscaler) last presented "
            "anew expires, by its first name (tls.allowed_clients set).",
            labels=["client"],
        )
        for client, not_after in self.client_certificates.items():
            expiry.add_metric([client], not_after)
        bounds = [*(str(bound) for bound in _BUCKETS), "+Inf"]  # as prometheus_client writes them
        for method, series in self.methods.items():
            started.add_metric([method], series.started)
            for code, count in series.counts().items():
                handled.add_metric([method, code.name], count)
            cumulative = list(itertools.accumulate(series.buckets))
            latency.add_metric([method], list(zip(bounds, cumulative, strict=True)), series.seconds)
        yield started
        yield handled
        yield latency
        yield expiry


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
