"""Strict schemas for the custom resources the chart renders, which kubernetes-validate does not
know: the fields the chart uses of cert-manager's Issuer and Certificate (cert-manager.io/v1)
and of the Prometheus Operator's ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1).
Written from those APIs' reference documentation; a field or enum value they do not have fails."""

from __future__ import annotations

from typing import Any

STRING = {"type": "string"}
STRINGS = {"type": "array", "items": STRING}
STRING_MAP = {"type": "object", "additionalProperties": STRING}
GO_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"}


def strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


METADATA = strict(
    {
        "name": {
            "type": "string",
            "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
            "maxLength": 253,
        },
        "namespace": STRING,
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    ("name",),
)


def resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return strict(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


ISSUER_REF = strict(
    {"name": STRING, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": STRING}, ("name",)
)
KEY_USAGES = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
]

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Issuer"): resource(
        "cert-manager.io/v1",
        "Issuer",
        {
            "type": "object",
            "properties": {
                "selfSigned": strict({}),
                "ca": strict({"secretName": STRING}, ("secretName",)),
            },
            "additionalProperties": False,
            "minProperties": 1,
            "maxProperties": 1,
        },
    ),
    ("cert-manager.io/v1", "Certificate"): resource(
        "cert-manager.io/v1",
        "Certificate",
        strict(
            {
                "secretName": STRING,
                "secretTemplate": strict({"labels": STRING_MAP, "annotations": STRING_MAP}),
                "commonName": {"type": "string", "maxLength": 64},
                "dnsNames": STRINGS,
                "isCA": {"type": "boolean"},
                "duration": GO_DURATION,
                "renewBefore": GO_DURATION,
                "usages": {"type": "array", "items": {"enum": KEY_USAGES}},
                "privateKey": strict(
                    {
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "size": {"type": "integer"},
                        "encoding": {"enum": ["PKCS1", "PKCS8"]},
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                    }
                ),
                "issuerRef": ISSUER_REF,
            },
            ("secretName", "issuerRef"),
        ),
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): resource(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        strict(
            {
                "selector": strict({"matchLabels": STRING_MAP}),
                "namespaceSelector": strict({"matchNames": STRINGS, "any": {"type": "boolean"}}),
                "endpoints": {
                    "type": "array",
                    "items": strict(
                        {
                            "port": STRING,
                            "path": STRING,
                            "scheme": {"enum": ["http", "https"]},
                            "interval": GO_DURATION,
                            "scrapeTimeout": GO_DURATION,
                        }
                    ),
                },
            },
            ("selector", "endpoints"),
        ),
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): resource(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        strict(
            {
                "groups": {
                    "type": "array",
                    "items": strict(
                        {
                            "name": STRING,
                            "interval": GO_DURATION,
                            "limit": {"type": "integer"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    **strict(
                                        {
                                            "alert": STRING,
                                            "record": STRING,
                                            "expr": {"type": ["string", "integer"]},
                                            "for": GO_DURATION,
                                            "keep_firing_for": GO_DURATION,
                                            "labels": STRING_MAP,
                                            "annotations": STRING_MAP,
                                        },
                                        ("expr",),
                                    ),
                                    "oneOf": [
                                        {"required": ["alert"]},
                                        {"required": ["record"]},
                                    ],
                                },
                            },
                        },
                        ("name", "rules"),
                    ),
                }
            },
            ("groups",),
        ),
    ),
}
