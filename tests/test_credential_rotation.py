"""Credentials rotate live (issue 21, problem 3).

osas reads its credentials from a clouds.yaml (``OS_CLIENT_CONFIG_FILE``), as the chart mounts
it from a Secret. An operator rotates the application credential: a new one is made, the file
is replaced (the kubelet swaps the Secret's files in place), the old one deleted, which revokes
every token issued from it. osas picks the new file up without a restart, with one
authentication shared by every thread; SIGHUP says what it reloaded; a create dropped at
shutdown is a warning with its group and count.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
import structlog
import yaml
from keystoneauth1 import exceptions as ks_exceptions
from support import (
    Provider,
    big_config,
    ca_client,
    ours,
    rotate_application_credential,
    write_clouds_yaml,
    write_config,
)

from osas.cloud.openstack import OpenStackCloud
from osas.cloud.openstack_settings import OpenStackSettings
from osas.config import load_config
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova
from osas.sim.server import APP_CREDENTIAL_ID, CLOUD_NAME

TOKENS = "identity.tokens.create"
NEW_ID = "app-cred-rotated"


def rotate(sim: SimulatedOpenStack, clouds: Path) -> None:
    rotate_application_credential(sim, clouds, APP_CREDENTIAL_ID, NEW_ID)


def start(sim: SimulatedOpenStack, tmp_path: Path, monkeypatch) -> tuple[Provider, Path]:
    clouds = tmp_path / "clouds.yaml"
    write_clouds_yaml(sim, clouds)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
    config = big_config(tmp_path)
    settings = OpenStackSettings(
        cloud=CLOUD_NAME, api_timeout=2.0, rate_limit=1000.0, backoff=0.05, backoff_max=0.5
    )
    provider = Provider(config, OpenStackCloud(settings), config_path=tmp_path / "osas.yaml")
    return provider, clouds


async def until(check, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await anyio.sleep(0.05)


async def test_a_rotated_application_credential_is_used_without_a_restart(tmp_path, monkeypatch):
    """Problem 3: osas kept failing (every call 401, /readyz 503) until it was restarted."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        provider, clouds = start(sim, tmp_path, monkeypatch)
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                await ca.increase("big", 1)
                await until(lambda: len(ours(sim)) == 1, "the first server")
                since = len(sim.history)
                rotate(sim, clouds)
                await ca.increase("big", 2)
                await until(lambda: len(ours(sim)) == 3, "two servers with the new credential")
                failed = [i for i in await ca.nodes("big") if i.status.HasField("errorInfo")]
                assert failed == []
            assert provider.app.reconciler.status.credentials_refused is None
            # One new authentication for every thread, with the new credential.
            issued = [e for e in list(sim.history)[since:] if e.operation == TOKENS]
            assert [e.status for e in issued if e.status == 201] == [201]
        finally:
            await provider.stop()


def test_a_call_refused_on_the_replaced_connection_leaves_the_new_token_alone(
    tmp_path, monkeypatch
):
    """Invariant: a renewal after a 401 renews the token of the connection that was refused,
    never another's. A call in flight on the connection a rotation replaced is refused once
    the old credential is deleted; renewing there must not throw away the new connection's
    token, or the new credential authenticates twice (the race behind a rare failure of the
    test above under load: its 201s were [201, 201])."""
    with SimulatedOpenStack(FakeNova()) as sim:
        _, clouds = start(sim, tmp_path, monkeypatch)
        settings = OpenStackSettings(cloud=CLOUD_NAME, api_timeout=2.0)
        cloud = OpenStackCloud(settings)
        with cloud._connection() as old:
            old.session.get_auth_headers()
        rotate(sim, clouds)
        assert cloud.reload_credentials() == [str(clouds)]
        with cloud._connection() as new:
            new.session.get_auth_headers()
        assert new is not old
        since = len(sim.history)
        # The replaced connection's token is refused (its credential is gone): renewed there,
        # with the old credential, which Keystone refuses in turn.
        with pytest.raises(ks_exceptions.Unauthorized):
            cloud._renew(old, cloud._auth_epoch)
        with cloud._connection() as current:
            assert current is new
            current.session.get_auth_headers()
        issued = [e for e in list(sim.history)[since:] if e.operation == TOKENS]
        assert [e.status for e in issued] == [401]  # the old credential's; none for the new


async def test_a_call_refused_after_another_made_the_new_connection_goes_on_with_it(
    tmp_path, monkeypatch
):
    """Invariant: a call refused on a connection that a rotation replaced is sent again on the
    new connection, whichever call noticed the rotation. Here another call noticed it and made
    the new connection while this one was on the old: its renewal with the old credential is
    refused, the files say nothing changed since the new connection read them, and the call
    failed as refused credentials (a fault schedule on a busy machine)."""
    with SimulatedOpenStack(FakeNova()) as sim:
        _, clouds = start(sim, tmp_path, monkeypatch)
        cloud = OpenStackCloud(OpenStackSettings(cloud=CLOUD_NAME, api_timeout=2.0))
        with cloud._connection() as old:
            old.session.get_auth_headers()
        used = []

        def flavors(conn) -> list[str]:
            used.append(conn)
            if len(used) == 1:
                # Meanwhile, another call: the rotation noticed, the new connection made.
                rotate(sim, clouds)
                assert cloud.reload_credentials() == [str(clouds)]
                with cloud._connection() as new:
                    new.session.get_auth_headers()
            return [flavor.name for flavor in conn.compute.flavors()]

        assert "m1.small" in await cloud._once(flavors, rated=False)
        assert used[0] is old
        assert used[-1] is not old
        await cloud.close()


def test_a_file_replaced_while_a_connection_is_made_reads_as_changed(tmp_path, monkeypatch):
    """Invariant: a connection never takes a file's newer state for the one it read. The file
    replaced after openstacksdk read it and before osas looked at it: the connection holds the
    old credential, and when that one is deleted, nothing said the file had changed since, so
    every call was refused until the next change of the file."""
    with SimulatedOpenStack(FakeNova()) as sim:
        _, clouds = start(sim, tmp_path, monkeypatch)
        cloud = OpenStackCloud(OpenStackSettings(cloud=CLOUD_NAME, api_timeout=2.0))
        with cloud._connection():
            pass  # the first connection: the files are known from here on
        assert cloud.reload_credentials() == []
        write_clouds_yaml(sim, clouds)  # the same credential, a new file: made again
        made = cloud._new_connection

        def made_as_the_file_is_replaced():
            conn = made()
            rotate(sim, clouds)
            return conn

        monkeypatch.setattr(cloud, "_new_connection", made_as_the_file_is_replaced)
        assert cloud.reload_credentials() == [str(clouds)]
        with cloud._connection() as old:
            assert old.auth["application_credential_id"] == APP_CREDENTIAL_ID
        monkeypatch.setattr(cloud, "_new_connection", made)
        assert cloud.reload_credentials() == [str(clouds)]
        with cloud._connection() as new:
            assert new.auth["application_credential_id"] == NEW_ID
            assert [flavor.name for flavor in new.compute.flavors()]


async def test_sighup_reads_the_credentials_at_once_and_says_what_it_reloaded(
    tmp_path, monkeypatch
):
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        provider, clouds = start(sim, tmp_path, monkeypatch)
        await provider.start()
        try:
            rotate(sim, clouds)
            with structlog.testing.capture_logs() as logs:
                assert await provider.app.reload_once(force=True) == "applied"
                assert await provider.app.reload_once(force=True) == "applied"
            reloaded = [e for e in logs if e["event"] == "configuration reloaded"]
            assert [e["openstack_credentials"] for e in reloaded] == [[str(clouds)], "unchanged"]
            assert all(e["restart_needed"] == [] for e in reloaded)
            await provider.sync(full=False)  # authenticates with the new credential
            assert provider.app.reconciler.status.credentials_refused is None
        finally:
            await provider.stop()


async def test_a_create_dropped_at_shutdown_is_a_warning_with_its_group_and_count(tmp_path):
    """Problem 3: a create waiting for credentials that work was dropped at the restart with
    only a debug line."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        config = big_config(tmp_path)
        data = yaml.safe_load((tmp_path / "osas.yaml").read_text())
        data["openstack"]["auth"] = sim.clouds_yaml_entry()["auth"]
        config = load_config(write_config(tmp_path, data))
        settings = OpenStackSettings(
            auth=config.openstack.auth, api_timeout=2.0, rate_limit=1000.0, backoff=0.05
        )
        provider = Provider(config, OpenStackCloud(settings))
        await provider.start()
        async with ca_client(provider.address) as ca:
            sim.identity.refuse_credentials = True
            sim.identity.revoke_all()
            await ca.increase("big", 1)
            await anyio.sleep(1.0)  # refused, and sent again and again
        with structlog.testing.capture_logs() as logs:
            await provider.stop()
        dropped = [
            e
            for e in logs
            if e["log_level"] == "warning" and "dropped" in e["event"] and e.get("group") == "big"
        ]
        assert dropped, [e["event"] for e in logs]
        assert (
            sum(e.get("count", 0) for e in dropped) + sum(e.get("dropped", 0) for e in dropped) == 1
        )
        assert ours(sim) == []
