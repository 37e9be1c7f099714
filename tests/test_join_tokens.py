"""Join credentials that expire (issue 32): for a node group with ``bootstrap_token``, osas
mints a kubeadm bootstrap token per server at its create, a Secret in kube-system in the form
the API server's bootstrap authenticator accepts, and fills it in as ``${bootstrap_token}``.

Against the Kubernetes stand-in (osas/sim/kubernetes.py), whose authenticator follows the API
server's rules, and the simulated OpenStack over HTTP; where ``OSAS_TEST_KUBECONFIG`` names a
real API server (started with ``--enable-bootstrap-token-auth``), the token's own tests run
against it too."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import ssl
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import Provider, ca_client, config_on, make_config, write_config

from osas.app import openstack_cloud
from osas.check import Report, check_join_tokens
from osas.config import ConfigError, load_config
from osas.election.port import JoinTokenError
from osas.election.tokens import NODE_TOKEN_GROUP, BootstrapTokens
from osas.protocol import externalgrpc_pb2 as pb
from osas.sim import SimulatedOpenStack
from osas.sim.kubernetes import DROP, KubeStandIn
from osas.sim.model import FakeNova

TOKEN_FORM = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
TEMPLATE = (
    "#cloud-config\nruncmd:\n"
    "  - kubeadm join 10.0.0.10:6443 --token ${bootstrap_token} --node-name ${server_name}\n"
)
# What kubeadm's own node tokens carry (kubeadm token create), and nothing else.
KUBEADM_KEYS = {
    "description",
    "token-id",
    "token-secret",
    "expiration",
    "usage-bootstrap-authentication",
    "usage-bootstrap-signing",
    "auth-extra-groups",
}


def data(secret: dict[str, Any]) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def who_am_i(url: str, token: str, ca: str | None = None) -> dict[str, Any] | int:
    """The API server's SelfSubjectReview for ``token``: its userInfo, or the HTTP status."""
    request = urllib.request.Request(  # noqa: S310 - a loopback URL the test made
        f"{url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        method="POST",
        data=json.dumps(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        ).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cadata=ca) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:  # noqa: S310
            return json.loads(answer.read())["status"]["userInfo"]
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def standin(tmp_path):
    with KubeStandIn() as running:
        running.kubeconfig = running.write_kubeconfig(tmp_path / "kubeconfig")
        yield running


def assert_kubeadm_form(secret: dict[str, Any], token: str, *, ttl: float, now: datetime) -> None:
    token_id, token_secret = TOKEN_FORM.fullmatch(token).groups()
    assert secret["metadata"]["name"] == f"bootstrap-token-{token_id}"
    assert secret["metadata"]["namespace"] == "kube-system"
    assert secret["type"] == "bootstrap.kubernetes.io/token"
    fields = data(secret)
    assert set(fields) == KUBEADM_KEYS
    assert fields["token-id"] == token_id
    assert fields["token-secret"] == token_secret
    assert fields["usage-bootstrap-authentication"] == "true"
    assert fields["usage-bootstrap-signing"] == "true"
    assert (
        fields["auth-extra-groups"]
        == NODE_TOKEN_GROUP
        == ("system:bootstrappers:kubeadm:default-node-token")
    )
    expires = datetime.strptime(fields["expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((expires - now).total_seconds() - ttl) < 5


# -- the token and its Secret ---------------------------------------------------------------------


async def test_a_minted_token_authenticates_as_a_kubeadm_node_bootstrapper_until_it_expires(
    standin,
):
    tokens = BootstrapTokens(standin.kubeconfig, cluster_name="prod")
    try:
        token = await tokens.mint(server_name="prod-workers-1a2b", group_id="workers", ttl=900)
    finally:
        await tokens.aclose()
    (secret,) = standin.secrets("kube-system")
    assert_kubeadm_form(secret, token, ttl=900, now=datetime.now(UTC))
    assert secret["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "osas",
        "osas.openstack.org/cluster": "prod",
        "osas.openstack.org/node-group": "workers",
    }
    assert "prod-workers-1a2b" in data(secret)["description"]
    token_id = token.partition(".")[0]
    assert who_am_i(standin.url, token) == {
        "username": f"system:bootstrap:{token_id}",
        "groups": ["system:bootstrappers", NODE_TOKEN_GROUP, "system:authenticated"],
    }
    # The same token a second past its expiration, by the server's clock: nobody.
    standin.wall_clock = lambda: datetime.now(UTC) + timedelta(seconds=901)
    assert who_am_i(standin.url, token) == 401


async def test_each_mint_is_a_new_token(standin):
    tokens = BootstrapTokens(standin.kubeconfig, cluster_name="prod")
    try:
        minted = {
            await tokens.mint(server_name=f"s{i}", group_id="workers", ttl=600) for i in range(20)
        }
    finally:
        await tokens.aclose()
    assert len(minted) == 20
    assert len(standin.secrets("kube-system")) == 20


async def test_expirations_follow_the_api_servers_clock_once_a_create_showed_it(standin):
    """A host whose clock is an hour behind the API server's would mint tokens that expire
    an hour early by the server's: osas learns the gap from the first Secret's
    creationTimestamp and writes the next expirations by the server's clock."""
    standin.wall_clock = lambda: datetime.now(UTC) + timedelta(hours=1)
    tokens = BootstrapTokens(standin.kubeconfig, cluster_name="prod")
    try:
        first = await tokens.mint(server_name="s1", group_id="workers", ttl=1800)
        second = await tokens.mint(server_name="s2", group_id="workers", ttl=1800)
    finally:
        await tokens.aclose()
    by_id = {data(s)["token-id"]: s for s in standin.secrets("kube-system")}
    server_now = standin.wall_clock()
    assert_kubeadm_form(by_id[second[:6]], second, ttl=1800, now=server_now)
    # The first was written before the gap was known: half an hour early... by the host.
    assert_kubeadm_form(by_id[first[:6]], first, ttl=1800 - 3600, now=server_now)


async def test_a_refusal_says_so_and_an_unreachable_api_is_not_a_refusal(standin, tmp_path):
    standin.grant("leases-only", {"kube-system"}, resources={"leases"})
    narrow = standin.write_kubeconfig(tmp_path / "narrow", token="leases-only")
    tokens = BootstrapTokens(narrow, cluster_name="prod")
    try:
        with pytest.raises(JoinTokenError) as refused:
            await tokens.mint(server_name="s1", group_id="workers", ttl=600)
    finally:
        await tokens.aclose()
    assert refused.value.refused
    assert "403 Forbidden" in str(refused.value)
    assert 'cannot create resource "secrets"' in str(refused.value)
    standin.unreachable = DROP
    tokens = BootstrapTokens(standin.kubeconfig, cluster_name="prod")
    try:
        with pytest.raises(JoinTokenError) as unanswered:
            await tokens.mint(server_name="s1", group_id="workers", ttl=600)
    finally:
        await tokens.aclose()
    assert not unanswered.value.refused
    assert standin.secrets("kube-system") == []


async def test_check_config_rehearses_the_mint_and_stores_nothing(standin, tmp_path):
    data_ = config_on_nothing(standin.kubeconfig)
    config = load_config(write_config(tmp_path, data_))
    out = io.StringIO()
    assert await check_join_tokens(config, Report(out)) == 0
    assert "join tokens: ok: node group 'workers': a Secret like bootstrap-token-" in out.getvalue()
    assert standin.secrets("kube-system") == []
    standin.grant("osas-standin-token", {"kube-system"}, resources={"leases"})
    out = io.StringIO()
    assert await check_join_tokens(config, Report(out)) == 1
    assert "join tokens: PROBLEM: node group 'workers': the Kubernetes API refused" in (
        out.getvalue()
    )


def config_on_nothing(kubeconfig: Path) -> dict[str, Any]:
    """A configuration whose workers mint tokens through ``kubeconfig`` (its cloud unused)."""
    from support import config_data  # noqa: PLC0415 - kept beside its one use

    data_ = config_data()
    data_["leader_election"] = {"kubeconfig": str(kubeconfig)}
    data_["node_groups"][0].update(user_data=TEMPLATE, bootstrap_token={"ttl": "20m"})
    return data_


# -- the configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "reason"),
    [
        ({"bootstrap_token": {"ttl": "30s"}}, "ttl must be between 2m and 24h, not 30s"),
        ({"bootstrap_token": {"ttl": "25h"}}, "not 90000s"),
        (
            {"bootstrap_token": {}, "user_data": "#cloud-config\n"},
            "user_data never says ${bootstrap_token}",
        ),
        (
            {
                "bootstrap_token": {"ttl": "10m"},
                "options": {"max_node_provision_time": "15m"},
            },
            "(600s) is shorter than options.max_node_provision_time (900s)",
        ),
        (
            {"user_data_vars": {"bootstrap_token": "/etc/t"}},
            "user_data_vars ['bootstrap_token'] are filled in by osas itself",
        ),
    ],
)
def test_the_bootstrap_token_block_is_checked_at_load(tmp_path, group, reason):
    data_ = config_on_nothing(tmp_path / "kubeconfig")
    data_["node_groups"][0].update(group)
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path, data_))
    assert reason in str(caught.value)


def test_a_group_that_mints_needs_a_kubernetes_api_at_start(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    data_ = config_on_nothing(tmp_path / "kubeconfig")
    data_["leader_election"] = {}
    config = load_config(write_config(tmp_path, data_))
    with pytest.raises(ConfigError) as caught:
        Provider(config, openstack_cloud(config))
    assert "node groups ['workers'] mint join tokens (bootstrap_token)" in str(caught.value)
    assert "no usable Kubernetes configuration" in str(caught.value)
    assert "outside a pod, name a kubeconfig in leader_election.kubeconfig" in str(caught.value)


# -- through osas: a token per server, in its user data and nowhere else ------------------------


async def scale_up(
    provider: Provider, sim: SimulatedOpenStack, group: str, count: int, *, errors: int = 0
) -> list[pb.Instance]:
    """IncreaseSize(count), then syncs until ``count`` servers are listed or ``errors``
    instances carry an error; the group's instances as CA sees them."""
    async with ca_client(provider.address) as ca:
        await ca.refresh()
        await ca.increase(group, count)
        for _ in range(400):
            await provider.sync()
            instances = await ca.nodes(group)
            failed = [i for i in instances if i.status.HasField("errorInfo")]
            listed = [s for s in sim.nova.all_servers() if f"-{group}-" in s.name]
            if (errors and len(failed) >= errors) or (not errors and len(listed) >= count):
                return instances
            await asyncio.sleep(0.05)
        return await ca.nodes(group)


def user_data_token(server) -> str:
    text = base64.b64decode(server.user_data or "").decode()
    match = re.search(r"--token (\S+) --node-name (\S+)\n", text)
    assert match is not None, text
    assert match.group(2) == server.name
    return match.group(1)


async def test_each_server_joins_with_a_token_of_its_own_that_appears_nowhere_else(
    standin, tmp_path, capfd, logs_at_debug
):
    """Four creates, sent through a Nova rate limit that refuses some of them (429) so that
    they are sent again: four Secrets, one per server (a create sent again keeps its token),
    each server's user data holding its own, each token authenticating, and none of them in
    a log line, the configuration or what CA sees."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        sim.nova.faults.create_rate = 1.0
        data_ = config_on(sim, leader_election={"kubeconfig": str(standin.kubeconfig)})
        data_["node_groups"][0].update(user_data=TEMPLATE, bootstrap_token={"ttl": "20m"})
        config = make_config(tmp_path, **data_)
        provider = Provider(config, openstack_cloud(config))
        await provider.start()
        try:
            seen = await scale_up(provider, sim, "workers", 4)
        finally:
            await provider.stop()
        servers = [s for s in sim.nova.all_servers() if "-workers-" in s.name]
        throttled = sim.throttled["compute.servers.create"]
    assert throttled > 0  # some creates were sent again
    assert len(servers) == 4
    secrets = standin.secrets("kube-system")
    assert len(secrets) == 4
    tokens = {server.name: user_data_token(server) for server in servers}
    assert len(set(tokens.values())) == 4
    now = datetime.now(UTC)
    by_id = {data(secret)["token-id"]: secret for secret in secrets}
    for name, token in tokens.items():
        secret = by_id[token[:6]]
        assert_kubeadm_form(secret, token, ttl=1200, now=now)
        assert name in data(secret)["description"]
        assert who_am_i(standin.url, token)["username"] == f"system:bootstrap:{token[:6]}"
    captured = capfd.readouterr()
    assert (captured.out + captured.err).count("join token minted") == 4
    everything = "\n".join(
        [captured.out, captured.err, repr(config), (tmp_path / "osas.yaml").read_text()]
    )
    everything += "\n".join(str(instance) for instance in seen)
    for token in tokens.values():
        assert token.partition(".")[2] not in everything


async def test_a_token_the_cluster_refuses_fails_the_create_before_nova_sees_it(
    standin, tmp_path, capfd
):
    standin.grant("osas-standin-token", {"kube-system"}, resources={"leases"})
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        data_ = config_on(sim, leader_election={"kubeconfig": str(standin.kubeconfig)})
        group = data_["node_groups"][1]
        group.update(user_data=TEMPLATE, bootstrap_token={"ttl": "20m"})
        config = make_config(tmp_path, **data_)
        provider = Provider(config, openstack_cloud(config))
        await provider.start()
        try:
            seen = await scale_up(provider, sim, "gpu", 1, errors=1)
        finally:
            await provider.stop()
        servers = [s for s in sim.nova.all_servers() if "-gpu-" in s.name]
    assert servers == []
    (failed,) = [i for i in seen if i.status.HasField("errorInfo")]
    assert failed.status.errorInfo.errorCode == "JoinTokenUnavailable"
    assert "the Kubernetes API refused the join token of" in failed.status.errorInfo.errorMessage
    assert "403 Forbidden" in failed.status.errorInfo.errorMessage
    captured = capfd.readouterr()
    assert "join token refused; create refused" in captured.out + captured.err


async def test_creates_wait_for_an_api_server_that_does_not_answer_and_go_once_it_does(
    standin, tmp_path
):
    """Unanswered (the connection dropped) is not a refusal: the create is not sent, and
    is sent again after a backoff (``create_attempts`` times in all before CA hears of it),
    with a token minted once the API server answers."""
    standin.unreachable = DROP
    with SimulatedOpenStack(FakeNova(build_seconds=0.1)) as sim:
        data_ = config_on(sim, leader_election={"kubeconfig": str(standin.kubeconfig)})
        data_["reconcile"]["retry_backoff"] = 0.2
        data_["node_groups"][0].update(user_data=TEMPLATE, bootstrap_token={"ttl": "20m"})
        config = make_config(tmp_path, **data_)
        provider = Provider(config, openstack_cloud(config))
        await provider.start()
        try:
            async with ca_client(provider.address) as ca:
                await ca.increase("workers", 1)
                for _ in range(200):
                    if any(e.resource == "secrets" for e in standin.history):
                        break
                    await asyncio.sleep(0.01)
                assert [s for s in sim.nova.all_servers() if "-workers-" in s.name] == []
                standin.unreachable = None
                for _ in range(200):
                    await provider.sync()
                    if [s for s in sim.nova.all_servers() if "-workers-" in s.name]:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await provider.stop()
        (server,) = [s for s in sim.nova.all_servers() if "-workers-" in s.name]
    token = user_data_token(server)
    assert next(e.status for e in standin.history if e.resource == "secrets") == 0  # dropped
    (secret,) = standin.secrets("kube-system")
    assert data(secret)["token-id"] == token[:6]


# -- a real API server (OSAS_TEST_KUBECONFIG) ------------------------------------------------------


def real_api_server() -> tuple[Path, str, str | None]:
    path = os.environ.get("OSAS_TEST_KUBECONFIG")
    if not path:
        pytest.skip("OSAS_TEST_KUBECONFIG names no kubeconfig: the real API server lane is off")
    config = yaml.safe_load(Path(path).read_text())
    cluster = config["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data")
    return Path(path), cluster["server"], base64.b64decode(ca).decode() if ca else None


async def test_on_a_real_api_server_the_token_authenticates_as_a_bootstrapper_until_it_expires():
    kubeconfig, url, ca = real_api_server()
    tokens = BootstrapTokens(kubeconfig, cluster_name="osas-test")
    try:
        token = await tokens.mint(server_name="osas-test-1", group_id="workers", ttl=6)
    finally:
        await tokens.aclose()
    answer = who_am_i(url, token, ca)
    assert answer["username"] == f"system:bootstrap:{token[:6]}"
    assert set(answer["groups"]) >= {"system:bootstrappers", NODE_TOKEN_GROUP}
    # Past its expiration the API server refuses it, once its cache of successful token
    # authentications (10 s) has let go of it.
    deadline = asyncio.get_running_loop().time() + 6 + 10 + 15
    while (answer := who_am_i(url, token, ca)) != 401:
        assert asyncio.get_running_loop().time() < deadline, answer
        await asyncio.sleep(1)


async def test_a_warm_pool_group_gets_a_token_per_claim_in_metadata_and_none_while_warm(
    standin, tmp_path
):
    """Warm pools (issue 36): no token is minted for a server that waits in the pool (its user
    data holds none); each claim and each cold create gets one of its own, in the server's
    metadata (osas-join-token), named for that server, authenticating; once a claimed server
    runs its claim mark goes and its token stays (the node reads it later than ACTIVE)."""
    with SimulatedOpenStack(FakeNova(build_seconds=0.05)) as sim:
        data_ = config_on(sim, leader_election={"kubeconfig": str(standin.kubeconfig)})
        data_["node_groups"][0].update(
            user_data="#cloud-config\nhostname: ${server_name}\n",
            bootstrap_token={"ttl": "20m"},
            warm_pool={"size": 1},
        )
        data_["reconcile"] = {**data_.get("reconcile", {}), "interval": "0.2s"}
        config = make_config(tmp_path, **data_)
        provider = Provider(config, openstack_cloud(config))
        await provider.start()
        try:
            async with asyncio.timeout(20):  # ready, as osas sees it
                while provider.app.status()["groups"][0]["warm_pool"].get("ready") != 1:
                    await asyncio.sleep(0.05)
            (waiting,) = [s for s in sim.nova.live_servers() if "osas-warm" in s.metadata]
            assert standin.secrets("kube-system") == []  # none for the pool
            assert "token" not in base64.b64decode(waiting.user_data or "").decode()
            seen: dict[str, str] = {}  # server name -> the token its metadata carried
            async with ca_client(provider.address) as ca:
                await ca.increase("workers", 2)  # one claim, one cold create
                async with asyncio.timeout(20):
                    while len(seen) < 2 or "osas-claimed" in waiting_now(sim, waiting):
                        for server in sim.nova.live_servers():
                            token = server.metadata.get("osas-join-token")
                            if token is not None:
                                seen[server.name] = token
                        await asyncio.sleep(0.02)
        finally:
            await provider.stop()
    assert waiting.name in seen  # the claimed server, by the name it was made with
    assert waiting_now(sim, waiting).get("osas-join-token") == seen[waiting.name]
    assert len(set(seen.values())) == 2
    by_id = {data(secret)["token-id"]: secret for secret in standin.secrets("kube-system")}
    assert len(by_id) == 2
    for name, token in seen.items():
        assert name in data(by_id[token[:6]])["description"]
        assert who_am_i(standin.url, token)["username"] == f"system:bootstrap:{token[:6]}"


def waiting_now(sim: SimulatedOpenStack, server) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The server's metadata as Nova holds it now."""
    found = sim.nova.get_server(server.server_id)
    return {} if found is None else dict(found.metadata)
