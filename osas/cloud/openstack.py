"""OpenStackCloud: the cloud port over openstacksdk. The only module that imports it.

openstacksdk is synchronous. Every call runs in a daemon thread (creates and other calls in
separate pools of ``concurrency`` threads, so slow creates never hold up listings and deletes),
with a connection of its own taken from a small pool (whether one connection may be shared by
threads is not documented). Idempotent calls are retried with jittered exponential backoff on
5xx, connection errors and timeouts. A create is sent exactly once: Nova has no idempotency key,
so it is POSTed with keystoneauth's own connect and status-code retries off, whatever
clouds.yaml says, and its failures are told apart: ``CreateNotSent`` when the request provably
never left, ``CreateInDoubt`` when Nova may have made the server. All calls share a rate limit.
Every openstacksdk and keystoneauth error is translated into ``osas.cloud.errors`` in
``_translate`` and nowhere else; messages are scrubbed of the configured secrets.
"""

from __future__ import annotations

import base64
import queue
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import anyio
import keystoneauth1.exceptions as ks_exceptions
import openstack
import openstack.connection
import openstack.exceptions as sdk_exceptions
import openstack.warnings as sdk_warnings
import requests.exceptions
import structlog
import urllib3.exceptions
from aiolimiter import AsyncLimiter
from cachetools import TTLCache
from keystoneauth1 import discover
from openstack import utils as sdk_utils
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from osas.cloud.errors import (
    CloudConfigurationError,
    CloudError,
    CloudUnavailable,
    CreateInDoubt,
    CreateNotSent,
    QuotaExceeded,
    RequestRejected,
)
from osas.cloud.openstack_settings import MIN_COMPUTE_MICROVERSION, OpenStackSettings
from osas.cloud.port import CreateServerRequest, Reference
from osas.cloud.threads import DaemonThreads
from osas.domain.servers import Fault, Flavor, ServerRecord, is_quota_message
from osas.domain.specs import NodeGroupSpec

logger = structlog.get_logger(__name__)

T = TypeVar("T")
# openstacksdk's own ceiling for servers; the SDK negotiates min(this, Nova's maximum).
SDK_SERVER_MICROVERSION = "2.100"
_HTTP_SERVER_ERROR = 500
_HTTP_UNAUTHORIZED = 401
_HTTP_FORBIDDEN = 403
_HTTP_TOO_LARGE = 413
_CLOSE_TIMEOUT = 5.0


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _translate_http(exc: sdk_exceptions.HttpException, secrets: tuple[str, ...]) -> CloudError:
    status = exc.status_code
    message = _scrub(str(exc), secrets)
    details = _scrub(str(exc.details or ""), secrets) or message
    text = f"{message} {details}".lower()
    if status in {_HTTP_FORBIDDEN, _HTTP_TOO_LARGE} and is_quota_message(text):
        return QuotaExceeded(details)
    if status is not None and status >= _HTTP_SERVER_ERROR:
        return CloudUnavailable(f"HTTP {status}: {details}")
    if status == _HTTP_UNAUTHORIZED:
        return CloudConfigurationError(f"OpenStack refused the credentials: {message}")
    return RequestRejected(details, status)


# Checked in order: the first class that matches decides.
_TRANSLATIONS: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], type[CloudError]], ...
] = (
    (ks_exceptions.Unauthorized, CloudConfigurationError),
    (
        (
            ks_exceptions.RetriableConnectionFailure,
            ks_exceptions.ConnectionError,
            ks_exceptions.DiscoveryFailure,
            ks_exceptions.HttpServerError,
            TimeoutError,
            OSError,
        ),
        CloudUnavailable,
    ),
    ((ks_exceptions.ClientException, sdk_exceptions.ConfigException), CloudConfigurationError),
    (sdk_exceptions.SDKException, RequestRejected),
)


def _translate(exc: Exception, secrets: tuple[str, ...]) -> CloudError:
    """The one place where openstacksdk and keystoneauth errors become osas errors."""
    if isinstance(exc, CloudError):
        return exc
    if isinstance(exc, sdk_exceptions.HttpException):
        return _translate_http(exc, secrets)
    message = _scrub(str(exc) or type(exc).__name__, secrets)
    for classes, error in _TRANSLATIONS:
        if isinstance(exc, classes):
            return error(message)
    return CloudError(f"{type(exc).__name__}: {message}")


def _never_sent(exc: BaseException) -> bool:
    """Whether a transport failure proves the request never left: the connection could not be
    made (refused, unreachable, connect timeout). keystoneauth folds these into the same
    exceptions as a read timeout or a dropped connection, so look at what it wrapped."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(
            current, requests.exceptions.ConnectTimeout | urllib3.exceptions.ConnectTimeoutError
        ):
            return True  # urllib3's NewConnectionError is a ConnectTimeoutError too
        reason = getattr(current, "reason", None)
        pending.extend([current.__cause__, current.__context__])
        pending.extend(arg for arg in (*current.args, reason) if isinstance(arg, BaseException))
    return False


def _create_failure(exc: Exception, secrets: tuple[str, ...]) -> CloudError:
    """What a failed create POST means: a definite refusal (an HTTP 4xx), proof that it never
    left, or doubt: anything else may have happened after Nova stored the server."""
    if isinstance(exc, CloudError):
        return exc
    if isinstance(exc, sdk_exceptions.HttpException):
        error = _translate_http(exc, secrets)
        if not isinstance(error, CloudUnavailable):
            return error
    message = _scrub(str(exc) or type(exc).__name__, secrets)
    if _never_sent(exc):
        return CreateNotSent(message)
    return CreateInDoubt(message)


def _fault(value: object) -> Fault | None:
    """Nova's ``fault`` object (on ERROR and DELETED servers only)."""
    if not isinstance(value, dict):
        return None
    return Fault(int(value.get("code") or 0), str(value.get("message") or ""))


def _record_from_body(body: dict[str, Any]) -> ServerRecord:
    """A server from Nova's JSON as it is: building openstacksdk resources costs milliseconds
    a server, which at 20,000 servers would make every complete listing take a minute."""
    fault = body.get("fault")
    return ServerRecord(
        server_id=str(body["id"]),
        name=str(body.get("name") or ""),
        status=str(body.get("status") or "").upper(),
        metadata={str(k): str(v) for k, v in (body.get("metadata") or {}).items()},
        tags=frozenset(str(tag) for tag in body.get("tags") or ()),
        task_state=body.get("OS-EXT-STS:task_state"),
        fault=_fault(fault),
        created=str(body.get("created") or ""),
    )


def _next_page(body: dict[str, Any]) -> str | None:
    for link in body.get("servers_links") or ():
        if link.get("rel") == "next":
            return str(link["href"])
    return None


def _record(server: Any) -> ServerRecord:
    fault = server.fault
    return ServerRecord(
        server_id=server.id,
        name=server.name or "",
        status=(server.status or "").upper(),
        metadata=dict(server.metadata or {}),
        tags=frozenset(server.tags or ()),
        task_state=server.task_state,
        fault=_fault(fault),
        created=str(server.created_at or ""),
    )


def _flavor(flavor: Any) -> Flavor:
    return Flavor(
        flavor_id=flavor.id,
        name=flavor.name,
        vcpus=int(flavor.vcpus or 0),
        ram_mib=int(flavor.ram or 0),
        disk_gib=int(flavor.disk or 0),
        ephemeral_gib=int(flavor.ephemeral or 0),
        extra_specs=dict(flavor.extra_specs or {}),
    )


class OpenStackCloud:
    def __init__(
        self,
        settings: OpenStackSettings,
        *,
        connect: Callable[[], openstack.connection.Connection] | None = None,
    ) -> None:
        # openstacksdk warns about its own internals on ordinary calls; those are its
        # maintainers' business, not an operator's (the filter is process-wide by nature).
        warnings.filterwarnings("ignore", category=sdk_warnings.OpenStackDeprecationWarning)
        warnings.filterwarnings("ignore", category=sdk_warnings.RemovedInSDK50Warning)
        warnings.filterwarnings("ignore", category=sdk_warnings.RemovedInSDK60Warning)
        self._settings = settings
        self._secrets = settings.auth.secrets() if settings.auth else ()
        self._connect = connect or self._default_connect
        self._pool: queue.SimpleQueue[openstack.connection.Connection] = queue.SimpleQueue()
        self._connections: list[openstack.connection.Connection] = []
        self._threads = DaemonThreads(settings.concurrency, "osas-openstack")
        self._create_threads = DaemonThreads(settings.concurrency, "osas-openstack-create")
        self._rate = AsyncLimiter(settings.rate_limit, 1.0)
        self._resolved: TTLCache[tuple[str, str], str | None] = TTLCache(
            maxsize=1024, ttl=settings.resolve_ttl
        )

    # -- plumbing ---------------------------------------------------------------------------------

    def _default_connect(self) -> openstack.connection.Connection:
        settings = self._settings
        options: dict[str, Any] = {"app_name": "osas", "api_timeout": settings.api_timeout}
        if settings.cloud:
            options["cloud"] = settings.cloud
        if settings.auth is not None:
            options["auth"] = settings.auth.as_sdk_auth()
            options["auth_type"] = settings.auth.auth_type
        if settings.region_name:
            options["region_name"] = settings.region_name
        if settings.interface:
            options["interface"] = settings.interface
        if settings.cacert is not None:
            options["cacert"] = str(settings.cacert)
        if not settings.verify:
            options["verify"] = False
        return openstack.connect(**options)

    @contextmanager
    def _connection(self) -> Iterator[openstack.connection.Connection]:
        try:
            conn = self._pool.get_nowait()
        except queue.Empty:
            conn = self._connect()
            self._connections.append(conn)
        try:
            yield conn
        finally:
            self._pool.put(conn)

    async def _once(
        self,
        operation: Callable[[openstack.connection.Connection], T],
        *,
        failure: Callable[[Exception, tuple[str, ...]], CloudError] = _translate,
        threads: DaemonThreads | None = None,
    ) -> T:
        """One call in a worker thread; every failure leaves as a CloudError."""
        secrets = self._secrets

        def run() -> T:
            try:
                with self._connection() as conn:
                    return operation(conn)
            except Exception as exc:
                raise failure(exc, secrets) from exc

        async with self._rate:
            return await (threads or self._threads).run(run)

    async def _call(self, operation: Callable[[openstack.connection.Connection], T]) -> T:
        """An idempotent call, retried on transient failures."""
        settings = self._settings
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(CloudUnavailable),
            wait=wait_exponential_jitter(
                multiplier=settings.backoff, jitter=settings.backoff, max=settings.backoff_max
            ),
            stop=stop_after_attempt(settings.attempts),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._once(operation)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    # -- the port ---------------------------------------------------------------------------------

    async def verify(self) -> str:
        def check(conn: openstack.connection.Connection) -> str:
            compute = conn.compute
            pinned = compute.default_microversion
            if pinned and discover.normalize_version_number(pinned) < MIN_COMPUTE_MICROVERSION:
                raise CloudConfigurationError(
                    f"compute microversion is pinned to {pinned} (compute_api_version, "
                    "OS_COMPUTE_API_VERSION or compute_default_microversion); osas needs "
                    "at least 2.52 for tag filters and tags on create: remove the pin"
                )
            negotiated = self._compute_microversion(conn)
            if discover.normalize_version_number(negotiated) < MIN_COMPUTE_MICROVERSION:
                raise CloudConfigurationError(
                    f"Nova at {compute.get_endpoint()} offers compute microversion "
                    f"{negotiated}; osas needs at least 2.52 for tag filters "
                    "and tags on create"
                )
            return f"compute {negotiated} at {compute.get_endpoint()}"

        return await self._call(check)

    async def list_servers(
        self, tag: str, *, changes_since: datetime | None = None
    ) -> list[ServerRecord]:
        # No `limit`: Nova pages at its [api] max_limit and links the next page.
        params: dict[str, str] | None = {"tags": tag}
        if changes_since is not None and params is not None:
            params["changes-since"] = changes_since.isoformat()

        def listing(conn: openstack.connection.Connection) -> list[ServerRecord]:
            compute = conn.compute
            microversion = self._compute_microversion(conn)
            # Nova may show a server twice across pages while builds are in flight: keep one
            # record per id (the later one, which is the newer view).
            records: dict[str, ServerRecord] = {}
            url: str | None = "/servers/detail"
            query = params
            while url is not None:
                response = compute.get(url, params=query, microversion=microversion)
                sdk_exceptions.raise_from_response(response)
                body = response.json()
                for server in body.get("servers", ()):
                    record = _record_from_body(server)
                    records[record.server_id] = record
                url, query = _next_page(body), None  # the next link carries the query
            return list(records.values())

        return await self._call(listing)

    def _compute_microversion(self, conn: openstack.connection.Connection) -> str:
        """The microversion to send: the pinned one, else the SDK's negotiated maximum."""
        compute = conn.compute
        version = compute.default_microversion or sdk_utils.maximum_supported_microversion(
            compute, SDK_SERVER_MICROVERSION
        )
        if version is None:
            raise CloudConfigurationError("Nova announced no compute microversion")
        return str(version)

    async def get_server(self, server_id: str) -> ServerRecord | None:
        def get(conn: openstack.connection.Connection) -> ServerRecord | None:
            try:
                return _record(conn.compute.get_server(server_id))
            except sdk_exceptions.NotFoundException:
                return None

        return await self._call(get)

    async def delete_server(self, server_id: str) -> None:
        def delete(conn: openstack.connection.Connection) -> None:
            conn.compute.delete_server(server_id, ignore_missing=True)

        await self._call(delete)

    async def get_flavor(self, name_or_id: str) -> Flavor | None:
        def get(conn: openstack.connection.Connection) -> Flavor | None:
            flavor = conn.compute.find_flavor(name_or_id, ignore_missing=True, get_extra_specs=True)
            return None if flavor is None else _flavor(flavor)

        return await self._call(get)

    async def _resolve_id(self, kind: str, name_or_id: str) -> str | None:
        key = (kind, name_or_id)
        if key in self._resolved:
            return self._resolved[key]

        def find(conn: openstack.connection.Connection) -> str | None:
            finders: dict[str, Callable[..., Any]] = {
                "flavor": conn.compute.find_flavor,
                "image": conn.image.find_image,
                "network": conn.network.find_network,
                "security group": conn.network.find_security_group,
                "server group": conn.compute.find_server_group,
                "keypair": conn.compute.find_keypair,
            }
            found = finders[kind](name_or_id, ignore_missing=True)
            return None if found is None else str(found.id or found.name)

        resource_id = await self._call(find)
        if resource_id is not None:
            self._resolved[key] = resource_id
        return resource_id

    async def _require(self, kind: str, name_or_id: str) -> str:
        resource_id = await self._resolve_id(kind, name_or_id)
        if resource_id is None:
            raise RequestRejected(f"{kind} {name_or_id!r} not found")
        return resource_id

    async def create_server(self, request: CreateServerRequest) -> ServerRecord:
        try:
            body = await self._create_body(request)
        except CloudUnavailable as exc:
            # Looking names up failed: the create itself was never sent.
            raise CreateNotSent(f"before sending the create: {exc}") from exc

        def prepare(conn: openstack.connection.Connection) -> str:
            # Token, endpoint and microversion first, so that a failure of the POST below can
            # only be the POST's own.
            conn.session.get_auth_headers()
            conn.compute.get_endpoint()
            return self._compute_microversion(conn)

        try:
            microversion = await self._call(prepare)
        except CloudUnavailable as exc:
            raise CreateNotSent(f"before sending the create: {exc}") from exc

        def create(conn: openstack.connection.Connection) -> ServerRecord:
            response = conn.compute.post(
                "/servers",
                json=body,
                microversion=microversion,
                raise_exc=False,
                # Sent once: a resend after a dropped connection or a 503 can make a second
                # server (clouds.yaml may set these retries for every other call).
                connect_retries=0,
                status_code_retries=0,
                retriable_status_codes=[],
            )
            sdk_exceptions.raise_from_response(response)
            try:
                server_id = str(response.json()["server"]["id"])
            except (ValueError, KeyError, TypeError) as exc:
                raise CreateInDoubt(f"Nova's answer to a create is unreadable: {exc}") from exc
            return ServerRecord(
                server_id=server_id,
                name=request.name,
                status="BUILD",
                metadata=dict(request.metadata),
                tags=frozenset(request.tags),
                task_state="scheduling",
            )

        return await self._once(create, failure=_create_failure, threads=self._create_threads)

    async def _create_body(self, request: CreateServerRequest) -> dict[str, Any]:
        """Nova's create body (compute API 2.52 and later), names resolved to ids."""
        flavor_id = await self._require("flavor", request.flavor)
        image_id = await self._require("image", request.image)
        server: dict[str, Any] = {
            "name": request.name,
            "flavorRef": flavor_id,
            "networks": [{"uuid": await self._require("network", n)} for n in request.networks],
            "metadata": dict(request.metadata),
            "tags": list(request.tags),
        }
        if request.boot_volume is None:
            server["imageRef"] = image_id
        else:
            mapping: dict[str, Any] = {
                "boot_index": 0,
                "uuid": image_id,
                "source_type": "image",
                "destination_type": "volume",
                "volume_size": request.boot_volume.size_gib,
                "delete_on_termination": True,
            }
            if request.boot_volume.volume_type:
                mapping["volume_type"] = request.boot_volume.volume_type
            server["block_device_mapping_v2"] = [mapping]
        if request.user_data is not None:
            server["user_data"] = base64.b64encode(request.user_data.encode()).decode("ascii")
        if request.key_name:
            server["key_name"] = request.key_name
        if request.security_groups:
            server["security_groups"] = [{"name": name} for name in request.security_groups]
        if request.availability_zone:
            server["availability_zone"] = request.availability_zone
        body: dict[str, Any] = {"server": server}
        if request.server_group:
            group_id = await self._require("server group", request.server_group)
            body["os:scheduler_hints"] = {"group": group_id}
        return body

    async def resolve(self, spec: NodeGroupSpec) -> list[Reference]:
        wanted: list[tuple[str, str]] = [("flavor", spec.flavor), ("image", spec.image)]
        wanted += [("network", n) for n in spec.networks]
        wanted += [("security group", g) for g in spec.security_groups]
        if spec.key_name:
            wanted.append(("keypair", spec.key_name))
        if spec.server_group:
            wanted.append(("server group", spec.server_group))
        return [Reference(kind, name, await self._resolve_id(kind, name)) for kind, name in wanted]

    async def close(self) -> None:
        def close_all() -> None:
            for conn in self._connections:
                conn.close()

        # In threads of its own: at shutdown the pools may all be stuck in calls.
        with anyio.move_on_after(_CLOSE_TIMEOUT):
            await DaemonThreads(1, "osas-openstack-close").run(close_all)
        self._connections.clear()
        self._threads.close()
        self._create_threads.close()
