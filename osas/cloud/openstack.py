"""OpenStackCloud: the cloud port over openstacksdk. The only module that imports it.

openstacksdk is synchronous. Every call runs in a daemon thread (creates and other calls in
separate pools of ``concurrency`` threads, so slow creates never hold up listings and deletes).
All threads share one connection, so one Keystone token and one discovery cache: keystoneauth
re-authenticates under a lock (``BaseIdentityPlugin.get_access``), requests' connection pool is
thread-safe, and openstacksdk itself runs one connection's calls in a thread pool. Names are
resolved once for all callers. Idempotent calls are retried with jittered exponential backoff on
5xx, connection errors and timeouts. A create is sent exactly once: Nova has no idempotency key,
so it is POSTed with keystoneauth's own connect and status-code retries off, whatever
clouds.yaml says, and its failures are told apart: ``CreateNotSent`` when the request provably
never left, ``CreateInDoubt`` when Nova may have made the server. All calls share a rate limit.
Every openstacksdk and keystoneauth error is translated into ``osas.cloud.errors`` by
``_translate`` (its table, ``_TRANSLATIONS``), a create's also by ``_create_failure``, which
tells a transient failure of the POST apart as not sent or in doubt; messages are scrubbed of
the configured secrets. What a create's failure means for the ledger is decided once, by
``osas.cloud.errors.create_outcome``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import email.utils
import functools
import http.client
import json
import logging
import math
import random
import re
import socket
import ssl
import threading
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio
import keystoneauth1.exceptions as ks_exceptions
import msgspec
import openstack
import openstack.config.loader as sdk_config_loader
import openstack.connection
import openstack.exceptions as sdk_exceptions
import openstack.warnings as sdk_warnings
import requests.exceptions
import structlog
import urllib3.exceptions
from cachetools import TTLCache
from keystoneauth1 import discover
from keystoneauth1 import session as ks_session
from openstack import utils as sdk_utils

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
from osas.cloud.metrics import PlaceCloudMetrics
from osas.cloud.openstack_settings import MIN_COMPUTE_MICROVERSION, OpenStackSettings
from osas.cloud.pacing import Pacer
from osas.cloud.port import CreateServerRequest, Reference, ServerListing
from osas.cloud.threads import DaemonThreads
from osas.domain.quota import Allowance, ProjectQuota
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
_HTTP_TOO_MANY_REQUESTS = 429  # a rate limit in front of Nova: the request was not processed
_HTTP_UNAVAILABLE = 503  # with Retry-After: the same
_CLOSE_TIMEOUT = 5.0
# How long an idempotent call keeps being sent again while the cloud's rate limit refuses it.
_RATE_LIMITED_PATIENCE = 60.0
# How often the files the credentials come from are looked at (a stat each).
_CREDENTIALS_CHECK_INTERVAL = 1.0


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _retry_after(response: object) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delay-seconds or an HTTP date), or None."""
    headers = getattr(response, "headers", None)
    value = headers.get("Retry-After") if isinstance(headers, Mapping) else None
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _translate_http(exc: sdk_exceptions.HttpException, secrets: tuple[str, ...]) -> CloudError:
    status = exc.status_code
    message = _scrub(str(exc), secrets)
    details = _scrub(str(exc.details or ""), secrets) or message
    text = f"{message} {details}".lower()
    if status in {_HTTP_FORBIDDEN, _HTTP_TOO_LARGE} and is_quota_message(text):
        return QuotaExceeded(details)
    retry_after = _retry_after(exc.response)
    if status == _HTTP_TOO_MANY_REQUESTS or (
        status == _HTTP_UNAVAILABLE and retry_after is not None
    ):
        # The rate limit in front of the API: the request never reached Nova.
        return RateLimited(f"HTTP {status}: {details}", retry_after)
    if status is not None and status >= _HTTP_SERVER_ERROR:
        return CloudUnavailable(f"HTTP {status}: {details}")
    if status == _HTTP_UNAUTHORIZED:
        return CredentialsRefused(f"OpenStack refused the credentials: {message}")
    return RequestRejected(details, status)


# Checked in order: the first class that matches decides.
_TRANSLATIONS: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], type[CloudError]], ...
] = (
    (ks_exceptions.Unauthorized, CredentialsRefused),
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


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps (causes, contexts, the errors urllib3 and
    requests keep as arguments or ``reason``), each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        reason = getattr(current, "reason", None)
        pending.extend([current.__cause__, current.__context__])
        pending.extend(arg for arg in (*current.args, reason) if isinstance(arg, BaseException))


# What went wrong on the way to OpenStack, by the innermost error that says it; checked in
# order. Read timeouts come before connect timeouts: urllib3's are both TimeoutErrors.
_TRANSPORT_FAILURES: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...
] = (
    (ConnectionRefusedError, "connection refused: nothing listens at that address and port"),
    (socket.gaierror, "its host name does not resolve"),
    (
        (ssl.SSLError, requests.exceptions.SSLError),
        "the TLS handshake failed (a certificate osas does not trust: openstack.cacert)",
    ),
    (
        (urllib3.exceptions.ReadTimeoutError, requests.exceptions.ReadTimeout),
        "it accepted the connection but sent no answer in time",
    ),
    (
        (urllib3.exceptions.ConnectTimeoutError, requests.exceptions.ConnectTimeout),
        "the connection timed out (a host that is down, or a firewall dropping it)",
    ),
    # RemoteDisconnected is a ConnectionResetError: the closed connection comes first.
    (http.client.RemoteDisconnected, "the connection closed before an answer"),
    ((ConnectionResetError, BrokenPipeError), "the connection was reset"),
    (OSError, "the network failed"),
)


def _transport_failure(exc: BaseException) -> str | None:
    """A failure to reach OpenStack over the network, said as what is wrong and what to fix
    (None when ``exc`` is no such failure): keystoneauth's and requests' messages nest
    urllib3's pool and socket errors several deep."""
    chain = list(_chain(exc))
    transport = ks_exceptions.ConnectionError | requests.exceptions.RequestException
    if not any(isinstance(link, transport) for link in chain):
        return None  # keystoneauth's discovery failure wraps one as its context
    address = "OpenStack"
    for link in chain:
        request = getattr(link, "request", None)
        url = getattr(request, "url", None)
        if isinstance(url, str) and url:
            address = url.partition("?")[0]  # a listing's query says nothing here
            break
    else:
        found = re.search(r"\bto (https?://\S+?):? ", str(exc))
        address = found.group(1) if found else address
    what = next(
        (
            sentence
            for classes, sentence in _TRANSPORT_FAILURES
            for link in reversed(chain)
            if isinstance(link, classes)
        ),
        None,
    )
    if what is None:
        return None
    return (
        f"cannot reach {address}: {what}; check the address (auth_url, or the endpoint "
        "Keystone's catalog gives for the service) and that osas can reach it"
    )


def _message(exc: BaseException, secrets: tuple[str, ...]) -> str:
    """What an error of openstacksdk or keystoneauth says, in osas's words where they are
    needed, scrubbed of the configured secrets."""
    return _scrub(_transport_failure(exc) or str(exc) or type(exc).__name__, secrets)


def _translate(exc: Exception, secrets: tuple[str, ...]) -> CloudError:
    """The one place where openstacksdk and keystoneauth errors become osas errors: the HTTP
    status, then the table above. A create's POST is told apart further by ``_create_failure``,
    from what this returns."""
    if isinstance(exc, CloudError):
        return exc
    if isinstance(exc, sdk_exceptions.HttpException):
        return _translate_http(exc, secrets)
    message = _message(exc, secrets)
    for classes, error in _TRANSLATIONS:
        if isinstance(exc, classes):
            return error(message)
    return CloudError(f"{type(exc).__name__}: {message}")


def _unauthorized(exc: BaseException) -> bool:
    """OpenStack answered 401: the token (or the credentials behind it) was refused, and the
    request did nothing (authentication comes before any API work)."""
    return isinstance(exc, ks_exceptions.Unauthorized) or (
        isinstance(exc, sdk_exceptions.HttpException) and exc.status_code == _HTTP_UNAUTHORIZED
    )


# Renewals of a refused token before the credentials are taken for refused, and how far
# apart: Keystone compares issue times in whole seconds (``_authenticated``).
_RENEWALS = 2
_KEYSTONE_RESOLUTION = 1.1  # seconds


def _keep_token() -> bool:
    """What keystoneauth's session is told when it wants to invalidate the token after a 401:
    no, the adapter renews it itself."""
    return False


def _never_sent(exc: BaseException) -> bool:
    """Whether a transport failure proves the request never left: the connection could not be
    made (refused, unreachable, connect timeout). keystoneauth folds these into the same
    exceptions as a read timeout or a dropped connection, so look at what it wrapped."""
    # urllib3's NewConnectionError is a ConnectTimeoutError too
    never = requests.exceptions.ConnectTimeout | urllib3.exceptions.ConnectTimeoutError
    return any(isinstance(link, never) for link in _chain(exc))


def _create_failure(exc: Exception, secrets: tuple[str, ...]) -> CloudError:
    """What a failed create POST means. ``_translate`` classifies it as any call's failure; a
    transient one (``CloudUnavailable``) is then either proof that the request never left
    (``CreateNotSent``: refused connection, connect timeout, 429) or doubt (``CreateInDoubt``:
    anything else may have happened after Nova stored the server)."""
    error = _translate(exc, secrets)
    if not isinstance(error, CloudUnavailable) or isinstance(error, CreateNotSent | CreateInDoubt):
        return error  # a rate limit's refusal (RateLimited) is a CreateNotSent
    message = _message(exc, secrets)
    if _never_sent(exc):
        return CreateNotSent(message)
    return CreateInDoubt(message)


def _before_create(error: CloudUnavailable) -> CreateNotSent:
    """A transient failure before a create's POST (name look-ups, token, endpoint): the create
    itself was never sent."""
    if isinstance(error, RateLimited):
        return RateLimited(f"before sending the create: {error}", error.retry_after)
    return CreateNotSent(f"before sending the create: {error}")


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
        # Nova's metadata and tags are strings already.
        metadata=dict(body.get("metadata") or {}),
        tags=frozenset(body.get("tags") or ()),
        task_state=body.get("OS-EXT-STS:task_state"),
        fault=_fault(fault),
        created=str(body.get("created") or ""),
        updated=str(body.get("updated") or ""),
    )


def _post_once(
    conn: openstack.connection.Connection, path: str, body: Any, microversion: str
) -> Any:
    """A POST to Nova sent exactly once, whatever retries clouds.yaml sets for every other
    call (for the calls that must not be repeated blindly); its answer, not raised."""
    return conn.compute.post(
        path,
        json=body,
        microversion=microversion,
        raise_exc=False,
        connect_retries=0,
        status_code_retries=0,
        retriable_status_codes=[],
    )


def _nova_time(headers: Mapping[str, str]) -> datetime | None:
    """Nova's clock, from an answer's ``Date`` header (whole seconds, set by the HTTP server
    in front of Nova); None when it is missing or unreadable."""
    value = headers.get("Date")
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class _FaultBody(msgspec.Struct, gc=False):
    code: int | str | None = None
    message: str | None = None


class _ServerBody(msgspec.Struct, rename={"task_state": "OS-EXT-STS:task_state"}, gc=False):
    """What osas reads of a server in Nova's detail listing; the other fields are skipped."""

    id: str
    name: str | None = None
    status: str | None = None
    metadata: dict[str, str] | None = None
    tags: frozenset[str] | None = None  # what ServerRecord keeps: no list made first
    task_state: str | None = None
    fault: _FaultBody | None = None
    created: str | None = None
    updated: str | None = None


class _LinkBody(msgspec.Struct, gc=False):
    rel: str | None = None
    href: str | None = None


class _ServersPage(msgspec.Struct, gc=False):
    servers: list[_ServerBody] = []
    servers_links: list[_LinkBody] | None = None


# A page of a detail listing (1000 servers, 1.5 MB) decoded straight into the few fields osas
# reads: some 1 ms where json.loads and dicts took 20, holding the interpreter all along, so
# CA's calls wait less while a complete listing is read. The bodies live as long as the page
# and hold only JSON's strings, lists and dicts, which cannot form a cycle: not tracked by
# the garbage collector (gc=False), whose passes would otherwise count them.
_PAGE_DECODER = msgspec.json.Decoder(_ServersPage)


def _records_of_page(content: bytes) -> tuple[list[ServerRecord], str | None]:
    """A detail listing's page: its servers, and the link of the next page. A page whose
    fields have types osas does not expect is read the lenient, slower way."""
    try:
        page = _PAGE_DECODER.decode(content)
    except msgspec.ValidationError:
        body = json.loads(content)
        return [_record_from_body(s) for s in body.get("servers", ())], _next_page(body)
    records = [
        ServerRecord(
            server_id=server.id,
            name=server.name or "",
            status=(server.status or "").upper(),
            metadata=server.metadata or {},
            tags=server.tags or frozenset(),
            task_state=server.task_state,
            fault=None
            if server.fault is None
            else Fault(int(server.fault.code or 0), server.fault.message or ""),
            created=server.created or "",
            updated=server.updated or "",
        )
        for server in page.servers
    ]
    following = next(
        (link.href for link in page.servers_links or () if link.rel == "next" and link.href),
        None,
    )
    return records, following


def _next_page(body: dict[str, Any]) -> str | None:
    for link in body.get("servers_links") or ():
        if link.get("rel") == "next":
            return str(link["href"])
    return None


# Where a page's links begin. Nova writes them after the servers, and nothing inside a server
# can match: only top-level keys are followed by a list, metadata values are strings.
_LINKS = re.compile(rb'"servers_links"\s*:\s*\[')


def _next_page_early(content: bytes) -> str | None:
    """The next page's link read from the end of a page without parsing its servers, so that
    the next page is on its way while this one is parsed. A guess: the parsed page has the
    last word (see ``list_server_pages``)."""
    found = None
    for found in _LINKS.finditer(content, max(0, len(content) - 4096)):  # noqa: B007
        pass
    if found is None:
        return None
    try:
        links, _ = json.JSONDecoder().raw_decode(content[found.end() - 1 :].decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return _next_page({"servers_links": links}) if isinstance(links, list) else None


# A page as fetched: its bytes, the next page's link read early, Nova's clock when it answered.
_Fetched = tuple[bytes, str | None, datetime | None]


def _cancel(pending: Awaitable[object] | None) -> None:
    if isinstance(pending, asyncio.Future):
        pending.cancel()


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
        updated=str(server.updated_at or ""),
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


class _NoFileContent(logging.Filter):
    """openstacksdk logs a clouds.yaml it cannot parse with yaml's message, which quotes the
    offending line: possibly the password. The record keeps the file's name only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Skipping config file") and record.args:
            record.args = (next(iter(record.args)), "not valid YAML or JSON")
        return True


_HIDE_FILE_CONTENT = _NoFileContent()


# The service each metered operation talks to; the rest are Nova's.
_SERVICE_OF_OPERATION = {
    "find_image": "image",
    "find_network": "network",
    "find_security_group": "network",
    "get_port_quota": "network",
    "get_volume_limits": "volume",
}


def _quota_limit(value: object) -> int | None:
    """A limit of Nova's ``/limits``: -1 (or absent) is unlimited."""
    if value is None:
        return None
    limit = int(str(value))
    return None if limit < 0 else limit


def _allowance(absolute: Mapping[str, Any], limit: str, used: str) -> Allowance:
    return Allowance(_quota_limit(absolute.get(limit)), int(absolute.get(used) or 0))


def _file_states(names: Sequence[str]) -> tuple[tuple[int, int, int] | None, ...]:
    """Inode, modification time and size of each file (read through symlinks); None for one
    that cannot be read."""
    states: list[tuple[int, int, int] | None] = []
    for name in names:
        try:
            found = Path(name).stat()
        except OSError:
            states.append(None)
        else:
            states.append((found.st_ino, found.st_mtime_ns, found.st_size))
    return tuple(states)


def _service_of(operation_name: str) -> str:
    return _SERVICE_OF_OPERATION.get(operation_name, "compute")


def _operation_name(operation: Callable[..., Any]) -> str:
    """The port method a call is made for (``get_server`` for the ``get`` it defines)."""
    qualname = getattr(operation, "__qualname__", "call")
    return qualname.split(".<locals>.")[0].rpartition(".")[2].lstrip("_")


class OpenStackCloud:
    def __init__(
        self,
        settings: OpenStackSettings,
        *,
        connect: Callable[[], openstack.connection.Connection] | None = None,
        metrics: PlaceCloudMetrics | None = None,
    ) -> None:
        # openstacksdk warns about its own internals on ordinary calls; those are its
        # maintainers' business, not an operator's (the filter is process-wide by nature).
        warnings.filterwarnings("ignore", category=sdk_warnings.OpenStackDeprecationWarning)
        warnings.filterwarnings("ignore", category=sdk_warnings.RemovedInSDK50Warning)
        warnings.filterwarnings("ignore", category=sdk_warnings.RemovedInSDK60Warning)
        logging.getLogger("openstack.config").addFilter(_HIDE_FILE_CONTENT)  # once: same object
        self._settings = settings
        self._secrets = settings.auth.secrets() if settings.auth else ()
        self._connect = connect or self._default_connect
        self._shared: openstack.connection.Connection | None = None
        self._region = ""  # resolved with the first connection
        self._shared_lock = threading.Lock()
        self._threads = DaemonThreads(settings.concurrency, "osas-openstack")
        self._create_threads = DaemonThreads(settings.concurrency, "osas-openstack-create")
        self._pacer = Pacer(settings.rate_limit)
        # Calls in progress that failed for a while and are being tried again: why.
        self._retrying: dict[object, str] = {}
        self._resolved: TTLCache[tuple[str, str], str | None] = TTLCache(
            maxsize=1024, ttl=settings.resolve_ttl
        )
        self._resolving: dict[tuple[str, str], asyncio.Future[str | None]] = {}
        self._metrics = metrics
        # Token renewals after a 401, shared by every thread (see ``_authenticated``).
        self._auth_lock = threading.Lock()
        self._auth_epoch = 0
        self._renewed_at = -_KEYSTONE_RESOLUTION
        # clouds.yaml and secure.yaml as openstacksdk found them, and their state when read.
        self._credential_files: tuple[str, ...] = ()
        self._credential_states: tuple[tuple[int, int, int] | None, ...] = ()
        self._credentials_checked_at = -math.inf

    # -- plumbing ---------------------------------------------------------------------------------

    @property
    def _source(self) -> str:
        """Where the credentials come from, in the words an operator fixes them by."""
        settings = self._settings
        if settings.auth is not None:
            return "openstack.auth in osas's configuration"
        if settings.cloud and settings.clouds_file is not None:
            return f"the entry {settings.cloud!r} of {settings.clouds_file} (clouds_file)"
        if settings.cloud:
            return f"the clouds.yaml entry {settings.cloud!r} (openstack.cloud)"
        return "OS_CLOUD or the OS_* variables"

    def _default_connect(self) -> openstack.connection.Connection:
        settings = self._settings
        loader = self._config_loader()
        # The files the credentials come from, watched for changes (``_connection``).
        self._credential_files = tuple(
            name for name in (loader.config_filename, loader.secure_config_filename) if name
        )
        own_file = settings.clouds_file
        try:
            region = loader.get_one(cloud=settings.cloud, **self._connect_options())
        except sdk_exceptions.ConfigException as exc:
            if own_file is not None and loader.config_filename is None:
                raise CloudConfigurationError(
                    f"clouds_file {own_file} cannot be read or is not YAML: fix the file, or "
                    "the Secret mounted there"
                ) from None
            if settings.cloud and loader.config_filename is None:
                folders = ", ".join(dict.fromkeys(sdk_config_loader.CONFIG_SEARCH_PATH))
                raise CloudConfigurationError(
                    f"no clouds.yaml to find openstack.cloud {settings.cloud!r} in (looked at "
                    f"OS_CLIENT_CONFIG_FILE and in {folders}; a file that does not parse is "
                    "skipped): put clouds.yaml in one of those folders or name it in "
                    "OS_CLIENT_CONFIG_FILE"
                ) from None
            if settings.cloud and settings.cloud not in loader.get_cloud_names():
                raise CloudConfigurationError(
                    f"{loader.config_filename} has no cloud {settings.cloud!r} (it has "
                    f"{', '.join(sorted(loader.get_cloud_names())) or 'none'}): fix "
                    "openstack.cloud or the file"
                ) from None
            raise CloudConfigurationError(f"{exc}: fix {self._source}") from None
        self._region = region.region_name or ""
        return openstack.connection.Connection(config=region)

    def _config_loader(self) -> sdk_config_loader.OpenStackConfig:
        """openstacksdk's reader of clouds.yaml and OS_* variables, reading what this place's
        credentials may come from and nothing else."""
        settings = self._settings
        # An auth block stands alone: openstacksdk would otherwise merge it with whatever
        # clouds.yaml or OS_* variables it finds (a password next to an application
        # credential, a pinned microversion), and take a lone clouds.yaml entry as default.
        standalone = settings.auth is not None
        # A clouds_file stands alone too: its cloud is read from it (and a secure.yaml beside
        # it), never from OS_CLIENT_CONFIG_FILE, another clouds.yaml or OS_* variables.
        own_file = settings.clouds_file
        files: dict[str, Any] = {}
        if own_file is not None:
            files = {
                "config_files": [str(own_file)],
                "secure_files": [str(own_file.with_name("secure.yaml"))],
            }
        try:
            return sdk_config_loader.OpenStackConfig(
                app_name="osas",
                load_yaml_config=not standalone,
                load_envvars=not (standalone or own_file),
                **files,
            )
        except sdk_exceptions.ConfigException as exc:
            raise CloudConfigurationError(f"{exc}: fix {self._source}") from None

    def _connect_options(self) -> dict[str, Any]:
        """What the configuration says beside the cloud's own settings, for ``get_one``."""
        settings = self._settings
        options: dict[str, Any] = {"api_timeout": settings.api_timeout}
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
        return options

    def _new_connection(self) -> openstack.connection.Connection:
        """Building a connection does no I/O, so whatever fails here (openstacksdk answers an
        auth block its plugin does not take with a TypeError) is the configuration's fault and
        fails the same way every time: never an outage to retry."""
        try:
            return self._connect()
        except CloudError:
            raise
        except Exception as exc:
            message = _scrub(str(exc) or type(exc).__name__, self._secrets)
            raise CloudConfigurationError(
                f"openstacksdk cannot build a connection ({type(exc).__name__}: {message}): "
                f"fix {self._source}"
            ) from exc

    def _credentials_changed(self, *, now: bool = False) -> list[str]:
        """The files the credentials come from (clouds.yaml, secure.yaml) that changed since
        the connection was made: looked at (one stat each) at most once a second, or ``now``.
        A Secret's volume is updated in place by the kubelet (a new file behind a symlink),
        so the inode, size or time of the file read through the path changes."""
        moment = time.monotonic()
        if not now and moment - self._credentials_checked_at < _CREDENTIALS_CHECK_INTERVAL:
            return []
        self._credentials_checked_at = moment
        states = _file_states(self._credential_files)
        return [
            name
            for name, before, after in zip(
                self._credential_files, self._credential_states, states, strict=True
            )
            if before != after
        ]

    def _drop_connection_if_credentials_changed(self, *, now: bool = False) -> list[str]:
        """A new connection (one new authentication, shared by every thread) once the files
        the credentials come from changed; the files that did."""
        with self._shared_lock:
            if self._shared is None:
                return []
            changed = self._credentials_changed(now=now)
            if changed:
                # Calls in flight finish on the old connection; the next ones use the new.
                self._shared = None
                logger.info(
                    "OpenStack credentials changed; authenticating with them", files=changed
                )
        return changed

    def _replaced(self, refused: openstack.connection.Connection) -> bool:
        """After a refusal on ``refused``: whether the connection to use now is another one,
        made (or to be made) from credential files that changed: noticed now, or by another
        call since ``refused`` was taken."""
        if self._credential_files:
            self._drop_connection_if_credentials_changed(now=True)
        return self._shared is not refused

    def reload_credentials(self) -> list[str]:
        return self._drop_connection_if_credentials_changed(now=True)

    @contextmanager
    def _connection(self) -> Iterator[openstack.connection.Connection]:
        """The connection every thread shares (see the module's docstring), made on first use,
        and again when the files its credentials come from change."""
        due = time.monotonic() - self._credentials_checked_at >= _CREDENTIALS_CHECK_INTERVAL
        if self._credential_files and due:
            self._drop_connection_if_credentials_changed()
        conn = self._shared
        if conn is None:
            with self._shared_lock:
                conn = self._shared
                if conn is None:
                    # The files' states before they are read: a file replaced while the
                    # connection is made reads as changed at the next look.
                    before = _file_states(self._credential_files)
                    conn = self._new_connection()
                    after = _file_states(self._credential_files)
                    # The first connection finds the files as it reads them.
                    self._credential_states = before if len(before) == len(after) else after
                    # requests keeps 10 connections per host; every thread may hold one.
                    adapter = ks_session.TCPKeepAliveAdapter(
                        pool_maxsize=2 * self._settings.concurrency + 2
                    )
                    for scheme in ("http://", "https://"):
                        conn.session.session.mount(scheme, adapter)
                    # keystoneauth re-authenticates after a 401 in the thread that saw it, so
                    # with several threads refused at once each throws the others' new token
                    # away; osas renews once for all of them instead (``_authenticated``).
                    plugin = conn.session.auth
                    if plugin is not None:
                        # An instance attribute over the plugin's method: the one way to keep
                        # keystoneauth's session from invalidating on its own (``_renew``
                        # calls the class's).
                        plugin.invalidate = _keep_token  # type: ignore[method-assign]
                    self._shared = conn
        yield conn

    def _authenticated(
        self,
        conn: openstack.connection.Connection,
        operation: Callable[[openstack.connection.Connection], T],
    ) -> T:
        """The operation; after a 401, again with a new token. The new token is got once for
        every thread refused with the old one (an expired or revoked token costs one
        authentication), and a request answered 401 did nothing, so even a create may be sent
        with the new token. Keystone keeps a token's issue time in whole seconds and refuses
        tokens issued within the second of a revocation too, so a new token refused is
        renewed once more, a second after it was issued; refused again, the credentials
        themselves are refused."""
        for renewal in range(_RENEWALS + 1):
            epoch = self._auth_epoch
            try:
                return operation(conn)
            except Exception as exc:
                if not _unauthorized(exc) or renewal == _RENEWALS:
                    raise
            self._renew(conn, epoch)
        raise AssertionError("unreachable: the last renewal's failure is raised")

    def _renew(self, conn: openstack.connection.Connection, epoch: int) -> None:
        """A new token for every thread refused with the one of ``epoch``, got once."""
        with self._auth_lock:
            if self._auth_epoch != epoch:  # renewed since that call began
                return
            # Not within the second of the previous renewal: that token was refused, and one
            # of the same second would be too.
            wait = self._renewed_at + _KEYSTONE_RESOLUTION - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            # The refused connection's own token, never the one of a connection made since
            # (a rotation's): its plugin's own method, under the instance attribute.
            plugin = conn.session.auth
            if plugin is not None:
                type(plugin).invalidate(plugin)
            conn.session.get_auth_headers()  # authenticate now, under the lock
            self._renewed_at = time.monotonic()
            self._auth_epoch += 1
            logger.info("OpenStack refused the token; authenticated again")

    async def _once(
        self,
        operation: Callable[[openstack.connection.Connection], T],
        *,
        failure: Callable[[Exception, tuple[str, ...]], CloudError] = _translate,
        threads: DaemonThreads | None = None,
        rated: bool = True,
        operation_name: str | None = None,
    ) -> T:
        """One call in a worker thread; every failure leaves as a CloudError. ``rated``: it
        sends a request to OpenStack, so it waits its turn under the rate limit, and is
        counted in the metrics (under ``operation_name``, by default the port method's)."""
        secrets = self._secrets

        def run() -> T:
            try:
                with self._connection() as conn:
                    try:
                        return self._authenticated(conn, operation)
                    except Exception as exc:
                        # Refused even with a fresh token: a rotated credential whose file
                        # changed since is tried at once (a 401 did nothing, so even a create
                        # may be).
                        if not _unauthorized(exc) or not self._replaced(conn):
                            raise
                with self._connection() as conn:
                    return self._authenticated(conn, operation)
            except Exception as exc:
                raise failure(exc, secrets) from exc

        if not rated:
            return await (threads or self._threads).run(run)
        await self._pacer.wait_turn()
        name = operation_name or _operation_name(operation)
        begun = time.perf_counter()
        try:
            result = await (threads or self._threads).run(run)
        except RateLimited as exc:
            self._pacer.refused(exc.retry_after)
            self._observe(name, exc, begun)
            raise
        except CloudError as exc:
            self._observe(name, exc, begun)
            raise
        self._pacer.answered()
        self._observe(name, None, begun)
        return result

    def _observe(self, name: str, error: CloudError | None, begun: float) -> None:
        if self._metrics is not None:
            self._metrics.observe(_service_of(name), name, error, time.perf_counter() - begun)
            self._metrics.set_pace(self._pacer.rate)

    async def _call(
        self,
        operation: Callable[[openstack.connection.Connection], T],
        *,
        rated: bool = True,
        operation_name: str | None = None,
    ) -> T:
        """An idempotent call, retried on transient failures. A rate limit's refusal is not
        one of ``attempts``: the call is sent again at the pacer's pace (which honours
        ``Retry-After``) for up to ``_RATE_LIMITED_PATIENCE`` seconds."""
        settings = self._settings
        failures = 0
        begun = time.monotonic()
        call = object()  # this call's key among those being retried
        try:
            while True:
                try:
                    return await self._once(operation, rated=rated, operation_name=operation_name)
                except RateLimited:
                    if time.monotonic() - begun >= _RATE_LIMITED_PATIENCE:
                        raise
                except CloudUnavailable as exc:
                    failures += 1
                    if failures >= settings.attempts:
                        raise
                    self._retrying[call] = (
                        f"{exc} (try {failures} of openstack.attempts, {settings.attempts}; "
                        "trying again)"
                    )
                    # Exponential, with jitter so that threads refused together spread out.
                    delay = min(settings.backoff_max, settings.backoff * 2 ** (failures - 1))
                    await anyio.sleep(delay + random.uniform(0, settings.backoff))  # noqa: S311
        finally:
            self._retrying.pop(call, None)

    def retrying(self) -> str | None:
        return next(reversed(self._retrying.values()), None)

    def region(self) -> str:
        return self._region

    # -- the port ---------------------------------------------------------------------------------

    async def verify(self) -> str:
        try:
            return await self._verify()
        except CredentialsRefused as exc:
            raise CredentialsRefused(
                f"{exc}: check the user, password, project or application credential in "
                f"{self._source}"
            ) from exc.__cause__

    async def _verify(self) -> str:
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
        self,
        tag: str | None,
        *,
        changes_since: datetime | None = None,
        status: str | None = None,
    ) -> ServerListing:
        # Nova may show a server twice across pages while builds are in flight: keep one
        # record per id (the later one, which is the newer view).
        records: dict[str, ServerRecord] = {}
        nova_time: datetime | None = None
        first = True
        async for page in self.list_server_pages(tag, changes_since=changes_since, status=status):
            if first:
                nova_time, first = page.nova_time, False
            records.update((record.server_id, record) for record in page.records)
        return ServerListing(list(records.values()), nova_time)

    async def list_changes(self, since: datetime) -> ServerListing:
        return await self.list_servers(None, changes_since=since)

    async def list_building(self, tag: str) -> ServerListing:
        return await self.list_servers(tag, status="BUILD")

    async def list_server_pages(
        self,
        tag: str | None,
        *,
        changes_since: datetime | None = None,
        status: str | None = None,
    ) -> AsyncIterator[ServerListing]:
        # No `limit`: Nova pages at its [api] max_limit and links the next page.
        first: dict[str, str] = {} if tag is None else {"tags": tag}
        if status is not None:
            first["status"] = status
        if changes_since is not None:
            # Whole seconds: Nova's `updated` has no fraction, and a fraction in the filter
            # could step over a change made within the same second.
            first["changes-since"] = changes_since.replace(microsecond=0).isoformat()
        microversion = await self._call(self._compute_microversion, rated=False)

        def fetch(url: str, query: dict[str, str] | None) -> Awaitable[_Fetched]:
            def get(conn: openstack.connection.Connection) -> _Fetched:
                response = conn.compute.get(url, params=query, microversion=microversion)
                sdk_exceptions.raise_from_response(response)
                content = response.content
                return content, _next_page_early(content), _nova_time(response.headers)

            # Each page retried on its own; the next link carries the query.
            return asyncio.ensure_future(self._call(get))

        def parse(content: bytes) -> tuple[list[ServerRecord], str | None]:
            try:
                return _records_of_page(content)
            except Exception as exc:
                raise _translate(exc, self._secrets) from exc

        pending: Awaitable[_Fetched] | None = fetch("/servers/detail", first)
        try:
            while pending is not None:
                content, guessed, nova_time = await pending
                pending = fetch(guessed, None) if guessed else None
                records, url = await self._threads.run(functools.partial(parse, content))
                del content  # the caller may drop the page before the next one comes
                if url != guessed:  # the guess was wrong: follow the page's own link
                    _cancel(pending)
                    pending = fetch(url, None) if url else None
                yield ServerListing(records, nova_time)
        finally:
            _cancel(pending)

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

    async def delete_server_if(
        self, server_id: str, still: Callable[[ServerRecord], bool]
    ) -> bool | None:
        # The read and the DELETE in one thread call: a mark removed by hand can land
        # between them only within Nova's round trip, never while osas's loop is busy.
        def read_then_delete(conn: openstack.connection.Connection) -> bool | None:
            try:
                record = _record(conn.compute.get_server(server_id))
            except sdk_exceptions.NotFoundException:
                return None
            if not still(record):
                return False
            conn.compute.delete_server(server_id, ignore_missing=True)
            return True

        return await self._call(read_then_delete)

    async def replace_metadata_if(
        self, server_id: str, metadata: Mapping[str, str], still: Callable[[ServerRecord], bool]
    ) -> ServerRecord | bool | None:
        microversion = await self._call(self._compute_microversion, rated=False)

        # Like read_then_delete: read and write in one thread call. Sent again after a lost
        # answer, the read finds the write done, and ``still`` accepts that too.
        def read_then_replace(conn: openstack.connection.Connection) -> ServerRecord | bool | None:
            try:
                record = _record(conn.compute.get_server(server_id))
            except sdk_exceptions.NotFoundException:
                return None
            if not still(record):
                return False
            response = conn.compute.put(
                f"/servers/{server_id}/metadata",
                json={"metadata": dict(metadata)},
                microversion=microversion,
                raise_exc=False,
            )
            sdk_exceptions.raise_from_response(response)
            return dataclasses.replace(record, metadata=dict(response.json()["metadata"]))

        return await self._call(read_then_replace, operation_name="replace_server_metadata")

    async def server_action(self, server_id: str, action: str) -> None:
        microversion = await self._call(self._compute_microversion, rated=False)

        def act(conn: openstack.connection.Connection) -> None:
            # Once: an action sent again after a lost answer meets the task it started (409);
            # whoever sent it reads the server again instead.
            path = f"/servers/{server_id}/action"
            response = _post_once(conn, path, {action: None}, microversion)
            sdk_exceptions.raise_from_response(response)

        await self._once(act, operation_name=f"server_{action.replace('-', '_')}")

    async def console_output(self, server_id: str, lines: int) -> str:
        microversion = await self._call(self._compute_microversion, rated=False)

        def read(conn: openstack.connection.Connection) -> str:
            response = conn.compute.post(
                f"/servers/{server_id}/action",
                json={"os-getConsoleOutput": {"length": lines}},
                microversion=microversion,
                raise_exc=False,
            )
            sdk_exceptions.raise_from_response(response)
            return str(response.json().get("output") or "")

        return await self._call(read, operation_name="get_console_output")

    async def get_flavor(self, name_or_id: str) -> Flavor | None:
        def get(conn: openstack.connection.Connection) -> Flavor | None:
            flavor = conn.compute.find_flavor(name_or_id, ignore_missing=True, get_extra_specs=True)
            return None if flavor is None else _flavor(flavor)

        return await self._call(get)

    async def get_quota(
        self, server_groups: Sequence[str], *, volumes: bool = False
    ) -> ProjectQuota:
        quota = await self._compute_quota(server_groups)
        unread: dict[str, str] = {}

        def port_quota(conn: openstack.connection.Connection) -> Allowance:
            project_id = conn.current_project_id
            if project_id is None:
                raise RequestRejected("the token names no project: no port quota to read")
            found = conn.network.get_quota(project_id, details=True)
            ports = found.ports or {}
            return Allowance(_quota_limit(ports.get("limit")), int(ports.get("used") or 0))

        def volume_limits(conn: openstack.connection.Connection) -> tuple[Allowance, Allowance]:
            absolute = conn.block_storage.get_limits().absolute
            return (
                Allowance(_quota_limit(absolute.max_total_volumes), absolute.total_volumes_used),
                Allowance(
                    _quota_limit(absolute.max_total_volume_gigabytes),
                    absolute.total_gigabytes_used,
                ),
            )

        ports = Allowance(None)
        try:
            ports = await self._call(port_quota, operation_name="get_port_quota")
        except CloudError as exc:  # Neutron without the quota API, or a policy: unbounded
            unread["ports"] = str(exc)
        volume_count = volume_gib = Allowance(None)
        if volumes:
            try:
                volume_count, volume_gib = await self._call(
                    volume_limits, operation_name="get_volume_limits"
                )
            except CloudError as exc:
                unread["volumes"] = str(exc)
        return dataclasses.replace(
            quota, ports=ports, volumes=volume_count, volume_gib=volume_gib, unread=unread
        )

    async def _compute_quota(self, server_groups: Sequence[str]) -> ProjectQuota:
        """Nova's limits and usage, and each server group's members."""
        microversion = await self._call(self._compute_microversion, rated=False)

        def get_json(path: str) -> Any:
            def get(conn: openstack.connection.Connection) -> Any:
                response = conn.compute.get(path, microversion=microversion, raise_exc=False)
                sdk_exceptions.raise_from_response(response)
                return response.json()

            return get

        limits = get_json("/limits")
        body = await self._call(limits, operation_name="get_limits")
        try:
            absolute = body["limits"]["absolute"]
            members_limit = _quota_limit(absolute.get("maxServerGroupMembers"))
            members: dict[str, Allowance] = {}
            for name in server_groups:
                group_id = await self._resolve_id("server group", name)
                if group_id is None:
                    continue  # check-config says so; the create fails with the reason
                group = get_json(f"/os-server-groups/{group_id}")
                answer = await self._call(group, operation_name="get_server_group")
                members[name] = Allowance(members_limit, len(answer["server_group"]["members"]))
            return ProjectQuota(
                instances=_allowance(absolute, "maxTotalInstances", "totalInstancesUsed"),
                cores=_allowance(absolute, "maxTotalCores", "totalCoresUsed"),
                ram_mib=_allowance(absolute, "maxTotalRAMSize", "totalRAMUsed"),
                server_group_members=members,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestRejected(f"Nova's limits are unreadable: {exc!r}") from exc

    async def _resolve_id(self, kind: str, name_or_id: str) -> str | None:
        """A name's id, looked up once for all callers: a hundred creates asking at once for
        the same flavor make one request."""
        key = (kind, name_or_id)
        if key in self._resolved:
            return self._resolved[key]
        pending = self._resolving.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._look_up(kind, name_or_id))
            self._resolving[key] = pending
            pending.add_done_callback(lambda _: self._resolving.pop(key, None))
        # Shielded: a caller that gives up does not cancel the look-up the others wait for.
        return await asyncio.shield(pending)

    async def _look_up(self, kind: str, name_or_id: str) -> str | None:
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

        resource_id = await self._call(find, operation_name=f"find_{kind.replace(' ', '_')}")
        if resource_id is not None:
            self._resolved[kind, name_or_id] = resource_id
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
            raise _before_create(exc) from exc

        def prepare(conn: openstack.connection.Connection) -> str:
            # Token, endpoint and microversion first, so that a failure of the POST below can
            # only be the POST's own.
            conn.session.get_auth_headers()
            conn.compute.get_endpoint()
            return self._compute_microversion(conn)

        try:
            # Not rated: the token, endpoint and microversion are cached after the first call.
            microversion = await self._call(prepare, rated=False)
        except CloudUnavailable as exc:
            raise _before_create(exc) from exc

        def create(conn: openstack.connection.Connection) -> ServerRecord:
            # Sent once: a resend after a dropped connection or a 503 can make a second server.
            response = _post_once(conn, "/servers", body, microversion)
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
        conn, self._shared = self._shared, None
        # In a thread of its own: at shutdown the pools may all be stuck in calls.
        if conn is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT):
                await DaemonThreads(1, "osas-openstack-close").run(conn.close)
        self._threads.close()
        self._create_threads.close()
