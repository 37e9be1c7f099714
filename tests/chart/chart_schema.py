"""The chart's view of osas's configuration, generated (`nox -s manifests`): the ``config`` part of
values.schema.json is osas's own JSON schema (osas.config.json_schema) with what the chart
itself sets or refuses laid over it, and templates/_config_defaults.tpl gives the templates
osas's defaults and duration pattern for the checks across keys. test_manifests.py fails when
either differs from what this module makes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from osas.config.json_schema import config_defaults, config_json_schema
from osas.config.schema import DURATION_PATTERN

CHART = Path(__file__).parent.parent.parent / "charts" / "osas"
VALUES_SCHEMA = CHART / "values.schema.json"
DEFAULTS_TEMPLATE = CHART / "templates" / "_config_defaults.tpl"

# The chart serves mTLS only: it always writes `tls`, so that osas would refuse `insecure`.
CHART_DROPS = ("insecure", "insecure_non_loopback")
# The chart writes the certificate's files itself; these two of `tls` may be added to.
TLS_KEYS = ("allowed_clients", "server_names")
# The chart needs the ports: the container's, the Service's and the probes'.
CHART_REQUIRES = ("listen", "health_listen")
# Paths in the pod: a relative one would be relative to the image's working directory.
ABSOLUTE = {"type": "string", "pattern": "^/"}

# What a reader of the schema should know of a key the chart treats specially.
DESCRIPTIONS = {
    (): "osas's configuration (docs/configuration.md), checked as osas checks it; generated "
    "from osas's models by `nox -s manifests`",
    ("listen",): "the gRPC address for CA (mTLS); its port is the container's and the Service's",
    ("metrics_listen",): "HTTP metrics and probes; null turns it off",
    ("tls",): "the chart sets the files, server_names and allowed_clients; only these two may "
    "be added to",
    ("tls", "server_names"): "added to the Service's name",
    ("cloud_backend",): "retired: osas runs against OpenStack only; accepted and ignored",
    ("openstack", "cloud"): "the clouds.yaml entry; the chart sets `openstack` with clouds.yaml "
    "credentials and refuses it with OS_* variables, unless it is a cloud of credentials.clouds",
    ("openstack", "auth"): "refused: credentials belong in a Secret (credentials)",
    ("openstack", "clouds_file"): "refused: the chart writes it for a cloud of "
    "credentials.clouds, whose Secret it mounts",
    ("leader_election",): "one writer among the replicas, elected through a coordination.k8s.io "
    "Lease",
    ("leader_election", "enabled"): "the chart's default is true; false only with replicaCount 1",
    ("leader_election", "lease_name"): "empty: osas-<cluster_name>",
    ("leader_election", "lease_namespace"): "fixed, not the release's namespace: a copy "
    "elsewhere competes for the same Lease",
    ("leader_election", "identity"): "refused unless empty: each replica is its pod's name "
    "(POD_NAME)",
    ("leader_election", "kubeconfig"): "refused: the pod's service account, set by the chart",
    ("leader_election", "service_name"): "refused: the Service CA dials, set by the chart",
    ("leader_election", "service_namespace"): "empty, or the release's namespace",
    ("node_groups", "user_data"): "an inline template; no secrets here: use user_data_vars",
    ("node_groups", "user_data_file"): "a template in a mounted Secret (userDataSecrets)",
    ("node_groups", "user_data_vars"): "template variables read from files: name -> path",
    ("node_groups", "openstack"): "where the group lives when not where `openstack` says: "
    "region_name, or cloud (another entry of the clouds.yaml Secret, or a cloud of "
    "credentials.clouds) with its verify, cacert, interface; provider_id_region",
    ("node_groups", "openstack", "clouds_file"): "refused: the chart writes it for a cloud of "
    "credentials.clouds, whose Secret it mounts",
}


def chart_config_schema() -> dict[str, Any]:
    """values.schema.json's ``config``: osas's schema, and the chart's own rules over it."""
    schema = config_json_schema()
    del schema["$schema"]
    properties = schema["properties"]
    for key in CHART_DROPS:
        del properties[key]
    tls = _object(properties["tls"])["properties"]
    properties["tls"] = {
        "type": "object",
        "properties": {key: tls[key] for key in TLS_KEYS},
        "additionalProperties": False,
    }
    schema["required"] = [*schema["required"], *CHART_REQUIRES]
    group = properties["node_groups"]["items"]["properties"]
    # A group's own place: another region, or another entry of the clouds.yaml Secret
    # (credentials belong in a Secret, so no auth block). osas's checks across the block's
    # keys, as a schema: a cloud or a region named (non-empty), TLS and interface only with
    # another cloud, a CA file's path absolute in the pod.
    place = _object(group["openstack"])
    del place["properties"]["auth"]
    place["properties"]["cacert"] = {"anyOf": [ABSOLUTE, {"type": "null"}]}
    named = {"type": "string", "minLength": 1}
    place["anyOf"] = [
        {"required": ["cloud"], "properties": {"cloud": named}},
        {"required": ["region_name"], "properties": {"region_name": named}},
    ]
    place["dependencies"] = {
        key: {"required": ["cloud"], "properties": {"cloud": named}}
        for key in ("verify", "cacert", "interface")
    }
    group["user_data_file"] = {"anyOf": [ABSOLUTE, {"type": "null"}]}
    group["user_data_vars"]["additionalProperties"] = ABSOLUTE
    for path, text in DESCRIPTIONS.items():
        _at(schema, path)["description"] = text
    return schema


def values_schema() -> dict[str, Any]:
    """values.schema.json as committed, its ``config`` part made anew."""
    values = json.loads(VALUES_SCHEMA.read_text())
    values["properties"]["config"] = chart_config_schema()
    return values


def values_schema_text() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


DEFAULTS_HEADER = """\
{{/* Generated from osas's configuration models by `nox -s manifests` (tests/chart/chart_schema.py):
do not edit. osas's defaults (durations in seconds) and its duration pattern, for the checks
across keys in _helpers.tpl, which compare values the user may have left out. */}}
"""


def defaults_template_text() -> str:
    defaults = json.dumps(config_defaults(), sort_keys=True)
    return (
        DEFAULTS_HEADER
        + f'{{{{- define "osas.configDefaults" -}}}}{defaults}{{{{- end }}}}\n'
        + f'{{{{- define "osas.durationPattern" -}}}}{DURATION_PATTERN}{{{{- end }}}}\n'
    )


def write() -> list[Path]:
    VALUES_SCHEMA.write_text(values_schema_text())
    DEFAULTS_TEMPLATE.write_text(defaults_template_text())
    return [VALUES_SCHEMA, DEFAULTS_TEMPLATE]


def _object(schema: dict[str, Any]) -> dict[str, Any]:
    """The object branch of an optional block (``anyOf: [object, null]``)."""
    if schema.get("type") == "object":
        return schema
    (branch,) = [s for s in schema.get("anyOf", []) if s.get("type") == "object"]
    return branch


def _at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = schema
    for key in path:
        node = _object(node) if "anyOf" in node else node
        node = node["items"] if node.get("type") == "array" else node
        node = node["properties"][key]
    return node
