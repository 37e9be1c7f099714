"""The admission policies the chart ships with osas's grants, their CEL evaluated as the API
server evaluates them (cel-python) against the requests osas's token makes and those a stolen
token could make (issue 32): osas's own EndpointSlice and Lease and the bootstrap tokens it
mints are admitted; a slice for another Service, its own slice relabelled for another Service,
another component's Lease and a Secret of another type, name or group are denied; nobody
else's requests are judged at all."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("helm_python", reason="chart tests run in their own venv: nox -s chart")
pytest.importorskip("celpy", reason="chart tests run in their own venv: nox -s chart")

import celpy
from chartkit import MINTING_WORKERS, chart_copy, documents, find, render_files, validate

NAMESPACE = "kube-system"
OSAS = "system:serviceaccount:kube-system:osas"


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> list[dict[str, Any]]:
    """Every grant the chart can make: leader election on, a group that mints join tokens."""
    chart: Path = chart_copy(tmp_path_factory.mktemp("chart"))
    values = {"config": {"cluster_name": "prod", "node_groups": [MINTING_WORKERS]}}
    return documents(render_files(chart, values))


def _program(expression: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def admitted(policy: dict[str, Any], request: dict[str, Any], obj: dict[str, Any]) -> bool:
    """The policy's verdict, as the API server reaches it: the match conditions first (a
    request they do not match is not judged), then every validation; an error fails closed
    (failurePolicy Fail)."""
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    activation = {"request": celpy.json_to_cel(request), "object": as_cel(obj)}
    for condition in spec["matchConditions"]:
        if not _program(condition["expression"]).evaluate(activation):
            return True
    for validation in spec["validations"]:
        verdict = _program(validation["expression"]).evaluate(activation)
        if not isinstance(verdict, celpy.celtypes.BoolType) or not verdict:
            return False
    return True


def as_cel(obj: dict[str, Any]) -> Any:
    """The object as the API server hands it to CEL: a Secret's data are bytes, those of the
    base64 text the JSON holds (what kube-apiserver 1.36 showed: ``string()`` of a value gives
    the base64 text, and CEL there has no decoder)."""
    value = celpy.json_to_cel(obj)
    if obj.get("kind") == "Secret" and "data" in obj:
        text = celpy.celtypes.StringType
        value[text("data")] = celpy.celtypes.MapType(
            {
                text(key): celpy.celtypes.BytesType(item.encode())
                for key, item in obj["data"].items()
            }
        )
    return value


def request(
    resource: str, name: str, *, namespace: str = NAMESPACE, user: str = OSAS, update: bool = False
) -> dict[str, Any]:
    group = {
        "endpointslices": "discovery.k8s.io",
        "leases": "coordination.k8s.io",
        "secrets": "",
    }[resource]
    return {
        "operation": "UPDATE" if update else "CREATE",
        "name": name,
        "namespace": namespace,
        "resource": {"group": group, "version": "v1", "resource": resource},
        "userInfo": {"username": user},
    }


def endpoint_slice(name: str, service: str | None) -> dict[str, Any]:
    labels = {"endpointslice.kubernetes.io/managed-by": "osas.openstack.org"}
    if service is not None:
        labels["kubernetes.io/service-name"] = service
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.9"]}],
    }


def lease(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": "osas-0", "leaseDurationSeconds": 3600},
    }


def secret(
    name: str = "bootstrap-token-abcdef",
    *,
    kind: str = "bootstrap.kubernetes.io/token",
    namespace: str = NAMESPACE,
    **changes: str | None,
) -> dict[str, Any]:
    """A Secret as osas mints it (osas/election/tokens.py), with ``changes`` to its data
    (None drops a key); its data base64 as the API server stores it."""
    fields = {
        "description": "osas: the join of server prod-workers-0a1b (node group workers)",
        "token-id": name.removeprefix("bootstrap-token-"),
        "token-secret": "0123456789abcdef",
        "expiration": "2026-12-05T10:00:00Z",
        "usage-bootstrap-authentication": "true",
        "usage-bootstrap-signing": "true",
        "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
    }
    for given, value in changes.items():
        key = given.replace("_", "-")
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": kind,
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in fields.items()},
    }


# Each case: what it is, the request, the object, whether it is admitted.
CASES = [
    (
        "its own slice",
        request("endpointslices", "osas-leader"),
        endpoint_slice("osas-leader", "osas"),
        True,
    ),
    (
        "its own slice, updated",
        request("endpointslices", "osas-leader", update=True),
        endpoint_slice("osas-leader", "osas"),
        True,
    ),
    (
        "a slice for kube-dns",
        request("endpointslices", "osas-leader-dns"),
        endpoint_slice("osas-leader-dns", "kube-dns"),
        False,
    ),
    (
        "a slice for kube-dns under its own slice's name",
        request("endpointslices", "osas-leader"),
        endpoint_slice("osas-leader", "kube-dns"),
        False,
    ),
    (
        "its own slice relabelled for kube-dns",
        request("endpointslices", "osas-leader", update=True),
        endpoint_slice("osas-leader", "kube-dns"),
        False,
    ),
    (
        "its own slice without the label",
        request("endpointslices", "osas-leader"),
        endpoint_slice("osas-leader", None),
        False,
    ),
    (
        "its own slice in another namespace",
        request("endpointslices", "osas-leader", namespace="default"),
        endpoint_slice("osas-leader", "osas"),
        False,
    ),
    ("its own Lease", request("leases", "osas-prod"), lease("osas-prod"), True),
    (
        "its own Lease, renewed",
        request("leases", "osas-prod", update=True),
        lease("osas-prod"),
        True,
    ),
    (
        "CA's own leader Lease",
        request("leases", "cluster-autoscaler"),
        lease("cluster-autoscaler"),
        False,
    ),
    (
        "its Lease's name in another namespace",
        request("leases", "osas-prod", namespace="default"),
        lease("osas-prod", "default"),
        False,
    ),
    (
        "a join token as osas mints it",
        request("secrets", "bootstrap-token-abcdef"),
        secret(),
        True,
    ),
    (
        "a join token without the signing usage or the extra group",
        request("secrets", "bootstrap-token-abcdef"),
        secret(usage_bootstrap_signing=None, auth_extra_groups=None),
        True,
    ),
    (
        "a Secret of another type: a ServiceAccount's token",
        request("secrets", "bootstrap-token-abcdef"),
        secret(kind="kubernetes.io/service-account-token"),
        False,
    ),
    (
        "an Opaque Secret",
        request("secrets", "bootstrap-token-abcdef"),
        secret(kind="Opaque"),
        False,
    ),
    (
        "a join token under another name",
        request("secrets", "cluster-admin-token"),
        secret("cluster-admin-token"),
        False,
    ),
    (
        "a Secret named like a join token, but not of a token id's form",
        request("secrets", "bootstrap-token-abcdefgh"),
        secret("bootstrap-token-abcdefgh"),
        False,
    ),
    (
        "a join token that never expires",
        request("secrets", "bootstrap-token-abcdef"),
        secret(expiration=None),
        False,
    ),
    (
        "a join token in another bootstrappers group",
        request("secrets", "bootstrap-token-abcdef"),
        secret(
            auth_extra_groups="system:bootstrappers:kubeadm:default-node-token,"
            "system:bootstrappers:worker-admins"
        ),
        False,
    ),
    (
        "a join token with a key of its own",
        request("secrets", "bootstrap-token-abcdef"),
        secret(**{"usage-something-else": "true"}),
        False,
    ),
    (
        "a join token in another namespace",
        request("secrets", "bootstrap-token-abcdef", namespace="default"),
        secret(namespace="default"),
        False,
    ),
    (
        "kube-controller-manager writing a slice for kube-dns: not osas, not judged",
        request(
            "endpointslices",
            "kube-dns-abcde",
            user="system:serviceaccount:kube-system:endpointslice-controller",
        ),
        endpoint_slice("kube-dns-abcde", "kube-dns"),
        True,
    ),
]


@pytest.mark.parametrize(
    ("req", "obj", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_policy_admits_osas_its_own_objects_alone(objects, req, obj, expected):
    policy = find(objects, "ValidatingAdmissionPolicy")
    assert admitted(policy, req, obj) is expected


def test_the_policy_is_bound_to_deny_and_covers_every_write_osas_may_make(objects):
    policy = find(objects, "ValidatingAdmissionPolicy")
    binding = find(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    rules = {
        (rule["apiGroups"][0], rule["resources"][0]): set(rule["operations"])
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
    }
    # Every resource osas may create or update (the chart's Roles), with both operations.
    granted = {
        (group, resource)
        for role in (o for o in objects if o["kind"] == "Role")
        for rule in role["rules"]
        if {"create", "update"} & set(rule["verbs"])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert set(rules) == granted
    assert all(operations == {"CREATE", "UPDATE"} for operations in rules.values())


def test_without_election_or_join_tokens_there_is_no_grant_and_no_policy(tmp_path):
    chart = chart_copy(tmp_path)
    values = {"replicaCount": 1, "config": {"leader_election": {"enabled": False}}}
    objects = documents(render_files(chart, values))
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Role", "RoleBinding", "ValidatingAdmissionPolicy"}


def test_join_tokens_without_election_grant_secrets_alone_held_by_the_policy(tmp_path):
    chart = chart_copy(tmp_path)
    values = {
        "replicaCount": 1,
        "config": {"leader_election": {"enabled": False}, "node_groups": [MINTING_WORKERS]},
    }
    objects = documents(render_files(chart, values))
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    policy = find(objects, "ValidatingAdmissionPolicy")
    assert [r["resources"] for r in policy["spec"]["matchConstraints"]["resourceRules"]] == [
        ["secrets"]
    ]
    assert admitted(policy, request("secrets", "bootstrap-token-abcdef"), secret())
    assert not admitted(policy, request("secrets", "bootstrap-token-abcdef"), secret(kind="Opaque"))


def test_without_join_tokens_no_secret_is_granted(tmp_path):
    chart = chart_copy(tmp_path)
    objects = documents(render_files(chart, {"config": {"cluster_name": "prod"}}))
    resources = {
        resource
        for role in (o for o in objects if o["kind"] == "Role")
        for rule in role["rules"]
        for resource in rule["resources"]
    }
    assert resources == {"leases", "endpointslices"}


def _grants_table() -> list[dict[str, str]]:
    """The rows of docs/security.md's table of every grant."""
    text = (Path(__file__).parent.parent.parent / "docs" / "security.md").read_text()
    section = text.split("### Every grant of osas's ServiceAccount", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in lines[2:]
    ]


def test_the_grants_are_those_docs_security_lists(objects):
    """Every verb on every resource the Roles grant, with the names RBAC narrows it to and
    the names the policy admits, is a row of the table, and every row is granted."""
    names = {
        "<lease>": "osas-prod",
        "<slice>": "osas-leader",
        "bootstrap-token-<id>": "^bootstrap-token-[a-z0-9]{6}$",
        "any": None,
    }
    granted = {
        (
            group,
            resource,
            frozenset(rule["verbs"]),
            tuple(rule.get("resourceNames", [])) or None,
        )
        for role in (o for o in objects if o["kind"] == "Role")
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    listed = {
        (
            "" if row["API group"] == "(core)" else row["API group"],
            row["resource"],
            frozenset(verb.strip() for verb in row["verbs"].split(",")),
            None
            if names[row["names (RBAC)"].strip("`")] is None
            else (names[row["names (RBAC)"].strip("`")],),
        )
        for row in _grants_table()
    }
    assert granted == listed
    policy = find(objects, "ValidatingAdmissionPolicy")
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for row in _grants_table():
        admitted_name = row["admitted (policy)"].split("`")[1]
        assert f"'{names[admitted_name]}'" in expressions


def test_the_metadata_service_example_of_docs_install_is_a_valid_policy_that_excepts_it():
    """docs/install.md's NetworkPolicy keeping pods from the metadata service (where the join
    token is served): valid for every Kubernetes the chart supports, every pod of its
    namespace selected, egress anywhere but 169.254.169.254."""
    text = (Path(__file__).parent.parent.parent / "docs" / "install.md").read_text()
    section = text.split("### The metadata service hands user data to every process", 1)[1]
    policy = yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])
    validate(policy)
    assert policy["kind"] == "NetworkPolicy"
    assert policy["spec"]["podSelector"] == {}
    assert policy["spec"]["policyTypes"] == ["Egress"]
    (rule,) = policy["spec"]["egress"]
    blocks = [peer["ipBlock"] for peer in rule["to"]]
    assert {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]} in blocks
    assert all(block.get("except") or block["cidr"] != "0.0.0.0/0" for block in blocks)
