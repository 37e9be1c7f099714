"""``LeaseElection``: ``Leadership`` on a ``coordination.k8s.io/v1`` Lease, by client-go's rules.

Every ``retry_period`` the loop makes one attempt. A holder renews first with the Lease its last
write returned (client-go's fast path: one request); a Conflict means someone wrote since, and
the attempt reads the Lease and decides again. Otherwise the attempt reads the Lease: missing,
it is created (AlreadyExists: another candidate won); held by this identity, it is renewed;
released (holder emptied), it is taken at once; held by another, it is taken only once its
record (holder, renewTime, resourceVersion) has not changed for ``leaseDurationSeconds`` by
this process's monotonic clock, counted from when it saw the change: wall clocks are never
compared, so a skewed host cannot steal the Lease. Every write carries the resourceVersion it
read; the API server refuses a stale one (409) and nothing is overwritten blindly.

A holder may write while the monotonic clock is below the start of its last successful acquire
or renew request plus ``renew_deadline`` (``may_write``), whatever the loop is doing: a request
that hangs does not extend it. Every request is cut at a third of the deadline and every
attempt at the deadline itself, after which the holder sets ``lost`` and the loop returns.

With a service configured, the holder also publishes itself as the one endpoint of CA's
Service (which has no selector), in a ``discovery.k8s.io/v1`` EndpointSlice named
``<service>-leader``, the way Patroni keeps its Endpoints: written by a task beside the loop
as soon as the Lease is taken (a slow or refused write never delays a renew), checked again
every ``lease_duration`` and repaired if it names anyone else, emptied by ``release`` before
the Lease is given up. Its writes are fenced like the holder's own (``may_write``), so a
holder that lost the Lease writes nothing more, and a standby never touches it.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from ipaddress import ip_address
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2
import structlog
import yaml
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.discovery_v1 import Endpoint, EndpointConditions, EndpointPort
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.discovery_v1 import EndpointSlice

from osas.election.port import (
    NO_ANNOTATIONS,
    AnnotationSource,
    ElectionSettings,
    ElectionSetupError,
    PreviousHolder,
    default_identity,
    resolve_endpoint,
)

logger = structlog.get_logger(__name__)
T = TypeVar("T")

FIELD_MANAGER = "osas"
# A request may take this share of renew_deadline: a holder whose API hangs gets three tries
# before it must stop writing.
_REQUESTS_PER_DEADLINE = 3
# What client-go writes on release: a candidate that does not read an empty holder as a
# release still sees the Lease expire a second later.
_RELEASED_DURATION_SECONDS = 1
_UNAUTHORIZED, _FORBIDDEN, _NOT_FOUND, _CONFLICT = 401, 403, 404, 409
_REFUSED = frozenset({_UNAUTHORIZED, _FORBIDDEN})
# What a request can fail with: the API's refusals, transport errors and timeouts, a token
# file gone (ConfigError), an answer that does not decode (msgspec's errors are ValueErrors).
_API_FAILURES = (httpx2.HTTPError, TimeoutError, ConfigError, ValueError)
# Kubernetes' rules for annotations: a key the API refuses would fail every renew.
_ANNOTATION_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_ANNOTATIONS_MAX_BYTES = 256 * 1024
# kube-proxy joins a Service's slices by this label; the EndpointSlice controllers leave alone
# a slice managed by anyone else.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "osas.openstack.org"
# Writes of the slice lost to another writer (Conflict) before the next round tries again.
_SLICE_WRITE_TRIES = 3


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _micro(moment: datetime) -> datetime:
    """A MicroTime as the API server parses it. It wants six fractional digits and lightkube's
    encoder drops a zero fraction, so an instant on a whole second moves by a microsecond."""
    moment = moment.astimezone(UTC)
    return moment if moment.microsecond else moment.replace(microsecond=1)


def check_annotations(annotations: Mapping[str, str]) -> None:
    """Raise ValueError for annotations the API server would refuse."""
    size = 0
    for key, value in annotations.items():
        prefix, _, name = key.rpartition("/")
        if not _ANNOTATION_NAME.fullmatch(name) or (
            prefix and not _DNS_SUBDOMAIN.fullmatch(prefix)
        ):
            raise ValueError(f"{key!r} is not a valid annotation key")
        size += len(key.encode()) + len(value.encode())
    if size > _ANNOTATIONS_MAX_BYTES:
        raise ValueError(f"annotations of {size} bytes exceed Kubernetes' {_ANNOTATIONS_MAX_BYTES}")


def load_kube_config(path: Path | None) -> KubeConfig:
    """The kubeconfig file at ``path``, or the pod's service account when None."""
    try:
        config = KubeConfig.from_service_account() if path is None else KubeConfig.from_file(path)
        config.get()  # a file without a usable context fails now, not at the first request
    except KeyError as exc:  # KUBERNETES_SERVICE_HOST or _PORT unset: not in a pod
        raise ElectionSetupError(
            f"no Kubernetes service environment ({exc} unset): outside a pod, give a kubeconfig"
        ) from exc
    except (ConfigError, OSError, TypeError, ValueError, yaml.YAMLError) as exc:
        where = "the pod's service account" if path is None else str(path)
        raise ElectionSetupError(f"no usable Kubernetes configuration in {where}: {exc}") from exc
    return config


@dataclass(frozen=True, slots=True)
class _Record:
    """What a candidate compares between two reads to know whether the holder is alive."""

    holder: str  # "" once released
    renew_time: datetime | None
    resource_version: str | None


def endpoint_slice_name(service_name: str) -> str:
    """The EndpointSlice through which the holder is the endpoint of ``service_name``."""
    return f"{service_name}-leader"


def _routes(endpoint_slice: EndpointSlice) -> list[str]:
    """The "ip:port" pairs a slice offers, for the logs."""
    ports = [port.port for port in endpoint_slice.ports or [] if port.port]
    return [
        f"{endpoint.addresses[0]}:{port}"
        for endpoint in endpoint_slice.endpoints or []
        if endpoint.addresses
        for port in ports
    ]


@dataclass(frozen=True, slots=True)
class _Outcome:
    done: bool  # the slice now says what was asked
    wrote: bool = False  # ...because this call wrote it
    found: tuple[str, ...] = ()  # what it offered before that write


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        return f"{exc.status.code} {exc.status.reason}: {exc.status.message}"
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return "no answer in time"
    return str(exc) or type(exc).__name__


class _EndpointPublisher:
    """This pod as the one endpoint of CA's Service: the EndpointSlice the holder writes.

    It decides nothing about when: ``LeaseElection`` calls ``publish`` while holding and
    ``withdraw`` on release, and passes its fence (``may_write``) for every write.
    """

    def __init__(
        self, settings: ElectionSettings, identity: str, request_timeout: float, log: Any
    ) -> None:
        address = ip_address(settings.pod_ip)
        self.namespace = settings.service_namespace
        self.name = endpoint_slice_name(settings.service_name)
        self.service = f"{self.namespace}/{settings.service_name}"
        host = f"[{address}]" if address.version == 6 else str(address)  # noqa: PLR2004
        self.endpoint = f"{host}:{settings.endpoint_port}"
        self.published = False  # the slice named this pod when last read or written
        self.writes = 0  # writes of the slice that landed
        self._address = str(address)  # the canonical form, which the API wants
        self._address_type = f"IPv{address.version}"
        self._labels = {SERVICE_NAME_LABEL: settings.service_name, MANAGED_BY_LABEL: MANAGED_BY}
        self._endpoints = [
            Endpoint(
                addresses=[self._address],
                conditions=EndpointConditions(ready=True, serving=True, terminating=False),
                targetRef=ObjectReference(kind="Pod", name=identity, namespace=self.namespace),
                nodeName=settings.node_name or None,
            )
        ]
        self._ports = [
            EndpointPort(
                name=settings.endpoint_port_name,
                port=settings.endpoint_port,
                protocol="TCP",
                appProtocol="grpc",
            )
        ]
        self._request_timeout = request_timeout
        self._failure: str | None = None  # the failure last logged, until a write succeeds
        self._log = log.bind(service=self.service, endpoint=self.endpoint)

    async def publish(self, client: AsyncClient, may_write: Callable[[], bool]) -> bool:
        """Make the slice name this pod alone; True once it does. API failures are logged
        once per kind and answer False (the caller tries again)."""
        try:
            outcome = await self._converge(client, self._endpoints, may_write)
        except _API_FAILURES as exc:
            self._failed(exc)
            return False
        if outcome.done:
            self._failure = None
            if outcome.wrote and self.published:
                self._log.warning(
                    "the endpoint slice had changed under the holder; written again",
                    slice=self.name,
                    found=list(outcome.found),
                )
            elif not self.published:
                self._log.info("published this osas as the endpoint of CA's service")
        self.published = outcome.done
        return outcome.done

    async def withdraw(self, client: AsyncClient) -> None:
        """Empty the slice, if it still names this pod, so that CA's new connections stop
        landing on a process that is stopping. Never raises but cancellation."""
        try:
            outcome = await self._converge(client, [], lambda: True, only_if_this_pod=True)
        except _API_FAILURES as exc:
            self._log.warning(
                "endpoint not withdrawn; CA may reach this stopping osas until the next "
                "holder publishes itself",
                error=_describe(exc),
            )
            return
        self.published = False
        if outcome.wrote:
            self._log.info("withdrew this osas from CA's service")

    async def _converge(
        self,
        client: AsyncClient,
        endpoints: list[Endpoint],
        may_write: Callable[[], bool],
        *,
        only_if_this_pod: bool = False,
    ) -> _Outcome:
        """Read the slice and write ``endpoints`` over it when it says otherwise. Every write
        carries the resourceVersion read, so nothing written meanwhile is overwritten
        unseen: a Conflict reads again."""
        wanted = EndpointSlice(
            metadata=ObjectMeta(name=self.name, namespace=self.namespace, labels=self._labels),
            addressType=self._address_type,
            endpoints=endpoints,
            ports=self._ports,
        )
        for _ in range(_SLICE_WRITE_TRIES):
            current = await self._get(client)
            if only_if_this_pod and (current is None or not self._names_this_pod(current)):
                return _Outcome(done=True)  # another holder's already, or nobody's
            if current is not None and self._says(current, wanted):
                return _Outcome(done=True)
            if not may_write():
                return _Outcome(done=False)
            try:
                # A write once sent is seen through (each is bounded by its timeout): one
                # abandoned in flight could land after the release's withdrawal, unseen.
                with anyio.CancelScope(shield=True):
                    if current is None:
                        await self._request(client.create(wanted))
                    elif current.addressType != wanted.addressType:
                        # Immutable (the pods' IP family changed): the slice is made again.
                        await self._request(
                            client.delete(EndpointSlice, self.name, namespace=self.namespace)
                        )
                        continue
                    else:
                        await self._request(client.replace(self._over(current, wanted)))
            except ApiError as exc:
                if exc.status.code not in {_CONFLICT, _NOT_FOUND}:
                    raise
                continue  # written or deleted by someone else since it was read: read again
            self.writes += 1
            return _Outcome(done=True, wrote=True, found=tuple(_routes(current) if current else ()))
        return _Outcome(done=False)

    def _says(self, current: EndpointSlice, wanted: EndpointSlice) -> bool:
        labels = (current.metadata.labels if current.metadata else None) or {}
        return (
            current.addressType == wanted.addressType
            and all(labels.get(key) == value for key, value in self._labels.items())
            and (current.endpoints or []) == (wanted.endpoints or [])
            and (current.ports or []) == (wanted.ports or [])
        )

    def _names_this_pod(self, current: EndpointSlice) -> bool:
        return any(self._address in endpoint.addresses for endpoint in current.endpoints or [])

    @staticmethod
    def _over(current: EndpointSlice, wanted: EndpointSlice) -> EndpointSlice:
        """``wanted`` with what the stored slice's metadata holds besides (resourceVersion,
        uid, others' labels and annotations)."""
        metadata = copy.copy(current.metadata) if current.metadata else ObjectMeta()
        wanted_labels = wanted.metadata.labels if wanted.metadata else None
        metadata.labels = {**(metadata.labels or {}), **(wanted_labels or {})}
        return EndpointSlice(
            metadata=metadata,
            addressType=wanted.addressType,
            endpoints=wanted.endpoints,
            ports=wanted.ports,
        )

    async def _get(self, client: AsyncClient) -> EndpointSlice | None:
        try:
            return await self._request(
                client.get(EndpointSlice, self.name, namespace=self.namespace)
            )
        except ApiError as exc:
            if exc.status.code == _NOT_FOUND:
                return None
            raise

    async def _request(self, request: Awaitable[T]) -> T:
        with anyio.fail_after(self._request_timeout):
            return await request

    def _failed(self, exc: Exception) -> None:
        code = exc.status.code if isinstance(exc, ApiError) else None
        kind = f"{type(exc).__name__} {code or ''}".strip()
        if kind == self._failure:
            return  # said once per kind of failure, until a write succeeds
        self._failure = kind
        if code in _REFUSED:
            self._log.error(
                "the Kubernetes API refuses osas the endpoint slice of CA's service; the "
                "holder keeps the lease and retries",
                slice=self.name,
                error=_describe(exc),
                fix=(
                    "give this pod's service account create, get and update on "
                    f"endpointslices (discovery.k8s.io) in namespace {self.namespace} (get and "
                    f"update may be limited to {self.name}; delete is needed only when the "
                    "pods' IP family changes): the Role and RoleBinding the chart installs"
                    if code == _FORBIDDEN
                    else "the API server does not accept the token: check the service "
                    "account (or the kubeconfig's user)"
                ),
            )
        else:
            self._log.warning(
                "endpoint slice request failed; retrying", slice=self.name, error=_describe(exc)
            )


class LeaseElection:
    """``Leadership`` through a Kubernetes Lease, with lightkube's AsyncClient."""

    def __init__(
        self,
        settings: ElectionSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if not settings.lease_name:
            raise ElectionSetupError("the election needs a lease name (lease_name_for(cluster))")
        settings = resolve_endpoint(settings)
        self._settings = settings
        self._identity = settings.identity or default_identity()
        self._lease = f"{settings.lease_namespace}/{settings.lease_name}"
        self._config = load_kube_config(settings.kubeconfig)
        self._clock = clock
        self._wall_clock = wall_clock  # only what is written in the Lease, for people to read
        self._request_timeout = settings.renew_deadline / _REQUESTS_PER_DEADLINE
        self._duration_seconds = math.ceil(settings.lease_duration)
        self._log = logger.bind(identity=self._identity, lease=self._lease)

        self._elected = anyio.Event()
        self._lost = anyio.Event()
        self._previous: PreviousHolder | None = None
        self._leading = False
        self._stopping = False  # release() was called: nothing more is taken or renewed
        self._renewed_at: float | None = None  # start of the last successful acquire or renew
        self._leading_since: float | None = None
        self._written: Lease | None = None  # the Lease as this holder's last write returned it
        self._observed: _Record | None = None
        self._observed_at = 0.0  # when the record last changed, by this process's clock
        self._seen_holder: str | None = None  # the last non-empty holder read
        self._transitions: int | None = None
        self._annotations: dict[str, str] = {}
        self._standing_by_for: str | None = None
        self._failure: str | None = None  # the API failure last logged, until an answer
        self._turn: anyio.CancelScope | None = None  # the loop's attempt and pause
        self._endpoint = self._endpoint_publisher()
        self._publishing: anyio.CancelScope | None = None  # the endpoint's task
        self._published_last = anyio.Event()  # set when that task has ended
        # Every write of the Lease goes one at a time: a renew, a record kept, the release
        # each write over what the one before returned.
        self._writing = anyio.Lock()
        self._source: AnnotationSource | None = None
        self._kept = 0  # the source's revision the last acknowledged write carried
        self._loop_client: AsyncClient | None = None  # the loop's, for keep_written
        self._seen_duration = float(self._duration_seconds)  # the holder's, as last read
        # Writes that landed, by what they were for: what this osas costs the API server.
        self._writes: Counter[str] = Counter()

    # -- Leadership ------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return True

    @property
    def identity(self) -> str:
        return self._identity

    def may_write(self) -> bool:
        renewed = self._renewed_at
        return (
            self._leading
            and not self._stopping
            and renewed is not None
            and self._clock() < renewed + self._settings.renew_deadline
        )

    @property
    def elected(self) -> anyio.Event:
        return self._elected

    @property
    def lost(self) -> anyio.Event:
        return self._lost

    @property
    def previous(self) -> PreviousHolder | None:
        return self._previous

    def status(self) -> dict[str, object]:
        leading = self.may_write()
        since = self._leading_since
        return {
            "enabled": True,
            "identity": self._identity,
            "lease": self._lease,
            "holder": (self._observed.holder or None) if self._observed else None,
            "leading": leading,
            "since": self._clock() - since if leading and since is not None else None,
            "transitions": self._transitions,
            "writes": {
                **self._writes,
                **({"endpoint": self._endpoint.writes} if self._endpoint else {}),
            },
            "service": self._endpoint.service if self._endpoint else None,
            "endpoint": (
                self._endpoint.endpoint
                if self._endpoint and self._endpoint.published and leading
                else None
            ),
        }

    def set_annotations(self, annotations: Mapping[str, str]) -> None:
        merged = {**self._annotations, **annotations}
        check_annotations(merged)
        self._annotations = merged

    def carry(self, source: AnnotationSource) -> None:
        self._source = source

    async def keep_written(self, revision: int, budget: float) -> bool:
        deadline = self._clock() + budget
        with anyio.move_on_after(budget):
            async with self._writing:
                # Whoever held the lock before may have written this revision already.
                if self._kept >= revision:
                    return True
                client, lease = self._loop_client, self._written
                if client is None or lease is None or not self.may_write():
                    return False
                try:
                    # Seen through once sent: an answer given up on could still land.
                    with anyio.CancelScope(shield=True):
                        return await self._keep_written_locked(client, lease, deadline)
                except _API_FAILURES as exc:
                    self._log.warning(
                        "promise record not written; the call is refused", error=_describe(exc)
                    )
                    return False
        return self._kept >= revision

    async def _keep_written_locked(
        self, client: AsyncClient, lease: Lease, deadline: float
    ) -> bool:
        """A renew carrying the record; on a Conflict (a write of this holder's that timed out
        and landed later, say) the Lease is read again and, still this holder's, written once
        more within the deadline."""
        started = self._clock()
        limit = max(deadline - started, 0.0)
        if await self._renew_locked(client, lease, started, limit=limit, kind="record"):
            return True
        fresh = await self._get(client, max(deadline - self._clock(), 0.0))
        holder = fresh.spec.holderIdentity if fresh is not None and fresh.spec else None
        if fresh is None or holder != self._identity or not self.may_write():
            return False  # the loop sorts out what happened to the Lease
        started = self._clock()
        limit = max(deadline - started, 0.0)
        return await self._renew_locked(client, fresh, started, limit=limit, kind="record")

    async def run_election(self) -> None:
        self._log.info("leader election started")
        async with self._client() as client, anyio.create_task_group() as tasks:
            self._loop_client = client
            try:
                if self._endpoint is not None:
                    tasks.start_soon(self._publish_while_leading, client, self._endpoint)
                await self._elect(client)
                tasks.cancel_scope.cancel()
            finally:
                self._loop_client = None

    async def release(self, annotations: Mapping[str, str] = NO_ANNOTATIONS) -> None:
        self._stopping = True
        if self._turn is not None:
            # The loop writes nothing more, even a renew in flight, and returns now.
            self._turn.cancel()
        # Before any await: the loop would otherwise take the stop for a lost lease.
        leading, self._leading = self._leading, False
        if self._publishing is not None:
            # Nor the endpoint's task; its write in flight, if any, lands before the slice is
            # read to be emptied below.
            self._publishing.cancel()
            with anyio.move_on_after(self._request_timeout):
                await self._published_last.wait()
        if not leading:
            return
        try:
            check_annotations(annotations)
        except ValueError as exc:
            self._log.warning("release annotations dropped", error=str(exc))
            annotations = NO_ANNOTATIONS
        # One bound for both steps; the endpoint gets half of it, so that a hanging API
        # still leaves the Lease its chance to be given back.
        deadline = self._clock() + self._settings.renew_deadline
        try:
            async with self._client() as client:
                if self._endpoint is not None:
                    with anyio.move_on_after(self._settings.renew_deadline / 2) as scope:
                        await self._endpoint.withdraw(client)
                    if scope.cancelled_caught:
                        self._log.warning("endpoint not withdrawn in time")
                with anyio.move_on_after(max(deadline - self._clock(), 0.0)) as scope:
                    await self._give_back(client, {**self._annotations, **annotations})
            if scope.cancelled_caught:
                self._log.warning("lease not released in time; it will expire instead")
        except _API_FAILURES as exc:
            self._log.warning("lease not released; it will expire instead", error=_describe(exc))

    # -- the loop --------------------------------------------------------------------------------

    async def _elect(self, client: AsyncClient) -> None:
        while True:
            if self._leading and not self.may_write():
                self._lose(f"not renewed within {self._settings.renew_deadline}s")
            if self._stopping or self._lost.is_set():
                return
            started = self._clock()
            with anyio.CancelScope() as self._turn:
                await self._attempt_until_deadline(client, started)
                if not self._lost.is_set():
                    await anyio.sleep(self._pause(started))
            self._turn = None

    async def _publish_while_leading(
        self, client: AsyncClient, endpoint: _EndpointPublisher
    ) -> None:
        """Beside the loop, so that a slow or refused write never delays a renew: the slice
        is written once the Lease is taken, then checked every lease duration; until it is
        written, it is tried again with each renew."""
        try:
            with anyio.CancelScope() as self._publishing:
                await self._elected.wait()
                while self._leading and not self._stopping:
                    done = False
                    with anyio.move_on_after(self._settings.renew_deadline):
                        done = await endpoint.publish(client, self.may_write)
                    settings = self._settings
                    await anyio.sleep(settings.lease_duration if done else settings.retry_period)
        finally:
            self._published_last.set()

    def _endpoint_publisher(self) -> _EndpointPublisher | None:
        settings = self._settings
        if not settings.service_name:
            return None
        missing = [
            what
            for what, value in (
                ("service_namespace (or $POD_NAMESPACE)", settings.service_namespace),
                ("pod_ip (or $POD_IP)", settings.pod_ip),
            )
            if not value
        ]
        if missing:
            # Said once, at start: CA's Service has no endpoint until this is fixed.
            self._log.warning(
                "this osas will not publish itself as the endpoint of CA's service",
                service=settings.service_name,
                missing=missing,
                fix="pass POD_NAMESPACE and POD_IP from the downward API, as the chart does",
            )
            return None
        return _EndpointPublisher(settings, self._identity, self._request_timeout, self._log)

    def _pause(self, started: float) -> float:
        now = self._clock()
        pause = started + self._settings.retry_period - now
        if self._leading and self._renewed_at is not None:
            # Wake at the deadline to stop, not a retry period later.
            pause = min(pause, self._renewed_at + self._settings.renew_deadline - now)
        return max(pause, 0.0)

    async def _attempt_until_deadline(self, client: AsyncClient, started: float) -> None:
        deadline = math.inf
        if self._leading and self._renewed_at is not None:
            deadline = self._renewed_at + self._settings.renew_deadline - started
        try:
            with anyio.move_on_after(deadline) as scope:
                await self._try_acquire_or_renew(client, started)
        except _API_FAILURES as exc:
            self._failed(exc)
        else:
            if self._failure is not None and not scope.cancelled_caught:
                self._log.info("the Kubernetes API answers again")
                self._failure = None

    async def _try_acquire_or_renew(self, client: AsyncClient, started: float) -> None:
        # A holder renews what its last write returned; a Conflict means someone wrote since:
        # read and decide again.
        if self._leading and self._written is not None and await self._renew(client, started):
            return
        lease = await self._get(client)
        if self._stopping:
            return
        if lease is None:
            await self._lease_missing(client, started)
            return
        record = self._observe(lease)
        if record.holder == self._identity:
            if self._leading:
                async with self._writing:
                    await self._renew_locked(client, lease, started)
            else:
                # An earlier life of this identity (the same pod, its container restarted):
                # it is gone, so the Lease is taken back at once, as client-go does.
                await self._take(client, lease, started)
        elif self._leading:
            self._lose(f"{record.holder} holds the lease")
        elif not record.holder or self._expired(lease):
            await self._take(client, lease, started)
        elif record.holder != self._standing_by_for:
            self._standing_by_for = record.holder
            self._log.info("another osas holds the lease; standing by", holder=record.holder)

    async def _lease_missing(self, client: AsyncClient, started: float) -> None:
        if self._leading:
            self._log.warning(
                "the lease was deleted under its holder (by hand, or another tool); made "
                "again at once, with the promise record"
            )
        elif self._waits_out_a_vanished_holder():
            return
        await self._create(client, started)

    def _waits_out_a_vanished_holder(self) -> bool:
        """The Lease is missing. A candidate that last saw it held may make it anew only once
        ``lease_duration`` has passed since that holder's record last changed: the holder may
        not know yet, and writes until its renew deadline. One that saw no holder (a first
        install, or a Lease released) makes it at once."""
        observed = self._observed
        if observed is None or not observed.holder:
            return False
        if self._clock() >= self._observed_at + self._seen_duration:
            return False
        if self._standing_by_for != f"{observed.holder} (lease deleted)":
            self._standing_by_for = f"{observed.holder} (lease deleted)"
            self._log.warning(
                "the lease vanished while another osas held it (deleted by hand?); it is made "
                "anew only once lease_duration has passed since its holder last renewed",
                holder=observed.holder,
                wait_seconds=round(self._observed_at + self._seen_duration - self._clock(), 1),
            )
        return True

    def _observe(self, lease: Lease) -> _Record:
        spec = lease.spec or LeaseSpec()
        record = _Record(
            spec.holderIdentity or "",
            spec.renewTime,
            lease.metadata.resourceVersion if lease.metadata else None,
        )
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()
        if record.holder:
            self._seen_holder = record.holder
            self._seen_duration = float(spec.leaseDurationSeconds or self._duration_seconds)
        self._transitions = spec.leaseTransitions
        return record

    def _expired(self, lease: Lease) -> bool:
        spec = lease.spec or LeaseSpec()
        duration = spec.leaseDurationSeconds or self._duration_seconds
        return self._clock() >= self._observed_at + duration

    async def _create(self, client: AsyncClient, started: float) -> None:
        async with self._writing:
            await self._create_locked(client, started)

    async def _create_locked(self, client: AsyncClient, started: float) -> None:
        now = _micro(self._wall_clock())
        revision, annotations = self._carried()
        lease = Lease(
            metadata=ObjectMeta(
                name=self._settings.lease_name,
                namespace=self._settings.lease_namespace,
                annotations=annotations or None,
            ),
            spec=LeaseSpec(
                holderIdentity=self._identity,
                leaseDurationSeconds=self._duration_seconds,
                acquireTime=now,
                renewTime=now,
                leaseTransitions=0,
            ),
        )
        try:
            created = await self._request(client.create(lease))
        except ApiError as exc:
            if exc.status.code != _CONFLICT:
                raise
            if self._leading:
                # Deleted under this holder and made again by another before it could: that
                # one may be writing already. Stop at once, not at the renew deadline.
                self._lose("the lease was deleted and another osas made it anew first")
            else:
                self._log.info("another candidate created the lease first")
            return
        self._wrote(revision)
        self._writes["create"] += 1
        if self._leading:  # deleted under this holder, made again: a renew
            self._renewed(created, started)
        else:
            # A Lease made after one vanished under a holder: what that holder promised is
            # unknown (its record went with the Lease), not nothing.
            seen = self._observed.holder if self._observed else None
            self._become_leader(
                created, started, PreviousHolder(seen or None, released=False, annotations={})
            )

    async def _take(self, client: AsyncClient, lease: Lease, started: float) -> None:
        spec = lease.spec or LeaseSpec()
        holder = spec.holderIdentity or ""
        previous = PreviousHolder(
            identity=holder or (self._seen_holder or ""),
            released=not holder,
            annotations=dict(lease.metadata.annotations or {}) if lease.metadata else {},
        )
        transitions = (spec.leaseTransitions or 0) + int(holder != self._identity)
        now = _micro(self._wall_clock())
        acquire = spec.acquireTime if holder == self._identity and spec.acquireTime else now
        async with self._writing:
            written = await self._write(
                client,
                lease,
                self._spec(spec, acquire=acquire, renew=now, transitions=transitions),
            )
        if written is None:
            self._log.info("another candidate took the lease first")
            return
        self._writes["take"] += 1
        self._become_leader(written, started, previous)

    async def _renew(self, client: AsyncClient, started: float) -> bool:
        """Renew over what the holder's last write returned; False when the Lease changed
        since (Conflict) or vanished."""
        async with self._writing:
            lease = self._written
            if lease is None:
                return False
            return await self._renew_locked(client, lease, started)

    async def _renew_locked(
        self,
        client: AsyncClient,
        lease: Lease,
        started: float,
        limit: float | None = None,
        kind: str = "renew",
    ) -> bool:
        spec = lease.spec or LeaseSpec()
        now = _micro(self._wall_clock())
        new_spec = self._spec(
            spec, acquire=spec.acquireTime or now, renew=now, transitions=spec.leaseTransitions or 0
        )
        written = await self._write(client, lease, new_spec, limit=limit)
        if written is None:
            return False
        self._writes[kind] += 1
        if not self._stopping:  # a release won the race: this holder no longer leads
            self._renewed(written, started)
        return True

    def _spec(
        self, read: LeaseSpec, *, acquire: datetime, renew: datetime, transitions: int
    ) -> LeaseSpec:
        return LeaseSpec(
            holderIdentity=self._identity,
            leaseDurationSeconds=self._duration_seconds,
            acquireTime=_micro(acquire),
            renewTime=renew,
            leaseTransitions=transitions,
            # Coordinated leader election's fields belong to whoever set them: kept.
            preferredHolder=read.preferredHolder,
            strategy=read.strategy,
        )

    async def _write(
        self,
        client: AsyncClient,
        lease: Lease,
        spec: LeaseSpec,
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
        *,
        limit: float | None = None,
    ) -> Lease | None:
        """PUT ``spec`` over ``lease`` with the resourceVersion (and uid) it was read with,
        carrying the holder's annotations; None when the API refuses it as stale (Conflict)
        or the Lease is gone (NotFound). Call it holding ``_writing``."""
        metadata = copy.copy(lease.metadata) if lease.metadata else ObjectMeta()
        revision, publish = self._carried()
        publish = {**publish, **annotations}
        if publish:
            metadata.annotations = {**(metadata.annotations or {}), **publish}
        try:
            written = await self._request(
                client.replace(Lease(metadata=metadata, spec=spec)), limit
            )
        except ApiError as exc:
            if exc.status.code in {_CONFLICT, _NOT_FOUND}:
                return None
            raise
        self._wrote(revision)
        return written

    def _carried(self) -> tuple[int | None, dict[str, str]]:
        """What the holder's writes carry: its own annotations and, once it carries a
        source, the source's, with the source's revision."""
        if self._source is None:
            return None, dict(self._annotations)
        revision, annotations = self._source()
        return revision, {**self._annotations, **annotations}

    def _wrote(self, revision: int | None) -> None:
        if revision is not None:
            self._kept = max(self._kept, revision)

    async def _get(self, client: AsyncClient, limit: float | None = None) -> Lease | None:
        try:
            return await self._request(
                client.get(
                    Lease, self._settings.lease_name, namespace=self._settings.lease_namespace
                ),
                limit,
            )
        except ApiError as exc:
            if exc.status.code == _NOT_FOUND:
                return None
            raise

    async def _request(self, request: Awaitable[T], limit: float | None = None) -> T:
        # httpx's timeouts bound each phase; this bounds the whole request.
        with anyio.fail_after(
            self._request_timeout if limit is None else min(limit, self._request_timeout)
        ):
            return await request

    # -- changes of state ------------------------------------------------------------------------

    def _renewed(self, lease: Lease, started: float) -> None:
        self._renewed_at = started
        self._written = lease
        self._observe(lease)

    def _become_leader(self, lease: Lease, started: float, previous: PreviousHolder) -> None:
        self._leading = True
        self._leading_since = started
        self._previous = previous
        self._standing_by_for = None
        self._renewed(lease, started)
        self._log.info(
            "became the leader",
            previous_holder=previous.identity,
            released=previous.released,
            transitions=self._transitions,
        )
        self._elected.set()

    def _lose(self, reason: str) -> None:
        self._leading = False
        self._written = None
        if self._publishing is not None:
            self._publishing.cancel()  # nothing more is written, the endpoint least of all
        self._log.error("lost the lease; stopping", reason=reason)
        self._lost.set()

    def _failed(self, exc: Exception) -> None:
        code = exc.status.code if isinstance(exc, ApiError) else None
        kind = f"{type(exc).__name__} {code or ''}".strip()
        if kind == self._failure:
            return  # said once per kind of failure, until the API answers again
        self._failure = kind
        if code in _REFUSED:
            self._log.error(
                "the Kubernetes API refuses osas its lease; retrying",
                error=_describe(exc),
                fix=(
                    "give this pod's service account get, create and update on leases "
                    f"(coordination.k8s.io) in namespace {self._settings.lease_namespace}: "
                    "the Role and RoleBinding the chart installs for leader election"
                    if code == _FORBIDDEN
                    else "the API server does not accept the token: check the service "
                    "account (or the kubeconfig's user)"
                ),
            )
        else:
            self._log.warning(
                "lease request failed; retrying",
                error=_describe(exc),
                request_timeout=round(self._request_timeout, 3),
            )

    async def _give_back(self, client: AsyncClient, annotations: Mapping[str, str]) -> None:
        lease = self._written
        while True:
            if lease is None:
                lease = await self._get(client)
                holder = lease.spec.holderIdentity if lease and lease.spec else None
                if lease is None or holder != self._identity:
                    self._log.info("lease not released: no longer held", holder=holder)
                    return
            spec = lease.spec or LeaseSpec()
            now = _micro(self._wall_clock())
            released = LeaseSpec(
                holderIdentity="",
                leaseDurationSeconds=_RELEASED_DURATION_SECONDS,
                acquireTime=now,
                renewTime=now,
                leaseTransitions=spec.leaseTransitions or 0,
            )
            async with self._writing:
                written = await self._write(client, lease, released, annotations)
            if written is not None:
                self._writes["release"] += 1
                self._written = None
                self._log.info("lease released")
                return
            lease = None  # renewed meanwhile by the loop: read it again

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[AsyncClient]:
        client = AsyncClient(
            self._config,
            namespace=self._settings.lease_namespace,
            timeout=httpx2.Timeout(self._request_timeout),
            field_manager=FIELD_MANAGER,
        )
        try:
            yield client
        finally:
            with anyio.CancelScope(shield=True):  # closed even when the loop is cancelled
                await client.close()
