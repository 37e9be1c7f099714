"""A stand-in for a kube-apiserver's Lease and EndpointSlice APIs on 127.0.0.1, for the
election's tests and the benchmark's failovers (osas's side of the election is
``osas.election``; this is the other side, as the simulator is Nova's).

No real API server can run here, so this serves exactly what lightkube calls for
``coordination.k8s.io/v1`` Leases and ``discovery.k8s.io/v1`` EndpointSlices, with the
semantics the election relies on, as the real server has them (kubernetes' generic registry
store, ``pkg/registry/coordination/lease`` and ``pkg/registry/discovery/endpointslice``):

- one global, increasing ``metadata.resourceVersion`` (a string); ``uid`` and
  ``creationTimestamp`` set on create and kept by updates; an update that changes nothing
  stores nothing and keeps its resourceVersion (etcd3's GuaranteedUpdate);
- PUT carrying a resourceVersion that is not the current one: 409 Conflict; PUT carrying a
  ``uid`` that is not the stored one (deleted, or deleted and made again): 409 Conflict (the
  UID precondition);
- Leases: PUT without a resourceVersion is 422 Invalid ("must be specified for an update")
  and PUT of a missing Lease without a uid creates it (201), as the Lease strategy's
  ``AllowUnconditionalUpdate`` (false) and ``AllowCreateOnUpdate`` (true) say;
  EndpointSlices: the other way round, PUT without a resourceVersion is applied and PUT of a
  missing slice is 404 NotFound;
- POST of an existing name: 409 AlreadyExists; GET and DELETE of a missing one: 404 NotFound;
- MicroTimes (acquireTime, renewTime) parsed as the API server parses them, RFC 3339 with
  exactly six fractional digits (anything else is a 400), and written back in UTC;
- an EndpointSlice validated as the server does the parts a client can get wrong (addressType,
  immutable once created; addresses of that family, 1 to 100 per endpoint; unique port names,
  ports and protocols; labels), with its ports defaulted (protocol TCP, name ""). One rule is
  left out on purpose: the real server refuses loopback addresses, which are all the tests can
  dial here;
- bearer tokens: an unknown one is 401, one not granted the namespace and resource is 403
  Forbidden;
- every refusal is a ``Status`` object with ``Content-Type: application/json`` (lightkube
  builds an ``ApiError`` from nothing else).

Core ``v1`` Secrets are served too (what osas's join tokens make): ``stringData`` merged into
``data`` (base64) as the API server's conversion does, ``type`` immutable, ``dryRun=All``
judged in full and stored nowhere. Bearer tokens of the form ``<id>.<secret>`` authenticate as
the API server's bootstrap token authenticator lets them (``--enable-bootstrap-token-auth``):
a Secret ``kube-system/bootstrap-token-<id>`` of type ``bootstrap.kubernetes.io/token`` whose
``token-id`` and ``token-secret`` match, with ``usage-bootstrap-authentication: "true"``, not
past its ``expiration`` (by ``wall_clock``, which tests may move), and only
``system:bootstrappers:`` groups in ``auth-extra-groups``; such a user is
``system:bootstrap:<id>`` and may ask who it is (``SelfSubjectReview``) and nothing else.

Watch and PATCH are not served (the election uses neither); a list takes an equality
``labelSelector``. Fault hooks: ``unreachable`` ("hang": requests are never answered nor
applied, as in a partition, until it is cleared; "drop": the connection is closed without an
answer), ``cut_off`` (tokens whose requests hang so: one client partitioned, the others
answered) and ``latency`` (seconds before each request is handled). ``writes`` records every
applied write with the monotonic time it was applied, so that tests can order events on the
server's side. ``service_endpoint`` plays kube-proxy: where a connection to a Service goes.

Run alone: ``python -m osas.sim.kubernetes --port N [--kubeconfig PATH]`` prints one JSON line
(url, port, token, kubeconfig) and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import copy
import hmac
import json
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from osas.sim.serving import BackgroundHttp, TrackedHandler, TrackedHttpServer

GROUP = "coordination.k8s.io"
API_VERSION = f"{GROUP}/v1"
DISCOVERY_GROUP = "discovery.k8s.io"
LEASES, ENDPOINT_SLICES, SECRETS = "leases", "endpointslices", "secrets"
BOOTSTRAP_TOKEN_TYPE = "bootstrap.kubernetes.io/token"  # noqa: S105 - a Secret type's name
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
DEFAULT_TOKEN = "osas-standin-token"  # noqa: S105 - the stand-in's own test token
DEFAULT_USER = "system:serviceaccount:kube-system:osas"
HANG, DROP = "hang", "drop"
# The API server's bounds on what a client writes (label values, endpoints and addresses of a
# slice, port numbers).
_LABEL_VALUE_MAX = 63
_ENDPOINTS_MAX = 1000
_ADDRESSES_MAX = 100
_PORT_MAX = 65535

_PATH = re.compile(r"^/apis?/(?:([^/]+)/)?v1/namespaces/([^/]+)/([^/]+?)(?:/([^/]+))?/?$")
_SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
# The bootstrap token authenticator's rules (k8s.io/cluster-bootstrap).
_BOOTSTRAP_TOKEN = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
_BOOTSTRAP_GROUP = re.compile(r"^system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_CONFLICT_MESSAGE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


@dataclass(frozen=True, slots=True)
class Write:
    """One write the stand-in applied."""

    at: float  # time.monotonic() when applied (the tests' process shares the clock)
    verb: str  # create, update, delete
    namespace: str
    name: str
    holder: str | None  # a Lease's holderIdentity; None for an EndpointSlice
    resource_version: str
    resource: str = LEASES
    endpoints: tuple[str, ...] = ()  # an EndpointSlice's ready "ip:port"s, as kube-proxy sees


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request the stand-in answered (or dropped: status 0)."""

    verb: str
    namespace: str
    name: str
    status: int
    resource: str = LEASES


class Refusal(Exception):
    """An answer other than success, as the API server words it."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            status["details"] = self.details
        return status


@dataclass(frozen=True, slots=True)
class _Kind:
    """One resource the stand-in serves, with the rules its registry strategy sets."""

    group: str
    plural: str
    kind: str
    create_on_update: bool  # AllowCreateOnUpdate: PUT of a missing object creates it
    unconditional_update: bool  # AllowUnconditionalUpdate: PUT without a resourceVersion
    immutable: tuple[str, ...]  # top-level fields an update may not change
    # The object's fields besides metadata, validated and defaulted as the server stores them.
    body: Callable[[_Kind, str, dict[str, Any]], dict[str, Any]]

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    def subject(self, name: str) -> str:
        plural = f"{self.plural}.{self.group}" if self.group else self.plural
        return f'{plural} "{name}"' if name else plural

    def details(self, name: str) -> dict[str, Any]:
        return {"name": name, "group": self.group, "kind": self.plural}


def _not_found(kind: _Kind, name: str) -> Refusal:
    return Refusal(404, "NotFound", f"{kind.subject(name)} not found", kind.details(name))


def _conflict(kind: _Kind, name: str, why: str) -> Refusal:
    return Refusal(
        409,
        "Conflict",
        f"Operation cannot be fulfilled on {kind.subject(name)}: {why}",
        kind.details(name),
    )


def _invalid(kind: _Kind, name: str, field: str, value: object, detail: str) -> Refusal:
    cause = f"Invalid value: {json.dumps(value)}: {detail}"
    return Refusal(
        422,
        "Invalid",
        f'{kind.kind}.{kind.group} "{name}" is invalid: {field}: {cause}',
        {
            "name": name,
            "group": kind.group,
            "kind": kind.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": field}],
        },
    )


def _bad_request(message: str) -> Refusal:
    return Refusal(400, "BadRequest", message)


def _micro_time(value: object, field: str) -> str:
    """A MicroTime as the API server decodes and re-encodes it (UTC, six digits)."""
    if not isinstance(value, str) or not _MICRO_TIME.fullmatch(value):
        raise _bad_request(
            f'Lease in version "v1" cannot be handled as a Lease: {field}: parsing time '
            f'{json.dumps(value)} as "2006-01-02T15:04:05.000000Z07:00": cannot parse'
        )
    moment = datetime.fromisoformat(value).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _check_metadata(kind: _Kind, name: str, metadata: dict[str, Any]) -> None:
    """What every object's metadata must be: a DNS subdomain for a name, qualified names for
    label and annotation keys, label values of at most 63 characters."""
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise _invalid(kind, name, "metadata.name", name, "a lowercase RFC 1123 subdomain")
    for field in ("labels", "annotations"):
        for key, value in (metadata.get(field) or {}).items():
            prefix, _, short = key.rpartition("/")
            if not _QUALIFIED_NAME.fullmatch(short) or (
                prefix and not _DNS_SUBDOMAIN.fullmatch(prefix)
            ):
                raise _invalid(
                    kind, name, f"metadata.{field}", key, "name part must be a qualified name"
                )
            if field == "labels" and not (
                isinstance(value, str)
                and len(value) <= _LABEL_VALUE_MAX
                and _LABEL_VALUE.fullmatch(value)
            ):
                raise _invalid(kind, name, "metadata.labels", value, "a valid label value")


def _lease_body(kind: _Kind, name: str, document: dict[str, Any]) -> dict[str, Any]:
    """The Lease strategy's validation, the parts a client can get wrong."""
    spec = dict(document.get("spec") or {})
    for field in ("acquireTime", "renewTime"):
        if spec.get(field) is not None:
            spec[field] = _micro_time(spec[field], f"spec.{field}")
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        raise _invalid(kind, name, "spec.leaseDurationSeconds", duration, "must be greater than 0")
    transitions = spec.get("leaseTransitions")
    if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
        raise _invalid(
            kind, name, "spec.leaseTransitions", transitions, "must be greater than or equal to 0"
        )
    holder = spec.get("holderIdentity")
    if holder is not None and not isinstance(holder, str):
        raise _bad_request("spec.holderIdentity: expects a string")
    return {"spec": spec}


_ADDRESS_FAMILIES: dict[str, type[IPv4Address | IPv6Address]] = {
    "IPv4": IPv4Address,
    "IPv6": IPv6Address,
}


def _endpoint_slice_body(kind: _Kind, name: str, document: dict[str, Any]) -> dict[str, Any]:
    """The EndpointSlice validation (``ValidateEndpointSlice``) and defaulting
    (``SetDefaults_EndpointPort``), the parts a client can get wrong."""
    address_type = document.get("addressType")
    if address_type not in {"IPv4", "IPv6", "FQDN"}:
        raise _invalid(kind, name, "addressType", address_type, 'supported: "IPv4", "IPv6"')
    endpoints = document.get("endpoints") or []
    if not isinstance(endpoints, list) or len(endpoints) > _ENDPOINTS_MAX:
        raise _invalid(kind, name, "endpoints", len(endpoints), "at most 1000 endpoints")
    for index, endpoint in enumerate(endpoints):
        _check_endpoint(kind, name, f"endpoints[{index}]", endpoint, address_type)
    ports = [dict(port) for port in document.get("ports") or []]
    names: set[str] = set()
    for index, port in enumerate(ports):
        port.setdefault("name", "")
        port.setdefault("protocol", "TCP")
        _check_port(kind, name, f"ports[{index}]", port, names)
        names.add(port["name"])
    return {"addressType": address_type, "endpoints": endpoints, "ports": ports}


def _check_endpoint(kind: _Kind, name: str, path: str, endpoint: object, address_type: str) -> None:
    if not isinstance(endpoint, dict):
        raise _bad_request(f"{path}: expects an object")
    addresses = endpoint.get("addresses")
    if not isinstance(addresses, list) or not 1 <= len(addresses) <= _ADDRESSES_MAX:
        raise _invalid(kind, name, f"{path}.addresses", addresses, "1 to 100 addresses")
    family = _ADDRESS_FAMILIES.get(address_type)
    for address in addresses:
        # The real server also refuses loopback addresses: allowed here, see the top.
        try:
            parsed = ip_address(address) if family else None
        except ValueError:
            parsed = None
        if family and not isinstance(parsed, family):
            raise _invalid(
                kind, name, f"{path}.addresses", address, f"must be a valid {address_type}"
            )
    conditions = endpoint.get("conditions") or {}
    if any(value is not None and not isinstance(value, bool) for value in conditions.values()):
        raise _bad_request(f"{path}.conditions: expects booleans")


def _check_port(kind: _Kind, name: str, path: str, port: dict[str, Any], names: set[str]) -> None:
    if port["name"] and not _DNS_LABEL_NAME.fullmatch(port["name"]):
        raise _invalid(kind, name, f"{path}.name", port["name"], "a DNS-1123 label")
    if port["name"] in names:
        raise _invalid(kind, name, f"{path}.name", port["name"], "Duplicate value")
    number = port.get("port")
    if number is not None and (not isinstance(number, int) or not 1 <= number <= _PORT_MAX):
        raise _invalid(kind, name, f"{path}.port", number, "between 1 and 65535")
    if port["protocol"] not in {"TCP", "UDP", "SCTP"}:
        raise _invalid(kind, name, f"{path}.protocol", port["protocol"], "TCP, UDP or SCTP")


LEASE = _Kind(
    group=GROUP,
    plural=LEASES,
    kind="Lease",
    create_on_update=True,
    unconditional_update=False,
    immutable=(),
    body=_lease_body,
)
ENDPOINT_SLICE = _Kind(
    group=DISCOVERY_GROUP,
    plural=ENDPOINT_SLICES,
    kind="EndpointSlice",
    create_on_update=False,
    unconditional_update=True,
    immutable=("addressType",),
    body=_endpoint_slice_body,
)


def _secret_body(kind: _Kind, name: str, document: dict[str, Any]) -> dict[str, Any]:
    """A Secret as stored: ``stringData`` merged into ``data`` (base64, winning over it),
    every key a valid one, every ``data`` value base64; ``type`` defaulted to Opaque."""
    data: dict[str, str] = {}
    for key, value in (document.get("data") or {}).items():
        try:
            base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise _invalid(kind, name, f"data[{key}]", "", "illegal base64 data") from None
        data[key] = value
    for key, value in (document.get("stringData") or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    for key in data:
        if not _SECRET_KEY.fullmatch(key):
            raise _invalid(
                kind,
                name,
                "data",
                key,
                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            )
    return {"type": document.get("type") or "Opaque", "data": data}


SECRET = _Kind(
    group="",
    plural=SECRETS,
    kind="Secret",
    create_on_update=False,
    unconditional_update=True,
    immutable=("type",),
    body=_secret_body,
)
_KINDS = {kind.plural: kind for kind in (LEASE, ENDPOINT_SLICE, SECRET)}


def _secret_text(secret: dict[str, Any], key: str) -> str:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value).decode() if value else ""


def bootstrap_user(
    secrets_by_name: Callable[[str], dict[str, Any] | None], token: str, now: datetime
) -> tuple[str, list[str]] | None:
    """Who a bootstrap token is, as the API server's authenticator says, or None."""
    match = _BOOTSTRAP_TOKEN.fullmatch(token)
    if match is None:
        return None
    token_id, token_secret = match.groups()
    secret = secrets_by_name(f"bootstrap-token-{token_id}")
    if secret is None or not _admits(secret, token_id, token_secret, now):
        return None
    extra = _secret_text(secret, "auth-extra-groups")
    groups = ["system:bootstrappers", *filter(None, (g.strip() for g in extra.split(",")))]
    if not all(_BOOTSTRAP_GROUP.fullmatch(group) for group in groups[1:]):
        return None
    return f"system:bootstrap:{token_id}", groups


def _admits(secret: dict[str, Any], token_id: str, token_secret: str, now: datetime) -> bool:
    """The Secret is a bootstrap token's, the token's, for authentication, and not expired
    (an expiration that does not parse counts as past)."""
    expiration = _secret_text(secret, "expiration")
    if expiration:
        try:
            expires = datetime.fromisoformat(expiration)
        except ValueError:
            return False
        if expires.tzinfo is None or now >= expires:
            return False
    return (
        secret.get("type") == BOOTSTRAP_TOKEN_TYPE
        and hmac.compare_digest(_secret_text(secret, "token-secret"), token_secret)
        and _secret_text(secret, "token-id") == token_id
        and _secret_text(secret, "usage-bootstrap-authentication") == "true"
    )


def routes(endpoint_slice: dict[str, Any]) -> list[tuple[str, int, str]]:
    """Where kube-proxy sends a connection through this slice: the first address of each
    ready endpoint (ready unset counts as ready), on each numbered port, by port name."""
    if endpoint_slice.get("addressType") not in _ADDRESS_FAMILIES:
        return []  # kube-proxy ignores FQDN slices
    ports = [port for port in endpoint_slice.get("ports") or [] if port.get("port")]
    return [
        (endpoint["addresses"][0], port["port"], port.get("name") or "")
        for endpoint in endpoint_slice.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready") is not False
        for port in ports
    ]


def _route_text(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class _HttpServer(TrackedHttpServer):
    def __init__(self, address: tuple[str, int], standin: KubeStandIn) -> None:
        self.standin = standin
        super().__init__(address, _Handler)


class _Handler(TrackedHandler):
    server: _HttpServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        answer = self.server.standin.handle(
            self.command, self.path, self.headers.get("Authorization", ""), body
        )
        if answer is None:
            self.close_connection = True  # nothing written: the client reads EOF
            return
        status, document = answer
        payload = json.dumps(document).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up first

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve  # noqa: N815 - the stdlib's names

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        del format, args  # tests read ``history``, not a log


@dataclass(frozen=True, slots=True)
class _Grant:
    user: str
    namespaces: frozenset[str] | None  # None: every namespace
    resources: (
        frozenset[str] | None
    )  # None: every resource served (leases, endpointslices, secrets)


class KubeStandIn(BackgroundHttp):
    """The Lease and EndpointSlice APIs on 127.0.0.1 (port 0: any free port), in a daemon
    thread.

    ``DEFAULT_TOKEN`` is granted everything; ``grant`` adds tokens (or changes one's grant),
    limited to some namespaces and resources if asked. Tests read and change the stored
    objects with ``lease``, ``put_lease``, ``delete_lease``, ``endpoint_slice``,
    ``put_endpoint_slice`` and ``delete_endpoint_slice`` (as another client's writes would),
    see the traffic in ``calls`` (by verb), ``history`` and ``writes``, and ask where a
    Service's connections go with ``service_endpoint``.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._requested_port = port
        self.lock = threading.Lock()
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self._version = 0
        self._grants: dict[str, _Grant] = {DEFAULT_TOKEN: _Grant(DEFAULT_USER, None, None)}
        self.unreachable: str | None = None  # HANG or DROP
        # Tokens whose requests hang as with HANG, the others answered: one client cut off.
        self.cut_off: set[str] = set()
        self.latency = 0.0
        # The server's clock: creationTimestamps and bootstrap tokens' expirations.
        self.wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self.calls: Counter[str] = Counter()
        self.history: list[Exchange] = []
        self.writes: list[Write] = []
        super().__init__()

    # -- set-up and faults ------------------------------------------------------------------------

    def grant(
        self,
        token: str,
        namespaces: set[str] | None = None,
        *,
        resources: set[str] | None = None,
        user: str = DEFAULT_USER,
    ) -> None:
        """Accept ``token`` as ``user``, allowed every verb on ``resources`` ("leases",
        "endpointslices", "secrets"; None: all three) in ``namespaces`` (None: all of them).
        Granting a token again replaces its grant, as an edited Role would."""
        with self.lock:
            self._grants[token] = _Grant(
                user,
                None if namespaces is None else frozenset(namespaces),
                None if resources is None else frozenset(resources),
            )

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(LEASE, namespace, name)

    def put_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        """Store ``lease`` as another client's unconditional write would: a new
        resourceVersion, the uid kept if it existed."""
        return self._put(LEASE, namespace, name, lease)

    def delete_lease(self, namespace: str, name: str) -> None:
        self._delete(LEASE, namespace, name)

    def endpoint_slice(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(ENDPOINT_SLICE, namespace, name)

    def put_endpoint_slice(
        self, namespace: str, name: str, endpoint_slice: dict[str, Any]
    ) -> dict[str, Any]:
        """Store ``endpoint_slice`` as another client's unconditional write would."""
        return self._put(ENDPOINT_SLICE, namespace, name, endpoint_slice)

    def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        self._delete(ENDPOINT_SLICE, namespace, name)

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(SECRET, namespace, name)

    def secrets(self, namespace: str) -> list[dict[str, Any]]:
        with self.lock:
            return [
                copy.deepcopy(stored)
                for (plural, where, _), stored in sorted(self._objects.items())
                if plural == SECRETS and where == namespace
            ]

    def service_endpoint(
        self, namespace: str, service: str, port_name: str | None = None
    ) -> tuple[str, int] | None:
        """Where kube-proxy sends a connection to ``service`` (on its port ``port_name``;
        None: any): the address and port of the ready endpoint of the EndpointSlices labelled
        for it, or None when it has none. Several distinct endpoints are an error here: the
        Service has one writer behind it, and kube-proxy would spread connections."""
        with self.lock:
            slices = [
                stored
                for (plural, where, _), stored in self._objects.items()
                if plural == ENDPOINT_SLICES
                and where == namespace
                and (stored["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == service
            ]
            found = {
                (address, port)
                for endpoint_slice in slices
                for address, port, name in routes(endpoint_slice)
                if port_name is None or name == port_name
            }
        if len(found) > 1:
            raise AssertionError(f"service {namespace}/{service} has several endpoints: {found}")
        return found.pop() if found else None

    def write_kubeconfig(
        self, path: Path, *, token: str = DEFAULT_TOKEN, namespace: str = "default"
    ) -> Path:
        """A kubeconfig for this stand-in, authenticating with ``token``."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "standin",
                    "context": {"cluster": "standin", "user": "standin", "namespace": namespace},
                }
            ],
            "current-context": "standin",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._serve(_HttpServer((self.host, self._requested_port), self), "kube-standin")

    @property
    def port(self) -> int:
        port = self.serving_port
        if port is None:
            raise RuntimeError("the stand-in is not running")
        return port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- the API ----------------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, authorization: str, body: bytes
    ) -> tuple[int, dict[str, Any]] | None:
        """One request: (status, JSON document), or None to close the connection unanswered."""
        url = urlsplit(target)
        match = _PATH.fullmatch(url.path)
        kind = _KINDS.get(match.group(3)) if match else None
        if (
            match is None
            or kind is None
            or kind.group != (match.group(1) or "")
            or url.path.startswith("/api/") != (kind.group == "")
        ):
            kind, namespace, name = None, "", ""
        else:
            namespace, name = match.group(2), match.group(4) or ""
        verb = self._verb(method, name)
        resource = kind.plural if kind else ""
        token = authorization.partition(" ")[2]
        if self._hangs(token):
            # Never answered nor applied; the connection is closed once the fault is cleared,
            # long after the client gave up.
            while self._hangs(token) and not self.stopping.wait(0.01):
                pass
        if self.unreachable in {HANG, DROP}:
            self._exchange(verb, namespace, name, 0, resource)
            return None
        if self.latency:
            time.sleep(self.latency)
        try:
            if method == "POST" and url.path == _SELF_SUBJECT_REVIEWS:
                status, document = 201, self._self_subject_review(authorization)
            else:
                kind = self._admit(authorization, kind, verb, namespace, name)
                with self.lock:
                    status, document = self._route(
                        kind, verb, namespace, name, body=body, query=url.query
                    )
        except Refusal as refusal:
            status, document = refusal.code, refusal.status()
        self._exchange(verb, namespace, name, status, resource)
        return status, document

    def _hangs(self, token: str) -> bool:
        return self.unreachable == HANG or token in self.cut_off

    def _exchange(self, verb: str, namespace: str, name: str, status: int, resource: str) -> None:
        with self.lock:
            self.calls[verb] += 1
            self.history.append(Exchange(verb, namespace, name, status, resource))

    @staticmethod
    def _verb(method: str, name: str) -> str:
        if method == "GET":
            return "get" if name else "list"
        return {"POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}.get(
            method, method.lower()
        )

    def _authenticate(self, authorization: str) -> tuple[str, list[str], _Grant | None]:
        """The user, groups and grant of a request's bearer token; 401 when it is nobody."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            raise Refusal(401, "Unauthorized", "Unauthorized")
        with self.lock:
            grant = self._grants.get(token)
            if grant is not None:
                namespace = grant.user.split(":")[2] if grant.user.count(":") >= 3 else ""  # noqa: PLR2004
                groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
                return grant.user, [*groups, "system:authenticated"], grant
            bootstrap = bootstrap_user(
                lambda name: self._objects.get((SECRETS, "kube-system", name)),
                token,
                self.wall_clock(),
            )
        if bootstrap is None:
            raise Refusal(401, "Unauthorized", "Unauthorized")
        user, groups = bootstrap
        return user, [*groups, "system:authenticated"], None

    def _self_subject_review(self, authorization: str) -> dict[str, Any]:
        user, groups, _ = self._authenticate(authorization)
        return {
            "kind": "SelfSubjectReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "status": {"userInfo": {"username": user, "groups": groups}},
        }

    def _admit(
        self, authorization: str, kind: _Kind | None, verb: str, namespace: str, name: str
    ) -> _Kind:
        """Authentication first (401 for anything), then the path, then authorization."""
        user, _, grant = self._authenticate(authorization)
        if kind is None:
            raise Refusal(404, "NotFound", "the server could not find the requested resource")
        if (
            grant is None
            or (grant.namespaces is not None and namespace not in grant.namespaces)
            or (grant.resources is not None and kind.plural not in grant.resources)
        ):
            raise Refusal(
                403,
                "Forbidden",
                f'{kind.subject(name)} is forbidden: User "{user}" cannot {verb} resource '
                f'"{kind.plural}" in API group "{kind.group}" in the namespace "{namespace}"',
                kind.details(name),
            )
        return kind

    def _route(
        self, kind: _Kind, verb: str, namespace: str, name: str, *, body: bytes, query: str
    ) -> tuple[int, dict[str, Any]]:
        if verb == "get":
            existing = self._objects.get((kind.plural, namespace, name))
            if existing is None:
                raise _not_found(kind, name)
            return 200, existing
        if verb == "list":
            return 200, self._list(kind, namespace, query)
        if verb == "create" and not name:
            dry_run = parse_qs(query).get("dryRun") == ["All"]
            return self._create(kind, namespace, self._decode(kind, body), dry_run=dry_run)
        if verb == "update" and name:
            return self._update(kind, namespace, name, self._decode(kind, body))
        if verb == "delete" and name:
            existing = self._objects.pop((kind.plural, namespace, name), None)
            if existing is None:
                raise _not_found(kind, name)
            self._record(kind, "delete", namespace, name, existing)
            return 200, {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {**kind.details(name), "uid": existing["metadata"]["uid"]},
            }
        raise Refusal(405, "MethodNotAllowed", f"{verb} is not served by the stand-in")

    def _list(self, kind: _Kind, namespace: str, query: str) -> dict[str, Any]:
        """The objects of ``namespace``, filtered by an equality ``labelSelector`` (a=b,c=d)."""
        selector = dict(
            term.split("=", 1)
            for text in parse_qs(query).get("labelSelector", [])
            for term in text.split(",")
            if "=" in term
        )
        items = [
            stored
            for (plural, where, _), stored in sorted(self._objects.items())
            if plural == kind.plural
            and where == namespace
            and all(
                (stored["metadata"].get("labels") or {}).get(key) == value
                for key, value in selector.items()
            )
        ]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self._version)},
            "items": items,
        }

    @staticmethod
    def _decode(kind: _Kind, body: bytes) -> dict[str, Any]:
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise _bad_request(f"the body is not JSON: {exc}") from exc
        if not isinstance(document, dict):
            raise _bad_request("the body is not a JSON object")
        if document.get("kind", kind.kind) != kind.kind or document.get(
            "apiVersion", kind.api_version
        ) not in (kind.api_version, ""):
            raise _bad_request(f"the body is not a {kind.api_version} {kind.kind}")
        return document

    def _create(
        self, kind: _Kind, namespace: str, document: dict[str, Any], *, dry_run: bool = False
    ) -> tuple[int, dict[str, Any]]:
        metadata = document.get("metadata") or {}
        name = metadata.get("name") or ""
        if not name:
            raise _invalid(kind, "", "metadata.name", "", "name or generateName is required")
        self._check_namespace(namespace, metadata)
        if metadata.get("resourceVersion"):
            raise _bad_request("resourceVersion should not be set on objects to be created")
        stored = self._normalized(kind, namespace, name, document)
        if (kind.plural, namespace, name) in self._objects:
            raise Refusal(
                409, "AlreadyExists", f"{kind.subject(name)} already exists", kind.details(name)
            )
        if dry_run:  # judged in full, stored nowhere, the stored fields as they would be
            stored["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=self._stamp())
            return 201, stored
        self._store(kind, namespace, name, stored, existing=None, verb="create")
        return 201, stored

    def _stamp(self) -> str:
        return self.wall_clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _update(
        self, kind: _Kind, namespace: str, name: str, document: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        metadata = document.get("metadata") or {}
        if metadata.get("name") != name:
            raise _bad_request(
                f"the name of the object ({metadata.get('name') or ''}) does not match the "
                f"name on the URL ({name})"
            )
        self._check_namespace(namespace, metadata)
        existing = self._objects.get((kind.plural, namespace, name))
        uid = metadata.get("uid")
        if uid and uid != (existing["metadata"]["uid"] if existing else ""):
            actual = existing["metadata"]["uid"] if existing else ""
            raise _conflict(
                kind,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}",
            )
        stored = self._normalized(kind, namespace, name, document)
        if existing is None:
            if not kind.create_on_update:
                raise _not_found(kind, name)
            self._store(kind, namespace, name, stored, existing=None, verb="create")
            return 201, stored
        version = metadata.get("resourceVersion") or ""
        if not version and not kind.unconditional_update:
            raise _invalid(
                kind, name, "metadata.resourceVersion", 0, "must be specified for an update"
            )
        if version and not version.isdigit():
            raise _bad_request(f"invalid resourceVersion {version!r}")
        if version and version != existing["metadata"]["resourceVersion"]:
            raise _conflict(kind, name, _CONFLICT_MESSAGE)
        for field in kind.immutable:
            if stored.get(field) != existing.get(field):
                raise _invalid(kind, name, field, stored.get(field), "field is immutable")
        self._store(kind, namespace, name, stored, existing=existing, verb="update")
        return 200, stored

    @staticmethod
    def _check_namespace(namespace: str, metadata: dict[str, Any]) -> None:
        if metadata.get("namespace") not in (None, "", namespace):
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )

    @staticmethod
    def _normalized(
        kind: _Kind, namespace: str, name: str, document: dict[str, Any]
    ) -> dict[str, Any]:
        """The object as the server would store it, before its system fields are set."""
        metadata = {
            key: value
            for key, value in (document.get("metadata") or {}).items()
            if key not in {"uid", "resourceVersion", "creationTimestamp", "generation"}
        }
        metadata.update(name=name, namespace=namespace)
        _check_metadata(kind, name, metadata)
        return {
            "kind": kind.kind,
            "apiVersion": kind.api_version,
            "metadata": metadata,
            **kind.body(kind, name, document),
        }

    def _store(
        self,
        kind: _Kind,
        namespace: str,
        name: str,
        stored: dict[str, Any],
        *,
        existing: dict[str, Any] | None,
        verb: str,
    ) -> None:
        """Set the system fields and store ``stored`` (in place); a write that changes
        nothing keeps the stored object and its resourceVersion."""
        if existing is not None:
            kept = existing["metadata"]
            stored["metadata"]["uid"] = kept["uid"]
            stored["metadata"]["creationTimestamp"] = kept["creationTimestamp"]
            stored["metadata"]["resourceVersion"] = kept["resourceVersion"]
            if stored == existing:
                return
        else:
            stored["metadata"]["uid"] = str(uuid.uuid4())
            stored["metadata"]["creationTimestamp"] = self._stamp()
        self._version += 1
        stored["metadata"]["resourceVersion"] = str(self._version)
        self._objects[kind.plural, namespace, name] = stored
        self._record(kind, verb, namespace, name, stored)

    def _record(
        self, kind: _Kind, verb: str, namespace: str, name: str, stored: dict[str, Any]
    ) -> None:
        if verb == "delete":
            self._version += 1
        is_lease = kind is LEASE
        self.writes.append(
            Write(
                at=time.monotonic(),
                verb=verb,
                namespace=namespace,
                name=name,
                holder=stored["spec"].get("holderIdentity") if is_lease else None,
                resource_version=str(self._version),
                resource=kind.plural,
                endpoints=()
                if kind is not ENDPOINT_SLICE or verb == "delete"
                else tuple(_route_text(address, port) for address, port, _ in routes(stored)),
            )
        )

    # -- the stored objects, as another client's writes would change them ------------------------

    def _read(self, kind: _Kind, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return copy.deepcopy(self._objects.get((kind.plural, namespace, name)))

    def _put(
        self, kind: _Kind, namespace: str, name: str, document: dict[str, Any]
    ) -> dict[str, Any]:
        with self.lock:
            existing = self._objects.get((kind.plural, namespace, name))
            stored = self._normalized(kind, namespace, name, document)
            verb = "update" if existing else "create"
            self._store(kind, namespace, name, stored, existing=existing, verb=verb)
            return copy.deepcopy(stored)

    def _delete(self, kind: _Kind, namespace: str, name: str) -> None:
        with self.lock:
            existing = self._objects.pop((kind.plural, namespace, name), None)
            if existing is not None:
                self._record(kind, "delete", namespace, name, existing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for it here")
    parser.add_argument("--namespace", default="default", help="the kubeconfig's namespace")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with KubeStandIn(port=args.port) as standin:
        if args.kubeconfig is not None:
            standin.write_kubeconfig(args.kubeconfig, namespace=args.namespace)
        info = {
            "url": standin.url,
            "port": standin.port,
            "token": DEFAULT_TOKEN,
            "kubeconfig": str(args.kubeconfig) if args.kubeconfig else None,
        }
        print(json.dumps(info), flush=True)  # noqa: T201 - the line a parent process reads
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
