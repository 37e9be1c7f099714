"""``BootstrapTokens``: a kubeadm bootstrap token minted for each server at its create.

The token is a Secret ``bootstrap-token-<id>`` of type ``bootstrap.kubernetes.io/token`` in
``kube-system``, the only place the API server's bootstrap authenticator looks, in the form it
accepts: a ``token-id`` of 6 and a ``token-secret`` of 16 characters of ``[a-z0-9]``, the
authentication and signing usages (signing: ``kubeadm join`` checks the cluster-info it
discovers by the token's signature), the group kubeadm's own node tokens carry, and an
``expiration`` ``ttl`` after the create. Past it the authenticator refuses the token and
kube-controller-manager's token cleaner deletes the Secret; osas never reads, updates or
deletes one, and its grant (create, held by an admission policy to this form) allows nothing
else.

``expiration`` is judged by the API server's clock. osas learns how far its own is off from
each Secret's ``creationTimestamp`` (whole seconds) and writes the next expirations by the
server's clock; a gap of more than a minute is logged.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import structlog
from lightkube import ApiError, AsyncClient, ConfigError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from osas.election.lease import FIELD_MANAGER, load_kube_config
from osas.election.port import ElectionSetupError, JoinTokenError

logger = structlog.get_logger(__name__)

TOKEN_NAMESPACE = "kube-system"  # the only namespace the bootstrap authenticator reads
SECRET_TYPE = "bootstrap.kubernetes.io/token"
SECRET_NAME_PREFIX = "bootstrap-token-"
# kubeadm's default node token's group: kubeadm's cluster lets it request node client
# certificates and approves them. Nothing else is ever written here.
NODE_TOKEN_GROUP = "system:bootstrappers:kubeadm:default-node-token"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
CLUSTER_LABEL = "osas.openstack.org/cluster"
GROUP_LABEL = "osas.openstack.org/node-group"
_ALPHABET = string.ascii_lowercase + string.digits
_ID_LENGTH, _SECRET_LENGTH = 6, 16
# Two tokens drawn with the same id (one in 36**6) meet an AlreadyExists: draw again.
_DRAWS = 3
# The refusals that another try will not change: the token, RBAC, an admission policy, the
# object itself.
_REFUSALS = frozenset({400, 401, 403, 404, 422})
_ALREADY_EXISTS = 409
_SKEW_WORTH_SAYING = 60.0  # seconds
_FAILURES = (httpx2.HTTPError, TimeoutError, ConfigError, ValueError)


@dataclass(frozen=True, slots=True)
class BootstrapToken:
    token_id: str
    secret: str

    @classmethod
    def generate(cls) -> BootstrapToken:
        draw = secrets.choice
        return cls(
            "".join(draw(_ALPHABET) for _ in range(_ID_LENGTH)),
            "".join(draw(_ALPHABET) for _ in range(_SECRET_LENGTH)),
        )

    @property
    def secret_name(self) -> str:
        return f"{SECRET_NAME_PREFIX}{self.token_id}"

    def __str__(self) -> str:
        # What kubeadm join --token and kubelet's bootstrap kubeconfig take.
        return f"{self.token_id}.{self.secret}"

    def __repr__(self) -> str:
        return f"BootstrapToken({self.token_id!r})"  # the secret never reaches a log


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def token_secret(
    token: BootstrapToken, *, expires: datetime, labels: dict[str, str], description: str
) -> Secret:
    """The Secret that makes ``token`` valid until ``expires`` (as the API server's clock
    says), for a node's join alone."""
    return Secret(
        metadata=ObjectMeta(name=token.secret_name, namespace=TOKEN_NAMESPACE, labels=labels),
        type=SECRET_TYPE,
        stringData={
            "description": description,
            "token-id": token.token_id,
            "token-secret": token.secret,
            "expiration": rfc3339(expires),
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": NODE_TOKEN_GROUP,
        },
    )


def _utc_now() -> datetime:
    return datetime.now(UTC)


class BootstrapTokens:
    """``JoinTokens`` as kubeadm bootstrap tokens, with lightkube's AsyncClient (one
    connection, opened at the first mint)."""

    def __init__(
        self,
        kubeconfig: Path | None,
        *,
        cluster_name: str,
        request_timeout: float = 5.0,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        """Raises ElectionSetupError when there is no usable Kubernetes configuration."""
        self._config = load_kube_config(kubeconfig)
        self._cluster = cluster_name
        self._timeout = request_timeout
        self._wall_clock = wall_clock
        self._client: AsyncClient | None = None
        self._server_ahead = 0.0  # seconds the API server's clock is ahead of ours
        self.minted = 0

    async def mint(self, *, server_name: str, group_id: str, ttl: float) -> str:
        token = await self._create(server_name=server_name, group_id=group_id, ttl=ttl)
        self.minted += 1
        return str(token)

    async def rehearse(self, *, group_id: str, ttl: float) -> str:
        """A mint the API server judges in full (RBAC, admission policies, validation) and
        stores nothing of (``dryRun``): what check-config asks. Returns the Secret's name;
        raises JoinTokenError as ``mint`` does."""
        token = await self._create(
            server_name="check-config", group_id=group_id, ttl=ttl, dry_run=True
        )
        return token.secret_name

    async def _create(
        self, *, server_name: str, group_id: str, ttl: float, dry_run: bool = False
    ) -> BootstrapToken:
        labels = {
            MANAGED_BY_LABEL: "osas",
            CLUSTER_LABEL: self._cluster,
            GROUP_LABEL: group_id,
        }
        description = f"osas: the join of server {server_name} (node group {group_id})"
        for _ in range(_DRAWS):
            token = BootstrapToken.generate()
            sent_at = self._wall_clock()
            expires = sent_at + timedelta(seconds=self._server_ahead + ttl)
            secret = token_secret(token, expires=expires, labels=labels, description=description)
            try:
                created = await self._connection().create(secret, dry_run=dry_run)
            except ApiError as exc:
                if exc.status.code == _ALREADY_EXISTS:
                    continue
                raise JoinTokenError(
                    f"the Kubernetes API refused the join token of {server_name}: "
                    f"{exc.status.code} {exc.status.reason}: {exc.status.message}",
                    refused=exc.status.code in _REFUSALS,
                ) from exc
            except _FAILURES as exc:
                raise JoinTokenError(
                    f"the join token of {server_name} could not be made: the Kubernetes API "
                    f"did not answer ({type(exc).__name__}: {exc})",
                    refused=False,
                ) from exc
            if dry_run:
                return token
            self._learn_clock(created, sent_at, time_taken=self._wall_clock() - sent_at)
            logger.info(
                "join token minted",
                server=server_name,
                group=group_id,
                secret=token.secret_name,
                expires=rfc3339(expires),
            )
            return token
        raise JoinTokenError(
            f"the join token of {server_name}: {_DRAWS} drawn ids were all taken", refused=False
        )

    def _learn_clock(self, created: Secret, sent_at: datetime, *, time_taken: timedelta) -> None:
        stamp = created.metadata.creationTimestamp if created.metadata else None
        if stamp is None:
            return
        # The server stamped it between our send and its answer, to the second below.
        middle = sent_at + time_taken / 2
        ahead = (stamp - middle).total_seconds()
        within = time_taken.total_seconds() / 2 + 1.0
        if abs(ahead - self._server_ahead) <= within:
            return  # what we knew still explains the stamp
        if abs(ahead) > _SKEW_WORTH_SAYING:
            logger.warning(
                "the Kubernetes API server's clock differs from this host's; join tokens "
                "expire by the server's",
                server_ahead_seconds=round(ahead),
            )
        self._server_ahead = ahead if abs(ahead) > within else 0.0

    def _connection(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(
                self._config,
                namespace=TOKEN_NAMESPACE,
                timeout=httpx2.Timeout(self._timeout),
                field_manager=FIELD_MANAGER,
            )
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


__all__ = [
    "NODE_TOKEN_GROUP",
    "SECRET_TYPE",
    "TOKEN_NAMESPACE",
    "BootstrapToken",
    "BootstrapTokens",
    "ElectionSetupError",
    "token_secret",
]
