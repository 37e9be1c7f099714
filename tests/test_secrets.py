"""No password, application credential secret or token ever shows in a log line, an error
message or a debug string, on the good paths and the bad ones."""

from __future__ import annotations

import grpc
import pytest
from support import Provider, ca_client, make_config

from osas.app import openstack_cloud
from osas.cloud.errors import CloudError
from osas.cloud.openstack import OpenStackCloud
from osas.config import load_config
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova
from osas.sim.server import APP_CREDENTIAL_SECRET, DEFAULT_PASSWORD


async def exercise(provider: Provider, sim: SimulatedOpenStack) -> list[str]:
    """A session with every kind of failure; the error details CA would see."""
    details = []
    async with ca_client(provider.address) as ca:
        await ca.refresh()
        await ca.increase("workers", 2)
        sim.nova.faults.quota_exceeded = 1
        await ca.increase("workers", 1)
        await provider.sync()
        sim.nova.faults.error_rate = 1.0
        try:
            await provider.sync()
        except CloudError as exc:
            details.append(str(exc))
        sim.nova.faults.error_rate = 0.0
        for call in (
            ca.increase("workers", 99),
            ca.delete("workers", [("n", "openstack:///not-a-uuid")]),
            ca.template("nope"),
        ):
            try:
                await call
            except grpc.aio.AioRpcError as exc:
                details.append(exc.details() or "")
        details += [g.debug for g in await ca.node_groups()]
        details += [i.status.errorInfo.errorMessage for i in await ca.nodes("workers")]
    return details


@pytest.mark.parametrize("method", ["password", "application-credential"])
async def test_no_secret_in_logs_errors_or_debug_strings(tmp_path, capfd, logs_at_debug, method):
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        auth = sim.clouds_yaml_entry(application_credential=method != "password")["auth"]
        config = make_config(tmp_path, openstack={"auth": auth})
        provider = Provider(config, openstack_cloud(config))
        await provider.start()
        try:
            seen = await exercise(provider, sim)
        finally:
            await provider.stop()
        # A wrong secret of the same kind, refused by Keystone.
        wrong = {
            k: f"{v}-wrong" if "password" in k or "secret" in k else v for k, v in auth.items()
        }
        wrong_config = make_config(tmp_path, openstack={"auth": wrong})
        adapter = OpenStackCloud(wrong_config.openstack_settings())
        try:
            with pytest.raises(CloudError) as refused:
                await adapter.verify()
            seen.append(str(refused.value))
        finally:
            await adapter.close()
        tokens = list(sim.identity._tokens)
    captured = capfd.readouterr()
    seen += [captured.out, captured.err, repr(config), str(config), repr(config.cluster_spec())]
    seen += [repr(config.openstack_settings()), repr(wrong_config.openstack_settings())]
    text = "\n".join(seen)
    assert "NodeGroupIncreaseSize" in text  # the logs were captured (its access line)
    assert tokens
    secrets = [DEFAULT_PASSWORD, APP_CREDENTIAL_SECRET, f"{DEFAULT_PASSWORD}-wrong"]
    secrets += [f"{APP_CREDENTIAL_SECRET}-wrong", *tokens]
    for secret in secrets:
        assert secret not in text


def test_config_loaded_from_file_keeps_secrets_out_of_its_repr(tmp_path):
    config = make_config(
        tmp_path,
        openstack={
            "auth": {
                "auth_url": "https://keystone.example:5000/v3",
                "application_credential_id": "id",
                "application_credential_secret": "app-secret-value",
            }
        },
    )
    reloaded = load_config(tmp_path / "osas.yaml")
    for shown in (repr(config), str(reloaded), repr(reloaded.openstack_settings())):
        assert "app-secret-value" not in shown
