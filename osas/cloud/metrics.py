"""What the OpenStack adapter records: every request, by service, operation and outcome."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from osas.cloud.errors import (
    CloudConfigurationError,
    CloudError,
    CloudUnavailable,
    CreateInDoubt,
    CreateNotSent,
    CredentialsRefused,
    QuotaExceeded,
    RateLimited,
    RequestRejected,
)

# Most specific first: CreateInDoubt and CreateNotSent are also CloudUnavailable, and
# RateLimited is a CreateNotSent.
_STATUS_OF_ERROR: tuple[tuple[type[CloudError], str], ...] = (
    (RateLimited, "rate_limited"),
    (CreateInDoubt, "in_doubt"),
    (CreateNotSent, "not_sent"),
    (CloudUnavailable, "unavailable"),
    (QuotaExceeded, "quota"),
    (RequestRejected, "rejected"),
    (CredentialsRefused, "credentials_refused"),
    (CloudConfigurationError, "configuration"),
)
STATUSES = ("ok", *(status for _, status in _STATUS_OF_ERROR), "error")

# From a cached look-up (milliseconds) to a create Nova takes its time over.
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def status_of(error: CloudError | None) -> str:
    """The ``status`` label of a request that ended with ``error`` (None: it succeeded)."""
    if error is None:
        return "ok"
    return next((status for cls, status in _STATUS_OF_ERROR if isinstance(error, cls)), "error")


class CloudMetrics:
    """OpenStack requests as the adapters made them (each attempt of a retried call counts),
    by the cloud and region each adapter reaches: one set of families per registry, a view of
    them per place (``at``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "osas_openstack_requests",
            "OpenStack API calls made, by cloud, region, service, operation and outcome (ok, "
            "or the error class: rate_limited, unavailable, quota, rejected, "
            "credentials_refused, configuration, in_doubt, not_sent, error).",
            ["cloud", "region", "service", "operation", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "osas_openstack_request_duration_seconds",
            "How long OpenStack API calls took, waiting for a thread included, by cloud, "
            "region, service and operation.",
            ["cloud", "region", "service", "operation"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.pace = Gauge(
            "osas_openstack_pace_per_second",
            "Requests per second osas allows itself now, per cloud and region: "
            "openstack.rate_limit, lowered while the cloud answers 429 (or 503 with "
            "Retry-After) and raised again once it stops.",
            ["cloud", "region"],
            registry=registry,
        )

    def at(self, cloud: str, region: str) -> PlaceCloudMetrics:
        """What one place's adapter records, labelled with its cloud and region."""
        return PlaceCloudMetrics(self, cloud, region)


class PlaceCloudMetrics:
    """``CloudMetrics`` as one place's adapter records into them."""

    __slots__ = ("_families", "_place")

    def __init__(self, families: CloudMetrics, cloud: str, region: str) -> None:
        self._families = families
        self._place = (cloud, region)

    def observe(
        self, service: str, operation: str, error: CloudError | None, seconds: float
    ) -> None:
        families, place = self._families, self._place
        families.requests.labels(*place, service, operation, status_of(error)).inc()
        families.latency.labels(*place, service, operation).observe(seconds)

    def set_pace(self, rate: float) -> None:
        self._families.pace.labels(*self._place).set(rate)
