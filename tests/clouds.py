"""The two clouds the scenario suite runs against: the simulated OpenStack (``osas sim``) and
real Nova from the pinned ``nova`` wheel's functional fixtures (``nox -s nova``).

osas reaches both exactly as it reaches a production cloud — a clouds.yaml entry, Keystone,
the service catalog, version discovery — and the scenarios look at both through the same
openstacksdk calls an operator would make. Only what cannot be done through the project's own
API is done per cloud: quotas (an admin call in Nova, the control API in the simulator),
making Nova run out of hosts, revoking tokens (Keystone's admin API beside real Nova) and the
lifetime of new tokens (Keystone's ``[token] expiration``, Keystone restarted).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import openstack
import openstack.connection
from realnova import cloud as realnova

from osas.cloud.openstack_settings import OpenStackSettings
from osas.sim import CLOUD_NAME, SimulatedOpenStack
from osas.sim.model import FakeNova

PAGE = 3  # Nova's [api] max_limit in both clouds: every listing of more than 3 servers pages
# Real Nova: BUILD to ACTIVE in about half a second, ACTIVE with task_state=deleting for 0.5-2 s.
SIM_BUILD_SECONDS = 0.5
SIM_DELETE_SECONDS = 1.0

NOVA_AVAILABLE = importlib.util.find_spec("nova") is not None


class ScenarioCloud(Protocol):
    kind: str
    clouds_yaml: Path
    cloud_name: str
    flavor: str  # fits a host
    image: str
    network: str

    def set_instance_quota(self, instances: int | None) -> None:
        """The project's instance quota; None: as it was."""

    def set_ram_quota(self, ram_mib: int | None) -> None:
        """The project's RAM quota (MiB); None: as it was."""

    @contextmanager
    def no_valid_host(self) -> Iterator[str]:
        """A flavor whose creates end in ERROR "No valid host was found"."""

    def revoke_tokens(self) -> None:
        """Keystone revokes every token issued so far to osas's user: each is refused from
        now on, while the credentials keep working."""

    def set_token_lifetime(self, seconds: int | None) -> None:
        """How long tokens Keystone issues from now on live; None: as it was."""


def settings_for(cloud: ScenarioCloud, **overrides: Any) -> OpenStackSettings:
    """osas's settings for a cloud: its clouds.yaml entry, fast retries."""
    values: dict[str, Any] = {
        "cloud": cloud.cloud_name,
        "api_timeout": 10.0,
        "backoff": 0.05,
        "backoff_max": 0.5,
        "rate_limit": 1000.0,
    }
    values.update(overrides)
    return OpenStackSettings(**values)


def connect(cloud: ScenarioCloud) -> openstack.connection.Connection:
    """The operator's own openstacksdk connection to the project osas manages."""
    return openstack.connect(cloud=cloud.cloud_name)


def project_servers(conn: openstack.connection.Connection) -> list[dict[str, Any]]:
    """Every server of the project, as the detail listing shows it (one request per page)."""
    servers: dict[str, dict[str, Any]] = {}
    url: str | None = "/servers/detail"
    while url is not None:
        body = conn.compute.get(url, microversion="2.52").json()
        for server in body["servers"]:
            servers[server["id"]] = server
        url = next(
            (link["href"] for link in body.get("servers_links", ()) if link.get("rel") == "next"),
            None,
        )
    return list(servers.values())


def delete_everything(conn: openstack.connection.Connection, timeout: float = 60.0) -> None:
    """Leave the project empty for the next scenario. Real Nova can answer a delete 204 and
    keep the server (seen in this lane, a minute later still there): a server left after
    ``RESEND_DELETE_AFTER`` that Nova is not deleting is deleted again."""
    deadline = time.monotonic() + timeout
    resend_at = 0.0
    while left := project_servers(conn):
        now = time.monotonic()
        if now > deadline:
            msg = f"servers left behind after the scenario: {describe_servers(left)}"
            raise AssertionError(msg)
        if now >= resend_at:
            delete_unless_deleting(conn, left, again=bool(resend_at))
            resend_at = now + RESEND_DELETE_AFTER
        time.sleep(0.2)


RESEND_DELETE_AFTER = 10.0


def delete_unless_deleting(
    conn: openstack.connection.Connection, servers: list[dict[str, Any]], *, again: bool
) -> None:
    """Delete each server Nova is not deleting already; ``again`` says so (a delete real Nova
    accepted and did not carry out), for a failure's output."""
    if again:
        print(f"delete sent again: {describe_servers(servers)}")  # noqa: T201 - for a failure
    for server in servers:
        if server.get("OS-EXT-STS:task_state") != "deleting":
            conn.compute.delete_server(server["id"], ignore_missing=True)


def describe_servers(servers: list[dict[str, Any]]) -> list[str]:
    """Each server's id, status and task state, for a failure's message."""
    return [f"{s['id']} {s['status']} {s.get('OS-EXT-STS:task_state')}" for s in servers]


class SimCloud:
    kind = "sim"
    cloud_name = CLOUD_NAME
    flavor = "m1.small"
    image = "ubuntu-24.04"
    network = "cluster-net"

    def __init__(self, workdir: Path) -> None:
        nova = FakeNova(build_seconds=SIM_BUILD_SECONDS, delete_seconds=SIM_DELETE_SECONDS)
        self.sim = SimulatedOpenStack(nova, max_limit=PAGE)
        self.clouds_yaml = workdir / "clouds.yaml"
        self._default_token_lifetime = self.sim.identity.token_lifetime

    def start(self) -> None:
        self.sim.start()
        self.sim.write_clouds_yaml(self.clouds_yaml)

    def stop(self) -> None:
        self.sim.stop()

    def set_instance_quota(self, instances: int | None) -> None:
        self.sim.nova.quota.instances = instances

    def set_ram_quota(self, ram_mib: int | None) -> None:
        self.sim.nova.quota.ram = ram_mib

    @contextmanager
    def no_valid_host(self) -> Iterator[str]:
        self.sim.nova.faults.no_valid_host = 1000
        try:
            yield self.flavor
        finally:
            self.sim.nova.faults.no_valid_host = 0

    def revoke_tokens(self) -> None:
        self.sim.identity.revoke_all()

    def set_token_lifetime(self, seconds: int | None) -> None:
        identity = self.sim.identity
        identity.token_lifetime = (
            self._default_token_lifetime if seconds is None else timedelta(seconds=seconds)
        )


class NovaCloud:
    """Real Nova in a child process, real Keystone in another (tests/realnova/cloud.py)."""

    kind = "nova"
    flavor = "m1.small"
    network = "cluster-net"

    def __init__(self, workdir: Path) -> None:
        self.cloud_name = realnova.CLOUD
        self.image = realnova.IMAGE_NAME
        self._default_instances = realnova.DEFAULT_QUOTAS["instances"]
        options = realnova.NovaOptions(hosts=2, max_limit=PAGE)
        self.nova = realnova.RealNovaProcess(options, workdir=workdir)

    @property
    def clouds_yaml(self) -> Path:
        return self.nova.clouds_yaml

    def start(self) -> None:
        self.nova.start()

    def stop(self) -> None:
        self.nova.stop()

    def set_instance_quota(self, instances: int | None) -> None:
        self.nova.set_quota(instances=self._default_instances if instances is None else instances)

    def set_ram_quota(self, ram_mib: int | None) -> None:
        default = realnova.DEFAULT_QUOTAS["ram"]
        self.nova.set_quota(ram=default if ram_mib is None else ram_mib)

    @contextmanager
    def no_valid_host(self) -> Iterator[str]:
        # It asks Placement for a VGPU that no fake compute host has.
        yield "g1.xlarge"

    def revoke_tokens(self) -> None:
        # Through Keystone's admin API: the user's password set again to what it is.
        self.nova.revoke_tokens()

    def set_token_lifetime(self, seconds: int | None) -> None:
        # Keystone restarted with another [token] expiration (some 2 s; a no-op if the same).
        self.nova.set_token_lifetime(seconds)


@contextmanager
def running_cloud(kind: str, workdir: Path) -> Iterator[ScenarioCloud]:
    cloud: SimCloud | NovaCloud = SimCloud(workdir) if kind == "sim" else NovaCloud(workdir)
    previous = os.environ.get("OS_CLIENT_CONFIG_FILE")
    cloud.start()
    os.environ["OS_CLIENT_CONFIG_FILE"] = str(cloud.clouds_yaml)
    try:
        yield cloud
    finally:
        if previous is None:
            os.environ.pop("OS_CLIENT_CONFIG_FILE", None)
        else:
            os.environ["OS_CLIENT_CONFIG_FILE"] = previous
        cloud.stop()
