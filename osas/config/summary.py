"""The start-up summary: the effective settings an operator needs to tell what runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from osas.config.schema import OsasConfig


def startup_summary(config: OsasConfig) -> dict[str, Any]:
    """One log event's worth of settings. Built key by key, never dumped, so that no secret or
    user data can slip in."""
    tls = config.tls
    reconcile = config.reconcile
    return {
        "cluster_name": config.cluster_name,
        "listen": config.listen,
        "health_listen": config.health_listen,
        "metrics_listen": config.metrics_listen,
        "tls": (
            {
                "cert_file": str(tls.cert_file),
                "key_file": str(tls.key_file),
                "client_ca_file": str(tls.client_ca_file),
                "server_names": list(tls.server_names),
                "allowed_clients": list(tls.allowed_clients),
            }
            if tls
            else "off (insecure: true)"
        ),
        "openstack": _openstack(config),
        "reconcile": {
            name: _seconds(getattr(reconcile, name)) for name in type(reconcile).model_fields
        },
        "queue": {"capacity": config.queue.capacity, "workers": config.queue.workers},
        "leader_election": _election(config),
        "shutdown_grace": config.shutdown_grace.total_seconds(),
        "node_groups": [
            {
                "id": group.group_id,
                "min_size": group.min_size,
                "max_size": group.max_size,
                "flavor": group.flavor,
                "image": group.image,
            }
            for group in config.node_groups
        ],
    }


def _openstack(config: OsasConfig) -> dict[str, Any]:
    openstack = config.openstack
    auth = openstack.auth
    if auth is not None:
        cloud: dict[str, Any] = {
            "auth_type": auth.auth_type,
            "auth_url": auth.auth_url,
            "username": auth.username,
            "project": auth.project_name or auth.project_id,
            "application_credential_id": auth.application_credential_id,
        }
    else:
        cloud = {"cloud": openstack.cloud or "(OS_CLOUD or the OS_* variables)"}
    cloud.update(
        region_name=openstack.region_name,
        interface=openstack.interface,
        verify=openstack.verify,
        api_timeout=openstack.api_timeout.total_seconds(),
        concurrency=openstack.concurrency,
        rate_limit=openstack.rate_limit,
        attempts=openstack.attempts,
    )
    return {key: value for key, value in cloud.items() if value is not None}


def _election(config: OsasConfig) -> dict[str, Any] | str:
    if not config.leader_election.enabled:
        return "off"
    settings = config.election_settings()
    return {
        "lease": f"{settings.lease_namespace}/{settings.lease_name}",
        "identity": settings.identity,
        "lease_duration": settings.lease_duration,
        "renew_deadline": settings.renew_deadline,
        "retry_period": settings.retry_period,
        "service": settings.service_name or None,
    }


def _seconds(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value
