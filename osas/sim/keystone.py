"""Keystone v3 as keystoneauth needs it to reach the other simulated services.

Version discovery (``/identity`` answers 300 Multiple Choices with ``versions.values``, the way
Keystone does, and ``/identity/v3`` a single ``version``), project-scoped tokens from the
``password`` and ``application_credential`` methods with the ``X-Subject-Token`` header, and a
catalog that names compute, image, network and block-storage (also as volumev3) in every
region of this simulator. Every other API checks the ``X-Auth-Token`` it is sent against
``Identity.token``.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from osas.sim.routing import HttpError, Request, Response, Router

IDENTITY_VERSION = "v3.14"
TOKEN_LIFETIME = timedelta(hours=24)
DEFAULT_DOMAIN_ID = "default"
DEFAULT_DOMAIN_NAME = "Default"
_ROLES = ("member", "reader")
_NAMESPACE = uuid.UUID("6f1a4b2e-3c0d-4e8f-9a7b-5d2c1e0f3a4b")  # stable ids across runs


def stable_id(kind: str, name: str) -> str:
    """An id that is the same on every run, so clouds.yaml files and logs stay comparable."""
    return uuid.uuid5(_NAMESPACE, f"{kind}:{name}").hex


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One service's endpoint in one region, as the token's catalogue names it."""

    service_type: str
    name: str
    region: str
    url: str


@dataclass(frozen=True, slots=True)
class Project:
    project_id: str
    name: str
    domain_id: str = DEFAULT_DOMAIN_ID
    domain_name: str = DEFAULT_DOMAIN_NAME


@dataclass(frozen=True, slots=True)
class User:
    user_id: str
    name: str
    password: str
    project: Project  # the one project the user has roles on
    domain_id: str = DEFAULT_DOMAIN_ID
    domain_name: str = DEFAULT_DOMAIN_NAME


@dataclass(frozen=True, slots=True)
class ApplicationCredential:
    """Scoped by itself: it carries its user's project, and a token from it needs no scope."""

    credential_id: str
    name: str
    secret: str
    user: User


@dataclass(frozen=True, slots=True)
class Token:
    token_id: str
    user: User
    project: Project | None  # None: unscoped, no catalog
    methods: tuple[str, ...]
    issued_at: datetime
    expires_at: datetime
    application_credential: ApplicationCredential | None = None


def keystone_error(status: int, title: str, message: str) -> HttpError:
    return HttpError(
        Response.json(status, {"error": {"code": status, "title": title, "message": message}})
    )


def unauthorized(base_url: str) -> Response:
    """Keystone's (and keystonemiddleware's, in front of every other API) 401."""
    error = keystone_error(
        401, "Unauthorized", "The request you have made requires authentication."
    )
    error.response.headers["WWW-Authenticate"] = f'Keystone uri="{base_url}/identity"'
    return error.response


def _bad_request(message: str) -> HttpError:
    return keystone_error(400, "Bad Request", message)


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Identity:
    """Users, application credentials and tokens, and the Keystone routes over them."""

    def __init__(self, *, catalog: Callable[[str], Iterable[CatalogEntry]]) -> None:
        # ``catalog(base_url)``: every endpoint, in every region, the catalogue names.
        self._catalog = catalog
        self.users: dict[str, User] = {}
        self.application_credentials: dict[str, ApplicationCredential] = {}
        self._tokens: dict[str, Token] = {}
        # What an operator or Keystone does to tokens (the control API sets these):
        self.token_lifetime = TOKEN_LIFETIME  # the expires_at of new tokens
        # Tokens refused by every API once this old, while their expires_at says they are
        # valid: what a client meets as a 401 on a token it thinks good (a revocation seen
        # through keystonemiddleware's cache, a clock apart). None: never.
        self.refuse_after: timedelta | None = None
        # Every password and application credential refused (changed, deleted, expired).
        self.refuse_credentials = False
        # The last revocation of every token. Keystone compares a token's issue time, which a
        # fernet token holds in whole seconds, with the revocation's: a token issued later
        # within the same second is refused too.
        self._revoked_at: datetime | None = None

    # -- registry ---------------------------------------------------------------------------------

    def add_user(self, name: str, password: str, project_name: str) -> User:
        project = Project(stable_id("project", project_name), project_name)
        user = User(stable_id("user", name), name, password, project)
        self.users[user.user_id] = user
        return user

    def add_application_credential(
        self, credential_id: str, secret: str, user: User, name: str = "osas"
    ) -> ApplicationCredential:
        credential = ApplicationCredential(credential_id, name, secret, user)
        self.application_credentials[credential_id] = credential
        return credential

    def delete_application_credential(self, credential_id: str) -> int:
        """Deleted, as `openstack application credential delete` does: it authenticates no
        more, and every token issued from it is refused from now on. How many tokens."""
        self.application_credentials.pop(credential_id, None)
        revoked = [
            token_id
            for token_id, token in self._tokens.items()
            if token.application_credential is not None
            and token.application_credential.credential_id == credential_id
        ]
        for token_id in revoked:
            del self._tokens[token_id]
        return len(revoked)

    def token(self, token_id: str | None) -> Token | None:
        """The live token behind an ``X-Auth-Token``, or None (then the API answers 401)."""
        token = self._tokens.get(token_id or "")
        now = datetime.now(UTC)
        if token is None or token.expires_at <= now:
            return None
        if self.refuse_after is not None and now - token.issued_at >= self.refuse_after:
            return None
        if self._revoked_at is not None and token.issued_at.replace(microsecond=0) <= (
            self._revoked_at
        ):
            return None
        return token

    def revoke_all(self) -> int:
        """Keystone revokes every token issued so far (a password changed, an application
        credential rotated): each is refused from now on, and so is any token issued later
        within the same second, as Keystone does. How many there were."""
        revoked = len(self._tokens)
        self._tokens.clear()
        self._revoked_at = datetime.now(UTC)
        return revoked

    # -- routes -----------------------------------------------------------------------------------

    def register(self, router: Router) -> None:
        router.add("GET", "/identity", "identity.versions", self._versions, authenticated=False)
        router.add("GET", "/identity/v3", "identity.version", self._version, authenticated=False)
        router.add(
            "POST",
            "/identity/v3/auth/tokens",
            "identity.tokens.create",
            self._issue,
            authenticated=False,
        )
        router.add("GET", "/identity/v3/auth/tokens", "identity.tokens.get", self._validate)
        router.add("DELETE", "/identity/v3/auth/tokens", "identity.tokens.delete", self._revoke)

    def _version_document(self, base_url: str) -> dict[str, Any]:
        return {
            "id": IDENTITY_VERSION,
            "status": "stable",
            "updated": "2020-04-07T00:00:00Z",
            "links": [{"rel": "self", "href": f"{base_url}/identity/v3/"}],
            "media-types": [
                {"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}
            ],
        }

    def _versions(self, request: Request) -> Response:
        # Keystone answers its root with 300 and the list under "values"; keystoneauth copes.
        document = {"versions": {"values": [self._version_document(request.base_url)]}}
        return Response.json(300, document)

    def _version(self, request: Request) -> Response:
        return Response.json(200, {"version": self._version_document(request.base_url)})

    def _issue(self, request: Request) -> Response:
        body = request.json(_bad_request)
        auth = body.get("auth") if isinstance(body, dict) else None
        if not isinstance(auth, dict):
            raise _bad_request("Expecting to find auth in request body.")
        identity = auth.get("identity")
        if not isinstance(identity, dict) or not isinstance(identity.get("methods"), list):
            raise _bad_request("Expecting to find identity in auth.")
        methods = tuple(str(method) for method in identity["methods"])
        now = datetime.now(UTC)
        project: Project | None
        if self.refuse_credentials:
            raise HttpError(unauthorized(request.base_url))
        if "application_credential" in methods:
            credential = self._check_application_credential(identity, request.base_url)
            user, project = credential.user, credential.user.project
        elif "password" in methods:
            credential = None
            user = self._check_password(identity, request.base_url)
            project = self._scope(auth.get("scope"), user, request.base_url)
        else:
            raise keystone_error(401, "Unauthorized", f"Unsupported auth methods {methods}.")
        token = Token(
            token_id=secrets.token_hex(32),
            user=user,
            project=project,
            methods=methods,
            issued_at=now,
            expires_at=now + self.token_lifetime,
            application_credential=credential,
        )
        self._tokens[token.token_id] = token
        return Response.json(
            201,
            {"token": self._token_body(token, request.base_url)},
            {"X-Subject-Token": token.token_id},
        )

    def _validate(self, request: Request) -> Response:
        token = self.token(request.header("X-Subject-Token"))
        if token is None:
            raise keystone_error(404, "Not Found", "Could not find token.")
        return Response.json(
            200,
            {"token": self._token_body(token, request.base_url)},
            {"X-Subject-Token": token.token_id},
        )

    def _revoke(self, request: Request) -> Response:
        if self._tokens.pop(request.header("X-Subject-Token") or "", None) is None:
            raise keystone_error(404, "Not Found", "Could not find token.")
        return Response.empty(204)

    # -- authentication ---------------------------------------------------------------------------

    def _check_password(self, identity: Mapping[str, Any], base_url: str) -> User:
        password = identity.get("password")
        user_ref = password.get("user") if isinstance(password, dict) else None
        if not isinstance(user_ref, dict):
            raise _bad_request("Expecting to find user in password.")
        for user in self.users.values():
            if _names_user(user_ref, user) and secrets.compare_digest(
                str(user_ref.get("password", "")), user.password
            ):
                return user
        raise HttpError(unauthorized(base_url))

    def _check_application_credential(
        self, identity: Mapping[str, Any], base_url: str
    ) -> ApplicationCredential:
        ref = identity.get("application_credential")
        if not isinstance(ref, dict):
            raise _bad_request("Expecting to find application_credential in identity.")
        candidates = list(self.application_credentials.values())
        if "id" in ref:
            candidates = [c for c in candidates if c.credential_id == ref["id"]]
        else:
            user_ref = ref.get("user")
            candidates = [
                c
                for c in candidates
                if c.name == ref.get("name")
                and isinstance(user_ref, dict)
                and _names_user(user_ref, c.user)
            ]
        for credential in candidates:
            if secrets.compare_digest(str(ref.get("secret", "")), credential.secret):
                return credential
        raise HttpError(unauthorized(base_url))

    def _scope(self, scope: Any, user: User, base_url: str) -> Project | None:
        if scope is None:
            return None
        project_ref = scope.get("project") if isinstance(scope, dict) else None
        if not isinstance(project_ref, dict):
            # Domain and system scopes are not simulated: nothing here would use them.
            raise HttpError(unauthorized(base_url))
        project = user.project
        if "id" in project_ref:
            named = project_ref["id"] == project.project_id
        else:
            named = project_ref.get("name") == project.name and _names_domain(
                project_ref.get("domain"), project.domain_id, project.domain_name
            )
        if not named:
            raise HttpError(unauthorized(base_url))
        return project

    # -- bodies -----------------------------------------------------------------------------------

    def _token_body(self, token: Token, base_url: str) -> dict[str, Any]:
        user = token.user
        body: dict[str, Any] = {
            "methods": list(token.methods),
            "user": {
                "id": user.user_id,
                "name": user.name,
                "domain": {"id": user.domain_id, "name": user.domain_name},
                "password_expires_at": None,
            },
            "audit_ids": [secrets.token_urlsafe(16)],
            "issued_at": _timestamp(token.issued_at),
            "expires_at": _timestamp(token.expires_at),
        }
        project = token.project
        if project is not None:
            body["project"] = {
                "id": project.project_id,
                "name": project.name,
                "domain": {"id": project.domain_id, "name": project.domain_name},
            }
            body["is_domain"] = False
            body["roles"] = [{"id": stable_id("role", role), "name": role} for role in _ROLES]
            body["catalog"] = self._catalog_body(base_url)
        if token.application_credential is not None:
            credential = token.application_credential
            body["application_credential"] = {
                "id": credential.credential_id,
                "name": credential.name,
                "restricted": True,
            }
        return body

    def _catalog_body(self, base_url: str) -> list[dict[str, Any]]:
        services: dict[str, dict[str, Any]] = {}
        for entry in self._catalog(base_url):
            service = services.setdefault(
                entry.service_type,
                {
                    "type": entry.service_type,
                    "name": entry.name,
                    "id": stable_id("service", entry.service_type),
                    "endpoints": [],
                },
            )
            service["endpoints"].extend(
                {
                    "id": stable_id("endpoint", f"{entry.region}/{entry.service_type}/{interface}"),
                    "interface": interface,
                    "region": entry.region,
                    "region_id": entry.region,
                    "url": entry.url,
                }
                for interface in ("public", "internal", "admin")
            )
        return list(services.values())


def _names_domain(ref: Any, domain_id: str, domain_name: str) -> bool:
    if not isinstance(ref, dict):
        return False
    if "id" in ref:
        return bool(ref["id"] == domain_id)
    return bool(ref.get("name") == domain_name)


def _names_user(ref: Mapping[str, Any], user: User) -> bool:
    if "id" in ref:
        return bool(ref["id"] == user.user_id)
    return ref.get("name") == user.name and _names_domain(
        ref.get("domain"), user.domain_id, user.domain_name
    )
