"""The Helm chart, rendered offline for every kind of install (nox -s chart): each object valid
for Kubernetes 1.27 to the newest schema, osas's configuration accepted by osas's own loader,
CA's cloud-config as CA reads it and covered by the server certificate, secrets only in
Secrets, and the values schema refusing what would not work."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("helm_python", reason="chart tests run in their own venv: nox -s chart")
pytest.importorskip("kubernetes_validate", reason="chart tests run in their own venv: nox -s chart")

import anyio
import helm_python as helm
from chartkit import (
    CHART,
    EXAMPLE_REPOSITORY,
    SHIPPED_FILES,
    chart_copy,
    documents,
    find,
    kinds,
    notes,
    render_files,
    validate,
)
from node_examples import markdown_blocks, secret_commands
from support import make_config, running

import osas
from osas.config import NodeGroupConfig, OsasConfig, load_config, places_of
from osas.config.schema import LeaderElectionConfig
from osas.demo.certs import DemoAuthority

PASSWORD = "s3cret-Passw0rd"
APP_SECRET = "app-cred-secret-value"
CLOUDS_YAML = {
    "clouds": {
        "openstack": {
            "auth": {
                "auth_url": "https://keystone.example:5000/v3",
                "username": "osas",
                "password": PASSWORD,
                "project_name": "k8s",
                "user_domain_name": "Default",
                "project_domain_name": "Default",
            },
            "region_name": "RegionOne",
        }
    }
}
ENV = {
    "OS_AUTH_URL": "https://keystone.example:5000/v3",
    "OS_AUTH_TYPE": "v3applicationcredential",
    "OS_APPLICATION_CREDENTIAL_ID": "0123abcd",
    "OS_APPLICATION_CREDENTIAL_SECRET": APP_SECRET,
    "OS_REGION_NAME": "RegionOne",
}
TWO_GROUPS = [
    {
        "id": "workers",
        "min_size": 1,
        "max_size": 20,
        "flavor": "m1.large",
        "image": "ubuntu-24.04-k8s",
        "networks": ["cluster-net"],
        "user_data_file": "/etc/osas/bootstrap/user-data",
        "user_data_vars": {"join_token": "/etc/osas/bootstrap/token"},
    },
    {
        "id": "gpu",
        "min_size": 0,
        "max_size": 4,
        "flavor": "g1.xlarge",
        "image": "ubuntu-24.04-k8s",
        "networks": ["cluster-net"],
        "labels": {"pool": "gpu"},
        "user_data_file": "/etc/osas/bootstrap/user-data",
        "user_data_vars": {"join_token": "/etc/osas/bootstrap/token"},
    },
]

# A public cloud's application credential, in a clouds.yaml of its own (credentials.clouds).
PUBLIC_SECRET = "public-cloud-app-secret"
PUBLIC_CLOUDS_YAML = {
    "clouds": {
        "public": {
            "auth_type": "v3applicationcredential",
            "auth": {
                "auth_url": "https://identity.public.example:5000/v3",
                "application_credential_id": "4567efgh",
                "application_credential_secret": PUBLIC_SECRET,
            },
            "region_name": "GRA",
        }
    }
}
CLOUD_FILES = "/etc/openstack-clouds"


def group_in(group_id: str, openstack: dict[str, Any] | None = None) -> dict[str, Any]:
    """A node group, in the place its ``openstack`` block names (the top-level one without)."""
    group = {**TWO_GROUPS[0], "id": group_id}
    del group["user_data_file"], group["user_data_vars"]
    return group if openstack is None else {**group, "openstack": openstack}


# Node groups in several clouds: the main clouds.yaml Secret (its entries `openstack` and
# `private-gpu`), a public cloud's Secret made beforehand, a partner's made by the chart.
CLOUDS_OF_THEIR_OWN = {
    "credentials": {
        "clouds": [
            {"name": "public", "existingSecret": "osas-openstack-public"},
            {
                "name": "partner",
                "cloudsYaml": yaml.safe_dump(
                    {"clouds": {"partner": CLOUDS_YAML["clouds"]["openstack"]}}
                ),
            },
        ]
    },
    "config": {
        "node_groups": [
            group_in("workers"),
            group_in("south", {"region_name": "South", "provider_id_region": "South"}),
            group_in("gpu", {"cloud": "private-gpu"}),
            group_in("burst", {"cloud": "public", "region_name": "GRA"}),
            group_in("burst-de", {"cloud": "public", "region_name": "DE1"}),
            group_in("partner", {"cloud": "partner"}),
        ]
    },
}
# Every cloud in a Secret of its own: no main Secret, config.openstack.cloud one of them.
EVERY_CLOUD_ITS_OWN = {
    "credentials": {
        "existingSecret": "",
        "clouds": [
            {"name": "private", "existingSecret": "osas-openstack-private"},
            {"name": "public", "cloudsYaml": PUBLIC_CLOUDS_YAML},
        ],
    },
    "config": {
        "openstack": {"cloud": "private"},
        "node_groups": [
            group_in("workers"),
            group_in("workers-2", {"region_name": "RegionTwo"}),
            group_in("also-private", {"cloud": "private"}),
            group_in("burst", {"cloud": "public"}),
        ],
    },
}

# name -> (release name, values): every kind of install the chart supports.
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "defaults": ("osas", {}),
    "release-name-and-overrides": (
        "prod",
        {"nameOverride": "scaler", "commonLabels": {"team": "platform"}},
    ),
    "fullname-override": ("anything", {"fullnameOverride": "cloud-scaler"}),
    "without-cert-manager": (
        "osas",
        {
            "tls": {
                "certManager": {"enabled": False},
                "existingSecret": "my-osas-tls",
                "clientSecret": "my-ca-client",
                "clientDnsName": "autoscaler.example",
            }
        },
    ),
    "own-issuer": (
        "osas",
        {"tls": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
    ),
    "clouds-yaml-from-values": ("osas", {"credentials": {"cloudsYaml": CLOUDS_YAML}}),
    "clouds-yaml-as-text": ("osas", {"credentials": {"cloudsYaml": yaml.safe_dump(CLOUDS_YAML)}}),
    # OS_* variables need no config.openstack.cloud: the chart sets it for clouds.yaml alone.
    "env-from-values": ("osas", {"credentials": {"env": ENV}}),
    "existing-env-secret": (
        "osas",
        {"credentials": {"existingSecret": "os-env", "existingSecretFormat": "env"}},
    ),
    "ha-story": (
        "osas",
        {
            "priorityClassName": "system-node-critical",
            "podDisruptionBudget": {"maxUnavailable": 1},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "node-role.kubernetes.io/control-plane",
                                        "operator": "Exists",
                                    }
                                ]
                            },
                            {"matchExpressions": [{"key": "infra", "operator": "Exists"}]},
                        ]
                    }
                },
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 50,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {
                                    "matchLabels": {
                                        "app.kubernetes.io/name": (
                                            "externalgrpc-cluster-autoscaler"
                                        )
                                    }
                                },
                            },
                        }
                    ]
                },
            },
            "tolerations": [
                {
                    "key": "node-role.kubernetes.io/control-plane",
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            ],
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "osas"}},
                }
            ],
        },
    ),
    "network-policy": (
        "osas",
        {
            "networkPolicy": {
                "enabled": True,
                "egress": [{"ports": [{"port": 5000}, {"port": 8774}, {"port": 53}]}],
                "extraIngress": [{"from": [{"podSelector": {"matchLabels": {"debug": "yes"}}}]}],
            }
        },
    ),
    "custom-ports": (
        "osas",
        {
            "config": {
                "listen": "0.0.0.0:9443",
                "health_listen": "[::]:9444",
                "metrics_listen": "0.0.0.0:9100",
            },
            "networkPolicy": {"enabled": True},
        },
    ),
    "metrics-off": (
        "osas",
        {"config": {"metrics_listen": None}, "networkPolicy": {"enabled": True}},
    ),
    "monitoring": (
        "osas",
        {
            "metrics": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
                "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
                "dashboard": {"enabled": True, "namespace": "monitoring"},
            }
        },
    ),
    "custom-lease": (
        "osas",
        {
            "config": {
                "leader_election": {
                    "lease_name": "scaler-lease",
                    "lease_namespace": "osas-system",
                    "lease_duration": "30s",
                    "renew_deadline": "20s",
                    "retry_period": "5s",
                }
            },
            "networkPolicy": {
                "enabled": True,
                "egress": [{"ports": [{"port": 5000}]}],
                "kubernetesApi": {"ports": [6443], "to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
            },
        },
    ),
    "other-namespace": ("osas", {}),
    "election-off-one-replica": (
        "osas",
        {
            "replicaCount": 1,
            "config": {"leader_election": {"enabled": False}, "metrics_listen": None},
            "replicaSpread": {"enabled": False},
            "networkPolicy": {"enabled": True, "egress": [{"ports": [{"port": 5000}]}]},
        },
    ),
    "five-replicas-strict-spread": (
        "osas",
        {
            "replicaCount": 5,
            "rbac": {"create": False},
            "serviceAccount": {"create": False, "name": "osas-elsewhere"},
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "osas"}},
                }
            ],
        },
    ),
    "clouds-of-their-own": ("osas", CLOUDS_OF_THEIR_OWN),
    "every-cloud-its-own-secret": ("osas", EVERY_CLOUD_ITS_OWN),
    # OS_* variables for the top-level place, a clouds.yaml Secret for another cloud.
    "env-and-a-cloud-of-its-own": (
        "osas",
        {
            "credentials": {
                "env": ENV,
                "clouds": [{"name": "public", "cloudsYaml": yaml.safe_dump(PUBLIC_CLOUDS_YAML)}],
            },
            "config": {
                "node_groups": [group_in("workers"), group_in("burst", {"cloud": "public"})]
            },
        },
    ),
    "user-data-from-secrets": (
        "osas",
        {
            "config": {"node_groups": TWO_GROUPS},
            "userDataSecrets": [
                {"secretName": "osas-bootstrap", "mountPath": "/etc/osas/bootstrap"}
            ],
            "extraEnv": [{"name": "OSAS_QUEUE__WORKERS", "value": "8"}],
            "extraVolumes": [{"name": "ca-bundle", "configMap": {"name": "keystone-ca"}}],
            "extraVolumeMounts": [{"name": "ca-bundle", "mountPath": "/etc/ssl/keystone"}],
            "image": {"digest": "sha256:" + "ab" * 32},
        },
    ),
}


@pytest.fixture(scope="session")
def chart(tmp_path_factory) -> Path:
    return chart_copy(tmp_path_factory.mktemp("chart"))


# The release's namespace where it is not kube-system (the Lease's stays kube-system).
NAMESPACES = {"other-namespace": "autoscaling"}


def namespace_of(scenario: str) -> str:
    return NAMESPACES.get(scenario, "kube-system")


@pytest.fixture(scope="session")
def rendered(chart) -> dict[str, tuple[dict[str, str], list[dict[str, Any]]]]:
    out = {}
    for scenario, (release, values) in SCENARIOS.items():
        files = render_files(chart, values, name=release, namespace=namespace_of(scenario))
        out[scenario] = (files, documents(files))
    return out


def osas_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "osas.yaml" in o["data"])
    return yaml.safe_load(config_map["data"]["osas.yaml"])


def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Deployment")


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return deployment(objects)["spec"]["template"]["spec"]["containers"][0]


def ca_service(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The Service CA dials: the Deployment's name (fullname)."""
    return find(objects, "Service", deployment(objects)["metadata"]["name"])


def metrics_service(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Service", deployment(objects)["metadata"]["name"] + "-metrics")


def roles(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, resource) -> the Role granting it, for the Lease and the EndpointSlice."""
    found = {}
    for role in (o for o in objects if o["kind"] == "Role"):
        (resource,) = {r for rule in role["rules"] for r in rule["resources"]}
        found[(role["metadata"]["namespace"], resource)] = role
    return found


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def ca_cloud_config(objects: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    secret = next(
        o
        for o in objects
        if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-ca-cloud-config")
    )
    return secret["metadata"]["name"], yaml.safe_load(secret["stringData"]["cloud-config.yaml"])


def load_rendered_config(objects, tmp_path):
    """The rendered configuration through osas's own loader."""
    path = tmp_path / "osas.yaml"
    path.write_text(yaml.safe_dump(osas_config(objects)))
    return load_config(path, read_files=False)  # the files are the pod's mounted Secret


# -- every scenario -----------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_is_valid_for_kubernetes(rendered, scenario):
    _, objects = rendered[scenario]
    assert objects
    for obj in objects:
        validate(obj)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_carries_the_standard_labels(rendered, scenario):
    release, _ = SCENARIOS[scenario]
    _, objects = rendered[scenario]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == release
        assert labels["helm.sh/chart"] == f"osas-{osas.__version__}"
        assert "app.kubernetes.io/name" in labels
        if obj["kind"] != "Pod":  # the helm test pod
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/version"] == osas.__version__


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_rendered_configuration_loads_with_osas_own_loader(rendered, scenario, tmp_path):
    _, objects = rendered[scenario]
    config = load_rendered_config(objects, tmp_path)
    assert config.tls is not None
    assert str(config.tls.cert_file).startswith("/etc/osas/tls/")
    # Every group carries the label that keeps osas off the nodes it manages.
    for group in config.node_groups:
        assert group.labels["osas/node-group"] == group.group_id


def test_the_install_pages_values_render_as_written(chart, tmp_path):
    """docs/install.md's osas-values.yaml, as a user copies it: the image it names, the
    bootstrap Secret mounted where its node group reads the template and the variables."""
    (values,) = [
        yaml.safe_load(block.text)
        for block in markdown_blocks(CHART.parent.parent / "docs" / "install.md")
        if block.lang == "yaml" and "userDataSecrets:" in block.text
    ]
    with helm.Chart.load(chart) as loaded:  # no example repository added: the page's own
        files = loaded.render(values=values, name="osas", namespace="kube-system", is_install=True)
    objects = documents(files)
    for obj in objects:
        validate(obj)
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"registry.example.com/osas:{osas.__version__}"
    config = load_rendered_config(objects, tmp_path)
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    (group,) = config.node_groups
    for path in [group.user_data_file, *group.user_data_vars.values()]:
        assert str(Path(str(path)).parent) in mounts, path


def test_the_install_pages_cloud_of_its_own_renders_as_written(chart, tmp_path):
    """docs/install.md's burst into a public cloud: its Secret, made by the page's command,
    mounted where the chart names its clouds.yaml for the group living there."""
    page = CHART.parent.parent / "docs" / "install.md"
    blocks = markdown_blocks(page)
    (values,) = [
        yaml.safe_load(block.text)
        for block in blocks
        if block.lang == "yaml" and "clouds:" in block.text and "credentials:" in block.text
    ]
    made = {
        command.name: command.keys
        for block in blocks
        if block.lang == "sh"
        for command in secret_commands(block.text)
    }
    objects = documents(render_files(chart, values))
    for obj in objects:
        validate(obj)
    (cloud,) = values["credentials"]["clouds"]
    assert "clouds.yaml" in made[cloud["existingSecret"]]
    mounted = cloud_mounts(objects)
    assert mounted == {f"{CLOUD_FILES}/{cloud['name']}": cloud["existingSecret"]}
    config = load_rendered_config(objects, tmp_path)
    (burst,) = [g for g in config.node_groups if g.openstack is not None]
    assert burst.openstack.cloud == cloud["name"]
    assert str(burst.openstack.clouds_file) == f"{CLOUD_FILES}/{cloud['name']}/clouds.yaml"
    assert config.openstack.clouds_file is None  # the private cloud: the main Secret


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ca_cloud_config_parses_as_ca_reads_it_and_the_certificate_covers_it(rendered, scenario):
    files, objects = rendered[scenario]
    name, cloud_config = ca_cloud_config(objects)
    # CA's externalgrpc client unmarshals exactly these keys.
    assert set(cloud_config) == {"address", "cert", "key", "cacert", "grpc_timeout"}
    assert re.fullmatch(r"([0-9]+(\.[0-9]+)?(h|m|s|ms))+", cloud_config["grpc_timeout"])
    host, _, port = cloud_config["address"].rpartition(":")
    service = ca_service(objects)
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert int(port) == grpc_port["port"] == port_of(osas_config(objects)["listen"])
    # osas checks its certificate against the host CA dials, at start and on every renewal.
    assert host in osas_config(objects)["tls"]["server_names"]
    certificates = [o for o in objects if o["kind"] == "Certificate"]
    if certificates:
        server = next(c for c in certificates if c["metadata"]["name"].endswith("-tls"))
        assert host in server["spec"]["dnsNames"]
    for key in ("cert", "key", "cacert"):
        assert cloud_config[key].startswith("/etc/osas-ca/tls/")
    # The install notes give the official chart's values with these very names.
    text = notes(files)
    assert f"name: {name}" in text
    assert "cloud-config: /etc/osas-ca/config/cloud-config.yaml" in text
    assert "cloudProvider: externalgrpc" in text
    assert "clusterName:" in text


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ports_come_from_the_configuration(rendered, scenario):
    _, objects = rendered[scenario]
    config = osas_config(objects)
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert ports["grpc"] == port_of(config["listen"])
    assert ports["health"] == port_of(config["health_listen"])
    service_ports = {p["name"]: p for p in ca_service(objects)["spec"]["ports"]}
    probes = [container(objects)["livenessProbe"], container(objects)["readinessProbe"]]
    if config.get("metrics_listen"):
        (metrics,) = metrics_service(objects)["spec"]["ports"]
        assert metrics["name"] == "metrics"
        assert ports["metrics"] == metrics["port"] == port_of(config["metrics_listen"])
        assert [p["httpGet"] for p in probes] == [
            {"path": "/healthz", "port": "metrics"},
            {"path": "/readyz", "port": "metrics"},
        ]
    else:
        assert "metrics" not in ports
        assert not [o for o in objects if o["metadata"]["name"].endswith("-metrics")]
        # The health port's services mean what /healthz and /readyz do.
        assert [p["grpc"] for p in probes] == [
            {"port": ports["health"], "service": "liveness"},
            {"port": ports["health"], "service": "readiness"},
        ]
    # CA's Service carries gRPC alone, on the pod's port: the EndpointSlice the holder writes
    # names the port `grpc` and gives the pod's number.
    assert list(service_ports) == ["grpc"]
    assert service_ports["grpc"]["port"] == service_ports["grpc"]["targetPort"] == ports["grpc"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_warm_standbys_safe_to_evict_and_off_the_managed_nodes(rendered, scenario):
    _, objects = rendered[scenario]
    spec = deployment(objects)["spec"]
    assert spec["replicas"] == SCENARIOS[scenario][1].get("replicaCount", 2)
    # A new pod is ready once warm, then an old one goes (the holder's SIGTERM hands over).
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]
    assert (
        pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    )
    assert pod["spec"]["priorityClassName"].endswith("-critical")
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    avoid = {"key": "osas/node-group", "operator": "DoesNotExist"}
    assert terms
    assert all(avoid in term["matchExpressions"] for term in terms)
    main = container(objects)
    assert "--config=/etc/osas/config/osas.yaml" in main["args"]
    assert {"name": "OSAS_CONFIG", "value": "/etc/osas/config/osas.yaml"} in main["env"]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # The token only where osas calls the Kubernetes API (the Lease); never for the account's
    # other users.
    election = osas_config(objects)["leader_election"]["enabled"]
    assert pod["spec"]["automountServiceAccountToken"] is election
    for account in (o for o in objects if o["kind"] == "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False
    for mount in main["volumeMounts"]:
        assert "subPath" not in mount  # a subPath mount never sees a Secret's update
    pdb = find(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1  # one at a time; a single replica stays drainable
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_credential_outside_a_secret(rendered, scenario):
    files, objects = rendered[scenario]
    outside = [o for o in objects if o["kind"] != "Secret"]
    text = yaml.safe_dump_all(outside) + notes(files)
    for secret in (PASSWORD, APP_SECRET, PUBLIC_SECRET):
        assert secret not in text
    assert "auth" not in osas_config(objects).get("openstack", {})


# -- particular scenarios -----------------------------------------------------------------------


def test_defaults_render_the_expected_objects(rendered):
    _, objects = rendered["defaults"]
    assert kinds(objects) == [
        "Certificate",
        "Certificate",
        "Certificate",
        "ConfigMap",
        "Deployment",
        "Issuer",
        "Issuer",
        "Pod",
        "PodDisruptionBudget",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Secret",
        "Service",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Secret", "osas-ca-cloud-config") in names
    assert ("Certificate", "osas-client") in names
    assert ("Certificate", "osas-tls") in names


def test_the_lifetime_strategy_survives_renewal(rendered):
    """A long-lived CA that keeps its key, and a long-lived client certificate that keeps its
    key: CA's in-memory copies stay valid across osas's server certificate renewals."""
    _, objects = rendered["defaults"]
    certificates = {c["metadata"]["name"]: c["spec"] for c in objects if c["kind"] == "Certificate"}
    ca, server, client = (
        certificates["osas-ca"],
        certificates["osas-tls"],
        certificates["osas-client"],
    )
    assert ca["isCA"] is True
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert ca["duration"] == "87600h"
    assert client["privateKey"]["rotationPolicy"] == "Never"
    assert client["duration"] == "17520h"
    assert client["renewBefore"] == "2160h"
    assert client["usages"] == ["client auth", "digital signature"]
    assert server["privateKey"]["rotationPolicy"] == "Always"
    assert server["issuerRef"]["name"] == client["issuerRef"]["name"] == "osas-ca"
    # osas accepts exactly the client certificate's identity.
    allowed = osas_config(objects)["tls"]["allowed_clients"]
    assert allowed == [f"dns:{name}" for name in client["dnsNames"]]


def test_names_follow_release_name_and_overrides(rendered):
    _, prod = rendered["release-name-and-overrides"]
    assert deployment(prod)["metadata"]["name"] == "prod-scaler"
    assert deployment(prod)["metadata"]["labels"]["team"] == "platform"
    assert ca_service(prod)["metadata"]["name"] == "prod-scaler"
    assert osas_config(prod)["leader_election"]["service_name"] == "prod-scaler"
    assert metrics_service(prod)["metadata"]["name"] == "prod-scaler-metrics"
    _, custom = rendered["fullname-override"]
    assert ca_service(custom)["metadata"]["name"] == "cloud-scaler"
    assert osas_config(custom)["leader_election"]["service_name"] == "cloud-scaler"
    slice_role = roles(custom)[("kube-system", "endpointslices")]
    assert slice_role["rules"][1]["resourceNames"] == ["cloud-scaler-leader"]
    _, cloud_config = ca_cloud_config(custom)
    assert cloud_config["address"] == "cloud-scaler.kube-system.svc:8086"


def test_without_cert_manager_the_existing_secrets_are_used(rendered):
    files, objects = rendered["without-cert-manager"]
    assert "Certificate" not in kinds(objects)
    assert "Issuer" not in kinds(objects)
    volumes = {v["name"]: v for v in deployment(objects)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "my-osas-tls"
    assert osas_config(objects)["tls"]["allowed_clients"] == ["dns:autoscaler.example"]
    assert "name: my-ca-client" in notes(files)
    test_pod = find(objects, "Pod")
    secrets = [v["secret"]["secretName"] for v in test_pod["spec"]["volumes"]]
    assert "my-ca-client" in secrets


def test_an_own_issuer_replaces_the_private_ca(rendered):
    _, objects = rendered["own-issuer"]
    assert "Issuer" not in kinds(objects)
    for certificate in (o for o in objects if o["kind"] == "Certificate"):
        assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


@pytest.mark.parametrize("scenario", ["clouds-yaml-from-values", "clouds-yaml-as-text"])
def test_clouds_yaml_from_values_goes_to_a_secret_mounted_for_openstacksdk(rendered, scenario):
    _, objects = rendered[scenario]
    secret = find(objects, "Secret", "osas-openstack")
    clouds = yaml.safe_load(base64.b64decode(secret["data"]["clouds.yaml"]))
    assert clouds == CLOUDS_YAML
    main = container(objects)
    assert {"name": "OS_CLIENT_CONFIG_FILE", "value": "/etc/openstack/clouds.yaml"} in main["env"]
    # The entry of clouds.yaml osas uses: the chart's `openstack` unless the values name one.
    assert osas_config(objects)["openstack"]["cloud"] == "openstack"
    volumes = {v["name"]: v for v in deployment(objects)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["openstack"]["secret"]["secretName"] == "osas-openstack"
    # No hash of the credentials anywhere a reader of the pod could test guesses against.
    annotations = deployment(objects)["spec"]["template"]["metadata"]["annotations"]
    digests = {
        hashlib.sha256(text.encode()).hexdigest()
        for text in (yaml.safe_dump(CLOUDS_YAML), json.dumps(CLOUDS_YAML))
    }
    assert not any(name.startswith("checksum/credentials") for name in annotations)
    assert not digests & set(annotations.values())


def test_os_variables_from_values_go_to_a_secret_passed_as_environment(rendered):
    _, objects = rendered["env-from-values"]
    secret = find(objects, "Secret", "osas-openstack")
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == ENV
    main = container(objects)
    assert main["envFrom"] == [{"secretRef": {"name": "osas-openstack"}}]
    assert "openstack" not in {m["name"] for m in main["volumeMounts"]}
    assert "cloud" not in osas_config(objects).get("openstack", {})


def test_an_existing_env_secret_is_passed_as_environment(rendered):
    _, objects = rendered["existing-env-secret"]
    assert container(objects)["envFrom"] == [{"secretRef": {"name": "os-env"}}]
    assert "cloud" not in osas_config(objects)["openstack"]
    assert not [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "os-env"]


# -- clouds with credentials of their own (credentials.clouds) ----------------------------------


def cloud_mounts(objects: list[dict[str, Any]]) -> dict[str, str]:
    """mount path -> the Secret mounted there, for the clouds of credentials.clouds."""
    pod = deployment(objects)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    found = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        if mount["mountPath"].startswith(CLOUD_FILES + "/"):
            assert mount["readOnly"] is True
            assert "subPath" not in mount  # a subPath mount never sees a rotated credential
            found[mount["mountPath"]] = volumes[mount["name"]]["secret"]["secretName"]
    return found


def clouds_files(objects: list[dict[str, Any]]) -> dict[str, str | None]:
    """Node group id (and "" for the top-level block) -> the clouds_file the chart wrote."""
    config = osas_config(objects)
    files = {"": config["openstack"].get("clouds_file")}
    for group in config["node_groups"]:
        files[group["id"]] = (group.get("openstack") or {}).get("clouds_file")
    return files


def test_each_cloud_of_its_own_is_its_secret_mounted_as_a_folder(rendered):
    _, objects = rendered["clouds-of-their-own"]
    assert cloud_mounts(objects) == {
        f"{CLOUD_FILES}/public": "osas-openstack-public",
        f"{CLOUD_FILES}/partner": "osas-openstack-partner",
    }
    # The main clouds.yaml stays where it was, for the groups naming its entries.
    main = container(objects)
    assert {"name": "OS_CLIENT_CONFIG_FILE", "value": "/etc/openstack/clouds.yaml"} in main["env"]
    volumes = {v["name"]: v for v in deployment(objects)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["openstack"]["secret"]["secretName"] == "osas-openstack"
    # A Secret made beforehand is not made by the chart; one given as cloudsYaml is.
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    assert "osas-openstack-public" not in secrets
    assert "osas-openstack-partner" in secrets


def test_the_groups_of_such_a_cloud_read_it_from_its_file_and_no_other_group_does(
    rendered, tmp_path
):
    _, objects = rendered["clouds-of-their-own"]
    assert clouds_files(objects) == {
        "": None,
        "workers": None,
        "south": None,  # the top-level cloud's other region
        "gpu": None,  # another entry of the main clouds.yaml
        "burst": f"{CLOUD_FILES}/public/clouds.yaml",
        "burst-de": f"{CLOUD_FILES}/public/clouds.yaml",
        "partner": f"{CLOUD_FILES}/partner/clouds.yaml",
    }
    # osas's own loader takes it, and finds each file in a folder the pod mounts.
    config = load_rendered_config(objects, tmp_path)
    mounted = cloud_mounts(objects)
    places = {place.key: place for place in places_of(config)}
    assert set(places) == {
        ("openstack", ""),
        ("openstack", "South"),
        ("private-gpu", ""),
        ("public", "GRA"),
        ("public", "DE1"),
        ("partner", ""),
    }
    for place in places.values():
        file = place.settings.clouds_file
        if place.settings.cloud in {"public", "partner"}:
            assert file is not None
            assert str(file.parent) in mounted
        else:
            assert file is None
    assert places[("openstack", "South")].provider_id_region == "South"


@pytest.mark.parametrize(
    ("scenario", "cloud"),
    [
        ("clouds-of-their-own", "partner"),  # as text
        ("every-cloud-its-own-secret", "public"),  # as a mapping
        ("env-and-a-cloud-of-its-own", "public"),
    ],
)
def test_a_cloud_given_as_clouds_yaml_gets_a_secret_holding_it(rendered, scenario, cloud):
    _, objects = rendered[scenario]
    secret = find(objects, "Secret", f"osas-openstack-{cloud}")
    assert set(secret["data"]) == {"clouds.yaml"}
    held = yaml.safe_load(base64.b64decode(secret["data"]["clouds.yaml"]))
    clouds = SCENARIOS[scenario][1]["credentials"]["clouds"]
    (given,) = [c["cloudsYaml"] for c in clouds if c["name"] == cloud]
    assert held == (yaml.safe_load(given) if isinstance(given, str) else given)
    assert secret["metadata"]["labels"]["app.kubernetes.io/instance"] == "osas"
    # No hash of the credentials where a reader of the pod could test guesses against it.
    annotations = deployment(objects)["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"checksum/config", "cluster-autoscaler.kubernetes.io/safe-to-evict"}


def test_every_cloud_in_a_secret_of_its_own_leaves_out_the_main_secret(rendered, tmp_path):
    _, objects = rendered["every-cloud-its-own-secret"]
    main = container(objects)
    assert "OS_CLIENT_CONFIG_FILE" not in env_of(objects)
    assert "envFrom" not in main
    assert "/etc/openstack" not in {m["mountPath"] for m in main["volumeMounts"]}
    assert cloud_mounts(objects) == {
        f"{CLOUD_FILES}/private": "osas-openstack-private",
        f"{CLOUD_FILES}/public": "osas-openstack-public",
    }
    private = f"{CLOUD_FILES}/private/clouds.yaml"
    assert clouds_files(objects) == {
        "": private,
        "workers": None,  # the top-level place's
        "workers-2": None,  # another region of it: osas gives it the top-level clouds_file
        "also-private": private,  # the same place as the top-level, not a second of its name
        "burst": f"{CLOUD_FILES}/public/clouds.yaml",
    }
    config = load_rendered_config(objects, tmp_path)
    places = {place.key: place for place in places_of(config)}
    assert set(places) == {("private", ""), ("private", "RegionTwo"), ("public", "")}
    assert places[("private", "")].group_ids == ("workers", "also-private")
    assert str(places[("private", "RegionTwo")].settings.clouds_file) == private


def test_with_os_variables_a_cloud_of_its_own_is_read_from_its_file_alone(rendered):
    _, objects = rendered["env-and-a-cloud-of-its-own"]
    assert container(objects)["envFrom"] == [{"secretRef": {"name": "osas-openstack"}}]
    assert cloud_mounts(objects) == {f"{CLOUD_FILES}/public": "osas-openstack-public"}
    assert clouds_files(objects) == {
        "": None,
        "workers": None,
        "burst": f"{CLOUD_FILES}/public/clouds.yaml",
    }
    assert "cloud" not in osas_config(objects)["openstack"]


def test_clouds_of_their_own_need_no_grant(rendered):
    """The Secrets are mounted by kubelet, never read by osas through the API."""
    _, defaults = rendered["defaults"]
    for scenario in ("clouds-of-their-own", "every-cloud-its-own-secret"):
        _, objects = rendered[scenario]
        assert roles(objects) == roles(defaults)
        granted = {
            r
            for role in roles(objects).values()
            for rule in role["rules"]
            for r in rule["resources"]
        }
        assert "secrets" not in granted


def config_checksum(chart: Path, values: dict[str, Any]) -> str:
    objects = documents(render_files(chart, values))
    return deployment(objects)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_the_configuration_checksum_follows_the_clouds_not_their_credentials(chart):
    """Moving a group to a cloud of its own, or renaming that cloud, rolls the pod (osas takes
    a new place only at a restart); new credentials in its Secret do not (osas reads them)."""
    groups = {"node_groups": [group_in("workers"), group_in("burst", {"cloud": "public"})]}
    in_main = {"config": groups}
    own = {"credentials": {"clouds": [{"name": "public", "cloudsYaml": PUBLIC_CLOUDS_YAML}]}}
    renamed_clouds = copy.deepcopy(PUBLIC_CLOUDS_YAML)
    renamed_clouds["clouds"]["public-2"] = renamed_clouds["clouds"].pop("public")
    renamed = {
        "credentials": {"clouds": [{"name": "public-2", "cloudsYaml": renamed_clouds}]},
        "config": {"node_groups": [group_in("workers"), group_in("burst", {"cloud": "public-2"})]},
    }
    rotated_clouds = copy.deepcopy(PUBLIC_CLOUDS_YAML)
    rotated_clouds["clouds"]["public"]["auth"]["application_credential_secret"] = "rotated"
    rotated = {"credentials": {"clouds": [{"name": "public", "cloudsYaml": rotated_clouds}]}}
    checksums = {
        "in the main clouds.yaml": config_checksum(chart, in_main),
        "a Secret of its own": config_checksum(chart, {**own, "config": groups}),
        "renamed": config_checksum(chart, renamed),
        "rotated": config_checksum(chart, {**rotated, "config": groups}),
    }
    assert len(set(checksums.values())) == 3, checksums
    assert checksums["rotated"] == checksums["a Secret of its own"]


def test_the_notes_name_each_clouds_secret_and_its_groups(rendered, chart):
    files, _ = rendered["clouds-of-their-own"]
    text = notes(files)
    assert (
        f"public: Secret osas-openstack-public (yours to make), at {CLOUD_FILES}/public/\n"
        "    for group burst, group burst-de\n"
    ) in text
    assert f"partner: Secret osas-openstack-partner, at {CLOUD_FILES}/partner/\n" in text
    files, _ = rendered["every-cloud-its-own-secret"]
    assert "    for config.openstack, group also-private\n" in notes(files)
    unused = {
        "credentials": {"clouds": [{"name": "spare", "existingSecret": "osas-openstack-spare"}]}
    }
    spare = notes(render_files(chart, unused))
    assert "named by no node group: is a group's openstack.cloud misspelt?" in spare
    # Without clouds of their own the notes say nothing of them.
    files, _ = rendered["defaults"]
    assert CLOUD_FILES not in notes(files)


def test_the_ha_story_keeps_user_affinity_and_adds_the_managed_node_rule(rendered):
    _, objects = rendered["ha-story"]
    pod = deployment(objects)["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [e["key"] for e in terms[0]["matchExpressions"]] == [
        "node-role.kubernetes.io/control-plane",
        "osas/node-group",
    ]
    assert [e["key"] for e in terms[1]["matchExpressions"]] == ["infra", "osas/node-group"]
    assert "podAntiAffinity" in pod["affinity"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"
    zone, host = pod["topologySpreadConstraints"]
    assert zone["topologyKey"] == "topology.kubernetes.io/zone"
    # The chart's soft spread of the replicas over nodes comes after the user's own.
    assert host == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {
            "matchLabels": {"app.kubernetes.io/name": "osas", "app.kubernetes.io/instance": "osas"}
        },
    }


@pytest.mark.parametrize("scenario", ["network-policy", "custom-ports", "metrics-off"])
def test_network_policy_lets_only_ca_reach_grpc_and_monitoring_reach_metrics(rendered, scenario):
    _, objects = rendered[scenario]
    policy = find(objects, "NetworkPolicy")["spec"]
    grpc_rule, *rest = policy["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    assert grpc_rule["from"][0] == {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "externalgrpc-cluster-autoscaler"}
        }
    }
    test_labels = {
        k: v for k, v in find(objects, "Pod")["metadata"]["labels"].items() if k != "helm.sh/chart"
    }
    assert grpc_rule["from"][1]["podSelector"]["matchLabels"] == test_labels
    if osas_config(objects).get("metrics_listen"):
        metrics_rule = rest[0]
        assert metrics_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        assert metrics_rule["from"][0]["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
        }
    else:
        assert all(r.get("ports") != [{"port": "metrics", "protocol": "TCP"}] for r in rest)
    if scenario == "network-policy":
        assert policy["policyTypes"] == ["Ingress", "Egress"]
        assert rest[-1] == {"from": [{"podSelector": {"matchLabels": {"debug": "yes"}}}]}
        # The user's egress, then the Kubernetes API for the Lease and the EndpointSlice.
        assert policy["egress"] == [
            {"ports": [{"port": 5000}, {"port": 8774}, {"port": 53}]},
            {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]},
        ]
    else:
        assert policy["policyTypes"] == ["Ingress"]


def test_monitoring_objects_come_from_the_shipped_files(rendered, chart):
    _, objects = rendered["monitoring"]
    monitor = find(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    # It picks the metrics Service (every replica) and never the one CA dials (the holder).
    wanted = monitor["spec"]["selector"]["matchLabels"]
    picked = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Service" and wanted.items() <= o["metadata"]["labels"].items()
    ]
    assert picked == ["osas-metrics"]
    rule = find(objects, "PrometheusRule")
    # The chart's own clientRenewBefore (2160h) in place of the file's placeholder.
    text = (chart / "files" / "prometheus-rules.yaml").read_text()
    assert "CLIENT_RENEW_BEFORE_SECONDS" in text
    shipped = yaml.safe_load(text.replace("CLIENT_RENEW_BEFORE_SECONDS", str(2160 * 3600)))
    assert rule["spec"]["groups"] == shipped["groups"]
    (renewal,) = [
        r
        for r in rule["spec"]["groups"][0]["rules"]
        if r["alert"] == "OsasClientCertificateRenewedNotUsed"
    ]
    assert renewal["expr"].endswith("- time() < 7776000")
    dashboard = find(objects, "ConfigMap", "osas-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert (
        dashboard["data"]["osas.json"].strip()
        == (chart / "files" / "grafana-dashboard.json").read_text().strip()
    )


@pytest.mark.parametrize(
    ("tls", "seconds"),
    [
        pytest.param({"certManager": {"clientRenewBefore": "1h30m"}}, 5400, id="1h30m"),
        pytest.param({"certManager": {"clientRenewBefore": "720h"}}, 2592000, id="720h"),
        pytest.param({"certManager": {"clientRenewBefore": "90.5s"}}, 90, id="fraction"),
        # The client certificate is not the chart's: its schedule unknown, 30 days.
        pytest.param(
            {"certManager": {"enabled": False}, "existingSecret": "s", "clientSecret": "c"},
            2592000,
            id="no-cert-manager",
        ),
    ],
)
def test_the_client_certificate_alert_follows_the_renewal_schedule(chart, tls, seconds):
    values = {"metrics": {"prometheusRule": {"enabled": True}}, "tls": tls}
    files = render_files(chart, values, name="osas", namespace="kube-system")
    rule = find(documents(files), "PrometheusRule")
    (renewal,) = [
        r
        for r in rule["spec"]["groups"][0]["rules"]
        if r["alert"] == "OsasClientCertificateRenewedNotUsed"
    ]
    assert renewal["expr"].endswith(f"- time() < {seconds}")


def test_user_data_secrets_are_mounted_as_directories(rendered, tmp_path):
    _, objects = rendered["user-data-from-secrets"]
    pod = deployment(objects)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = mounts["/etc/osas/bootstrap"]
    assert volumes[mount["name"]]["secret"]["secretName"] == "osas-bootstrap"
    assert "/etc/ssl/keystone" in mounts
    assert {"name": "OSAS_QUEUE__WORKERS", "value": "8"} in pod["containers"][0]["env"]
    assert pod["containers"][0]["image"] == f"{EXAMPLE_REPOSITORY}@sha256:" + "ab" * 32
    config = load_rendered_config(objects, tmp_path)
    for group in config.node_groups:
        assert str(group.user_data_file).startswith(mount["mountPath"])
        assert all(str(p).startswith(mount["mountPath"]) for p in group.user_data_vars.values())
    assert config.node_groups[1].labels == {"pool": "gpu", "osas/node-group": "gpu"}


# -- one writer: the Lease, its Roles, the Service CA dials ------------------------------------


def env_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objects)["env"]}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_pod_knows_who_and_where_it_is(rendered, scenario):
    """osas's name on the Lease, its namespace, and the address the holder publishes."""
    _, objects = rendered[scenario]
    env = env_of(objects)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_replicas_default_to_a_writer_and_a_warm_standby_on_another_node(rendered):
    _, objects = rendered["defaults"]
    spec = deployment(objects)["spec"]
    assert spec["replicas"] == 2
    (spread,) = spec["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # never keeps a replica pending
    assert spread["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_a_constraint_of_the_users_on_the_same_key_replaces_the_charts_spread(rendered):
    _, objects = rendered["five-replicas-strict-spread"]
    spec = deployment(objects)["spec"]
    assert spec["replicas"] == 5
    (spread,) = spec["template"]["spec"]["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"


@pytest.mark.parametrize(
    ("scenario", "lease_namespace", "lease_name"),
    [
        ("defaults", "kube-system", "osas-my-cluster"),
        ("release-name-and-overrides", "kube-system", "osas-my-cluster"),
        ("other-namespace", "kube-system", "osas-my-cluster"),
        ("custom-lease", "osas-system", "scaler-lease"),
    ],
)
def test_the_lease_role_names_the_lease_osas_computes(
    rendered, scenario, lease_namespace, lease_name, tmp_path
):
    """The Role grants the very Lease osas competes for: lease_name, else osas-<cluster_name>,
    in lease_namespace (kube-system unless set), wherever the release is."""
    _, objects = rendered[scenario]
    election = load_rendered_config(objects, tmp_path).election_settings()
    assert (election.lease_namespace, election.lease_name) == (lease_namespace, lease_name)
    role = roles(objects)[(lease_namespace, "leases")]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease_name],
            "verbs": ["get", "update"],
        },
    ]
    binding = find(objects, "RoleBinding", role["metadata"]["name"])
    assert binding["metadata"]["namespace"] == lease_namespace
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": deployment(objects)["spec"]["template"]["spec"]["serviceAccountName"],
            "namespace": namespace_of(scenario),
        }
    ]


def test_the_lease_role_elsewhere_is_named_for_the_release_namespace(rendered):
    """Two releases in two namespaces, one Lease namespace: their Roles there must not clash."""
    _, objects = rendered["other-namespace"]
    assert roles(objects)[("kube-system", "leases")]["metadata"]["name"] == "autoscaling-osas-lease"
    _, objects = rendered["defaults"]
    assert roles(objects)[("kube-system", "leases")]["metadata"]["name"] == "osas-lease"


@pytest.mark.parametrize("scenario", ["defaults", "fullname-override", "other-namespace"])
def test_the_endpointslice_role_names_the_leader_slice_in_the_release_namespace(rendered, scenario):
    _, objects = rendered[scenario]
    namespace = namespace_of(scenario)
    service = ca_service(objects)["metadata"]["name"]
    role = roles(objects)[(namespace, "endpointslices")]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["create"]},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "resourceNames": [f"{service}-leader"],
            "verbs": ["get", "update", "delete"],
        },
    ]
    binding = find(objects, "RoleBinding", role["metadata"]["name"])
    assert binding["metadata"]["namespace"] == namespace
    assert binding["subjects"][0]["namespace"] == namespace
    # osas publishes into $POD_NAMESPACE unless told otherwise: the release's.
    assert "service_namespace" not in osas_config(objects)["leader_election"]


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "election-off-one-replica"])
def test_the_configuration_elects_one_writer_behind_the_service_ca_dials(rendered, scenario):
    _, objects = rendered[scenario]
    election = osas_config(objects)["leader_election"]
    assert election["enabled"] is True
    assert election["service_name"] == ca_service(objects)["metadata"]["name"]
    assert "kubeconfig" not in election  # the pod's service account
    assert "identity" not in election or not election["identity"]  # POD_NAME
    # CA's Service has no selector: its one endpoint is what the Lease holder publishes.
    assert "selector" not in ca_service(objects)["spec"]
    assert ca_service(objects)["metadata"]["labels"]["app.kubernetes.io/component"] == "provider"
    if osas_config(objects).get("metrics_listen"):
        metrics = metrics_service(objects)
        assert metrics["spec"]["selector"] == deployment(objects)["spec"]["selector"]["matchLabels"]
        assert metrics["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"


def test_the_users_election_timings_and_lease_are_kept(rendered, tmp_path):
    _, objects = rendered["custom-lease"]
    assert osas_config(objects)["leader_election"] == {
        "enabled": True,
        "service_name": "osas",
        "lease_name": "scaler-lease",
        "lease_namespace": "osas-system",
        "lease_duration": "30s",
        "renew_deadline": "20s",
        "retry_period": "5s",
    }
    settings = load_rendered_config(objects, tmp_path).election_settings()
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (30, 20, 5)
    # A NetworkPolicy with egress rules lets osas reach the API, here on 6443 to one subnet.
    policy = find(objects, "NetworkPolicy")["spec"]
    assert policy["egress"][-1] == {
        "ports": [{"port": 6443, "protocol": "TCP"}],
        "to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
    }


def test_without_leader_election_one_replica_is_reached_by_its_labels(rendered, tmp_path):
    """enabled: false (one replica): no Lease, so no RBAC, no token, nothing published; CA's
    Service selects the pod itself."""
    _, objects = rendered["election-off-one-replica"]
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding")]
    assert deployment(objects)["spec"]["replicas"] == 1
    assert deployment(objects)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert osas_config(objects)["leader_election"] == {
        "enabled": False,
        "lease_name": "",
        "lease_namespace": "kube-system",
    }
    assert load_rendered_config(objects, tmp_path).leader_election.enabled is False
    service = ca_service(objects)
    assert service["spec"]["selector"] == deployment(objects)["spec"]["selector"]["matchLabels"]
    policy = find(objects, "NetworkPolicy")["spec"]
    assert policy["egress"] == [{"ports": [{"port": 5000}]}]  # no API rule: it never calls it


def test_without_rbac_the_notes_say_what_to_grant(rendered):
    files, objects = rendered["five-replicas-strict-spread"]
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding")]
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "osas-elsewhere"
    assert pod["automountServiceAccountToken"] is True
    assert "give the service account osas-elsewhere create, get and update" in notes(files)


def test_the_notes_show_where_to_see_the_writer(rendered):
    files, _ = rendered["custom-lease"]
    assert "kubectl -n osas-system get lease scaler-lease" in notes(files)
    assert "kubectl -n kube-system get endpointslice osas-leader" in notes(files)
    # What helm uninstall leaves, as osas made it: how to delete it.
    assert "kubectl -n osas-system delete lease scaler-lease" in notes(files)
    assert "kubectl -n kube-system delete endpointslice osas-leader" in notes(files)


def test_the_install_page_deletes_on_uninstall_what_osas_made_itself(rendered):
    """What helm uninstall leaves (osas makes the Lease and the EndpointSlice, Helm does not
    know them) is deleted by docs/install.md's uninstall, as the chart's notes name it."""
    files, objects = rendered["defaults"]
    cluster = osas_config(objects)["cluster_name"]
    assert f"kubectl -n kube-system delete lease osas-{cluster}\n" in notes(files)
    page = (CHART.parent.parent / "docs" / "install.md").read_text()
    section = page.split("## Uninstall")[1].split("\n## ")[0]
    assert "kubectl -n kube-system delete lease osas-<cluster_name>" in section
    assert "kubectl -n kube-system delete endpointslice osas-leader" in section
    # The plain manifests name the Lease osas.
    assert "kubectl -n kube-system delete lease osas endpointslice osas-leader" in page


# -- what the chart refuses ---------------------------------------------------------------------


def own_cloud(name: str, **secret: Any) -> dict[str, Any]:
    """Values with one cloud of credentials.clouds."""
    return {"credentials": {"clouds": [{"name": name, **secret}]}}


def group_of(openstack: dict[str, Any]) -> dict[str, Any]:
    """config with one node group in the place ``openstack`` names."""
    return {"node_groups": [group_in("burst", openstack)]}


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"replicaCount": 0}, "/replicaCount"),
        ({"replicaCount": 6}, "/replicaCount"),
        ({"replicaCount": "2"}, "/replicaCount"),
        ({"config": {"leader_election": {"lease_duraton": "30s"}}}, "'lease_duraton' not allowed"),
        ({"config": {"leader_election": {"enabled": "yes"}}}, "/config/leader_election/enabled"),
        (
            {"config": {"leader_election": {"lease_namespace": "Kube_System"}}},
            "/config/leader_election/lease_namespace",
        ),
        (
            {"config": {"leader_election": {"lease_name": "Osas Lease"}}},
            "/config/leader_election/lease_name",
        ),
        (
            {"config": {"leader_election": {"retry_period": ["2s"]}}},
            "/config/leader_election/retry_period",
        ),
        ({"rbac": {"create": "true"}}, "/rbac/create"),
        ({"replicaSpread": {"topologyKey": ""}}, "/replicaSpread/topologyKey"),
        ({"networkPolicy": {"kubernetesApi": {"ports": []}}}, "/networkPolicy/kubernetesApi/ports"),
        ({"replicas": 1}, "'replicas' not allowed"),
        ({"config": {"listen": "8086"}}, "/config/listen"),
        ({"config": {"insecure": True}}, "'insecure' not allowed"),
        ({"config": {"tls": {"cert_file": "/x"}}}, "'cert_file' not allowed"),
        ({"config": {"node_groups": []}}, "/config/node_groups"),
        ({"config": {"node_groups": [{"id": "a"}]}}, "/config/node_groups/0"),
        ({"config": {"cluster_name": "My_Cluster"}}, "/config/cluster_name"),
        ({"config": {"queue": 4}}, "/config/queue"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"credentials": {"env": {"PASSWORD": "x"}}}, "'PASSWORD' does not match pattern"),
        ({"tls": {"certManager": {"caDuration": "10 years"}}}, "/tls/certManager/caDuration"),
        ({"userDataSecrets": [{"secretName": "b"}]}, "/userDataSecrets/0"),
        ({"podDisruptionBudget": {"enabled": "yes"}}, "/podDisruptionBudget/enabled"),
        ({"networkPolicy": {"enabeld": True}}, "'enabeld' not allowed"),
        ({"clusterAutoscaler": {"podLabels": {"app": 1}}}, "/clusterAutoscaler/podLabels/app"),
        # A cloud's name is in its Secret's and its volume's names: a DNS label.
        (own_cloud("Public", existingSecret="s"), "/credentials/clouds/0/name"),
        (own_cloud("public_cloud", existingSecret="s"), "/credentials/clouds/0/name"),
        (own_cloud("p" * 58, existingSecret="s"), "/credentials/clouds/0/name"),
        (own_cloud("", existingSecret="s"), "/credentials/clouds/0/name"),
        (own_cloud("public", existingSecret="Osas_Public"), "/credentials/clouds/0/existingSecret"),
        (own_cloud("public", existingSecret="s", env=ENV), "'env' not allowed"),
        ({"credentials": {"clouds": [{"existingSecret": "s"}]}}, "/credentials/clouds/0"),
        ({"credentials": {"clouds": {"public": "s"}}}, "/credentials/clouds"),
    ],
)
def test_the_schema_refuses_values_that_would_not_work(chart, values, reason):
    with pytest.raises(helm.HelmError) as refused:
        render_files(chart, values)
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        (
            {"config": {"openstack": {"auth": {"auth_url": "https://k", "password": PASSWORD}}}},
            "config.openstack.auth would put OpenStack credentials in a ConfigMap in plain text",
        ),
        (
            {"tls": {"certManager": {"enabled": False}}},
            "tls.existingSecret is required when tls.certManager.enabled is false",
        ),
        (
            {"credentials": {"cloudsYaml": CLOUDS_YAML, "env": ENV}},
            "credentials: give cloudsYaml or env, not both",
        ),
        ({"credentials": {"existingSecret": ""}}, "credentials: give existingSecret"),
        (
            {"credentials": {"env": ENV}, "config": {"openstack": {"cloud": "openstack"}}},
            "remove config.openstack.cloud",
        ),
        (
            {"config": {"metrics_listen": None}, "metrics": {"serviceMonitor": {"enabled": True}}},
            "metrics.serviceMonitor.enabled needs config.metrics_listen",
        ),
        (
            {"config": {"leader_election": {"service_name": "my-osas"}}},
            (
                "config.leader_election.service_name is set by the chart: it is the Service CA "
                "dials (osas), whose only endpoint the Lease holder publishes; remove it"
            ),
        ),
        (
            {"config": {"leader_election": {"kubeconfig": "/etc/kube/config"}}},
            "config.leader_election.kubeconfig is set by the chart: osas reaches the Kubernetes",
        ),
        (
            {"config": {"leader_election": {"kubeconfig": None}}},
            "config.leader_election.kubeconfig is set by the chart",
        ),
        (
            {"config": {"leader_election": {"identity": "osas-0"}}},
            "config.leader_election.identity would give every replica the same name",
        ),
        (
            {"config": {"leader_election": {"service_namespace": "default"}}},
            "config.leader_election.service_namespace must be the release's namespace",
        ),
        (
            {"config": {"leader_election": {"enabled": False}}},  # with the default 2 replicas
            (
                "config.leader_election.enabled is false with replicaCount 2: every replica "
                "would act on every scale-up (two writers). Keep leader election on, or set "
                "replicaCount: 1"
            ),
        ),
        (
            {"replicaCount": 3, "config": {"leader_election": {"enabled": False}}},
            "config.leader_election.enabled is false with replicaCount 3",
        ),
        (
            {
                "credentials": {
                    "clouds": [
                        {"name": "public", "existingSecret": "osas-openstack-public"},
                        {"name": "public", "cloudsYaml": CLOUDS_YAML},
                    ]
                }
            },
            "credentials.clouds: the cloud 'public' is given twice: one Secret per cloud",
        ),
        (
            own_cloud("public", existingSecret="osas-openstack-public", cloudsYaml=CLOUDS_YAML),
            "credentials.clouds[0](public): give existingSecret or cloudsYaml, not both",
        ),
        (
            own_cloud("public"),
            (
                "credentials.clouds[0](public): give existingSecret (a Secret with the key "
                "clouds.yaml) or cloudsYaml"
            ),
        ),
        (
            own_cloud("public", cloudsYaml=CLOUDS_YAML),  # its one entry is `openstack`
            (
                "credentials.clouds[0](public): cloudsYaml has no cloud 'public' under "
                "`clouds:`: osas reads that entry from this clouds.yaml alone"
            ),
        ),
        (
            own_cloud("public", cloudsYaml=f"clouds: [password: {PASSWORD}"),
            "credentials.clouds[0](public): cloudsYaml is not a YAML mapping",
        ),
        (
            {"config": {"openstack": {"clouds_file": "/etc/openstack/clouds.yaml"}}},
            (
                "config.openstack.clouds_file is set by the chart, which owns the pod's mount "
                "paths: give the cloud's clouds.yaml a Secret of its own in credentials.clouds"
            ),
        ),
        (
            {
                **own_cloud("public", existingSecret="osas-openstack-public"),
                "config": group_of(
                    {"cloud": "public", "clouds_file": f"{CLOUD_FILES}/public/clouds.yaml"}
                ),
            },
            (
                "config.node_groups[0](burst).openstack.clouds_file is set by the chart, which "
                "owns the pod's mount paths"
            ),
        ),
        (
            {"credentials": {"env": ENV}, "config": group_of({"cloud": "public"})},
            (
                "config.node_groups[0](burst).openstack.cloud 'public' is not a cloud of "
                "credentials.clouds, and the main credentials are OS_* variables, so no "
                "clouds.yaml holds it"
            ),
        ),
        (
            {
                "credentials": {
                    "existingSecret": "",
                    "clouds": [{"name": "private", "existingSecret": "osas-openstack-private"}],
                },
                "config": {"openstack": {"cloud": "private"}, **group_of({"cloud": "public"})},
            },
            (
                "config.node_groups[0](burst).openstack.cloud 'public' is not a cloud of "
                "credentials.clouds, and there are no main credentials, so no clouds.yaml holds it"
            ),
        ),
        (
            {
                "credentials": {
                    "existingSecret": "",
                    "clouds": [{"name": "public", "existingSecret": "osas-openstack-public"}],
                },
            },
            (
                "credentials: give existingSecret (a Secret you made), cloudsYaml or env; or, to "
                "keep every cloud's credentials in a Secret of its own, name in "
                "config.openstack.cloud a cloud of credentials.clouds"
            ),
        ),
        (
            {"image": {"repository": ""}},  # the chart's default: osas publishes no image
            (
                "image.repository is not set: osas publishes no image. Build it from the "
                "repository's Containerfile"
            ),
        ),
    ],
)
def test_templates_refuse_with_a_clear_message(chart, values, reason):
    with pytest.raises(helm.HelmError) as refused:
        render_files(chart, values)
    assert reason in str(refused.value)
    assert PASSWORD not in str(refused.value)


def test_lint_is_clean(chart):
    for scenario in (
        {},
        SCENARIOS["monitoring"][1],
        SCENARIOS["network-policy"][1],
        SCENARIOS["clouds-of-their-own"][1],
    ):
        values = {**scenario, "image": {"repository": EXAMPLE_REPOSITORY}}
        report = helm.lint(chart, values, strict=True, namespace="kube-system")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems, problems
        assert not report["errors"], report["errors"]


# -- the chart and osas in step -----------------------------------------------------------------


def test_app_version_is_osas_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == osas.__version__
    assert chart["version"] == osas.__version__


def test_schema_config_keys_are_osas_keys():
    schema = helm.Chart.load(CHART).schema
    assert schema is not None
    config = schema["properties"]["config"]["properties"]
    # The chart is mTLS only: insecure and insecure_non_loopback are left out on purpose.
    assert set(config) <= set(OsasConfig.model_fields)
    assert set(OsasConfig.model_fields) - set(config) <= {"insecure", "insecure_non_loopback"}
    group = config["node_groups"]["items"]["properties"]
    # The words of the file: a field's alias where it has one (a node group's `id`).
    file_keys = {field.alias or name for name, field in NodeGroupConfig.model_fields.items()}
    assert set(group) == file_keys


def test_osas_knows_every_key_the_chart_writes(rendered):
    _, objects = rendered["defaults"]
    assert set(osas_config(objects)) <= set(OsasConfig.model_fields)


def test_osas_knows_every_leader_election_key_the_chart_writes(rendered):
    schema = helm.Chart.load(CHART).schema
    assert schema is not None
    keys = schema["properties"]["config"]["properties"]["leader_election"]["properties"]
    assert set(keys) == set(LeaderElectionConfig.model_fields)
    for scenario in ("defaults", "custom-lease"):
        _, objects = rendered[scenario]
        written = osas_config(objects)["leader_election"]
        assert set(written) <= set(LeaderElectionConfig.model_fields)


def test_stand_ins_only_for_files_the_chart_lacks(chart):
    """The test copy gets stand-ins; the chart itself is never given any."""
    for name in SHIPPED_FILES:
        assert (chart / name).exists()
        original = CHART / name
        if original.exists():
            assert (chart / name).read_text() == original.read_text()


# -- the helm test pod's script, run against a real osas on loopback ------------------------------


def test_the_helm_test_script_dials_osas_as_ca_does(rendered, tmp_path):
    _, objects = rendered["defaults"]
    pod = find(objects, "Pod")
    script, cloud_config_path = pod["spec"]["containers"][0]["args"]
    assert cloud_config_path == "/etc/osas-ca/config/cloud-config.yaml"
    authority = DemoAuthority()
    server = authority.issue("localhost")
    client = authority.issue("cluster-autoscaler.kube-system.svc")
    for name, data in {
        "ca.crt": authority.cert_pem,
        "tls.crt": server.cert_pem,
        "tls.key": server.key_pem,
        "client.crt": client.cert_pem,
        "client.key": client.key_pem,
    }.items():
        (tmp_path / name).write_bytes(data)
    config = make_config(
        tmp_path,
        insecure=False,
        tls={
            "cert_file": str(tmp_path / "tls.crt"),
            "key_file": str(tmp_path / "tls.key"),
            "client_ca_file": str(tmp_path / "ca.crt"),
            "server_names": ["localhost"],
        },
    )

    async def run() -> subprocess.CompletedProcess[str]:
        async with running(config) as provider:
            _, ca_config = ca_cloud_config(objects)
            ca_config.update(
                address=f"localhost:{provider.app.server.port}",
                cert=str(tmp_path / "client.crt"),
                key=str(tmp_path / "client.key"),
                cacert=str(tmp_path / "ca.crt"),
            )
            (tmp_path / "cloud-config.yaml").write_text(yaml.safe_dump(ca_config))
            ports.append(provider.app.server.port)
            return await anyio.run_process(
                [sys.executable, "-c", script, str(tmp_path / "cloud-config.yaml")], check=False
            )

    ports: list[int] = []
    done = anyio.run(run)
    [port] = ports
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    assert f"health of localhost:{port}: SERVING" in output
    assert "node group workers: min 1, max 10" in output


def test_a_deep_copy_of_values_is_not_changed_by_rendering(chart):
    values = copy.deepcopy(SCENARIOS["ha-story"][1])
    render_files(chart, values)
    assert values == SCENARIOS["ha-story"][1]
