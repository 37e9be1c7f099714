"""Real Nova on 127.0.0.1, for the real-Nova test lane (``nox -s nova``).

``RealNova`` starts the nova-api WSGI app, conductor, scheduler and fake-driver computes in
this process, from the functional-test fixtures the pinned ``nova`` wheel ships
(``nova.tests.functional.integrated_helpers._IntegratedTestBase``, set up by hand outside any
test runner): in-process Placement, the fixtures' fake Glance and Neutron, sqlite, the fake
oslo.messaging transport. It serves everything on one free 127.0.0.1 port behind small facades,
so that unmodified openstacksdk reaches it as it reaches a production cloud:

- ``/identity``: Keystone v3 (version discovery, password and application-credential tokens
  with a service catalog). A token is mapped to the headers the fixtures' keystone stub reads
  (``X-Auth-User``, ``X-Auth-Project-Id``, ``X-Roles``; the stub makes user ``admin`` an admin);
  whatever a client sends in those headers itself is dropped, as keystonemiddleware does.
- ``/compute``: nova-api itself (its own version documents, microversions, policy, quotas).
- ``/image``: Glance v2, read-only, over the fixtures' fake image service.
- ``/network``: Neutron v2.0, read-only (networks, subnets, ports, security groups), over the
  fixtures' fake Neutron.

``RealNovaProcess`` runs the same thing in a child interpreter (``python cloud.py``), which is
what tests should normally use: Nova's fixtures patch process-wide state (``os.uname`` and
``psutil.net_if_addrs`` poisoned, ``mock``'s autospec patched, ``HOME`` and the tempdir moved,
root logging, openstacksdk's IPv6 probe), and under pytest's ``filterwarnings = error`` Nova's
own DeprecationWarnings (webob's ``cgi`` import, SQLAlchemy) become errors: in-process use under
pytest needs ``-W ignore::DeprecationWarning``. Nova runs on native threads only
(``OS_NOVA_DISABLE_EVENTLET_PATCHING=1``, set here): tried in eventlet mode, Nova answered
but the launcher never printed "ready" nor stopped on SIGTERM. Run by hand::

    python tests/realnova/cloud.py --clouds-yaml /tmp/realnova/clouds.yaml --port 8774

prints the Keystone URL and the clouds.yaml path, and serves until SIGTERM or Ctrl-C.

Admin helpers (both classes): ``set_quota`` (Nova's os-quota-sets), ``reset_state`` (force a
server to ERROR), ``admin_servers`` (every project), ``add_project`` (a fresh project and user,
added to clouds.yaml as ``realnova-<name>``).

Only the standard library and PyYAML are imported at module level: this module can be
imported where Nova is not installed (``RealNovaProcess`` then fails to start, cleanly).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import logging
import os
import secrets
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
from urllib.parse import parse_qs, urlencode
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import yaml

logger = logging.getLogger("realnova")

HOST = "127.0.0.1"
REGION = "RegionOne"
DOMAIN_ID = "default"
DOMAIN_NAME = "Default"

# clouds.yaml entries written by the launcher.
CLOUD = "realnova"  # the member user, password auth
APPCRED_CLOUD = "realnova-appcred"  # the same user and project, application credential
ADMIN_CLOUD = "realnova-admin"  # user "admin" (an admin for Nova's policy), same project

# The project of the fixtures: their network, subnets and security group belong to it.
PROJECT_ID = "6f70656e737461636b20342065766572"
PROJECT_NAME = "osas"
USER_NAME = "osas"
USER_PASSWORD = "osas-secret"
ADMIN_USER_ID = "admin"  # the fixtures' keystone stub makes exactly this user id an admin
ADMIN_PASSWORD = "admin-secret"
APP_CREDENTIAL_ID = "0c5bb8e2a0f84f2c9f1cbd7c8a3b6e11"
APP_CREDENTIAL_SECRET = "osas-appcred-secret"

IMAGE_NAME = "ubuntu-24.04"
IMAGE_ID = "5b1c3f4e-8d2a-4e6b-9c7d-1a2b3c4d5e6f"
NETWORK_NAME = "cluster-net"  # the fixtures' one network ("private"), renamed


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

    def to_args(self) -> list[str]:
        args = ["--hosts", str(self.hosts), "--driver", self.driver]
        args += ["--log-level", self.log_level]
        for name, value in self.quotas.items():
            args += ["--quota", f"{name}={value}"]
        if self.max_limit is not None:
            args += ["--max-limit", str(self.max_limit)]
        if not self.recheck_quota:
            args.append("--no-recheck-quota")
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
# Keystone v3
# ================================================================================================


@dataclass(frozen=True, slots=True)
class _User:
    user_id: str
    name: str
    password: str
    project_id: str
    project_name: str
    roles: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Token:
    token_id: str
    user: _User
    scoped: bool
    methods: tuple[str, ...]
    issued_at: datetime
    expires_at: datetime
    application_credential_id: str | None = None


class _Keystone:
    """Users, application credentials and tokens: just what keystoneauth's password and
    v3applicationcredential plugins need."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users: dict[str, _User] = {}
        self.app_credentials: dict[str, tuple[str, str, _User]] = {}  # id -> (name, secret, user)
        self.tokens: dict[str, _Token] = {}

    def add_user(
        self,
        name: str,
        password: str,
        project_name: str,
        *,
        user_id: str | None = None,
        project_id: str | None = None,
        admin: bool = False,
    ) -> _User:
        roles = ("reader", "member", "admin") if admin else ("reader", "member")
        user = _User(
            user_id=user_id or uuid.uuid5(uuid.NAMESPACE_URL, f"realnova/user/{name}").hex,
            name=name,
            password=password,
            project_id=project_id
            or uuid.uuid5(uuid.NAMESPACE_URL, f"realnova/project/{project_name}").hex,
            project_name=project_name,
            roles=roles,
        )
        with self.lock:
            self.users[user.user_id] = user
        return user

    def token(self, token_id: str | None) -> _Token | None:
        with self.lock:
            token = self.tokens.get(token_id or "")
        if token is None or token.expires_at <= datetime.now(UTC):
            return None
        return token

    def issue(self, body: Any) -> _Token:
        auth = body.get("auth") if isinstance(body, dict) else None
        identity = auth.get("identity") if isinstance(auth, dict) else None
        if not isinstance(identity, dict) or not isinstance(identity.get("methods"), list):
            raise _HTTPError(400, _keystone_error(400, "Bad Request", "Expecting auth.identity."))
        methods = tuple(str(m) for m in identity["methods"])
        credential_id = None
        if "application_credential" in methods:
            user, credential_id = self._check_app_credential(identity.get("application_credential"))
            scoped = True
        elif "password" in methods:
            user = self._check_password(identity.get("password"))
            scoped = self._check_scope(auth.get("scope"), user)
        else:
            raise _unauthorized()
        now = datetime.now(UTC)
        token = _Token(
            secrets.token_hex(20),
            user,
            scoped,
            methods,
            now,
            now + timedelta(hours=12),
            credential_id,
        )
        with self.lock:
            self.tokens[token.token_id] = token
        return token

    def _check_password(self, password: Any) -> _User:
        ref = password.get("user") if isinstance(password, dict) else None
        if not isinstance(ref, dict):
            raise _unauthorized()
        with self.lock:
            users = list(self.users.values())
        for user in users:
            named = ("id" in ref and ref["id"] == user.user_id) or (
                ref.get("name") == user.name and _names_default_domain(ref.get("domain"))
            )
            if named and secrets.compare_digest(str(ref.get("password", "")), user.password):
                return user
        raise _unauthorized()

    def _check_app_credential(self, ref: Any) -> tuple[_User, str]:
        if not isinstance(ref, dict):
            raise _unauthorized()
        with self.lock:
            credentials = dict(self.app_credentials)
        for credential_id, (name, secret, user) in credentials.items():
            named = ref.get("id") == credential_id or (
                "id" not in ref
                and ref.get("name") == name
                and isinstance(ref.get("user"), dict)
                and (ref["user"].get("id") == user.user_id or ref["user"].get("name") == user.name)
            )
            if named and secrets.compare_digest(str(ref.get("secret", "")), secret):
                return user, credential_id
        raise _unauthorized()

    def _check_scope(self, scope: Any, user: _User) -> bool:
        if scope is None:
            return False  # unscoped: no catalog
        project = scope.get("project") if isinstance(scope, dict) else None
        if not isinstance(project, dict):
            raise _unauthorized()  # domain and system scopes: not here
        if "id" in project:
            if project["id"] != user.project_id:
                raise _unauthorized()
        elif project.get("name") != user.project_name or not _names_default_domain(
            project.get("domain")
        ):
            raise _unauthorized()
        return True

    def token_body(self, token: _Token, base_url: str) -> dict[str, Any]:
        user = token.user
        body: dict[str, Any] = {
            "methods": list(token.methods),
            "user": {
                "id": user.user_id,
                "name": user.name,
                "domain": {"id": DOMAIN_ID, "name": DOMAIN_NAME},
                "password_expires_at": None,
            },
            "audit_ids": [secrets.token_urlsafe(16)],
            "issued_at": _iso(token.issued_at),
            "expires_at": _iso(token.expires_at),
        }
        if token.scoped:
            body["project"] = {
                "id": user.project_id,
                "name": user.project_name,
                "domain": {"id": DOMAIN_ID, "name": DOMAIN_NAME},
            }
            body["is_domain"] = False
            body["roles"] = [
                {"id": uuid.uuid5(uuid.NAMESPACE_URL, f"realnova/role/{r}").hex, "name": r}
                for r in user.roles
            ]
            body["catalog"] = _catalog(base_url)
        if token.application_credential_id is not None:
            name = self.app_credentials[token.application_credential_id][0]
            body["application_credential"] = {
                "id": token.application_credential_id,
                "name": name,
                "restricted": True,
            }
        return body


def _names_default_domain(domain: Any) -> bool:
    if not isinstance(domain, dict):
        return False
    return domain.get("id") == DOMAIN_ID or domain.get("name") == DOMAIN_NAME


def _catalog(base_url: str) -> list[dict[str, Any]]:
    services = {
        "identity": ("keystone", f"{base_url}/identity"),
        "compute": ("nova", f"{base_url}/compute/v2.1"),
        "image": ("glance", f"{base_url}/image"),
        "network": ("neutron", f"{base_url}/network"),
    }
    return [
        {
            "type": service_type,
            "name": name,
            "id": uuid.uuid5(uuid.NAMESPACE_URL, f"realnova/service/{service_type}").hex,
            "endpoints": [
                {
                    "id": uuid.uuid5(
                        uuid.NAMESPACE_URL, f"realnova/endpoint/{service_type}/{interface}"
                    ).hex,
                    "interface": interface,
                    "region": REGION,
                    "region_id": REGION,
                    "url": url,
                }
                for interface in ("public", "internal", "admin")
            ],
        }
        for service_type, (name, url) in services.items()
    ]


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _iso_seconds(moment: Any) -> str | None:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return None if moment is None else str(moment)


def _keystone_error(status: int, title: str, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "title": title, "message": message}}


def _unauthorized() -> _HTTPError:
    return _HTTPError(
        401,
        _keystone_error(401, "Unauthorized", "The request you have made requires authentication."),
    )


# ================================================================================================
# The HTTP front: one WSGI app routing to Keystone, Nova, Glance and Neutron
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

# Headers keystonemiddleware would strip from a client's request before setting its own.
_IDENTITY_HEADERS = (
    "HTTP_X_AUTH_USER",
    "HTTP_X_AUTH_PROJECT_ID",
    "HTTP_X_ROLES",
    "HTTP_X_ROLE",
    "HTTP_X_USER_ID",
    "HTTP_X_USER",
    "HTTP_X_USER_NAME",
    "HTTP_X_PROJECT_ID",
    "HTTP_X_PROJECT_NAME",
    "HTTP_X_TENANT_ID",
    "HTTP_X_TENANT",
    "HTTP_X_TENANT_NAME",
    "HTTP_X_IDENTITY_STATUS",
    "HTTP_X_SERVICE_CATALOG",
)
# Nova's unauthenticated version documents, below /compute.
_COMPUTE_VERSION_PATHS = {"", "/", "/v2", "/v2/", "/v2.1", "/v2.1/"}


class _Front:
    """The WSGI app on the port: facades plus nova-api."""

    def __init__(
        self,
        keystone: _Keystone,
        nova_app: Callable[..., Any],
        images: Callable[[], Iterable[Mapping[str, Any]]],
        neutron: Any,
        admin_hook: Callable[[str, Any], Any],
    ) -> None:
        self.keystone = keystone
        self.nova_app = nova_app
        self.images = images
        self.neutron = neutron
        self.admin_hook = admin_hook
        self.base_url = ""

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "") or "/"
        try:
            if path == "/compute" or path.startswith("/compute/"):
                return self._nova(environ, start_response, path[len("/compute") :])
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
        if path == "/identity" or path.startswith("/identity/"):
            return self._identity(method, path, environ)
        if path == "/image" or path.startswith("/image/"):
            return self._image(method, path, query, environ)
        if path == "/network" or path.startswith("/network/"):
            return self._network(method, path, query, environ)
        if path.startswith("/_realnova/"):
            return self._control(method, path, environ)
        raise _HTTPError(404, {"error": {"code": 404, "message": "not served"}})

    # -- helpers ---------------------------------------------------------------------------------

    def _authenticated(self, environ: Mapping[str, Any]) -> _Token:
        token = self.keystone.token(environ.get("HTTP_X_AUTH_TOKEN"))
        if token is None or not token.scoped:
            raise _HTTPError(
                401,
                _keystone_error(
                    401, "Unauthorized", "The request you have made requires authentication."
                ),
                {"WWW-Authenticate": f'Keystone uri="{self.base_url}/identity"'},
            )
        return token

    # -- Nova ------------------------------------------------------------------------------------

    def _nova(self, environ: dict[str, Any], start_response: Callable[..., Any], rest: str) -> Any:
        for name in _IDENTITY_HEADERS:
            environ.pop(name, None)
        if rest not in _COMPUTE_VERSION_PATHS:
            token = self._authenticated(environ)
            user = token.user
            environ["HTTP_X_AUTH_USER"] = user.user_id
            environ["HTTP_X_AUTH_PROJECT_ID"] = user.project_id
            environ["HTTP_X_ROLES"] = ",".join(user.roles)
            # What keystonemiddleware sets as well (the fixtures' stub reads the three above).
            environ["HTTP_X_USER_ID"] = user.user_id
            environ["HTTP_X_USER_NAME"] = user.name
            environ["HTTP_X_PROJECT_ID"] = user.project_id
            environ["HTTP_X_PROJECT_NAME"] = user.project_name
            environ["HTTP_X_IDENTITY_STATUS"] = "Confirmed"
        environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + "/compute"
        environ["PATH_INFO"] = rest
        return self.nova_app(environ, start_response)

    # -- Keystone --------------------------------------------------------------------------------

    def _identity_version(self) -> dict[str, Any]:
        return {
            "id": "v3.14",
            "status": "stable",
            "updated": "2020-04-07T00:00:00Z",
            "links": [{"rel": "self", "href": f"{self.base_url}/identity/v3/"}],
            "media-types": [
                {"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}
            ],
        }

    def _identity(
        self, method: str, path: str, environ: Mapping[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        path = path.rstrip("/")
        if path == "/identity" and method == "GET":
            return 300, {"versions": {"values": [self._identity_version()]}}, {}
        if path == "/identity/v3" and method == "GET":
            return 200, {"version": self._identity_version()}, {}
        if path == "/identity/v3/auth/tokens" and method in {"POST", "GET", "DELETE"}:
            return self._tokens(method, environ)
        if path.startswith("/identity/v3/projects/") and method == "GET":
            token = self._authenticated(environ)
            wanted = path.rsplit("/", 1)[1]
            with self.keystone.lock:
                projects = {(u.project_id, u.project_name) for u in self.keystone.users.values()}
            for project_id, name in projects:
                if project_id == wanted and (
                    "admin" in token.user.roles or project_id == token.user.project_id
                ):
                    return 200, {"project": _project_body(project_id, name)}, {}
            raise _HTTPError(404, _keystone_error(404, "Not Found", "Could not find project."))
        raise _HTTPError(404, _keystone_error(404, "Not Found", "Not served by realnova."))

    def _tokens(self, method: str, environ: Mapping[str, Any]) -> tuple[int, Any, dict[str, str]]:
        if method == "POST":
            token = self.keystone.issue(_json_body(environ))
            body = {"token": self.keystone.token_body(token, self.base_url)}
            return 201, body, {"X-Subject-Token": token.token_id}
        self._authenticated(environ)
        subject = self.keystone.token(environ.get("HTTP_X_SUBJECT_TOKEN"))
        if subject is None:
            raise _HTTPError(404, _keystone_error(404, "Not Found", "Could not find token."))
        if method == "GET":
            body = {"token": self.keystone.token_body(subject, self.base_url)}
            return 200, body, {"X-Subject-Token": subject.token_id}
        with self.keystone.lock:
            self.keystone.tokens.pop(subject.token_id, None)
        return 204, None, {}

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
        token = self._authenticated(environ)
        images = [self._glance_image(meta) for meta in self.images()]
        images = [
            i for i in images if i["visibility"] != "private" or i["owner"] == token.user.project_id
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
        owner = properties.pop("owner", None) or meta.get("owner") or PROJECT_ID
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
        token = self._authenticated(environ)
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
            if "admin" in token.user.roles
            or item.get("shared")
            or item.get("project_id", item.get("tenant_id")) == token.user.project_id
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
        token = self._authenticated(environ)
        if "admin" not in token.user.roles:
            raise _HTTPError(403, {"error": {"code": 403, "message": "admin only"}})
        if method != "POST":
            raise _HTTPError(405, {"error": {"code": 405, "message": "POST only"}})
        return 200, self.admin_hook(path[len("/_realnova/") :], _json_body(environ)), {}


def _snapshot(store: Mapping[str, Any]) -> list[Any]:
    """The values of a fixture's dict, which Nova's threads may be changing meanwhile (a copy
    is taken at once; iterating the dict itself could fail half-way)."""
    return list(dict(store).values())


def _project_body(project_id: str, name: str) -> dict[str, Any]:
    return {
        "id": project_id,
        "name": name,
        "domain_id": DOMAIN_ID,
        "enabled": True,
        "is_domain": False,
        "parent_id": DOMAIN_ID,
        "description": "",
        "tags": [],
        "options": {},
    }


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


class _AdminClient:
    """Nova's admin API through the facade, with the ``admin`` user's token."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._token: str | None = None

    def _get_token(self) -> str:
        if self._token is None:
            body = {
                "auth": {
                    "identity": {
                        "methods": ["password"],
                        "password": {"user": {"id": ADMIN_USER_ID, "password": ADMIN_PASSWORD}},
                    },
                    "scope": {"project": {"id": PROJECT_ID}},
                }
            }
            _status, headers, _body = self._request(
                "POST", "/identity/v3/auth/tokens", body, token=None
            )
            self._token = headers["X-Subject-Token"]
        return self._token

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None,
        microversion: str | None = None,
    ) -> tuple[int, Mapping[str, str], Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
            self.base_url + path, data=data, method=method
        )
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
        parsed = json.loads(raw) if raw else None
        if status >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {status} {raw[:500]!r}")
        return status, headers, parsed

    def call(
        self, method: str, path: str, body: Any = None, microversion: str | None = None
    ) -> Any:
        return self._request(
            method, path, body, token=self._get_token(), microversion=microversion
        )[2]


class _AdminHelpers:
    """Admin helpers shared by RealNova and RealNovaProcess (``base_url`` is theirs)."""

    @property
    def base_url(self) -> str:
        raise NotImplementedError

    def _admin(self) -> _AdminClient:
        client: _AdminClient | None = getattr(self, "_admin_client", None)
        if client is None or client.base_url != self.base_url:
            client = _AdminClient(self.base_url)
            self._admin_client = client
        return client

    def set_quota(self, project_id: str | None = None, **limits: int) -> dict[str, Any]:
        """Nova's quota for a project, through Nova's own quota API (os-quota-sets)."""
        project = project_id or PROJECT_ID
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

    def __init__(self) -> None:
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


def _nova_case_class(options: NovaOptions, paste_ini: Path) -> type:  # noqa: C901 - nested classes
    """A subclass of Nova's integrated-test base, built once Nova may be imported."""
    # First: this chooses eventlet or native threads (monkey_patch.patch()), and must run
    # before anything imports futurist, which imports eventlet when it can.
    import fixtures  # noqa: PLC0415
    import nova.tests.functional  # noqa: PLC0415, F401
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
    # deadlock that way.
    nova_fixtures.nova.ReaderWriterLock = _ReaderPreferringLock

    class _NovaCase(integrated_helpers._IntegratedTestBase):
        # Nova-api returns at once and the build goes on in the background, as in production.
        CAST_AS_CALL = False
        REQUIRES_LOCKING = True

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
            super()._setup_services()

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
    return _NovaCase


class RealNova(_AdminHelpers):
    """Real Nova in this process, served on 127.0.0.1 (see the module docstring).

    Use as a context manager. ``clouds_yaml`` (written at start, mode 0600) holds the
    ``realnova`` (password), ``realnova-appcred`` and ``realnova-admin`` clouds; point
    ``OS_CLIENT_CONFIG_FILE`` at it. Nova keeps its state for the life of the object.
    """

    def __init__(
        self,
        options: NovaOptions | None = None,
        *,
        port: int = 0,
        clouds_yaml: Path | str | None = None,
    ) -> None:
        self.options = options or NovaOptions()
        self._requested_port = port
        self._clouds_yaml = Path(clouds_yaml) if clouds_yaml else None
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        self._case: Any = None
        self._server: _ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.keystone = _Keystone()
        self.startup_seconds = 0.0
        self.flavor_ids: dict[str, str] = {}
        self.image_id = IMAGE_ID
        self.network_id = ""
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
        started = time.monotonic()
        _prepare_nova_import()
        case_class = _nova_case_class(self.options, _api_paste_ini())
        module, _originals, replacements = case_class.fixture_swaps
        for name, replacement in replacements.items():
            setattr(module, name, replacement)
        case = case_class("runTest")
        self._case = case
        try:
            case.setUp()
        except BaseException:
            self._run_cleanups()
            raise
        finally:
            for name, original in _originals.items():
                setattr(module, name, original)
        try:
            self._populate()
            self._serve()
            self._write_clouds_yaml()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._run_cleanups()
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
            same = flavor is not None and (
                flavor.vcpus == spec.vcpus
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
                    flavorid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"realnova/flavor/{spec.name}")),
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
        template.update({"id": IMAGE_ID, "name": IMAGE_NAME, "tags": []})
        template["properties"] = {"os_distro": "ubuntu", "os_version": "24.04"}
        case.glance.create(None, template)

        # The fixtures' one network is "private"; give it the name osas configs use.
        neutron = case.neutron
        network = copy.deepcopy(neutron.network_1)
        network["name"] = NETWORK_NAME
        network["shared"] = True  # other projects (add_project) boot on it too
        neutron._networks[network["id"]] = network
        self.network_id = network["id"]

        keystone = self.keystone
        user = keystone.add_user(USER_NAME, USER_PASSWORD, PROJECT_NAME, project_id=PROJECT_ID)
        keystone.app_credentials[APP_CREDENTIAL_ID] = ("osas", APP_CREDENTIAL_SECRET, user)
        keystone.add_user(
            "admin",
            ADMIN_PASSWORD,
            PROJECT_NAME,
            user_id=ADMIN_USER_ID,
            project_id=PROJECT_ID,
            admin=True,
        )

    def _serve(self) -> None:
        case = self._case
        front = _Front(
            self.keystone,
            case.api_fixture.app(),
            functools.partial(_snapshot, case.glance.images),
            case.neutron,
            self._admin_hook,
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
        if action == "projects":
            name = str((body or {}).get("name") or "")
            if not name:
                raise _HTTPError(400, {"error": {"code": 400, "message": "name is required"}})
            return self.add_project(name)
        raise _HTTPError(404, {"error": {"code": 404, "message": f"no action {action}"}})

    # -- what tests use --------------------------------------------------------------------------

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
        return f"{self.base_url}/identity/v3"

    @property
    def clouds_yaml(self) -> Path:
        if self._clouds_yaml is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="realnova-")
            self._clouds_yaml = Path(self._tempdir.name) / "clouds.yaml"
        return self._clouds_yaml

    @property
    def project_id(self) -> str:
        return PROJECT_ID

    @property
    def nova(self) -> Any:
        """The fixtures' test case (``.api``, ``.admin_api``, ``.computes``, ``.glance``,
        ``.neutron``...), for what the HTTP API cannot do."""
        return self._case

    def cloud_entry(self, kind: str = CLOUD) -> dict[str, Any]:
        auth: dict[str, Any] = {"auth_url": self.auth_url}
        if kind == APPCRED_CLOUD:
            auth.update(
                application_credential_id=APP_CREDENTIAL_ID,
                application_credential_secret=APP_CREDENTIAL_SECRET,
            )
        else:
            admin = kind == ADMIN_CLOUD
            auth.update(
                username="admin" if admin else USER_NAME,
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
        """A new project with a member user ``name`` (password ``name``-secret), added to
        clouds.yaml as cloud ``realnova-<name>``: a clean slate for one test. Nova learns of
        the project from its first request."""
        user = self.keystone.add_user(name, f"{name}-secret", name)
        cloud = f"{CLOUD}-{name}"
        self._extra_clouds[cloud] = {
            "auth": {
                "auth_url": self.auth_url,
                "username": name,
                "password": user.password,
                "project_name": name,
                "user_domain_name": DOMAIN_NAME,
                "project_domain_name": DOMAIN_NAME,
            },
            "region_name": REGION,
            "interface": "public",
            "identity_api_version": 3,
        }
        self._write_clouds_yaml()
        return {"cloud": cloud, "project_id": user.project_id, "user_id": user.user_id}

    def describe(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "auth_url": self.auth_url,
            "clouds_yaml": str(self.clouds_yaml),
            "cloud": CLOUD,
            "appcred_cloud": APPCRED_CLOUD,
            "admin_cloud": ADMIN_CLOUD,
            "project_id": PROJECT_ID,
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
    is the interpreter to run it with (one where ``nova`` is installed); ``log_path`` receives
    Nova's stderr."""

    def __init__(
        self,
        options: NovaOptions | None = None,
        *,
        workdir: Path | str,
        python: str = sys.executable,
        startup_timeout: float = 120.0,
    ) -> None:
        self.options = options or NovaOptions()
        self.workdir = Path(workdir)
        self.python = python
        self.startup_timeout = startup_timeout
        self.info: dict[str, Any] = {}
        self.log_path = self.workdir / "realnova.log"
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
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
        command = [
            self.python,
            str(Path(__file__).resolve()),
            "--clouds-yaml",
            str(self.workdir / "clouds.yaml"),
            "--parent-pid",
            str(os.getpid()),
            *self.options.to_args(),
        ]
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


# ================================================================================================
# python cloud.py
# ================================================================================================


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="realnova", description="Real Nova (from its functional-test fixtures) on 127.0.0.1"
    )
    parser.add_argument("--port", type=int, default=0, help="0 (default): a free port")
    parser.add_argument("--clouds-yaml", type=Path, help="where to write clouds.yaml")
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
    with (
        _stop_on_signals(stop),
        RealNova(_options_from_args(args), port=args.port, clouds_yaml=args.clouds_yaml) as nova,
    ):
        info = nova.describe()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
