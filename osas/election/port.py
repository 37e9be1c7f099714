"""One writer per cluster: the interface the rest of osas uses to know whether it may write.

In Kubernetes the writer is the replica holding a ``coordination.k8s.io/v1`` Lease (the
adapter is ``osas.election.lease``); outside it, or with election off, ``NoElection`` says
this process is the writer, as it always was. This module imports no Kubernetes client: the
engine depends on it alone.

Fencing is by time. A holder may write only while ``time.monotonic()`` is below the start of
its last successful acquire or renew request plus ``renew_deadline``; a candidate takes the
Lease only once the record has not changed for ``lease_duration`` by its own clock, counted
from when it saw the change, which is after that request started. With ``renew_deadline <
lease_duration`` the old holder has stopped writing before anyone else may start, whatever
the two hosts' wall clocks say (only their clock rates are assumed to agree).

The Cluster Autoscaler reaches the holder alone: its Service has no selector, and the holder
publishes itself as the Service's one endpoint (an EndpointSlice), so standbys stay Ready for
rollouts and disruption budgets without taking CA's calls.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import anyio

NO_ANNOTATIONS: Mapping[str, str] = MappingProxyType({})
# What the holder's writes carry besides the Lease itself: a revision (what the writer
# promised, see ``Leadership.keep_written``) and the annotations that say it.
AnnotationSource = Callable[[], tuple[int, Mapping[str, str]]]
# What the API server accepts: a Service's name (RFC 1035 label), a namespace and a port name
# (RFC 1123 labels). Checked here so that a typo fails at start, not at every write.
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_MAX_PORT = 65535


class PromisesNotKept(Exception):
    """The promise record could not be written in time (or this process no longer holds the
    Lease): the call that would have promised something is refused with nothing promised."""


class JoinTokenError(Exception):
    """No join token could be minted. ``refused``: the API server refused it (RBAC, an
    admission policy, an invalid object), and asking again changes nothing until an operator
    acts; otherwise (unreachable, timed out, a server error) a later try may succeed."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


class JoinTokens(Protocol):
    """Join credentials minted per server, kept by the cluster (``osas.election.tokens`` for
    kubeadm's bootstrap tokens)."""

    async def mint(self, *, server_name: str, group_id: str, ttl: float) -> str:
        """A new token for ``server_name``'s join, stored in the cluster and valid for ``ttl``
        seconds by the API server's clock; raises JoinTokenError."""
        ...

    async def rehearse(self, *, group_id: str, ttl: float) -> str:
        """A mint judged in full by the cluster and stored nowhere (check-config's dry run):
        the name the Secret would have; raises JoinTokenError as ``mint`` does."""
        ...

    async def aclose(self) -> None:
        """Close the connection; idempotent."""
        ...


class ElectionSetupError(Exception):
    """The election cannot start: no usable Kubernetes configuration, or bad settings."""


@dataclass(frozen=True, slots=True)
class ElectionSettings:
    enabled: bool = False
    lease_name: str = ""  # "" -> lease_name_for(cluster_name), decided by the caller
    lease_namespace: str = "kube-system"
    identity: str = ""  # "" -> default_identity()
    lease_duration: float = 15.0  # seconds; written as leaseDurationSeconds, rounded up
    renew_deadline: float = 10.0  # a holder that has not renewed for this long stops writing
    retry_period: float = 2.0  # between attempts
    kubeconfig: Path | None = None  # None -> the pod's service account
    # The holder publishes itself as the one endpoint of the Service CA dials (see
    # resolve_endpoint for the environment's defaults).
    service_name: str = ""  # "" publishes nothing
    service_namespace: str = ""  # "" -> $POD_NAMESPACE
    endpoint_port: int = 0  # the provider port CA is served on; required with a service name
    endpoint_port_name: str = "grpc"  # the Service's port name, which kube-proxy matches
    pod_ip: str = ""  # "" -> $POD_IP
    node_name: str = ""  # "" -> $NODE_NAME; optional

    def __post_init__(self) -> None:
        # The order is what fencing rests on: a holder gives up (renew_deadline) before a
        # candidate may take over (lease_duration), and it gets more than one try before that.
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ElectionSetupError(
                "election timings must satisfy 0 < retry_period < renew_deadline < "
                f"lease_duration, not {self.retry_period} < {self.renew_deadline} < "
                f"{self.lease_duration}"
            )
        self._check_endpoint()

    def _check_endpoint(self) -> None:
        checks = [
            ("service_name", self.service_name, _DNS_1035_LABEL, "an RFC 1035 label"),
            ("service_namespace", self.service_namespace, _DNS_1123_LABEL, "an RFC 1123 label"),
            ("endpoint_port_name", self.endpoint_port_name, _DNS_1123_LABEL, "an RFC 1123 label"),
        ]
        for name, value, pattern, what in checks:
            if value and not pattern.fullmatch(value):
                raise ElectionSetupError(f"election {name} {value!r} is not {what}")
        if not 0 <= self.endpoint_port <= _MAX_PORT:
            raise ElectionSetupError(f"election endpoint_port {self.endpoint_port} is no port")
        if self.pod_ip:
            try:
                ipaddress.ip_address(self.pod_ip)
            except ValueError as exc:
                raise ElectionSetupError(
                    f"election pod_ip {self.pod_ip!r} is not an IP address"
                ) from exc


def lease_name_for(cluster_name: str) -> str:
    """The Lease a cluster's replicas compete for when none is configured."""
    return f"osas-{cluster_name}"


def default_identity() -> str:
    """Who this process is on the Lease: the pod's name where the chart passes it (unique,
    and kept across a restart of the container, which then takes its own Lease back at
    once), else host and process id."""
    pod = os.environ.get("POD_NAME", "").strip()
    if pod:
        return pod
    return f"{socket.gethostname()}_{os.getpid()}"


def resolve_endpoint(settings: ElectionSettings) -> ElectionSettings:
    """``settings`` with the pod's environment filled in where left empty, as the chart passes
    it through the downward API: the service namespace ($POD_NAMESPACE), the pod's IP
    ($POD_IP) and node ($NODE_NAME). Call it once ``endpoint_port`` is set; ``LeaseElection``
    calls it too (it changes nothing the second time). Without a service name nothing is
    published and nothing is read. Raises ElectionSetupError for a service without a port."""
    if not settings.service_name:
        return settings
    if not settings.endpoint_port:
        raise ElectionSetupError(
            f"service {settings.service_name!r} needs the provider port its endpoint serves "
            "CA on (endpoint_port, from the listen address)"
        )
    return dataclasses.replace(
        settings,
        service_namespace=settings.service_namespace or _environ("POD_NAMESPACE"),
        pod_ip=settings.pod_ip or _environ("POD_IP"),
        node_name=settings.node_name or _environ("NODE_NAME"),
    )


def _environ(name: str) -> str:
    return os.environ.get(name, "").strip()


@dataclass(frozen=True, slots=True)
class PreviousHolder:
    """What the Lease said when this process took it.

    ``identity`` is None when no Lease existed (the first holder ever). A released Lease no
    longer names its holder: ``identity`` is then the holder this process last saw on it, or
    "" when it saw none.
    """

    identity: str | None
    released: bool  # the holder gave it up cleanly, rather than letting it expire
    annotations: Mapping[str, str]


class Leadership(Protocol):
    """Whether this process is the cluster's one writer, and for how long it may stay so."""

    @property
    def enabled(self) -> bool: ...

    def may_write(self) -> bool:
        """True only while this process holds the Lease and its last successful acquire or
        renew request started less than ``renew_deadline`` ago. Ask before every write."""
        ...

    @property
    def elected(self) -> anyio.Event:
        """Set once this process holds the Lease."""
        ...

    @property
    def lost(self) -> anyio.Event:
        """Set when a holder failed to renew within ``renew_deadline`` or found another
        holder: it must stop writing, and stop."""
        ...

    @property
    def previous(self) -> PreviousHolder | None:
        """Set when elected."""
        ...

    def status(self) -> dict[str, object]:
        """For /status: enabled, identity, lease ("namespace/name"), holder (last seen),
        leading, since (seconds as holder, or None), transitions, service ("namespace/name"
        of CA's Service, or None when nothing is published) and endpoint ("ip:port" while
        this holder is published as its endpoint, else None)."""
        ...

    async def run_election(self) -> None:
        """The election loop, run as a background task. Returns once ``lost`` is set or the
        Lease was released; raises nothing but cancellation (API errors are logged and
        retried)."""
        ...

    async def release(self, annotations: Mapping[str, str] = NO_ANNOTATIONS) -> None:
        """Clean shutdown: stop writing and, if holding, withdraw this process from CA's
        Service (its endpoint emptied), then give the Lease up (holder emptied,
        ``annotations`` written on it) so that a standby takes over at once. Bounded by a
        short timeout, best effort, never raises."""
        ...

    def set_annotations(self, annotations: Mapping[str, str]) -> None:
        """Annotations written on the Lease with the next renew: a little state the holder
        publishes for its successor. Keys are merged into the Lease's; each stays until
        written again."""
        ...

    def carry(self, source: AnnotationSource) -> None:
        """From now on every write of the holder's (renew, release) carries ``source()``'s
        annotations. Until this is called, the Lease's own are left as they are: a new holder
        carries its predecessor's record on until it has taken it in hand."""
        ...

    async def keep_written(self, revision: int, budget: float) -> bool:
        """True once a write of the holder's carrying the source at ``revision`` or later has
        been acknowledged by the API server (one write serves every caller waiting for it);
        False when this process is not the holder, or no such write landed within
        ``budget`` seconds. With election off, True at once: nothing is kept outside the process."""
        ...


class NoElection:
    """Election off: this process is the writer from the start and never stops being so."""

    def __init__(self) -> None:
        self._elected = anyio.Event()
        self._elected.set()
        self._lost = anyio.Event()

    @property
    def enabled(self) -> bool:
        return False

    def may_write(self) -> bool:
        return True

    @property
    def elected(self) -> anyio.Event:
        return self._elected

    @property
    def lost(self) -> anyio.Event:
        return self._lost

    @property
    def previous(self) -> PreviousHolder | None:
        return None

    def status(self) -> dict[str, object]:
        return {
            "enabled": False,
            "identity": None,
            "lease": None,
            "holder": None,
            "leading": True,
            "since": None,
            "transitions": None,
            "service": None,
            "endpoint": None,
        }

    async def run_election(self) -> None:
        # Never lost, so never returns: a caller that treats a returning loop as a failure
        # is right to.
        await anyio.sleep_forever()

    async def release(self, annotations: Mapping[str, str] = NO_ANNOTATIONS) -> None:
        del annotations  # no Lease to write them on

    def set_annotations(self, annotations: Mapping[str, str]) -> None:
        del annotations

    def carry(self, source: AnnotationSource) -> None:
        del source

    async def keep_written(self, revision: int, budget: float) -> bool:
        del revision, budget
        return True
