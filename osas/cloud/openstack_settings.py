"""How to reach OpenStack, as plain values; kept apart from the adapter so that the config
layer can build it without importing openstacksdk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# Tag filters need compute 2.26 and tags on create 2.52; below that Nova silently ignores
# the filter and lists every server of the project.
MIN_COMPUTE_MICROVERSION = (2, 52)


@dataclass(frozen=True, slots=True)
class OpenStackAuth:
    """An ``auth`` block: password or application credential. Secrets stay out of repr.

    The configuration validates the block straight into this class (one definition of its
    keys); ``__pydantic_config__`` is read by pydantic there, so that a misspelt key is refused
    rather than ignored."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    auth_url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    user_domain_name: str | None = None
    project_name: str | None = None
    project_id: str | None = None
    project_domain_name: str | None = None
    application_credential_id: str | None = None
    application_credential_secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.application_credential_id:
            if not self.application_credential_secret:
                raise ValueError("application_credential_id needs application_credential_secret")
        elif not (self.username and self.password):
            raise ValueError("give username and password, or an application credential")

    @property
    def auth_type(self) -> str:
        return "v3applicationcredential" if self.application_credential_id else "password"

    def as_sdk_auth(self) -> dict[str, str]:
        values = {
            "auth_url": self.auth_url,
            "username": self.username,
            "password": self.password,
            "user_domain_name": self.user_domain_name,
            "project_name": self.project_name,
            "project_id": self.project_id,
            "project_domain_name": self.project_domain_name,
            "application_credential_id": self.application_credential_id,
            "application_credential_secret": self.application_credential_secret,
        }
        return {key: value for key, value in values.items() if value is not None}

    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.password, self.application_credential_secret) if s)


@dataclass(frozen=True, slots=True)
class OpenStackSettings:
    """Where the credentials come from: a clouds.yaml entry, an auth block, or, with neither,
    the ``OS_CLOUD`` / ``OS_*`` environment as every OpenStack tool reads it."""

    cloud: str | None = None
    # The clouds.yaml to read ``cloud`` from, alone: no OS_* variable, no other file.
    clouds_file: Path | None = None
    auth: OpenStackAuth | None = None
    region_name: str | None = None
    interface: str | None = None
    verify: bool = True
    cacert: Path | None = None
    api_timeout: float = 30.0
    # Concurrent openstacksdk calls, creates and other calls each (threads sharing one
    # connection). 10 creates at once is what Cluster API's OpenStack provider sends by default.
    concurrency: int = 10
    # Requests to OpenStack per second, all threads together, spaced evenly. Nova applies no
    # rate limit of its own (its /limits answers "rate": []); a proxy in front of the cloud may:
    # its 429s slow osas down on their own (pacing.py), and this set to its allowance avoids them.
    rate_limit: float = 50.0
    # Attempts for idempotent calls (list, get, delete) on 5xx, connection errors, timeouts.
    attempts: int = 4
    backoff: float = 0.5
    backoff_max: float = 10.0
    # How long names of flavors, images, networks... stay resolved.
    resolve_ttl: float = 600.0
