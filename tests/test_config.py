"""The configuration file: one test per validation rule, the domain values a valid file builds,
environment overrides, and how `osas serve` refuses a bad file."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from support import config_data, write_config

import osas.cli.serve
from osas.cloud.openstack_settings import OpenStackSettings
from osas.config import ConfigError, OsasConfig, load_config, schema
from osas.domain.ledger import LedgerSettings
from osas.domain.specs import (
    BootVolume,
    ClusterSpec,
    GpuSpec,
    NodeGroupSpec,
    OptionOverrides,
    Pricing,
    Taint,
    TaintEffect,
)
from osas.election import ElectionSettings
from osas.engine.settings import EngineSettings, QueueSettings, ReconcileSettings
from osas.service.settings import ServerSettings, TlsFiles, TransportSettings

SERVER_UUID = "0b7f1d2e-3c4a-4b5c-8d6e-7f8091a2b3c4"
WORKERS = "node_groups[0](workers)"
GPU = "node_groups[1](gpu)"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No OSAS_* variable of the machine running the tests leaks into a config."""
    for name in list(os.environ):
        if name.upper().startswith("OSAS_"):
            monkeypatch.delenv(name)


@pytest.fixture
def restore_logging():
    """`osas serve` configures logging process-wide; put it back for the next test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**saved)


def group(index: int = 0, **fields: Any) -> dict[str, Any]:
    """The valid config with ``fields`` set on node group ``index`` (0: workers, 1: gpu)."""
    data = config_data()
    data["node_groups"][index].update(fields)
    return data


def problems(path: Path) -> list[str]:
    """The lines of the ConfigError that loading ``path`` must raise."""
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value).splitlines()


# How a value that is not a name (cluster_name, a node group id) is refused.
NAME = "is not a name of lowercase letters, digits and '-'"


def expect_problem(tmp_path: Path, data: dict[str, Any], where: str, *reasons: str) -> str:
    """Loading ``data`` fails with exactly one problem, located at ``where``, naming the file
    and containing every one of ``reasons``."""
    path = write_config(tmp_path, data)
    lines = problems(path)
    assert len(lines) == 1, lines
    prefix = f"{path}: {where}: "
    assert lines[0].startswith(prefix), lines[0]
    for reason in reasons:
        assert reason in lines[0].removeprefix(prefix), lines[0]
    return lines[0]


def load(tmp_path: Path, data: dict[str, Any]) -> OsasConfig:
    return load_config(write_config(tmp_path, data))


def lines_of(path: Path, start: str) -> list[int]:
    """The numbers of the lines of ``path`` that begin with ``start``."""
    text = path.read_text(encoding="utf-8")
    return [number for number, line in enumerate(text.splitlines(), 1) if line.startswith(start)]


# --- node groups ---------------------------------------------------------------------------


def test_min_size_greater_than_max_size(tmp_path):
    expect_problem(
        tmp_path,
        group(min_size=5, max_size=2),
        WORKERS,
        "min_size 5 is greater than max_size 2",
    )


def test_min_size_equal_to_max_size_is_allowed(tmp_path):
    config = load(tmp_path, group(min_size=3, max_size=3))
    assert config.node_groups[0].min_size == config.node_groups[0].max_size == 3


@pytest.mark.parametrize("key", ["min_size", "max_size"])
def test_negative_size(tmp_path, key):
    data = group(min_size=0, max_size=0)
    data["node_groups"][0][key] = -1
    expect_problem(tmp_path, data, f"{WORKERS}.{key}", "greater than or equal to 0")


def test_duplicate_node_group_ids_are_located_at_the_second_with_both_lines(tmp_path):
    data = config_data()
    data["node_groups"][1]["id"] = "workers"
    path = write_config(tmp_path, data)
    first, second = lines_of(path, "  id: workers")
    expect_problem(
        tmp_path,
        data,
        "node_groups[1](workers).id",
        f"duplicate node group id 'workers' (line {second}; first at "
        f"node_groups[0](workers).id, line {first})",
    )


def test_a_duplicate_id_set_from_the_environment_is_located_without_lines(tmp_path, monkeypatch):
    groups = [config_data()["node_groups"][0]] * 2
    monkeypatch.setenv("OSAS_NODE_GROUPS", json.dumps(groups))
    [line] = problems(write_config(tmp_path, config_data()))
    assert line.endswith(
        ".id: duplicate node group id 'workers' (first at node_groups[0](workers).id) "
        "(from OSAS_NODE_GROUPS)"
    ), line


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("Workers", "'Workers' " + NAME),
        ("my_group", "'my_group' " + NAME),
        ("pool/a", "'pool/a' " + NAME),
        ("-pool", "'-pool' " + NAME),
        ("pool-", "'pool-' " + NAME),
        ("", "'' " + NAME),
        ("a" * 41, "at most 40 characters"),
    ],
)
def test_bad_node_group_id(tmp_path, bad, reason):
    expect_problem(tmp_path, group(id=bad), f"node_groups[0]({bad}).id", reason)


def test_node_group_id_of_40_characters_is_allowed(tmp_path):
    assert load(tmp_path, group(id="a" * 40)).node_groups[0].group_id == "a" * 40


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("Prod", NAME),
        ("prod_1", NAME),
        ("prod.eu", NAME),
        ("c" * 41, "at most 40 characters"),
    ],
)
def test_bad_cluster_name(tmp_path, bad, reason):
    expect_problem(tmp_path, config_data(cluster_name=bad), "cluster_name", reason)


@pytest.mark.parametrize(
    ("key", "where"),
    [
        ("cluster_name", "cluster_name"),
        ("node_groups", "node_groups"),
    ],
)
def test_missing_required_top_level_key(tmp_path, key, where):
    data = config_data()
    del data[key]
    line = expect_problem(tmp_path, data, where, "required, and not given")
    assert not line.endswith(")")  # the top level: no block to point at


def test_node_groups_empty_list(tmp_path):
    expect_problem(tmp_path, config_data(node_groups=[]), "node_groups", "at least 1 item")


@pytest.mark.parametrize("key", ["id", "min_size", "max_size", "flavor", "image", "networks"])
def test_missing_required_node_group_key(tmp_path, key):
    data = config_data()
    del data["node_groups"][0][key]
    label = "node_groups[0]" if key == "id" else WORKERS
    line = expect_problem(tmp_path, data, f"{label}.{key}", "required, and not given")
    # The line the group lacking it starts on.
    number = int(re.search(r" \(in the block at line (\d+)\)$", line)[1])  # type: ignore[index]
    text = write_config(tmp_path, data).read_text().splitlines()
    assert text[number - 1].lstrip().startswith("- "), (number, text)


@pytest.mark.parametrize(("key", "value"), [("flavor", ""), ("image", ""), ("networks", [])])
def test_empty_required_node_group_value(tmp_path, key, value):
    expect_problem(tmp_path, group(**{key: value}), f"{WORKERS}.{key}", "at least 1")


# --- unknown keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "where", "meant"),
    [
        (("clustername",), "clustername", "cluster_name"),
        (("node_groups", 0, "flavour"), f"{WORKERS}.flavour", "flavor"),
        (("node_groups", 1, "gpu", "typ"), f"{GPU}.gpu.typ", "type"),
        (
            ("node_groups", 1, "options", "scale_down_unneded_time"),
            f"{GPU}.options.scale_down_unneded_time",
            "scale_down_unneeded_time",
        ),
        (("node_groups", 1, "taints", 0, "efect"), f"{GPU}.taints[0].efect", "effect"),
        (("reconcile", "intervall"), "reconcile.intervall", "interval"),
        (("queue", "worker"), "queue.worker", "workers"),
        (("openstack", "regoin_name"), "openstack.regoin_name", "region_name"),
    ],
)
def test_unknown_key(tmp_path, path, where, meant):
    """The key meant is named, and where the file gives the one written."""
    data = config_data()
    data.setdefault("openstack", {})
    node: Any = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = "oops"
    line = expect_problem(tmp_path, data, where, "not a key osas knows here")
    assert re.search(rf"; did you mean {meant}\? \(line \d+\)$", line), line


def test_unknown_key_far_from_any_lists_the_keys_of_its_block(tmp_path):
    data = config_data(queue={"capacity": 50, "workers": 2, "zzz": 1})
    line = expect_problem(tmp_path, data, "queue.zzz", "not a key osas knows here")
    assert "(the keys here: capacity, workers)" in line


def test_unknown_key_in_openstack_auth_block(tmp_path):
    data = config_data(openstack={"auth": {"auth_url": "https://keystone", "pasword": "x"}})
    # The block is validated straight into the cloud's OpenStackAuth, whose wording differs.
    expect_problem(tmp_path, data, "openstack.auth.pasword", "Unexpected keyword argument")


# --- transport -------------------------------------------------------------------------------

TLS = {"cert_file": "/tls/tls.crt", "key_file": "/tls/tls.key", "client_ca_file": "/tls/ca.crt"}


def test_tls_and_insecure_together(tmp_path):
    expect_problem(
        tmp_path, config_data(tls=TLS, insecure=True), "(top level)", "'tls'", "'insecure: true'"
    )


def test_neither_tls_nor_insecure(tmp_path):
    expect_problem(
        tmp_path, config_data(insecure=False), "(top level)", "'tls' is required", "insecure"
    )


@pytest.mark.parametrize("key", ["cert_file", "key_file", "client_ca_file"])
def test_tls_block_missing_a_file(tmp_path, key):
    tls = {k: v for k, v in TLS.items() if k != key}
    expect_problem(
        tmp_path, config_data(insecure=False, tls=tls), f"tls.{key}", "required, and not given"
    )


def test_listen_equal_to_health_listen(tmp_path):
    data = config_data(
        listen="0.0.0.0:8086", health_listen="0.0.0.0:8086", insecure_non_loopback=True
    )
    expect_problem(tmp_path, data, "(top level)", "listen and health_listen must differ")


def test_listen_and_health_listen_may_both_use_port_zero(tmp_path):
    config = load(tmp_path, config_data(listen="127.0.0.1:0", health_listen="127.0.0.1:0"))
    assert config.listen == config.health_listen == "127.0.0.1:0"


@pytest.mark.parametrize("key", ["listen", "health_listen"])
@pytest.mark.parametrize(
    "bad", ["8086", "127.0.0.1", "127.0.0.1:", "http://host:80", "a b:80", "host:123456"]
)
def test_bad_listen_address(tmp_path, key, bad):
    expect_problem(
        tmp_path,
        config_data(**{key: bad}),
        key,
        f"{bad!r} is not HOST:PORT (for example 127.0.0.1:8086, 0.0.0.0:8086 or [::]:8086)",
    )


@pytest.mark.parametrize("good", ["0.0.0.0:8086", "[::]:8086", "localhost:8086", "10.0.0.1:1"])
def test_good_listen_address(tmp_path, good):
    data = config_data(listen=good, insecure_non_loopback=True)
    assert load(tmp_path, data).listen == good


@pytest.mark.parametrize("address", ["0.0.0.0:8086", "[::]:8086", "10.0.0.1:1", "osas:8086"])
def test_plaintext_beyond_loopback_needs_a_second_setting(tmp_path, address):
    expect_problem(
        tmp_path, config_data(listen=address), "(top level)", "insecure_non_loopback: true"
    )


@pytest.mark.parametrize("address", ["127.0.0.1:8086", "127.9.9.9:1", "[::1]:8086", "localhost:1"])
def test_plaintext_on_loopback_needs_nothing_more(tmp_path, address):
    assert load(tmp_path, config_data(listen=address)).insecure


def test_tls_may_listen_anywhere(tmp_path):
    tls = {"cert_file": "c", "key_file": "k", "client_ca_file": "ca"}
    config = load(tmp_path, config_data(listen="0.0.0.0:8086", insecure=False, tls=tls))
    assert config.server_settings().tls is not None


@pytest.mark.parametrize("bad", ["cluster-autoscaler", "dns:", "spiffe://x", "ip:10.0.0.1"])
def test_allowed_clients_name_their_kind(tmp_path, bad):
    tls = {"cert_file": "c", "key_file": "k", "client_ca_file": "ca", "allowed_clients": [bad]}
    expect_problem(
        tmp_path,
        config_data(insecure=False, tls=tls),
        "tls.allowed_clients[0]",
        f"{bad!r} is not dns:NAME, uri:URI or cn:NAME",
    )


def test_transport_settings_reach_the_server(tmp_path):
    transport = {"max_concurrent_rpcs": 32, "max_connection_age": "2m", "keepalive_time": "30s"}
    settings = load(tmp_path, config_data(transport=transport)).server_settings().transport
    assert settings.max_concurrent_rpcs == 32
    assert settings.max_connection_age == 120.0
    assert settings.keepalive_time == 30.0


@pytest.mark.parametrize(
    ("key", "bad"), [("listen", "0.0.0.0:99999"), ("health_listen", "0.0.0.0:65536")]
)
def test_listen_port_above_65535(tmp_path, key, bad):
    expect_problem(tmp_path, config_data(**{key: bad}), key, bad)


# --- labels, taints, gpu, metadata, user data ------------------------------------------------


@pytest.mark.parametrize("effect", ["NoScheduleX", "noschedule", ""])
def test_taint_with_invalid_effect(tmp_path, effect):
    data = group(1, taints=[{"key": "dedicated", "value": "gpu", "effect": effect}])
    expect_problem(tmp_path, data, f"{GPU}.taints[0].effect", "'NoSchedule'", "'NoExecute'")


@pytest.mark.parametrize(
    ("field", "value"),
    [("key", "Bad Key"), ("key", "-dedicated"), ("value", "-gpu"), ("value", "v" * 64)],
)
def test_taint_with_invalid_key_or_value(tmp_path, field, value):
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    taint[field] = value
    data = group(1, taints=[taint])
    expect_problem(tmp_path, data, f"{GPU}.taints[0].{field}", "should match pattern")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("Bad Key", "x"),
        ("-pool", "x"),
        ("Example.com/pool", "x"),
        ("k" * 64, "x"),
        ("pool", "-workers"),
        ("pool", "has space"),
        ("pool", "v" * 64),
    ],
)
def test_invalid_label(tmp_path, key, value):
    expect_problem(
        tmp_path, group(labels={key: value}), WORKERS, f"label {key!r}=", "not a valid Kubernetes"
    )


def test_valid_labels_are_accepted(tmp_path):
    labels = {"example.com/pool": "workers", "tier": "", "k" * 63: "v" * 63}
    assert load(tmp_path, group(labels=labels)).node_groups[0].labels == labels


@pytest.mark.parametrize(("key", "value"), [("pool", "workers\n"), ("pool\n", "workers")])
def test_label_with_trailing_newline(tmp_path, key, value):
    expect_problem(tmp_path, group(labels={key: value}), WORKERS, "not a valid Kubernetes")


@pytest.mark.parametrize("count", [0, -1, 65])
def test_bad_gpu_count(tmp_path, count):
    data = group(1, gpu={"count": count, "type": "nvidia-a100"})
    expect_problem(tmp_path, data, f"{GPU}.gpu.count", "Input should be")


@pytest.mark.parametrize("key", ["osas-cluster", "osas-node-group", "osas-request-id", "osas-warm"])
def test_metadata_with_reserved_key(tmp_path, key):
    data = group(metadata={"team": "infra", key: "x"})
    expect_problem(tmp_path, data, WORKERS, f"metadata keys ['{key}']", "ownership")


@pytest.mark.parametrize(
    ("key", "value"),
    [("team", "x" * 256), ("k" * 256, "x"), ("", "x")],
    ids=["long-value", "long-key", "empty-key"],
)
def test_metadata_item_too_long_or_empty(tmp_path, key, value):
    data = group(metadata={key: value})
    expect_problem(tmp_path, data, WORKERS, f"metadata {key!r}", "1 to 255 characters")


def test_metadata_of_255_characters_is_allowed(tmp_path):
    metadata = {"k" * 255: "v" * 255}
    assert load(tmp_path, group(metadata=metadata)).node_groups[0].metadata == metadata


@pytest.mark.parametrize(
    "user_data",
    ["x" * 49_150, "é" * 24_576],  # 65536 base64 bytes; the second is short in characters
    ids=["ascii", "utf-8-bytes-count"],
)
def test_user_data_too_large_for_nova(tmp_path, user_data):
    expect_problem(
        tmp_path, group(user_data=user_data), WORKERS, "user_data is 65536 bytes", "65535"
    )


def test_user_data_just_under_the_nova_limit_is_allowed(tmp_path):
    user_data = "x" * 49_149  # 65532 bytes once base64-encoded
    assert load(tmp_path, group(user_data=user_data)).node_groups[0].user_data == user_data


# --- options and durations -------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["scale_down_unneeded_time", "scale_down_unready_time", "max_node_provision_time"]
)
@pytest.mark.parametrize("value", [0, -30, "0s", "0m"])
def test_option_duration_not_positive(tmp_path, key, value):
    data = group(1, options={key: value})
    expect_problem(tmp_path, data, f"{GPU}.options.{key}", "must be positive")


@pytest.mark.parametrize(
    "key", ["scale_down_utilization_threshold", "scale_down_gpu_utilization_threshold"]
)
@pytest.mark.parametrize("value", [-0.1, 1.01, 2, float("nan")])
def test_option_threshold_outside_zero_one(tmp_path, key, value):
    data = group(1, options={key: value})
    expect_problem(tmp_path, data, f"{GPU}.options.{key}", "Input should be")


@pytest.mark.parametrize("value", [0, 0.5, 1])
def test_option_threshold_bounds_are_inclusive(tmp_path, value):
    config = load(tmp_path, group(1, options={"scale_down_utilization_threshold": value}))
    assert config.node_groups[1].options.scale_down_utilization_threshold == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h", timedelta(hours=1)),
        ("1.5m", timedelta(seconds=90)),
        (90, timedelta(seconds=90)),
        (2.5, timedelta(seconds=2.5)),
        ("90", timedelta(seconds=90)),
        ("1.", timedelta(seconds=1)),
        (".5", timedelta(seconds=0.5)),
        (" 5m\t", timedelta(minutes=5)),
    ],
)
def test_duration_formats_accepted(tmp_path, value, expected):
    config = load(tmp_path, group(1, options={"scale_down_unneeded_time": value}))
    assert config.node_groups[1].options.scale_down_unneeded_time == expected


# ASCII digits only: the chart's schema checks the same pattern, as Go's regexp reads it.
@pytest.mark.parametrize(
    "value", ["5 minutes", "5min", "1d", "PT5M", "-30s", "30s5m", "", "m", " ", ".", "\u0663s"]
)
def test_duration_formats_rejected(tmp_path, value):
    data = group(1, options={"scale_down_unneeded_time": value})
    expect_problem(
        tmp_path, data, f"{GPU}.options.scale_down_unneeded_time", f"not a duration: {value!r}"
    )


def test_duration_rejected_outside_node_groups(tmp_path):
    expect_problem(
        tmp_path, config_data(shutdown_grace="5 seconds"), "shutdown_grace", "not a duration"
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("99999999999h", "not a duration"),
        ("1234567890", "not a duration"),  # over 9 digits, as the chart's schema says
        (1e10, "duration out of range: 10000000000.0 (at most 999999999s)"),
        (-1e300, "duration out of range"),
    ],
)
def test_duration_too_large(tmp_path, value, reason):
    data = group(1, options={"scale_down_unneeded_time": value})
    expect_problem(tmp_path, data, f"{GPU}.options.scale_down_unneeded_time", reason)


# --- reconcile, queue, openstack -------------------------------------------------------------


@pytest.mark.parametrize(
    ("reconcile", "reason"),
    [
        ({"full_resync_interval": "30m"}, "full_resync_interval must not be shorter than interval"),
        ({"max_inventory_age": "1h"}, "max_inventory_age must be longer than interval"),
        ({"max_inventory_age": "30m"}, "max_inventory_age must be longer than interval"),
        ({"interval": 0}, "must be positive"),
        ({"interval": "-1"}, "not a duration"),
    ],
)
def test_reconcile_intervals(tmp_path, reconcile, reason):
    data = config_data()
    data["reconcile"].update(reconcile)
    where = "reconcile" if "must" in reason and "positive" not in reason else "reconcile.interval"
    expect_problem(tmp_path, data, where, reason)


def test_reconcile_full_resync_equal_to_interval_is_allowed(tmp_path):
    data = config_data()
    data["reconcile"].update(interval="1m", full_resync_interval="1m", max_inventory_age="61s")
    reconcile = load(tmp_path, data).reconcile
    assert reconcile.full_resync_interval == reconcile.interval == timedelta(minutes=1)


@pytest.mark.parametrize("value", [0, -1])
def test_reconcile_retry_backoff_not_positive(tmp_path, value):
    data = config_data()
    data["reconcile"]["retry_backoff"] = value
    expect_problem(tmp_path, data, "reconcile.retry_backoff", "must be positive")


@pytest.mark.parametrize(
    ("queue", "where", "reason"),
    [
        ({"capacity": 0}, "queue.capacity", "greater than or equal to 1"),
        ({"capacity": 100_001}, "queue.capacity", "less than or equal to 100000"),
        ({"workers": 0}, "queue.workers", "greater than or equal to 1"),
        ({"workers": 65}, "queue.workers", "less than or equal to 64"),
    ],
)
def test_queue_bounds(tmp_path, queue, where, reason):
    expect_problem(tmp_path, config_data(queue=queue), where, reason)


def test_openstack_cloud_and_auth_together(tmp_path):
    auth = {"auth_url": "https://keystone:5000/v3", "username": "u", "password": "p"}
    data = config_data(openstack={"cloud": "prod", "auth": auth})
    expect_problem(tmp_path, data, "openstack", "either 'cloud'", "'auth', not both")


@pytest.mark.parametrize(
    ("auth", "reason"),
    [
        ({"username": "osas"}, "give username and password, or an application credential"),
        ({"password": "p"}, "give username and password, or an application credential"),
        ({"application_credential_id": "x"}, "needs application_credential_secret"),
    ],
)
def test_openstack_auth_needs_one_complete_method(tmp_path, auth, reason):
    data = config_data(openstack={"auth": {"auth_url": "https://keystone:5000/v3", **auth}})
    expect_problem(tmp_path, data, "openstack.auth", reason)


def test_openstack_settings_carry_the_secrets_but_never_show_them(tmp_path):
    auth = {
        "auth_url": "https://keystone:5000/v3",
        "application_credential_id": "cred-id",
        "application_credential_secret": "s3cr3t-app-cred",
    }
    config = load(tmp_path, config_data(openstack={"auth": auth, "region_name": "RegionTwo"}))
    settings = config.openstack_settings()
    assert settings.auth is not None
    assert settings.auth.auth_type == "v3applicationcredential"
    assert settings.auth.as_sdk_auth()["application_credential_secret"] == "s3cr3t-app-cred"
    assert settings.region_name == "RegionTwo"
    assert "s3cr3t-app-cred" not in repr(settings)
    assert "s3cr3t-app-cred" not in repr(config)


@pytest.mark.parametrize(
    ("value", "reason"),
    [("region/one", "should match pattern"), ("region one", "should match pattern")],
)
def test_bad_provider_id_region(tmp_path, value, reason):
    expect_problem(tmp_path, config_data(provider_id_region=value), "provider_id_region", reason)


# --- the file itself -------------------------------------------------------------------------


def test_file_that_does_not_exist(tmp_path):
    path = tmp_path / "missing.yaml"
    assert problems(path) == [f"{path}: cannot read: No such file or directory"]


def test_file_that_is_not_yaml(tmp_path):
    path = tmp_path / "osas.yaml"
    path.write_text("cluster_name: [unclosed\n", encoding="utf-8")
    lines = problems(path)
    assert lines == [
        (
            f"{path}: not valid YAML at line 2, column 1 (in what starts at line 1, column 15): "
            "the structure does not parse (indentation, a missing ':' or '-')"
        )
    ]


@pytest.mark.parametrize(
    "text", ["- cluster_name: a\n- insecure: true\n", "just a string\n", "42\n"]
)
def test_yaml_top_level_not_a_mapping(tmp_path, text):
    path = tmp_path / "osas.yaml"
    path.write_text(text, encoding="utf-8")
    assert problems(path) == [f"{path}: the top level must be a mapping of keys"]


def test_empty_file_reports_the_required_keys(tmp_path):
    path = tmp_path / "osas.yaml"
    path.write_text("", encoding="utf-8")
    assert problems(path) == [
        f"{path}: cluster_name: required, and not given",
        f"{path}: node_groups: required, and not given",
    ]


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "osas.yaml"
    path.write_bytes(b"cluster_name: caf\xe9\n")
    assert problems(path)[0].startswith(f"{path}: ")


@pytest.mark.parametrize("line", ["1: x\n", "on: x\n"])
def test_top_level_key_that_is_not_a_string(tmp_path, line):
    path = tmp_path / "osas.yaml"
    path.write_text(yaml.safe_dump(config_data()) + line, encoding="utf-8")
    assert problems(path)[0].startswith(f"{path}: ")


# --- a key given twice ------------------------------------------------------------------------

REPEATED = "(YAML would keep the last and drop the others unseen); keep one"


def test_a_top_level_key_given_three_times_is_refused_with_every_line(tmp_path):
    path = tmp_path / "osas.yaml"
    text = "cluster_name: first\n" + yaml.safe_dump(config_data()) + "cluster_name: third\n"
    path.write_text(text, encoding="utf-8")
    one, two, three = lines_of(path, "cluster_name:")
    assert problems(path) == [
        f"{path}: cluster_name: duplicate key at lines {one}, {two} and {three} {REPEATED}"
    ]


def test_a_second_node_groups_block_is_refused_not_dropped(tmp_path):
    path = tmp_path / "osas.yaml"
    data = config_data()
    second = {"node_groups": [data["node_groups"].pop()]}
    path.write_text(yaml.safe_dump(data) + yaml.safe_dump(second), encoding="utf-8")
    first, again = lines_of(path, "node_groups:")
    assert problems(path) == [
        f"{path}: node_groups: duplicate key at lines {first} and {again} {REPEATED}"
    ]


@pytest.mark.parametrize(
    ("line", "again", "where"),
    [
        ("  image: ubuntu-24.04", "  image: debian-13", f"{WORKERS}.image"),
        ("    pool: workers", "    pool: spare", f"{WORKERS}.labels.pool"),
        ("    count: 1", "    count: 2", f"{GPU}.gpu.count"),
        ("  - effect: NoSchedule", "    effect: NoExecute", f"{GPU}.taints[0].effect"),
        ("  interval: 1h", "  interval: 2h", "reconcile.interval"),
    ],
)
def test_a_key_given_twice_at_any_depth_is_refused_with_both_lines(tmp_path, line, again, where):
    path = tmp_path / "osas.yaml"
    text = yaml.safe_dump(config_data()).replace(f"{line}\n", f"{line}\n{again}\n", 1)
    path.write_text(text, encoding="utf-8")
    first = lines_of(path, line)[0]
    assert problems(path) == [
        f"{path}: {where}: duplicate key at lines {first} and {first + 1} {REPEATED}"
    ]


def test_every_key_given_twice_is_reported_in_file_order(tmp_path):
    path = tmp_path / "osas.yaml"
    text = yaml.safe_dump(config_data(metrics_listen="127.0.0.1:0"))
    text = text.replace("  labels:\n    pool: workers\n", "  labels: {pool: a, pool: b}\n")
    text += "metrics_listen: 127.0.0.1:0\n"
    path.write_text(text, encoding="utf-8")
    [labels] = lines_of(path, "  labels: {pool")
    first, again = lines_of(path, "metrics_listen:")
    assert first < labels < again  # reported in the order of their first occurrence
    assert problems(path) == [
        f"{path}: metrics_listen: duplicate key at lines {first} and {again} {REPEATED}",
        (
            f"{path}: {WORKERS}.labels.pool: duplicate key at line {labels}, column 12 and "
            f"line {labels}, column 21 {REPEATED}"
        ),
    ]


def test_keys_that_override_a_merged_mapping_are_not_given_twice(tmp_path):
    """``<<: *base`` then the keys that differ: YAML's own way to share, not a repetition."""
    path = tmp_path / "osas.yaml"
    data = config_data()
    workers = yaml.safe_dump({"node_groups": [data.pop("node_groups")[0]]})
    text = yaml.safe_dump(data) + workers.replace("- flavor:", "- &base\n  flavor:")
    text += "- <<: *base\n  id: more\n  flavor: m1.large\n  labels: {pool: more}\n"
    path.write_text(text, encoding="utf-8")
    groups = load_config(path).node_groups
    assert [(g.group_id, g.flavor, g.labels) for g in groups] == [
        ("workers", "m1.medium", {"pool": "workers"}),
        ("more", "m1.large", {"pool": "more"}),
    ]


# --- user data files ---------------------------------------------------------------------------


def user_data_files(tmp_path: Path, template: Path, token: Path) -> dict[str, Any]:
    """The valid config with the workers' user data read from ``template`` and ``token``."""
    data = config_data()
    workers = data["node_groups"][0]
    del workers["user_data"]
    workers.update(user_data_file=str(template), user_data_vars={"join_token": str(token)})
    return data


def unusable_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A file of ``kind`` that cannot be user data, and why osas says so."""
    path = tmp_path / kind
    if kind == "missing":
        return path, "does not exist"
    if kind == "a folder":
        path.mkdir()
        return path, "cannot be read: Is a directory"
    if kind == "too large":
        path.write_text("x" * 65_536)
        return path, "is 65536 bytes; user data is at most 65535 bytes once base64-encoded"
    path.write_bytes(b"token: caf\xe9")
    return path, "is not UTF-8 text (byte 10)"


@pytest.mark.parametrize("kind", ["missing", "a folder", "too large", "not UTF-8"])
@pytest.mark.parametrize("key", ["user_data_file", "user_data_vars.join_token"])
def test_a_user_data_file_that_cannot_be_read_is_refused_at_load(tmp_path, key, kind):
    """Not left for the first create to find: serve refuses to start, a reload is rejected,
    check-config stops, all with this line."""
    (tmp_path / "template").write_text("#cloud-config\n# ${join_token}\n")
    (tmp_path / "token").write_text("abcdef.0123456789abcdef\n")
    bad, reason = unusable_file(tmp_path, kind)
    template, token = (
        (bad, tmp_path / "token") if key == "user_data_file" else (tmp_path / "template", bad)
    )
    expect_problem(tmp_path, user_data_files(tmp_path, template, token), f"{WORKERS}.{key}",
                   f"{bad} {reason}")  # fmt: skip


def test_every_unreadable_user_data_file_is_reported_together(tmp_path):
    data = user_data_files(tmp_path, tmp_path / "template", tmp_path / "token")
    data["node_groups"][1]["user_data_file"] = str(tmp_path / "gpu-template")
    path = write_config(tmp_path, data)
    assert problems(path) == [
        f"{path}: {WORKERS}.user_data_file: {tmp_path / 'template'} does not exist",
        f"{path}: {WORKERS}.user_data_vars.join_token: {tmp_path / 'token'} does not exist",
        f"{path}: {GPU}.user_data_file: {tmp_path / 'gpu-template'} does not exist",
    ]


def test_user_data_files_are_read_where_osas_runs_and_never_shown(tmp_path, monkeypatch):
    secret = "abcdef.0123456789abcdef"
    (tmp_path / "bootstrap").mkdir()
    (tmp_path / "bootstrap" / "template").write_text("#cloud-config\n# ${join_token}\n")
    (tmp_path / "bootstrap" / "token").write_text(secret)
    monkeypatch.chdir(tmp_path)
    relative = user_data_files(tmp_path, Path("bootstrap/template"), Path("bootstrap/token"))
    assert load(tmp_path, relative).node_groups[0].user_data_file == Path("bootstrap/template")
    (tmp_path / "bootstrap" / "template").write_bytes(b"\xff" + secret.encode())
    assert secret not in "\n".join(problems(write_config(tmp_path, relative)))


def test_a_configuration_for_another_machine_loads_without_its_files(tmp_path):
    """The chart's rendered configuration names the files of the pod's mounted Secret."""
    data = user_data_files(tmp_path, Path("/etc/osas/bootstrap/u"), Path("/etc/osas/bootstrap/t"))
    path = write_config(tmp_path, data)
    config = load_config(path, read_files=False)
    assert config.node_groups[0].user_data_file == Path("/etc/osas/bootstrap/u")
    with pytest.raises(ConfigError, match="/etc/osas/bootstrap/u does not exist"):
        load_config(path)


# --- several problems ------------------------------------------------------------------------


def test_several_problems_reported_together(tmp_path):
    data = config_data(cluster_name="Bad_Name", queue={"capacity": 0, "workers": 1})
    data["node_groups"][0]["flavour"] = "m1.large"
    data["node_groups"][1]["gpu"] = {"count": 0, "type": "nvidia-a100"}
    data["node_groups"][1]["options"] = {"scale_down_unneeded_time": "5 minutes"}
    path = write_config(tmp_path, data)
    lines = problems(path)
    expected = [
        ("cluster_name", NAME),
        ("queue.capacity", "greater than or equal to 1"),
        (f"{WORKERS}.flavour", "not a key osas knows here; did you mean flavor?"),
        (f"{GPU}.gpu.count", "greater than or equal to 1"),
        (f"{GPU}.options.scale_down_unneeded_time", "not a duration"),
    ]
    assert len(lines) == len(expected), lines
    for where, reason in expected:
        assert any(line.startswith(f"{path}: {where}: ") and reason in line for line in lines), (
            where,
            lines,
        )


# --- environment overrides -------------------------------------------------------------------


def test_env_overrides_nested_value(tmp_path, monkeypatch):
    monkeypatch.setenv("OSAS_QUEUE__CAPACITY", "7")
    config = load(tmp_path, config_data())
    assert config.queue.capacity == 7
    assert config.queue.workers == 2  # the rest of the block still comes from the file
    assert config.engine_settings().queue.capacity == 7


def test_env_overrides_top_level_value(tmp_path, monkeypatch):
    monkeypatch.setenv("OSAS_CLUSTER_NAME", "prod")
    config = load(tmp_path, config_data())
    assert config.cluster_name == "prod"
    assert config.cluster_spec().cluster_name == "prod"


def test_env_supplies_a_key_missing_from_the_file(tmp_path, monkeypatch):
    data = config_data()
    del data["cluster_name"]
    monkeypatch.setenv("OSAS_CLUSTER_NAME", "from-env")
    assert load(tmp_path, data).cluster_name == "from-env"


@pytest.mark.parametrize(
    ("env", "where", "reason"),
    [
        (("OSAS_QUEUE__WORKERS", "0"), "queue.workers", "greater than or equal to 1"),
        (
            ("OSAS_QUEUE__CAPACITYY", "7"),
            "queue.capacityy",
            "did you mean capacity? (from OSAS_QUEUE__CAPACITYY)",
        ),
        (("OSAS_CLUSTER_NAME", "Bad_Name"), "cluster_name", NAME),
        (("OSAS_INSECURE", "false"), "(top level)", "'tls' is required"),
    ],
)
def test_env_bad_value_is_reported(tmp_path, monkeypatch, env, where, reason):
    monkeypatch.setenv(*env)
    expect_problem(tmp_path, config_data(), where, reason)


def test_osas_config_variable_is_not_taken_for_a_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("OSAS_CONFIG", str(tmp_path / "osas.yaml"))
    assert load(tmp_path, config_data()).cluster_name == "testc"


@pytest.mark.parametrize(("name", "value"), [("OSAS_QUEUE", "{bad"), ("OSAS_GPU_TYPES", "a,b")])
def test_env_malformed_json_is_reported(tmp_path, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    path = write_config(tmp_path, config_data())
    assert problems(path)[0].startswith(f"{path}: ")


# --- what a valid file builds ----------------------------------------------------------------


def test_cluster_spec_from_valid_config(tmp_path):
    data = config_data(
        gpu_types=["nvidia-a100"],
        pricing={"cpu_per_hour": 0.02, "memory_gib_per_hour": 0.005, "gpu_per_hour": 1.5},
    )
    data["node_groups"][0].update(
        boot_volume={"size": 50, "type": "ssd"},
        metadata={"team": "infra"},
        security_groups=["default", "k8s"],
        key_name="ops",
        price_per_hour=0.1,
        max_pods=64,
        architecture="arm64",
    )
    data["node_groups"][1]["gpu"]["resource"] = "amd.com/gpu"
    spec = load(tmp_path, data).cluster_spec()

    assert spec.cluster_name == "testc"
    assert [g.group_id for g in spec.node_groups] == ["workers", "gpu"]
    assert spec.gpu_types == ("nvidia-a100",)
    assert spec.gpu_label == "nvidia.com/gpu.product"
    assert spec.pricing == Pricing(cpu_per_hour=0.02, memory_gib_per_hour=0.005, gpu_per_hour=1.5)

    workers = spec.group("workers")
    assert workers is not None
    assert (workers.min_size, workers.max_size) == (1, 10)
    assert (workers.flavor, workers.image) == ("m1.medium", "ubuntu-24.04")
    assert workers.networks == ("cluster-net",)
    assert workers.security_groups == ("default", "k8s")
    assert workers.key_name == "ops"
    assert workers.labels == {"pool": "workers"}
    assert workers.metadata == {"team": "infra"}
    assert workers.user_data == "#cloud-config\nhostname: ${server_name}\n"
    assert workers.boot_volume == BootVolume(size_gib=50, volume_type="ssd")
    assert workers.taints == ()
    assert workers.gpu is None
    assert workers.options.is_empty()
    assert workers.price_per_hour == 0.1
    assert workers.max_pods == 64
    assert workers.architecture == "arm64"

    gpu = spec.group("gpu")
    assert gpu is not None
    assert (gpu.min_size, gpu.max_size) == (0, 3)
    assert gpu.availability_zone == "az-1"
    assert gpu.gpu == GpuSpec(count=1, type="nvidia-a100", resource="amd.com/gpu")
    assert gpu.taints == (Taint("nvidia.com/gpu", "present", TaintEffect.NO_SCHEDULE),)
    assert gpu.options == OptionOverrides(
        scale_down_unneeded_time=timedelta(minutes=20), zero_or_max_node_scaling=True
    )
    assert gpu.boot_volume is None
    assert gpu.max_pods == 110
    assert gpu.architecture == "amd64"


@pytest.mark.parametrize(
    ("region", "provider_id"),
    [("", f"openstack:///{SERVER_UUID}"), ("RegionOne", f"openstack://RegionOne/{SERVER_UUID}")],
)
def test_provider_id_format(tmp_path, region, provider_id):
    spec = load(tmp_path, config_data(provider_id_region=region)).cluster_spec()
    assert spec.provider_ids.format(SERVER_UUID) == provider_id
    assert spec.provider_ids.parse(provider_id) == SERVER_UUID


def test_engine_settings_from_valid_config(tmp_path):
    settings = load(tmp_path, config_data()).engine_settings()
    assert settings == EngineSettings(
        queue=QueueSettings(capacity=50, workers=2),
        reconcile=ReconcileSettings(
            interval=3600.0,
            full_resync_interval=3600.0,
            max_inventory_age=7200.0,
            retry_backoff=0.01,
            hold_after_start=False,
        ),
    )


def test_engine_settings_defaults(tmp_path):
    data = config_data()
    del data["reconcile"], data["queue"]
    settings = load(tmp_path, data).engine_settings()
    assert (settings.queue.capacity, settings.queue.workers) == (1000, 10)
    assert settings.reconcile.interval == 10.0
    assert settings.reconcile.full_resync_interval == 1800.0
    assert settings.reconcile.max_inventory_age == 180.0
    assert settings.reconcile.retry_backoff == 1.0
    assert settings.reconcile.hold_after_start


# What the file offers and the value it becomes are built from one list of names: a key added to
# one side only, or a name that differs, fails here instead of being dropped on the way.
VALUE_CLASSES = [
    (schema.NodeGroupConfig, NodeGroupSpec, set()),
    (schema.BootVolumeConfig, BootVolume, set()),
    (schema.TaintConfig, Taint, set()),
    (schema.GpuConfig, GpuSpec, set()),
    (schema.OptionsConfig, OptionOverrides, set()),
    (schema.PricingConfig, Pricing, set()),
    # Fixed by what CA accepts (4 MiB), not a setting.
    (schema.TransportConfig, TransportSettings, {"max_message_bytes"}),
    # The backoff follows reconcile.retry_backoff; the rest are the adapter's own.
    (schema.OpenStackConfig, OpenStackSettings, {"backoff", "backoff_max", "resolve_ttl"}),
    (schema.TlsConfig, TlsFiles, set()),
    (schema.QueueConfig, QueueSettings, {"delete_attempts"}),
    # What the pod is (downward API) and the port CA is served on: not the file's to say.
    (
        schema.LeaderElectionConfig,
        ElectionSettings,
        {"endpoint_port", "endpoint_port_name", "pod_ip", "node_name"},
    ),
]
# The ledger's own memory and attempts: not settings an operator needs.
LEDGER_OWN = {"create_attempts", "removed_memory", "given_up_memory"}
# Blocks that feed several value classes: each field of each class is offered by the block
# (or named here as the class's own), and every key of the block lands in one of them.
SHARED_BLOCKS = [
    (
        schema.ReconcileConfig,
        [(ReconcileSettings, {"changes_since_overlap"}), (LedgerSettings, LEDGER_OWN)],
    ),
    (
        schema.OsasConfig,
        [
            (ClusterSpec, set()),
            (ServerSettings, set()),
            (EngineSettings, set()),
        ],
    ),
]


# Keys that become no field of the value class: where a group lives is resolved, across the
# groups, into places (osas.config.places), not carried by the group's spec.
RESOLVED_ELSEWHERE = {schema.NodeGroupConfig: {"openstack"}}


@pytest.mark.parametrize(("model", "value", "not_offered"), VALUE_CLASSES)
def test_file_keys_and_value_fields_are_one_list(model, value, not_offered):
    fields = {item.name for item in dataclasses.fields(value) if item.init}
    assert set(model.model_fields) - RESOLVED_ELSEWHERE.get(model, set()) <= fields
    assert fields - set(model.model_fields) == not_offered


@pytest.mark.parametrize(("model", "values"), SHARED_BLOCKS)
def test_a_block_feeding_several_value_classes_names_fields_alike(model, values):
    offered = set(model.model_fields)
    landed: set[str] = set()
    for value, own in values:
        fields = {item.name for item in dataclasses.fields(value) if item.init}
        assert fields - offered == own, value
        landed |= fields & offered
    if model is schema.ReconcileConfig:
        assert landed == offered  # nothing of the block is dropped on the way


def test_defaults_are_the_value_classes_own(tmp_path):
    """A file that sets nothing optional gives exactly the defaults the engine, ledger, cloud,
    server and domain classes declare: each default is written once."""
    data = config_data()
    for key in ("reconcile", "queue", "shutdown_grace", "openstack", "transport"):
        data.pop(key, None)
    group = {key: data["node_groups"][0][key] for key in ("id", "min_size", "max_size")}
    data["node_groups"] = [{**group, "flavor": "f", "image": "i", "networks": ["n"]}]
    loaded = load(tmp_path, data)
    engine = EngineSettings()
    assert loaded.engine_settings() == engine
    assert loaded.ledger_settings() == LedgerSettings()
    assert loaded.openstack_settings() == OpenStackSettings(backoff=engine.reconcile.retry_backoff)
    server = loaded.server_settings()
    assert server.transport == TransportSettings()
    defaults = {item.name: item.default for item in dataclasses.fields(ServerSettings)}
    assert server.shutdown_grace == defaults["shutdown_grace"]
    spec = loaded.cluster_spec()
    assert spec.gpu_label == ClusterSpec(cluster_name="c", node_groups=()).gpu_label
    assert spec.node_groups[0] == NodeGroupSpec(
        group_id=group["id"],
        min_size=group["min_size"],
        max_size=group["max_size"],
        flavor="f",
        image="i",
        networks=("n",),
    )


def test_server_settings_plaintext(tmp_path):
    settings = load(tmp_path, config_data()).server_settings()
    assert settings == ServerSettings(
        listen="127.0.0.1:0", health_listen="127.0.0.1:0", tls=None, shutdown_grace=5.0
    )


def test_server_settings_tls(tmp_path):
    data = config_data(insecure=False, tls=TLS, listen="0.0.0.0:8086", health_listen="0.0.0.0:8087")
    settings = load(tmp_path, data).server_settings()
    assert settings == ServerSettings(
        listen="0.0.0.0:8086",
        health_listen="0.0.0.0:8087",
        tls=TlsFiles(Path("/tls/tls.crt"), Path("/tls/tls.key"), Path("/tls/ca.crt")),
        shutdown_grace=5.0,
    )


# --- secrets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "other"),
    [
        ("password", {"username": "osas"}),
        ("application_credential_secret", {"application_credential_id": "cred"}),
    ],
)
def test_openstack_secrets_are_hidden(tmp_path, key, other):
    secret = "hunter2-very-secret"
    auth = {"auth_url": "https://keystone:5000/v3", key: secret, **other}
    config = load(tmp_path, config_data(openstack={"auth": auth}))
    stored = getattr(config.openstack.auth, key)
    assert stored == secret
    assert secret not in repr(config)
    assert secret not in str(config)
    assert secret not in repr(config.openstack)


# --- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def no_start(monkeypatch):
    """Fail the test if `osas serve` gets as far as building the app."""
    started: list[object] = []

    def refuse(*args: object) -> None:
        started.append(args)
        raise AssertionError("osas serve started despite a bad configuration")

    monkeypatch.setattr(osas.cli.serve, "App", refuse)
    return started


def test_cli_serve_with_bad_config_exits_2(tmp_path, capsys, restore_logging, no_start):
    path = write_config(tmp_path, config_data(queue={"capacity": 50, "workers": 0}))
    assert osas.cli.main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err
    assert f"{path}: queue.workers: Input should be greater than or equal to 1" in err
    assert no_start == []


def test_cli_serve_with_missing_file_exits_2(tmp_path, capsys, restore_logging, no_start):
    path = tmp_path / "nope.yaml"
    assert osas.cli.main(["serve", "--config", str(path)]) == 2
    assert f"{path}: cannot read" in capsys.readouterr().err
    assert no_start == []


def test_cli_serve_reads_osas_config_variable(
    tmp_path, capsys, monkeypatch, restore_logging, no_start
):
    path = write_config(tmp_path, config_data(cluster_name="Bad_Name"))
    monkeypatch.setenv("OSAS_CONFIG", str(path))
    assert osas.cli.main(["serve"]) == 2
    assert f"{path}: cluster_name: 'Bad_Name' is not a name of" in capsys.readouterr().err
    assert no_start == []


def test_cli_serve_without_config_exits_2(capsys, restore_logging, no_start):
    assert osas.cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "--config" in err
    assert "OSAS_CONFIG" in err
    assert no_start == []


def test_a_file_of_an_earlier_release_with_cloud_backend_still_loads(tmp_path):
    """``cloud_backend`` is retired: ``openstack`` (all it ever meant in production) still
    loads; ``fake``, which pointed osas at an in-memory cloud, is refused and says why."""
    assert load(tmp_path, config_data(cloud_backend="openstack")).cloud_backend == "openstack"
    with pytest.raises(ConfigError, match="'fake' is no longer offered") as refused:
        load(tmp_path, config_data(cloud_backend="fake"))
    assert "remove cloud_backend" in str(refused.value)


# -- warm pools (issue 36) -----------------------------------------------------------------------

WARM_USER_DATA = "#cloud-config\n"


def test_a_warm_pool_loads_with_its_defaults(tmp_path):
    config = load(tmp_path, group(user_data=WARM_USER_DATA, warm_pool={}))
    spec = config.cluster_spec().node_groups[0]
    assert spec.warm_pool is not None
    assert spec.warm_pool.size is None  # up to max_size - target
    assert spec.warm_pool.state.value == "shutoff"
    assert spec.warm_pool.start_timeout == 120.0
    config = load(
        tmp_path,
        group(
            user_data=WARM_USER_DATA,
            warm_pool={"size": 2, "state": "shelved_offloaded", "max_age": "24h"},
        ),
    )
    pool = config.cluster_spec().node_groups[0].warm_pool
    assert pool is not None
    assert (pool.size, pool.state.value, pool.max_age) == (2, "shelved_offloaded", 86400.0)
    assert load(tmp_path, group()).cluster_spec().node_groups[0].warm_pool is None


def test_a_warm_pool_larger_than_max_size_is_refused(tmp_path):
    data = group(user_data=WARM_USER_DATA, max_size=3, warm_pool={"size": 4})
    expect_problem(tmp_path, data, WORKERS, "warm_pool.size 4 is greater than max_size 3")


def test_a_warm_pool_needs_user_data_that_prepares_and_stops(tmp_path):
    data = group(warm_pool={"size": 1})
    del data["node_groups"][0]["user_data"]
    expect_problem(tmp_path, data, WORKERS, "warm_pool needs user data")


def test_a_warm_pool_of_an_unknown_state_is_refused(tmp_path):
    data = group(user_data=WARM_USER_DATA, warm_pool={"state": "hibernated"})
    lines = problems(write_config(tmp_path, data))
    assert any("warm_pool.state" in line for line in lines), lines


def test_a_warm_pool_group_takes_its_token_from_metadata_not_user_data(tmp_path):
    """With warm_pool the token is minted per claim and reaches the node in its metadata: a
    template saying ${bootstrap_token} would be prepared with none."""
    data = group(
        user_data="#cloud-config\n# ${bootstrap_token}\n",
        bootstrap_token={"ttl": "30m"},
        warm_pool={"size": 1},
    )
    expect_problem(tmp_path, data, WORKERS, "must not say ${bootstrap_token}")
    fine = group(user_data=WARM_USER_DATA, bootstrap_token={"ttl": "30m"}, warm_pool={"size": 1})
    assert load(tmp_path, fine).cluster_spec().node_groups[0].bootstrap_token is not None


@pytest.mark.parametrize(
    "key", ["osas-warm-state", "osas-claimed", "osas-join-token", "osas-node-labels-2"]
)
def test_the_warm_pool_metadata_keys_are_reserved(tmp_path, key):
    expect_problem(tmp_path, group(metadata={key: "x"}), WORKERS, "ownership marks")
