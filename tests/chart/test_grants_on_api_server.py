"""The chart's grants on a real kube-apiserver (``OSAS_TEST_KUBECONFIG`` names an admin's
kubeconfig; skipped otherwise): its ServiceAccount, Roles, RoleBindings and admission policy
applied as rendered, then the requests of docs/security.md's table made with a token of osas's
ServiceAccount, admitted and denied as the table says, and a join token minted with that
token authenticating as a kubeadm node bootstrapper (issue 32)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("helm_python", reason="chart tests run in their own venv: nox -s chart")

from chartkit import MINTING_WORKERS, chart_copy, documents, render_files

from osas.election.tokens import NODE_TOKEN_GROUP, BootstrapTokens

NAMESPACE = "kube-system"
# Where each kind is created, and in which order (the policy before its binding).
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    ),
}


class Api:
    """Plain requests to the API server, as an admin (the kubeconfig's user) or a token."""

    def __init__(self, kubeconfig: Path, folder: Path, token: str | None = None) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.url = cluster["server"].rstrip("/")
        self.kubeconfig = kubeconfig
        self.context = ssl.create_default_context()
        if "certificate-authority-data" in cluster:
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            self.context.load_verify_locations(cadata=ca)
        elif "certificate-authority" in cluster:
            self.context.load_verify_locations(cluster["certificate-authority"])
        self.token = token or user.get("token")
        if token is None and "client-certificate-data" in user:
            cert, key = folder / "admin.crt", folder / "admin.key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            self.context.load_cert_chain(cert, key)
        self.cluster = cluster

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(  # noqa: S310 - the test's own API server
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers=headers,
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=20) as answer:  # noqa: S310
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def as_token(self, token: str, folder: Path) -> Api:
        """The same server, as ``token``, with a kubeconfig of its own for osas."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "osas.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": self.cluster}],
            "users": [{"name": "osas", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "osas"}}],
            "current-context": "c",
        }
        path.write_text(yaml.safe_dump(config))
        return Api(path, folder, token)


def lease(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "osas-test", "leaseDurationSeconds": 15},
    }


def endpoint_slice(name: str, service: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.9"]}],
        "ports": [{"name": "grpc", "port": 8086, "protocol": "TCP"}],
    }


def secret(name: str, kind: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": kind,
        "stringData": data,
    }


TOKEN_DATA = {
    "token-id": "osast1",
    "token-secret": "0123456789abcdef",
    "expiration": "2099-01-01T00:00:00Z",
    "usage-bootstrap-authentication": "true",
    "auth-extra-groups": NODE_TOKEN_GROUP,
}
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
# The table's requests: (what, path, object, admitted).
REQUESTS = [
    ("its own Lease", LEASES, lease("osas-prod"), True),
    ("CA's leader Lease", LEASES, lease("cluster-autoscaler-osas-test"), False),
    ("its own slice", SLICES, endpoint_slice("osas-leader", "osas"), True),
    ("a slice for kube-dns", SLICES, endpoint_slice("osas-test-dns", "kube-dns"), False),
    (
        "a join token as osas mints it",
        SECRETS,
        secret("bootstrap-token-osast1", "bootstrap.kubernetes.io/token", TOKEN_DATA),
        True,
    ),
    ("an Opaque Secret", SECRETS, secret("osas-test-opaque", "Opaque", {"a": "b"}), False),
    (
        "a ServiceAccount's token",
        SECRETS,
        {
            **secret("osas-test-sa-token", "kubernetes.io/service-account-token", {}),
            "metadata": {
                "name": "osas-test-sa-token",
                "annotations": {"kubernetes.io/service-account.name": "default"},
            },
        },
        False,
    ),
    (
        "a join token in another bootstrappers group",
        SECRETS,
        secret(
            "bootstrap-token-osast2",
            "bootstrap.kubernetes.io/token",
            {**TOKEN_DATA, "token-id": "osast2", "auth-extra-groups": "system:bootstrappers:x"},
        ),
        False,
    ),
]


@pytest.fixture
def admin(tmp_path) -> Api:
    path = os.environ.get("OSAS_TEST_KUBECONFIG")
    if not path:
        pytest.skip("OSAS_TEST_KUBECONFIG names no kubeconfig: the real API server lane is off")
    return Api(Path(path), tmp_path)


def apply_chart(admin: Api, folder: Path) -> list[tuple[str, str]]:
    """The chart's ServiceAccount, Roles, bindings and policy, made as rendered; what was
    made, as (path, name), for the clean-up."""
    chart = chart_copy(folder)
    values = {"config": {"cluster_name": "prod", "node_groups": [MINTING_WORKERS]}}
    made = []
    objects = documents(render_files(chart, values))
    for kind, where in PATHS.items():
        for obj in (o for o in objects if o["kind"] == kind):
            path = where.format(ns=obj["metadata"].get("namespace", NAMESPACE))
            status, answer = admin.call("POST", path, obj)
            if status == 409:
                admin.call("DELETE", f"{path}/{obj['metadata']['name']}")
                status, answer = admin.call("POST", path, obj)
            assert status == 201, (kind, answer)
            made.append((path, obj["metadata"]["name"]))
    return made


def osas_token(admin: Api) -> str:
    status, answer = admin.call(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/osas/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert status == 201, answer
    return answer["status"]["token"]


async def test_on_a_real_api_server_the_grants_admit_and_deny_as_the_table_says(admin, tmp_path):
    made = apply_chart(admin, tmp_path / "chart")
    osas = admin.as_token(osas_token(admin), tmp_path)
    try:
        # RBAC and the policy take effect once the API server's informers have them: wait for
        # the policy's own denial of another Lease (RBAC alone would admit it).
        deadline = time.monotonic() + 30
        while True:
            status, answer = osas.call("POST", LEASES, lease("osas-test-probe"))
            if status == 201:
                admin.call("DELETE", f"{LEASES}/osas-test-probe")
            elif "ValidatingAdmissionPolicy" in answer.get("message", ""):
                break
            assert time.monotonic() < deadline, f"the policy never took effect: {answer}"
            await asyncio.sleep(0.5)
        verdicts = {}
        for what, path, obj, _ in REQUESTS:
            status, answer = osas.call("POST", path, obj)
            verdicts[what] = status == 201
            if status == 201:
                made.append((path, obj["metadata"]["name"]))
            else:
                assert status in {403, 422}, (what, answer)  # RBAC or the policy
        assert verdicts == {what: expected for what, _, _, expected in REQUESTS}
        # Nothing read: not even the Secret it made.
        assert osas.call("GET", f"{SECRETS}/bootstrap-token-osast1")[0] == 403
        # osas's own mint, with osas's token: a dry run admitted, then a token that
        # authenticates as a kubeadm node bootstrapper.
        tokens = BootstrapTokens(osas.kubeconfig, cluster_name="prod")
        try:
            await tokens.rehearse(group_id="workers", ttl=120)
            token = await tokens.mint(server_name="prod-workers-t", group_id="workers", ttl=120)
        finally:
            await tokens.aclose()
        made.append((SECRETS, f"bootstrap-token-{token[:6]}"))
        bootstrapper = admin.as_token(token, tmp_path / "bootstrapper")
        status, answer = bootstrapper.call(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert status == 201, answer
        info = answer["status"]["userInfo"]
        assert info["username"] == f"system:bootstrap:{token[:6]}"
        assert {"system:bootstrappers", NODE_TOKEN_GROUP} <= set(info["groups"])
    finally:
        for path, name in reversed(made):
            admin.call("DELETE", f"{path}/{name}")
