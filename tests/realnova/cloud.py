"""Real Nova and real Keystone on 127.0.0.1, for the real-Nova test lane (``nox -s nova``).

``RealNova`` starts the nova-api WSGI app, conductor, scheduler and fake-driver computes in
this process, from the functional-test fixtures the pinned ``nova`` wheel ships
(``nova.tests.functional.integrated_helpers._IntegratedTestBase``, set up by hand outside any
test runner): in-process Placement, the fixtures' fake Glance and Neutron, sqlite, the fake
oslo.messaging transport. Beside it runs real Keystone, from the pinned ``keystone`` wheel, in a
child process of its own (``keystone_server.py``: Keystone imports eventlet, which Nova's
fixtures refuse in their process): sqlite, fernet tokens, set up by ``keystone-manage`` as an
operator does, on a port of its own. Unmodified openstacksdk reaches the pair as it reaches a
production cloud:

- Keystone v3 (its own port): password and application-credential tokens, the service catalog,
  the admin API, its cache in process memory (production's is memcached; Keystone drops cached
  tokens whenever it records a revocation). ``[token] expiration`` is an hour unless a test
  asks for less (``set_token_lifetime``: Keystone restarted with the new value, its keys and
  database kept).
- ``/compute``: nova-api itself (its own version documents, microversions, policy, quotas),
  checking every token with Keystone through its own pipeline's keystonemiddleware
  (``authtoken``), configured as in production with a ``nova`` service user, except that
  validated tokens are not cached (``token_cache_time = -1``): a revoked token is refused at
  once, where production clouds may accept it for minutes.
- ``/image``: Glance v2, read-only, over the fixtures' fake image service.
- ``/network``: Neutron v2.0, read-only (networks, subnets, ports, security groups), over the
  fixtures' fake Neutron.

Both facades sit behind keystonemiddleware as well (the same options), and read who is asking
from the headers it sets, as Glance and Neutron do; their version documents, like Nova's, need
no token. The fixtures' network, subnets and security group are handed to the ``osas``
project.

A second region of the same cloud is another launcher that joins this one's Keystone
(``keystone_url``; ``python cloud.py --keystone-url URL --region RegionTwo``): a Nova of its
own (database, computes, Placement, fake Glance and Neutron, facades) in its own process,
registered in that Keystone's catalog under its region (``POST /v3/regions``, then compute,
image, network and identity endpoints with that ``region_id``), checking tokens with that
Keystone. It starts no Keystone and writes no clouds.yaml: the first region's entries reach
it with ``region_name`` set to it (and the region listed in the entry's ``regions``). Its
image and flavors have ids of their own; its network keeps the fixtures' id.

``RealNovaProcess`` runs the same thing in a child interpreter (``python cloud.py``), which is
what tests should normally use: Nova's fixtures patch process-wide state (``os.uname`` and
``psutil.net_if_addrs`` poisoned, ``mock``'s autospec patched, ``HOME`` and the tempdir moved,
root logging, openstacksdk's IPv6 probe), and under pytest's ``filterwarnings = error`` Nova's
own DeprecationWarnings (webob's ``cgi`` import, SQLAlchemy) become errors: in-process use under
pytest needs ``-W ignore::DeprecationWarning``. Nova runs on native threads only
(``OS_NOVA_DISABLE_EVENTLET_PATCHING=1``, set here): tried in eventlet mode, Nova answered
but the launcher never printed "ready" nor stopped on SIGTERM. Run by hand::

    python tests/realnova/cloud.py --clouds-yaml /tmp/realnova/clouds.yaml --port 8774

prints the Keystone URL and the clouds.yaml path, and serves until SIGTERM or Ctrl-C. Keystone's
folder (database, keys, keystone.log) is ``keystone/`` beside clouds.yaml, made anew at start.

A create carrying the scheduler hint ``realnova_scheduling_delay`` (seconds, as a string) waits
that long in Nova's conductor before the scheduler is asked: a busy scheduler, stretched so that
a test can act on a server Nova still schedules (deleted then, it leaves no instance at all,
only its build request gone). Without the hint nothing changes; everything else is Nova's own.

Admin helpers (both classes), as Keystone's bootstrap admin: ``set_quota`` (Nova's
os-quota-sets), ``reset_state`` (force a server to ERROR), ``admin_servers`` (every project),
``revoke_tokens`` (every token of a user, through Keystone's admin API), ``set_token_lifetime``,
``add_project`` (a fresh project and user, added to clouds.yaml as ``realnova-<name>``).

Only the standard library, PyYAML and ``keystone_server`` (the standard library alone) are
imported at module level: this module can be imported where Nova and Keystone are not installed
(``RealNovaProcess`` then fails to start, cleanly).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import logging
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, quote, urlencode
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import yaml

if __package__:  # imported as realnova.cloud
    from . import keystone_server
else:  # run as a script: this file's folder is sys.path[0]
    import keystone_server

logger = logging.getLogger("realnova")

HOST = "127.0.0.1"
REGION = "RegionOne"  # where Keystone is, and the one Nova of the single-region lane
SECOND_REGION = "RegionTwo"  # the two-region lane's other Nova (RealNova with keystone_url)
DOMAIN_ID = "default"
DOMAIN_NAME = "Default"

# clouds.yaml entries written by the launcher.
CLOUD = "realnova"  # the member user, password auth
APPCRED_CLOUD = "realnova-appcred"  # the same user and project, application credential
ADMIN_CLOUD = "realnova-admin"  # Keystone's bootstrap admin, an admin of the same project too

PROJECT_NAME = "osas"
USER_NAME = "osas"
USER_PASSWORD = "osas-secret"
ADMIN_USER_NAME = "admin"  # made by keystone-manage bootstrap: admin of the system
ADMIN_PASSWORD = "admin-secret"
APP_CREDENTIAL_NAME = "osas"
APP_CREDENTIAL_SECRET = "osas-appcred-secret"
# Nova's service user, as in production: keystonemiddleware validates tokens with it.
SERVICE_PROJECT_NAME = "service"
NOVA_USER_NAME = "nova"
NOVA_PASSWORD = "nova-secret"

IMAGE_NAME = "ubuntu-24.04"
IMAGE_ID = "5b1c3f4e-8d2a-4e6b-9c7d-1a2b3c4d5e6f"
NETWORK_NAME = "cluster-net"  # the fixtures' one network ("private"), renamed


def region_image_id(region: str) -> str:
    """The id of ``IMAGE_NAME`` in a region: each region's Glance has its own."""
    if region == REGION:
        return IMAGE_ID
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"realnova/{region}/image/{IMAGE_NAME}"))


def _flavor_id(region: str, name: str) -> str:
    """The id of a flavor the launcher makes; in another region than the first, of that
    region's own (the first keeps the fixtures' ids for the flavors they already have)."""
    where = "" if region == REGION else f"{region}/"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"realnova/{where}flavor/{name}"))


# A create's scheduler hint: seconds its scheduling waits in the conductor (module docstring).
SCHEDULING_DELAY_HINT = "realnova_scheduling_delay"


@dataclass(frozen=True, slots=True)
class FlavorSpec:
    name: str
    vcpus: int
    ram_mib: int
    disk_gib: int
    extra_specs: Mapping[str, str] = field(default_factory=dict)


# Like osas/cloud/fake.py DEFAULT_FLAVORS. The fixtures already define m1.tiny, m1.small,
# m1.medium, m1.large (same sizes as these), m1.xlarge and m1.tiny.specs; what is missing is
# created. g1.xlarge asks Placement for a VGPU that no fake compute has: it ends in NoValidHost.
DEFAULT_FLAVORS = (
    FlavorSpec("m1.small", 1, 2048, 20),
    FlavorSpec("m1.medium", 2, 4096, 40),
    FlavorSpec("m1.large", 4, 8192, 80),
    FlavorSpec("g1.xlarge", 8, 32768, 100, {"resources:VGPU": "1"}),
)

# Nova's own defaults would be 10 instances, 20 cores, 50 GiB of RAM.
DEFAULT_QUOTAS: Mapping[str, int] = {"instances": 50, "cores": 200, "ram": 512 * 1024}


@dataclass(frozen=True, slots=True)
class NovaOptions:
    """What a test can choose about the cloud. ``driver`` is a ``compute_driver``:
    ``fake.FakeDriver`` (1000 vCPUs, 800 GB of RAM a host) or ``fake.SmallFakeDriver`` (2 vCPUs,
    8 GiB less 512 MiB reserved, RAM not overcommitted: a host takes 3 m1.small or 1 m1.medium
    and no m1.large; the way to NoValidHost)."""

    hosts: int = 1
    driver: str = "fake.FakeDriver"
    quotas: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    max_limit: int | None = None  # Nova's [api] max_limit (page size cap); 1000 if None
    flavors: tuple[FlavorSpec, ...] = DEFAULT_FLAVORS
    recheck_quota: bool = True  # Nova's [quota] recheck_quota
    log_level: str = "WARNING"  # Nova's log lines go to stderr from this level
    token_lifetime: int = keystone_server.DEFAULT_TOKEN_LIFETIME  # Keystone's [token] expiration

    def to_args(self) -> list[str]:
        args = ["--hosts", str(self.hosts), "--driver", self.driver]
        args += ["--log-level", self.log_level]
        for name, value in self.quotas.items():
            args += ["--quota", f"{name}={value}"]
        if self.max_limit is not None:
            args += ["--max-limit", str(self.max_limit)]
        if not self.recheck_quota:
            args.append("--no-recheck-quota")
        if self.token_lifetime != keystone_server.DEFAULT_TOKEN_LIFETIME:
            args += ["--token-lifetime", str(self.token_lifetime)]
        if self.flavors != DEFAULT_FLAVORS:
            args += ["--flavors", json.dumps([_flavor_json(f) for f in self.flavors])]
        return args


def _flavor_json(flavor: FlavorSpec) -> dict[str, Any]:
    return {
        "name": flavor.name,
        "vcpus": flavor.vcpus,
        "ram_mib": flavor.ram_mib,
        "disk_gib": flavor.disk_gib,
        "extra_specs": dict(flavor.extra_specs),
    }


# ================================================================================================
# The HTTP front: one WSGI app routing to Nova, Glance and Neutron
# ================================================================================================


class _HTTPError(Exception):
    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


_REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    300: "Multiple Choices",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}

# Version documents: served without a token, as Glance and Neutron do.
_UNAUTHENTICATED_PATHS = {"/image", "/image/versions", "/network"}


@dataclass(frozen=True, slots=True)
class _Caller:
    """Who keystonemiddleware says is asking (the headers it sets once Keystone has validated
    the token; whatever the client sent under those names it has removed)."""

    project_id: str
    roles: frozenset[str]

    @classmethod
    def of(cls, environ: Mapping[str, Any]) -> _Caller:
        if environ.get("HTTP_X_IDENTITY_STATUS") != "Confirmed":
            # Only if keystonemiddleware were told to let unauthenticated requests through.
            raise _HTTPError(401, {"error": {"code": 401, "message": "no valid token"}})
        roles = environ.get("HTTP_X_ROLES", "")
        return cls(
            project_id=str(environ.get("HTTP_X_PROJECT_ID", "")),
            roles=frozenset(role.strip() for role in roles.split(",") if role.strip()),
        )

    @property
    def admin(self) -> bool:
        return "admin" in self.roles


class _Front:
    """The WSGI app on the port: nova-api (its pipeline checks tokens), and the facades behind
    ``authenticate`` (keystonemiddleware, configured as Nova's)."""

    def __init__(
        self,
        nova_app: Callable[..., Any],
        images: Callable[[], Iterable[Mapping[str, Any]]],
        neutron: Any,
        admin_hook: Callable[[str, Any], Any],
        authenticate: Callable[[Callable[..., Any]], Callable[..., Any]],
    ) -> None:
        self.nova_app = nova_app
        self.images = images
        self.neutron = neutron
        self.admin_hook = admin_hook
        self._authenticated_facades = authenticate(self._facades)
        self.base_url = ""

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "") or "/"
        if path == "/compute" or path.startswith("/compute/"):
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + "/compute"
            environ["PATH_INFO"] = path[len("/compute") :]
            return self.nova_app(environ, start_response)
        if path.rstrip("/") in _UNAUTHENTICATED_PATHS:
            return self._facades(environ, start_response)
        return self._authenticated_facades(environ, start_response)

    def _facades(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "") or "/"
        try:
            status, body, headers = self._facade(path, environ)
        except _HTTPError as error:
            status, body, headers = error.status, error.body, error.headers
        except Exception:
            logger.exception("realnova front failed on %s", path)
            status, body, headers = 500, {"error": {"code": 500, "message": "front error"}}, {}
        return _respond(start_response, status, body, headers)

    def _facade(self, path: str, environ: Mapping[str, Any]) -> tuple[int, Any, dict[str, str]]:
        method = environ["REQUEST_METHOD"]
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        if path == "/image" or path.startswith("/image/"):
            return self._image(method, path, query, environ)
        if path == "/network" or path.startswith("/network/"):
            return self._network(method, path, query, environ)
        if path.startswith("/_realnova/"):
            return self._control(method, path, environ)
        raise _HTTPError(404, {"error": {"code": 404, "message": "not served"}})

    # -- Glance ----------------------------------------------------------------------------------

    def _image(
        self, method: str, path: str, query: Mapping[str, list[str]], environ: Mapping[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        if method != "GET":
            raise _HTTPError(405, {"error": "read-only Glance"})
        path = path.rstrip("/")
        if path in {"/image", "/image/versions"}:
            link = [{"rel": "self", "href": f"{self.base_url}/image/v2/"}]
            versions = [
                {"id": v, "status": "CURRENT" if i == 0 else "SUPPORTED", "links": link}
                for i, v in enumerate(("v2.16", "v2.15", "v2.9", "v2.0"))
            ]
            return 300, {"versions": versions}, {}
        caller = _Caller.of(environ)
        images = [self._glance_image(meta) for meta in self.images()]
        images = [
            i for i in images if i["visibility"] != "private" or i["owner"] == caller.project_id
        ]
        if path == "/image/v2/images":
            return 200, _glance_page(images, query), {}
        prefix = "/image/v2/images/"
        if path.startswith(prefix) and "/" not in path[len(prefix) :]:
            wanted = path[len(prefix) :]
            for image in images:
                if image["id"] == wanted:
                    return 200, image, {}
            raise _HTTPError(404, f"404 Not Found\n\nNo image found with ID {wanted}\n\n")
        raise _HTTPError(404, "404 Not Found\n\nThe resource could not be found.\n\n")

    def _glance_image(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        properties = dict(meta.get("properties") or {})
        owner = properties.pop("owner", None) or meta.get("owner")
        image_id = str(meta["id"])
        body: dict[str, Any] = {
            key: value for key, value in properties.items() if isinstance(value, str | int | bool)
        }
        body.update(
            {
                "id": image_id,
                "name": meta.get("name"),
                "status": meta.get("status", "active"),
                "visibility": meta.get("visibility", "public"),
                "os_hidden": False,
                "protected": bool(meta.get("protected", False)),
                "owner": owner,
                "size": meta.get("size"),
                "virtual_size": None,
                "min_disk": int(meta.get("min_disk") or 0),
                "min_ram": int(meta.get("min_ram") or 0),
                "disk_format": meta.get("disk_format"),
                "container_format": meta.get("container_format"),
                "checksum": None,
                "os_hash_algo": None,
                "os_hash_value": None,
                "tags": list(meta.get("tags") or []),
                "created_at": _iso_seconds(meta.get("created_at")),
                "updated_at": _iso_seconds(meta.get("updated_at")),
                "self": f"/v2/images/{image_id}",
                "file": f"/v2/images/{image_id}/file",
                "schema": "/v2/schemas/image",
            }
        )
        return body

    # -- Neutron ---------------------------------------------------------------------------------

    def _network(
        self, method: str, path: str, query: Mapping[str, list[str]], environ: Mapping[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        if method != "GET":
            raise _HTTPError(405, _neutron_error("HTTPMethodNotAllowed", "read-only Neutron"))
        path = path.rstrip("/")
        if path == "/network":
            link = [{"rel": "self", "href": f"{self.base_url}/network/v2.0/"}]
            return 200, {"versions": [{"id": "v2.0", "status": "CURRENT", "links": link}]}, {}
        caller = _Caller.of(environ)
        neutron = self.neutron  # the fixture's own stores, read as they are now
        collections = {
            "networks": ("network", functools.partial(_snapshot, neutron._networks)),
            "subnets": ("subnet", functools.partial(_snapshot, neutron._subnets)),
            "ports": ("port", functools.partial(_snapshot, neutron._ports)),
            "security-groups": (
                "security_group",
                functools.partial(_snapshot, neutron._security_groups),
            ),
        }
        if path == "/network/v2.0":
            resources = [
                {
                    "name": singular,
                    "collection": plural,
                    "links": [{"rel": "self", "href": f"{self.base_url}/network/v2.0/{plural}"}],
                }
                for plural, (singular, _items) in collections.items()
            ]
            return 200, {"resources": resources}, {}
        if path == "/network/v2.0/extensions":
            return 200, self.neutron.list_extensions(), {}
        parts = (
            path[len("/network/v2.0/") :].split("/") if path.startswith("/network/v2.0/") else []
        )
        if not parts or parts[0] not in collections or len(parts) > 2:
            raise _HTTPError(
                404, _neutron_error("HTTPNotFound", "The resource could not be found.")
            )
        singular, items = collections[parts[0]]
        plural_key = f"{singular}s"
        visible = [
            copy.deepcopy(item)
            for item in items()
            if caller.admin
            or item.get("shared")
            or item.get("project_id", item.get("tenant_id")) == caller.project_id
        ]
        if len(parts) == 2:
            for item in visible:
                if item["id"] == parts[1]:
                    return 200, {singular: item}, {}
            kind = "".join(p.title() for p in singular.split("_")) + "NotFound"
            raise _HTTPError(
                404, _neutron_error(kind, f"{singular.replace('_', ' ')} {parts[1]} not found.")
            )
        return 200, _neutron_page(plural_key, visible, query, self.base_url, path), {}

    # -- control (admin token only) --------------------------------------------------------------

    def _control(
        self, method: str, path: str, environ: Mapping[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        if not _Caller.of(environ).admin:
            raise _HTTPError(403, {"error": {"code": 403, "message": "admin only"}})
        if method != "POST":
            raise _HTTPError(405, {"error": {"code": 405, "message": "POST only"}})
        return 200, self.admin_hook(path[len("/_realnova/") :], _json_body(environ)), {}


def _snapshot(store: Mapping[str, Any]) -> list[Any]:
    """The values of a fixture's dict, which Nova's threads may be changing meanwhile (a copy
    is taken at once; iterating the dict itself could fail half-way)."""
    return list(dict(store).values())


def _iso_seconds(moment: Any) -> str | None:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return None if moment is None else str(moment)


def _json_body(environ: Mapping[str, Any]) -> Any:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    raw = environ["wsgi.input"].read(length) if length else b""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise _HTTPError(400, {"error": {"code": 400, "message": "body is not JSON"}}) from exc


def _respond(
    start_response: Callable[..., Any], status: int, body: Any, headers: Mapping[str, str]
) -> list[bytes]:
    if body is None:
        payload, content_type = b"", None
    elif isinstance(body, str):
        payload, content_type = body.encode(), "text/plain; charset=UTF-8"
    else:
        payload, content_type = json.dumps(body).encode(), "application/json"
    header_list = [(k, v) for k, v in headers.items()]
    if content_type:
        header_list.append(("Content-Type", content_type))
    header_list.append(("Content-Length", str(len(payload))))
    header_list.append(("X-Openstack-Request-Id", f"req-{uuid.uuid4()}"))
    start_response(f"{status} {_REASONS.get(status, 'Status')}", header_list)
    return [payload]


def _neutron_error(kind: str, message: str) -> dict[str, Any]:
    return {"NeutronError": {"type": kind, "message": message, "detail": ""}}


def _matches(item: Mapping[str, Any], query: Mapping[str, list[str]], skip: set[str]) -> bool:
    for key, values in query.items():
        if key in skip:
            continue
        if key not in item:
            return False  # real services answer 400 for unknown filters; empty is close enough
        actual = item[key]
        text = str(actual).lower() if isinstance(actual, bool) else str(actual)
        if text not in values:
            return False
    return True


def _glance_page(images: list[dict[str, Any]], query: Mapping[str, list[str]]) -> dict[str, Any]:
    skip = {"limit", "marker", "sort", "sort_key", "sort_dir", "member_status", "os_hidden"}
    selected = []
    for image in images:
        if not _matches(
            {k: v for k, v in image.items() if k not in {"name", "id"}},
            {k: v for k, v in query.items() if k not in {"name", "id"}},
            skip,
        ):
            continue
        for key in ("name", "id"):
            wanted = query.get(key, [None])[-1]
            if wanted is None:
                continue
            options = wanted[3:].split(",") if wanted.startswith("in:") else [wanted]
            if image[key] not in options:
                break
        else:
            selected.append(image)
    selected.sort(key=lambda i: (i["created_at"] or "", i["id"]), reverse=True)
    marker = query.get("marker", [None])[-1]
    if marker is not None:
        ids = [i["id"] for i in selected]
        if marker not in ids:
            raise _HTTPError(400, f"400 Bad Request\n\nInvalid marker {marker}\n\n")
        selected = selected[ids.index(marker) + 1 :]
    limit = _limit(query, 25)
    page = selected[:limit]
    body: dict[str, Any] = {"images": page, "first": "/v2/images", "schema": "/v2/schemas/images"}
    if page and len(page) == limit:
        params = [(k, v) for k, vs in query.items() if k != "marker" for v in vs]
        body["next"] = f"/v2/images?{urlencode([*params, ('marker', page[-1]['id'])])}"
    return body


def _neutron_page(
    plural: str,
    items: list[dict[str, Any]],
    query: Mapping[str, list[str]],
    base_url: str,
    path: str,
) -> dict[str, Any]:
    skip = {"limit", "marker", "fields", "sort_key", "sort_dir", "page_reverse"}
    selected = sorted((i for i in items if _matches(i, query, skip)), key=lambda i: i["id"])
    marker = query.get("marker", [None])[-1]
    if marker is not None:
        selected = [i for i in selected if i["id"] > marker]
    fields = query.get("fields")
    limit = _limit(query, 1000)
    page = selected[:limit]
    if fields:
        page = [{k: v for k, v in i.items() if k in fields} for i in page]
    body: dict[str, Any] = {plural: page}
    if page and len(page) == limit and "limit" in query:
        params = [(k, v) for k, vs in query.items() if k != "marker" for v in vs]
        href = f"{base_url}{path}?{urlencode([*params, ('marker', page[-1]['id'])])}"
        body[f"{plural}_links"] = [{"rel": "next", "href": href}]
    return body


def _limit(query: Mapping[str, list[str]], default: int) -> int:
    text = query.get("limit", [None])[-1]
    if text is None:
        return default
    try:
        return max(1, min(int(text), 1000))
    except ValueError as exc:
        raise _HTTPError(400, {"error": {"code": 400, "message": "bad limit"}}) from exc


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        logger.debug("%s %s", self.address_string(), format % args)


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


# ================================================================================================
# Admin calls over HTTP (for RealNova and RealNovaProcess alike)
# ================================================================================================

# A token this close to its expiry is renewed first (a test may make tokens live seconds).
_RENEW_BEFORE = timedelta(seconds=30)
_HTTP_UNAUTHORIZED = 401
_SYSTEM_SCOPE: dict[str, Any] = {"system": {"all": True}}


class _RefusedError(RuntimeError):
    def __init__(self, method: str, url: str, status: int, raw: bytes) -> None:
        super().__init__(f"{method} {url}: HTTP {status} {raw[:500]!r}")
        self.status = status


def _http(
    method: str,
    url: str,
    body: Any = None,
    *,
    token: str | None = None,
    microversion: str | None = None,
) -> tuple[Mapping[str, str], Any]:
    """One JSON request; the answer's headers and body, or ``_RefusedError`` from 400 on."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - 127.0.0.1
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json")
    if token:
        request.add_header("X-Auth-Token", token)
    if microversion:
        request.add_header("OpenStack-API-Version", f"compute {microversion}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            raw = response.read()
            status, headers = response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        raw = error.read()
        status, headers = error.code, dict(error.headers)
    if status >= 400:
        raise _RefusedError(method, url, status, raw)
    return headers, json.loads(raw) if raw else None


def _password_token(
    auth_url: str, user_name: str, password: str, scope: Mapping[str, Any]
) -> tuple[str, datetime]:
    """A token from Keystone for a user of the default domain, and when it expires."""
    body = {
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {
                    "user": {"name": user_name, "domain": {"id": DOMAIN_ID}, "password": password}
                },
            },
            "scope": dict(scope),
        }
    }
    headers, answer = _http("POST", f"{auth_url}/auth/tokens", body)
    expires_at = datetime.fromisoformat(answer["token"]["expires_at"])
    return headers["X-Subject-Token"], expires_at


def _project_scope(project_name: str) -> dict[str, Any]:
    return {"project": {"name": project_name, "domain": {"id": DOMAIN_ID}}}


class _AdminClient:
    """Keystone's bootstrap admin over HTTP. Keystone's own API takes a system-scoped token
    (its policies want the system for users, projects and the catalog); Nova's admin API and
    the launcher's control calls take one scoped to the osas project (Nova's policies want a
    project admin). Each is renewed shortly before it expires, and once after a 401."""

    def __init__(self, base_url: str, auth_url: str) -> None:
        self.base_url = base_url
        self.auth_url = auth_url
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, datetime]] = {}
        self._role_ids: dict[str, str] = {}  # roles are made once, by keystone-manage bootstrap

    def _token(self, scope: str, *, renew: bool) -> str:
        with self._lock:
            held = self._tokens.get(scope)
            if renew or held is None or held[1] - datetime.now(UTC) < _RENEW_BEFORE:
                wanted = _SYSTEM_SCOPE if scope == "system" else _project_scope(PROJECT_NAME)
                held = _password_token(self.auth_url, ADMIN_USER_NAME, ADMIN_PASSWORD, wanted)
                self._tokens[scope] = held
            return held[0]

    def _authorized(
        self, scope: str, method: str, url: str, body: Any, microversion: str | None = None
    ) -> Any:
        try:
            token = self._token(scope, renew=False)
            return _http(method, url, body, token=token, microversion=microversion)[1]
        except _RefusedError as refused:
            if refused.status != _HTTP_UNAUTHORIZED:
                raise
        token = self._token(scope, renew=True)
        return _http(method, url, body, token=token, microversion=microversion)[1]

    def keystone(self, method: str, path: str, body: Any = None) -> Any:
        """Keystone's API below /v3."""
        return self._authorized("system", method, f"{self.auth_url}{path}", body)

    def call(
        self, method: str, path: str, body: Any = None, microversion: str | None = None
    ) -> Any:
        """The front: Nova's API below /compute, the control calls below /_realnova."""
        return self._authorized("project", method, f"{self.base_url}{path}", body, microversion)

    # -- Keystone's objects, by name ---------------------------------------------------------------

    def named(self, collection: str, name: str) -> dict[str, Any]:
        """The one user, project or role of that name (users and projects: default domain)."""
        query = f"name={quote(name)}"
        if collection in {"users", "projects"}:
            query += f"&domain_id={DOMAIN_ID}"
        found = self.keystone("GET", f"/{collection}?{query}")[collection]
        if len(found) != 1:
            msg = f"Keystone has {len(found)} {collection} named {name!r}"
            raise LookupError(msg)
        return dict(found[0])

    def create_project(self, name: str) -> str:
        body = {"project": {"name": name, "domain_id": DOMAIN_ID, "enabled": True}}
        return str(self.keystone("POST", "/projects", body)["project"]["id"])

    def create_user(self, name: str, password: str) -> str:
        body = {"user": {"name": name, "password": password, "domain_id": DOMAIN_ID}}
        return str(self.keystone("POST", "/users", body)["user"]["id"])

    def grant(self, project_id: str, user_id: str, role_name: str) -> None:
        role_id = self._role_ids.get(role_name)
        if role_id is None:
            role_id = self._role_ids[role_name] = self.named("roles", role_name)["id"]
        self.keystone("PUT", f"/projects/{project_id}/users/{user_id}/roles/{role_id}")

    def add_service(self, service_type: str, name: str, url: str, region: str = REGION) -> None:
        """A service in the catalog, at ``url`` for every interface of ``region``."""
        body = {"service": {"type": service_type, "name": name, "enabled": True}}
        service_id = self.keystone("POST", "/services", body)["service"]["id"]
        self.add_endpoints(service_id, url, region)

    def add_endpoints(self, service_id: str, url: str, region: str) -> None:
        """A service's endpoints in a region, at ``url`` for every interface."""
        for interface in ("public", "internal", "admin"):
            endpoint = {"service_id": service_id, "interface": interface, "url": url}
            self.keystone("POST", "/endpoints", {"endpoint": {**endpoint, "region_id": region}})

    def service_id(self, service_type: str) -> str:
        """The catalog's one service of that type."""
        found = self.keystone("GET", f"/services?type={quote(service_type)}")["services"]
        if len(found) != 1:
            msg = f"Keystone has {len(found)} services of type {service_type!r}"
            raise LookupError(msg)
        return str(found[0]["id"])

    def add_region(self, region: str) -> None:
        """A region in Keystone (``POST /v3/regions``), as an operator adds one."""
        self.keystone("POST", "/regions", {"region": {"id": region}})


class _AdminHelpers:
    """Admin helpers shared by RealNova and RealNovaProcess (``base_url``, ``auth_url`` and
    ``project_id`` are theirs)."""

    @property
    def base_url(self) -> str:
        raise NotImplementedError

    @property
    def auth_url(self) -> str:
        raise NotImplementedError

    @property
    def project_id(self) -> str:
        raise NotImplementedError

    def _admin(self) -> _AdminClient:
        client: _AdminClient | None = getattr(self, "_admin_client", None)
        if client is None or (client.base_url, client.auth_url) != (self.base_url, self.auth_url):
            client = _AdminClient(self.base_url, self.auth_url)
            self._admin_client = client
        return client

    def set_quota(self, project_id: str | None = None, **limits: int) -> dict[str, Any]:
        """Nova's quota for a project, through Nova's own quota API (os-quota-sets)."""
        project = project_id or self.project_id
        body = {"quota_set": dict(limits)}
        return self._admin().call(
            "PUT", f"/compute/v2.1/os-quota-sets/{project}", body, microversion="2.1"
        )["quota_set"]

    def reset_state(self, server_id: str, state: str = "error") -> None:
        """Force a server's vm_state (``error`` or ``active``), the admin way."""
        self._admin().call(
            "POST",
            f"/compute/v2.1/servers/{server_id}/action",
            {"os-resetState": {"state": state}},
        )

    def admin_servers(self, **query: str) -> list[dict[str, Any]]:
        """Every project's servers (detail, admin, latest microversion)."""
        params = {"all_tenants": "1", **query}
        body = self._admin().call(
            "GET", f"/compute/v2.1/servers/detail?{urlencode(params)}", microversion="latest"
        )
        return list(body["servers"])

    def revoke_tokens(self, user_name: str = USER_NAME, password: str = USER_PASSWORD) -> None:
        """Keystone revokes every token of the user, application-credential tokens included:
        its password set again, to what it is, through Keystone's admin API (Keystone records
        a revocation event for the user; the credentials keep working). Keystone cuts times
        to whole seconds, so a token issued within the same second is revoked too."""
        admin = self._admin()
        user_id = admin.named("users", user_name)["id"]
        admin.keystone("PATCH", f"/users/{user_id}", {"user": {"password": password}})


# ================================================================================================
# Nova from its functional-test fixtures
# ================================================================================================


# ================================================================================================
# Nova from its functional-test fixtures
# ================================================================================================


def _prepare_nova_import() -> None:
    """Choose native threading (the default) before anything imports nova or eventlet."""
    if "nova.tests" in sys.modules:
        return
    # Native threads only: tried in eventlet mode, Nova answered, but the launcher's main
    # thread never got back to printing "ready" nor to its SIGTERM handler.
    chosen = os.environ.setdefault("OS_NOVA_DISABLE_EVENTLET_PATCHING", "1")
    if chosen.lower() not in {"1", "true", "yes"}:
        raise RuntimeError(
            f"OS_NOVA_DISABLE_EVENTLET_PATCHING={chosen}: RealNova runs Nova with native "
            "threads only (unset the variable)"
        )
    if "eventlet" in sys.modules:
        raise RuntimeError(
            "eventlet was imported before nova: native threading mode is impossible in this "
            "process (run RealNova in a process of its own: RealNovaProcess)"
        )
    # oslotest would arm a SIGALRM timeout from this variable, and capture stdout/stderr.
    for name in ("OS_TEST_TIMEOUT", "OS_STDOUT_CAPTURE", "OS_STDERR_CAPTURE", "OS_LOG_CAPTURE"):
        os.environ.pop(name, None)


def _api_paste_ini() -> Path:
    """The wheel installs api-paste.ini under <prefix>/etc/nova, not where the test config
    looks for it (under site-packages)."""
    import nova  # noqa: PLC0415 - after _prepare_nova_import

    candidates = [Path(sys.prefix) / "etc" / "nova" / "api-paste.ini"]
    candidates += [Path(p).parent / "etc" / "nova" / "api-paste.ini" for p in nova.__path__]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"api-paste.ini not found in {[str(c) for c in candidates]}")


class _ReaderPreferringLock:
    """A reader/writer lock where readers wait only for an active writer, never a queued one
    (see ``_nova_case_class``). Same interface and rules as fasteners': ``read_lock``,
    ``write_lock``; a writer may read and write again, a reader may not become a writer."""

    made = 0  # how many: proof that Nova's fixture uses this class

    def __init__(self) -> None:
        _ReaderPreferringLock.made += 1
        self._changed = threading.Condition()
        self._readers: dict[threading.Thread, int] = {}
        self._writer: threading.Thread | None = None
        self._depth = 0

    @contextlib.contextmanager
    def read_lock(self) -> Iterator[None]:
        me = threading.current_thread()
        with self._changed:
            while self._writer is not None and self._writer is not me:
                self._changed.wait()
            self._readers[me] = self._readers.get(me, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                self._readers[me] -= 1
                if not self._readers[me]:
                    del self._readers[me]
                self._changed.notify_all()

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        me = threading.current_thread()
        with self._changed:
            if me in self._readers and self._writer is not me:
                msg = f"reader {me.name} to writer privilege escalation not allowed"
                raise RuntimeError(msg)
            while self._writer is not me and (self._readers or self._writer is not None):
                self._changed.wait()
            self._writer = me
            self._depth += 1
        try:
            yield
        finally:
            with self._changed:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                self._changed.notify_all()


def _nova_case_class(  # noqa: C901 - nested classes
    options: NovaOptions, paste_ini: Path, authtoken: Mapping[str, Any]
) -> type:
    """A subclass of Nova's integrated-test base, built once Nova may be imported.
    ``authtoken``: the ``[keystone_authtoken]`` options of Nova's keystonemiddleware."""
    # First: this chooses eventlet or native threads (monkey_patch.patch()), and must run
    # before anything imports futurist, which imports eventlet when it can.
    import fixtures  # noqa: PLC0415
    import nova.tests.functional  # noqa: PLC0415, F401
    from nova import conf as nova_conf  # noqa: PLC0415
    from nova import context as nova_context  # noqa: PLC0415
    from nova import objects  # noqa: PLC0415
    from nova.tests import fixtures as nova_fixtures  # noqa: PLC0415
    from nova.tests.functional import integrated_helpers  # noqa: PLC0415
    from openstack import proxy as proxy_mod  # noqa: PLC0415
    from openstack import service_description  # noqa: PLC0415
    from openstack.cloud import _utils as sdk_utils  # noqa: PLC0415

    class _StderrLogging(fixtures.Fixture):
        """Instead of StandardLogging, which keeps every line (startup tracebacks included)
        in memory: Nova's lines from ``options.log_level`` go to stderr."""

        def _setUp(self) -> None:
            root = logging.getLogger()
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s [%(name)s] %(message)s")
            )
            level = logging.getLevelName(options.log_level.upper())
            handler.setLevel(level)
            previous = root.level
            root.setLevel(level)
            # nova.test calls oslo.log's setup at import time, which adds a stdout handler to
            # the root logger: stdout is for what the launcher prints.
            for existing in list(root.handlers):
                if getattr(existing, "stream", None) in {sys.stdout, sys.__stdout__}:
                    root.removeHandler(existing)
                    self.addCleanup(root.addHandler, existing)
            root.addHandler(handler)
            self.addCleanup(root.removeHandler, handler)
            self.addCleanup(root.setLevel, previous)
            # Nova's config parsing would call oslo.log's setup, adding a handler of its own.
            self.useFixture(fixtures.MonkeyPatch("oslo_log.log.setup", lambda *_args: None))

    class _NoWarningsFixture(fixtures.Fixture):
        """Instead of WarningsFixture, which makes SQLAlchemy's deprecation warnings errors:
        with SQLAlchemy 2.1 paged server listings then answer 500."""

    class _SDKFixture(fixtures.Fixture):
        """Instead of OpenStackSDKFixture, which also mocks ``openstack.proxy.Proxy.get_endpoint``
        process-wide (openstacksdk clients in this process would get a Mock for every
        endpoint). Nova still needs the rest: its Placement client made as a plain session
        client (the PlacementFixture patches that client's calls), and openstacksdk kept from
        probing the host's interfaces, which GenericPoisonFixture forbids."""

        def _setUp(self) -> None:
            description = service_description.ServiceDescription
            make_proxy = description._make_proxy

            def session_client_for_placement(desc: Any, instance: Any) -> Any:
                if desc.service_type in {"placement", "accelerator"}:
                    return instance.config.get_session_client(
                        desc.service_type, allow_version_hack=True
                    )
                return make_proxy(desc, instance)

            self.useFixture(
                fixtures.MockPatchObject(description, "_make_proxy", session_client_for_placement)
            )
            self.useFixture(
                fixtures.MockPatchObject(sdk_utils, "localhost_supports_ipv6", return_value=False)
            )
            # openstacksdk asks a new proxy for its endpoint; those session clients have no
            # auth and would fail. Only they get a made-up answer (never used for a request).
            real_get_endpoint = proxy_mod.Proxy.get_endpoint

            def get_endpoint(proxy: Any, *args: Any, **kwargs: Any) -> Any:
                if getattr(proxy, "service_type", None) in {"placement", "accelerator"}:
                    return f"http://{proxy.service_type}.realnova.invalid/"
                return real_get_endpoint(proxy, *args, **kwargs)

            self.useFixture(fixtures.MockPatchObject(proxy_mod.Proxy, "get_endpoint", get_endpoint))

    # The fixture that points the database at a cell guards it with a writer-preferring
    # reader/writer lock, made for eventlet. On native threads it deadlocks under concurrent
    # creates: a thread holding the read lock waits on an RPC whose handler needs the read
    # lock, queued behind a waiting writer. Readers that never wait for a queued writer cannot
    # deadlock that way. The module is looked up by name: the package's ``from .nova import *``
    # re-exports nova.py's own ``nova`` (the top-level package) over the submodule's name.
    cells_fixture = sys.modules["nova.tests.fixtures.nova"]
    cells_fixture.ReaderWriterLock = _ReaderPreferringLock  # type: ignore[attr-defined]

    class _NovaCase(integrated_helpers._IntegratedTestBase):
        # Nova-api returns at once and the build goes on in the background, as in production.
        CAST_AS_CALL = False
        REQUIRES_LOCKING = True
        # keystonemiddleware in nova-api's pipeline, checking tokens with Keystone.
        STUB_KEYSTONE = False

        def runTest(self) -> None:  # the TestCase needs a method to exist
            pass

        def _setup_services(self) -> None:
            self.flags(api_paste_config=str(paste_ini), group="wsgi")
            self.flags(response_validation="warn", group="api")  # production's default
            if options.max_limit is not None:
                self.flags(max_limit=options.max_limit, group="api")
            self.flags(recheck_quota=options.recheck_quota, group="quota")
            for name, value in options.quotas.items():
                self.flags(**{name: value, "group": "quota"})
            self.flags(compute_driver=options.driver)
            # keystonemiddleware registers [keystone_authtoken] when imported, but the service
            # user's options only once it loads its auth plugin, after these must be set.
            import keystonemiddleware.auth_token  # noqa: PLC0415, F401
            from keystoneauth1 import loading as ks_loading  # noqa: PLC0415

            nova_conf.CONF.register_opts(
                ks_loading.get_auth_plugin_conf_options("password"), group="keystone_authtoken"
            )
            self.flags(group="keystone_authtoken", **authtoken)
            self._slow_scheduling_on_request()
            super()._setup_services()

        def _slow_scheduling_on_request(self) -> None:
            """A create with ``SCHEDULING_DELAY_HINT`` is scheduled that many seconds late
            (only the conductor's thread for it waits; the API has answered already)."""
            from nova.conductor import manager as conductor  # noqa: PLC0415

            schedule = conductor.ComputeTaskManager._schedule_instances

            def slow_schedule(
                manager: Any, context: Any, request_spec: Any, *args: Any, **kwargs: Any
            ) -> Any:
                delay = request_spec.get_scheduler_hint(SCHEDULING_DELAY_HINT)
                if delay:
                    time.sleep(float(delay))
                return schedule(manager, context, request_spec, *args, **kwargs)

            self.useFixture(
                fixtures.MockPatchObject(
                    conductor.ComputeTaskManager, "_schedule_instances", slow_schedule
                )
            )

        def _setup_cells(self) -> None:
            made = _ReaderPreferringLock.made
            super()._setup_cells()
            if _ReaderPreferringLock.made == made:
                msg = "Nova's cell fixture made its own reader/writer lock: see _nova_case_class"
                raise RuntimeError(msg)

        def _setup_compute_service(self) -> Any:
            first = None
            for index in range(options.hosts):
                compute = self._start_compute(f"compute{index + 1}")
                first = first or compute
            return first

    originals = {
        "StandardLogging": nova_fixtures.StandardLogging,
        "WarningsFixture": nova_fixtures.WarningsFixture,
        "OpenStackSDKFixture": nova_fixtures.OpenStackSDKFixture,
    }
    replacements = {
        "StandardLogging": _StderrLogging,
        "WarningsFixture": _NoWarningsFixture,
        "OpenStackSDKFixture": _SDKFixture,
    }
    _NovaCase.fixture_swaps = (nova_fixtures, originals, replacements)
    _NovaCase.nova_context = nova_context
    _NovaCase.nova_objects = objects
    _NovaCase.fixtures_project_id = nova_fixtures.PROJECT_ID  # owns the fixtures' network
    return _NovaCase


class RealNova(_AdminHelpers):
    """Real Nova in this process and real Keystone in a child, served on 127.0.0.1 (see the
    module docstring).

    Use as a context manager. ``clouds_yaml`` (written at start, mode 0600) holds the
    ``realnova`` (password), ``realnova-appcred`` and ``realnova-admin`` clouds; point
    ``OS_CLIENT_CONFIG_FILE`` at it. Nova and Keystone keep their state for the life of the
    object.

    With ``keystone_url`` (the base URL of a Keystone another ``RealNova`` started), this one
    starts no Keystone and writes no clouds.yaml: it is another region of that cloud. Its
    Nova (a database, computes and Placement of its own) checks tokens with that Keystone,
    and it registers ``region`` there (``POST /v3/regions``) with its compute, image and
    network endpoints and the identity endpoint, as a multi-region cloud lists its one
    Keystone in every region. Its image and the flavors it makes have ids of the region's own;
    its network keeps the fixtures' id (their fake Neutron builds every port on it).
    """

    def __init__(
        self,
        options: NovaOptions | None = None,
        *,
        port: int = 0,
        clouds_yaml: Path | str | None = None,
        region: str = REGION,
        keystone_url: str | None = None,
    ) -> None:
        if (region == REGION) != (keystone_url is None):
            msg = f"{REGION} comes with a Keystone of its own; another region joins one"
            raise ValueError(msg)
        self.options = options or NovaOptions()
        self.region = region
        self._joined_keystone_url = keystone_url.rstrip("/") if keystone_url else None
        self._requested_port = port
        self._clouds_yaml = Path(clouds_yaml) if clouds_yaml else None
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        self._case: Any = None
        self._server: _ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.keystone: keystone_server.KeystoneProcess | None = None
        self.startup_seconds = 0.0
        self.flavor_ids: dict[str, str] = {}
        self.image_id = region_image_id(region)
        self.network_id = ""
        self._project_id = ""
        self.app_credential_id = ""
        self._extra_clouds: dict[str, dict[str, Any]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._joined_keystone_url is not None:
            self._start_joining(self._joined_keystone_url)
            return
        started = time.monotonic()
        # Keystone sets itself up in its own process (some 7 s) while Nova starts here.
        folder = self.clouds_yaml.parent / "keystone"
        shutil.rmtree(folder, ignore_errors=True)  # a new cloud: no users from a last run
        self.keystone = keystone_server.KeystoneProcess(
            folder,
            admin_password=ADMIN_PASSWORD,
            region=REGION,
            token_lifetime=self.options.token_lifetime,
        )
        try:
            self.keystone.start()
            self._start_nova(self.keystone.url)
            self._populate()
            self._serve()
            self.keystone.wait_ready()
            self._populate_keystone()
            self._write_clouds_yaml()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _start_joining(self, keystone_url: str) -> None:
        """Another region of the cloud whose Keystone is at ``keystone_url``."""
        started = time.monotonic()
        try:
            self._start_nova(keystone_url)
            self._populate()
            self._serve()
            self._join_catalog()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _start_nova(self, keystone_url: str) -> None:
        _prepare_nova_import()
        # keystonemiddleware as a production nova.conf sets it up, but for its cache of
        # validated tokens: every request is checked with Keystone, so revocation is seen at
        # once (production caches for token_cache_time, 300 s by default).
        authtoken = {
            "www_authenticate_uri": keystone_url,
            "auth_url": f"{keystone_url}/v3",
            "auth_type": "password",
            "username": NOVA_USER_NAME,
            "password": NOVA_PASSWORD,
            "project_name": SERVICE_PROJECT_NAME,
            "user_domain_name": DOMAIN_NAME,
            "project_domain_name": DOMAIN_NAME,
            # Where keystonemiddleware finds Keystone in the catalog: every region lists it.
            "region_name": self.region,
            "token_cache_time": -1,
            # memcached_servers is left unset: no memcached, an in-process cache (unused).
        }
        case_class = _nova_case_class(self.options, _api_paste_ini(), authtoken)
        module, originals, replacements = case_class.fixture_swaps
        for name, replacement in replacements.items():
            setattr(module, name, replacement)
        case = case_class("runTest")
        self._case = case
        try:
            case.setUp()
        finally:
            for name, original in originals.items():
                setattr(module, name, original)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._run_cleanups()
        if self.keystone is not None:
            self.keystone.stop()
            self.keystone = None
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    def _run_cleanups(self) -> None:
        case, self._case = self._case, None
        if case is None:
            return
        cleanups = getattr(case, "_cleanups", [])
        while cleanups:
            function, args, kwargs = cleanups.pop()
            try:
                function(*args, **kwargs)
            except Exception:
                logger.warning("realnova: a Nova fixture cleanup failed", exc_info=True)

    # -- setup -----------------------------------------------------------------------------------

    def _populate(self) -> None:
        case = self._case
        ctx = case.nova_context.get_admin_context()
        objects = case.nova_objects
        existing = {f.name: f for f in objects.FlavorList.get_all(ctx)}
        for spec in self.options.flavors:
            flavor = existing.get(spec.name)
            flavor_id = _flavor_id(self.region, spec.name)
            same = flavor is not None and (
                (self.region == REGION or flavor.flavorid == flavor_id)
                and flavor.vcpus == spec.vcpus
                and flavor.memory_mb == spec.ram_mib
                and flavor.root_gb == spec.disk_gib
                and dict(flavor.extra_specs or {}) == dict(spec.extra_specs)
            )
            if flavor is not None and not same:
                flavor.destroy()
                flavor = None
            if flavor is None:
                flavor = objects.Flavor(
                    context=ctx,
                    name=spec.name,
                    flavorid=flavor_id,
                    vcpus=spec.vcpus,
                    memory_mb=spec.ram_mib,
                    root_gb=spec.disk_gib,
                    ephemeral_gb=0,
                    swap=0,
                    rxtx_factor=1.0,
                    is_public=True,
                    disabled=False,
                    extra_specs=dict(spec.extra_specs),
                )
                flavor.create()
        self.flavor_ids = {f.name: f.flavorid for f in objects.FlavorList.get_all(ctx)}

        # An image named like a production one, shaped like the fixtures' own public image.
        template = copy.deepcopy(case.glance.image2)
        template.update({"id": self.image_id, "name": IMAGE_NAME, "tags": []})
        template["properties"] = {"os_distro": "ubuntu", "os_version": "24.04"}
        case.glance.create(None, template)

        # The fixtures' one network is "private"; give it the name osas configs use.
        neutron = case.neutron
        network = copy.deepcopy(neutron.network_1)
        network["name"] = NETWORK_NAME
        network["shared"] = True  # other projects (add_project) boot on it too
        neutron._networks[network["id"]] = network
        self.network_id = network["id"]

    def _populate_keystone(self) -> None:
        """What a deployment tool would make in Keystone once it answers: Nova's service user,
        the catalog, the osas project and user, the admin's role in that project, and the
        application credential (made by the user, as users make them)."""
        admin = self._admin()
        admin_user_id = admin.named("users", ADMIN_USER_NAME)["id"]
        service_project_id = admin.create_project(SERVICE_PROJECT_NAME)
        nova_user_id = admin.create_user(NOVA_USER_NAME, NOVA_PASSWORD)
        for role in ("service", "admin"):
            admin.grant(service_project_id, nova_user_id, role)
        for service_type, name, path in (
            ("compute", "nova", "/compute/v2.1"),
            ("image", "glance", "/image"),
            ("network", "neutron", "/network"),
        ):
            admin.add_service(service_type, name, f"{self.base_url}{path}")
        project_id = admin.create_project(PROJECT_NAME)
        user_id = admin.create_user(USER_NAME, USER_PASSWORD)
        admin.grant(project_id, user_id, "member")  # implies reader
        admin.grant(project_id, admin_user_id, "admin")
        self._project_id = project_id
        token, _expires_at = _password_token(
            self.auth_url, USER_NAME, USER_PASSWORD, _project_scope(PROJECT_NAME)
        )
        body = {
            "application_credential": {"name": APP_CREDENTIAL_NAME, "secret": APP_CREDENTIAL_SECRET}
        }
        _headers, answer = _http(
            "POST", f"{self.auth_url}/users/{user_id}/application_credentials", body, token=token
        )
        self.app_credential_id = str(answer["application_credential"]["id"])
        self._hand_network_to(project_id)

    def _join_catalog(self) -> None:
        """What an operator adds to the cloud's Keystone for a new region: the region, and in
        it this Nova's compute endpoint, the image and network endpoints beside it, and the
        identity endpoint (the one Keystone, listed in every region). The service user, the
        osas project and its user are the cloud's already."""
        admin = self._admin()
        admin.add_region(self.region)
        for service_type, url in (
            ("identity", self.auth_url),
            ("compute", f"{self.base_url}/compute/v2.1"),
            ("image", f"{self.base_url}/image"),
            ("network", f"{self.base_url}/network"),
        ):
            admin.add_endpoints(admin.service_id(service_type), url, self.region)
        self._project_id = str(admin.named("projects", PROJECT_NAME)["id"])
        self._hand_network_to(self._project_id)

    def _hand_network_to(self, project_id: str) -> None:
        """The fixtures' network, subnets and security group become the project's, as if it
        had made them."""
        neutron = self._case.neutron
        fixtures_project_id = self._case.fixtures_project_id
        for store in (neutron._networks, neutron._subnets, neutron._security_groups):
            for item in _snapshot(store):
                if item.get("project_id") == fixtures_project_id:
                    item["project_id"] = item["tenant_id"] = project_id

    def _serve(self) -> None:
        from keystonemiddleware import auth_token  # noqa: PLC0415 - with Nova's configuration

        case = self._case
        front = _Front(
            case.api_fixture.app(),
            functools.partial(_snapshot, case.glance.images),
            case.neutron,
            self._admin_hook,
            # Options from [keystone_authtoken], as Nova's own pipeline reads them.
            lambda app: auth_token.AuthProtocol(app, {}),
        )
        server = _ThreadingWSGIServer((HOST, self._requested_port), _QuietHandler)
        server.set_app(front)
        self._server = server
        front.base_url = self.base_url
        self._thread = threading.Thread(
            target=server.serve_forever, name="realnova-http", kwargs={"poll_interval": 0.2}
        )
        self._thread.daemon = True
        self._thread.start()

    def _admin_hook(self, action: str, body: Any) -> Any:
        arguments = body if isinstance(body, dict) else {}
        if self.keystone is None and action in {"projects", "keystone"}:
            message = f"{self.region} joined a Keystone: ask the launcher of {REGION}"
            raise _HTTPError(400, {"error": {"code": 400, "message": message}})
        if action == "projects":
            name = str(arguments.get("name") or "")
            if not name:
                raise _HTTPError(400, {"error": {"code": 400, "message": "name is required"}})
            return self.add_project(name)
        if action == "keystone":
            lifetime = arguments.get("token_lifetime")
            if lifetime is not None and not isinstance(lifetime, int):
                raise _HTTPError(400, {"error": {"code": 400, "message": "seconds or null"}})
            self.set_token_lifetime(lifetime)
            return {"token_lifetime": self._keystone().token_lifetime}
        raise _HTTPError(404, {"error": {"code": 404, "message": f"no action {action}"}})

    # -- what tests use --------------------------------------------------------------------------

    def _keystone(self) -> keystone_server.KeystoneProcess:
        if self.keystone is None:
            if self._joined_keystone_url is not None:
                msg = f"{self.region} joined a Keystone it does not run"
                raise RuntimeError(msg)
            raise RuntimeError("RealNova is not started")
        return self.keystone

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("RealNova is not started")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def auth_url(self) -> str:
        if self._joined_keystone_url is not None:
            return f"{self._joined_keystone_url}/v3"
        return self._keystone().auth_url

    @property
    def clouds_yaml(self) -> Path:
        if self._clouds_yaml is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="realnova-")
            self._clouds_yaml = Path(self._tempdir.name) / "clouds.yaml"
        return self._clouds_yaml

    @property
    def project_id(self) -> str:
        return self._project_id

    @property
    def nova(self) -> Any:
        """The fixtures' test case (``.api``, ``.admin_api``, ``.computes``, ``.glance``,
        ``.neutron``...), for what the HTTP API cannot do."""
        return self._case

    def set_token_lifetime(self, seconds: int | None) -> None:
        """Keystone's ``[token] expiration`` from now on (None: the options' own), Keystone
        restarted with it (some 2 s) on the same port, keys and database: tokens already issued
        keep the expiry they were issued with."""
        keystone = self._keystone()
        lifetime = self.options.token_lifetime if seconds is None else seconds
        if lifetime != keystone.token_lifetime:
            keystone.restart(token_lifetime=lifetime)

    def cloud_entry(self, kind: str = CLOUD) -> dict[str, Any]:
        auth: dict[str, Any] = {"auth_url": self.auth_url}
        if kind == APPCRED_CLOUD:
            auth.update(
                application_credential_id=self.app_credential_id,
                application_credential_secret=APP_CREDENTIAL_SECRET,
            )
        else:
            admin = kind == ADMIN_CLOUD
            auth.update(
                username=ADMIN_USER_NAME if admin else USER_NAME,
                password=ADMIN_PASSWORD if admin else USER_PASSWORD,
                project_name=PROJECT_NAME,
                user_domain_name=DOMAIN_NAME,
                project_domain_name=DOMAIN_NAME,
            )
        entry: dict[str, Any] = {
            "auth": auth,
            "region_name": REGION,
            "interface": "public",
            "identity_api_version": 3,
        }
        if kind == APPCRED_CLOUD:
            entry["auth_type"] = "v3applicationcredential"
        return entry

    def _write_clouds_yaml(self) -> None:
        clouds = {kind: self.cloud_entry(kind) for kind in (CLOUD, APPCRED_CLOUD, ADMIN_CLOUD)}
        clouds.update(self._extra_clouds)
        _write_private_yaml(self.clouds_yaml, {"clouds": clouds})

    def add_project(self, name: str) -> dict[str, Any]:
        """A new project in Keystone with a member user ``name`` (password ``name``-secret),
        added to clouds.yaml as cloud ``realnova-<name>``: a clean slate for one test. Nova
        learns of the project from its first request."""
        admin = self._admin()
        password = f"{name}-secret"
        project_id = admin.create_project(name)
        user_id = admin.create_user(name, password)
        admin.grant(project_id, user_id, "member")
        cloud = f"{CLOUD}-{name}"
        self._extra_clouds[cloud] = {
            "auth": {
                "auth_url": self.auth_url,
                "username": name,
                "password": password,
                "project_name": name,
                "user_domain_name": DOMAIN_NAME,
                "project_domain_name": DOMAIN_NAME,
            },
            "region_name": REGION,
            "interface": "public",
            "identity_api_version": 3,
        }
        self._write_clouds_yaml()
        return {"cloud": cloud, "project_id": project_id, "user_id": user_id}

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"region": self.region, "base_url": self.base_url}
        info["auth_url"] = self.auth_url
        if self.keystone is not None:  # the first region's: its Keystone and clouds.yaml
            info.update(
                keystone_log=str(self.keystone.log_path),
                token_lifetime=self.keystone.token_lifetime,
                clouds_yaml=str(self.clouds_yaml),
                cloud=CLOUD,
                appcred_cloud=APPCRED_CLOUD,
                admin_cloud=ADMIN_CLOUD,
            )
        return {
            **info,
            "project_id": self.project_id,
            "project_name": PROJECT_NAME,
            "image": IMAGE_NAME,
            "image_id": self.image_id,
            "network": NETWORK_NAME,
            "network_id": self.network_id,
            "flavors": self.flavor_ids,
            "hosts": self.options.hosts,
            "driver": self.options.driver,
            "startup_seconds": round(self.startup_seconds, 2),
            "pid": os.getpid(),
        }


def _write_private_yaml(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        yaml.safe_dump(dict(document), stream, sort_keys=False)


# ================================================================================================
# Real Nova in a process of its own
# ================================================================================================

READY_PREFIX = "realnova: ready "


class RealNovaProcess(_AdminHelpers):
    """``RealNova`` in a child interpreter (this file run as a script), for tests. ``python``
    is the interpreter to run it with (one where ``nova`` and ``keystone`` are installed);
    ``log_path`` receives Nova's stderr, ``workdir/keystone/keystone.log`` Keystone's log.

    With ``keystone_url`` (``RealNovaProcess.keystone_url`` of the first region's), the child
    is another ``region`` of that cloud (``RealNova``'s ``keystone_url``): a Nova of its own
    in the same Keystone's catalog, reached with the first region's clouds.yaml entries and
    their ``region_name`` set to ``region``. ``freeze`` and ``thaw`` make a region stop
    answering and answer again."""

    def __init__(
        self,
        options: NovaOptions | None = None,
        *,
        workdir: Path | str,
        python: str = sys.executable,
        startup_timeout: float = 120.0,
        region: str = REGION,
        keystone_url: str | None = None,
    ) -> None:
        if (region == REGION) != (keystone_url is None):
            msg = f"{REGION} comes with a Keystone of its own; another region joins one"
            raise ValueError(msg)
        self.options = options or NovaOptions()
        self.region = region
        self.joins = keystone_url  # the Keystone this region joins (None: it runs its own)
        self.workdir = Path(workdir)
        self.python = python
        self.startup_timeout = startup_timeout
        self.info: dict[str, Any] = {}
        self.log_path = self.workdir / "realnova.log"
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._frozen = False
        self.startup_seconds = 0.0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        command = [self.python, str(Path(__file__).resolve()), "--parent-pid", str(os.getpid())]
        if self.joins is None:
            command += ["--clouds-yaml", str(self.workdir / "clouds.yaml")]
        else:
            command += ["--region", self.region, "--keystone-url", self.joins]
        command += self.options.to_args()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
        env["PYTHONUNBUFFERED"] = "1"
        with self.log_path.open("w") as log:
            self._process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
            )
        ready = threading.Event()
        lines: list[str] = []

        def read() -> None:  # until the child closes its stdout
            assert self._process is not None
            assert self._process.stdout is not None
            for line in self._process.stdout:
                lines.append(line)
                if line.startswith(READY_PREFIX):
                    self.info = json.loads(line[len(READY_PREFIX) :])
                    ready.set()
            ready.set()  # the process ended

        self._reader = threading.Thread(target=read, name="realnova-stdout", daemon=True)
        self._reader.start()
        if not ready.wait(self.startup_timeout) or not self.info:
            self.stop()
            log_tail = self.log_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(
                f"real Nova did not start ({' '.join(command)}):\n"
                f"stdout: {''.join(lines)[-2000:]}\nstderr: {log_tail}"
            )
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if self._frozen and process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a stopped process would not see SIGTERM
            self._frozen = False
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        if process.stdout is not None:
            process.stdout.close()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def freeze(self) -> None:
        """The region stops answering (SIGSTOP): its port still takes connections (the
        kernel's backlog) and nothing answers them, a region whose API hangs; requests wait
        for the client's timeout. Nova's own work stops too (keep it well under a minute:
        Nova takes a compute silent for service_down_time, 60 s, for down)."""
        if self._process is None:
            raise RuntimeError("real Nova is not started")
        self._process.send_signal(signal.SIGSTOP)
        self._frozen = True

    def thaw(self) -> None:
        """The region answers again (SIGCONT): what was sent meanwhile is answered late, to
        clients that may have given up."""
        if self._process is None:
            raise RuntimeError("real Nova is not started")
        self._process.send_signal(signal.SIGCONT)
        self._frozen = False

    @property
    def keystone_url(self) -> str:
        """The cloud's Keystone (base URL, without /v3): what another region joins."""
        return self.auth_url.removesuffix("/v3")

    @property
    def base_url(self) -> str:
        return str(self.info["base_url"])

    @property
    def auth_url(self) -> str:
        return str(self.info["auth_url"])

    @property
    def clouds_yaml(self) -> Path:
        return Path(self.info["clouds_yaml"])

    @property
    def project_id(self) -> str:
        return str(self.info["project_id"])

    def add_project(self, name: str) -> dict[str, Any]:
        """As ``RealNova.add_project``: a fresh project and a ``realnova-<name>`` cloud."""
        return self._admin().call("POST", "/_realnova/projects", {"name": name})

    def set_token_lifetime(self, seconds: int | None) -> None:
        """As ``RealNova.set_token_lifetime``: Keystone restarted with a new ``[token]
        expiration`` (None: the options' own)."""
        self._admin().call("POST", "/_realnova/keystone", {"token_lifetime": seconds})


# ================================================================================================
# python cloud.py
# ================================================================================================


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="realnova",
        description="Real Nova (from its functional-test fixtures) and Keystone on 127.0.0.1",
    )
    parser.add_argument("--port", type=int, default=0, help="0 (default): a free port")
    parser.add_argument("--clouds-yaml", type=Path, help="where to write clouds.yaml")
    parser.add_argument(
        "--keystone-url",
        help="join this Keystone (another launcher's) as region --region: no Keystone, no "
        "clouds.yaml of its own",
    )
    parser.add_argument("--region", default=REGION, help="with --keystone-url")
    parser.add_argument("--hosts", type=int, default=1, help="fake compute hosts")
    parser.add_argument("--driver", default="fake.FakeDriver", help="compute_driver")
    parser.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Nova [quota] default (instances, cores, ram...); repeatable",
    )
    parser.add_argument("--max-limit", type=int, help="Nova's [api] max_limit (page size cap)")
    parser.add_argument("--no-recheck-quota", action="store_true")
    parser.add_argument("--flavors", help="flavors as JSON (name, vcpus, ram_mib, disk_gib...)")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--token-lifetime",
        type=int,
        default=keystone_server.DEFAULT_TOKEN_LIFETIME,
        help="Keystone's [token] expiration, in seconds",
    )
    parser.add_argument(
        "--parent-pid", type=int, help="stop when this process is gone (orphaned by a test run)"
    )
    return parser.parse_args(argv)


def _options_from_args(args: argparse.Namespace) -> NovaOptions:
    quotas = dict(DEFAULT_QUOTAS)
    for item in args.quota:
        name, _, value = item.partition("=")
        quotas[name.strip()] = int(value)
    flavors = DEFAULT_FLAVORS
    if args.flavors:
        flavors = tuple(
            FlavorSpec(
                f["name"], f["vcpus"], f["ram_mib"], f["disk_gib"], f.get("extra_specs") or {}
            )
            for f in json.loads(args.flavors)
        )
    return NovaOptions(
        hosts=args.hosts,
        driver=args.driver,
        quotas=quotas,
        max_limit=args.max_limit,
        flavors=flavors,
        recheck_quota=not args.no_recheck_quota,
        log_level=args.log_level,
        token_lifetime=args.token_lifetime,
    )


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    def handle(signum: int, frame: Any) -> None:
        del signum, frame
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    stop = threading.Event()
    nova = RealNova(
        _options_from_args(args),
        port=args.port,
        clouds_yaml=args.clouds_yaml,
        region=args.region,
        keystone_url=args.keystone_url,
    )
    with _stop_on_signals(stop), nova:
        info = nova.describe()
        if args.keystone_url:
            print(f"realnova: {nova.region} joined keystone at {nova.auth_url}", flush=True)  # noqa: T201
        else:
            print(f"realnova: keystone at {nova.auth_url}", flush=True)  # noqa: T201
            print(  # noqa: T201
                f"realnova: clouds.yaml at {nova.clouds_yaml} "
                f"(clouds {CLOUD}, {APPCRED_CLOUD}, {ADMIN_CLOUD})",
                flush=True,
            )
        print(READY_PREFIX + json.dumps(info), flush=True)  # noqa: T201
        while not stop.wait(0.5):
            if args.parent_pid and os.getppid() != args.parent_pid:
                break  # whoever started us is gone (a test run killed with -9, say)


if __name__ == "__main__":
    sys.exit(main())
