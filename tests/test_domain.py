"""Unit tests of the pure domain layer: ids, ownership, inventory, the ledger, sizing plans,
templates, options and prices. Everything here is a plain value; no I/O, no mocks, fake monotonic
time."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from osas.domain.errors import (
    InvalidRequest,
    NodeGroupNotFound,
    NodeNotFound,
    NotSupported,
    PreconditionFailed,
)
from osas.domain.ids import (
    NamedNode,
    PlaceholderNode,
    ProviderIdFormat,
    ServerNode,
    parse_node,
    parse_placeholder_id,
    placeholder_id,
)
from osas.domain.inventory import Instance, InstanceState, Inventory
from osas.domain.ledger import (
    IN_DOUBT_CODE,
    Created,
    CreateState,
    DecreasePlan,
    DeleteOrder,
    DeleteOutcome,
    DeletePlan,
    DeleteReason,
    EventKind,
    InDoubt,
    LedgerSettings,
    NotSent,
    Orders,
    Refused,
)
from osas.domain.limits import (
    MAX_ANNOTATIONS_BYTES,
    MAX_KEY_LENGTH,
    MAX_LABEL_VALUE_LENGTH,
    MAX_MAP_ENTRIES,
    MAX_NODE_ID_LENGTH,
    CheckedNodes,
    NodeInfo,
    check_node,
)
from osas.domain.options import AutoscalingOptions, group_options
from osas.domain.pricing import effective_requests, node_price, parse_quantity, pod_price
from osas.domain.promises import Promises
from osas.domain.quota import Allowance, ProjectQuota
from osas.domain.servers import (
    META_CLUSTER,
    META_GROUP,
    META_REQUEST,
    ErrorClass,
    ErrorInfo,
    Fault,
    Flavor,
    OwnershipMarks,
    Server,
    ServerRecord,
    classify_fault,
    epoch_seconds,
    server_name,
)
from osas.domain.sizing import IncreasePlan, plan_decrease, plan_delete, plan_increase
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
from osas.domain.template import build_template

CLUSTER = "prod"
IDS = ProviderIdFormat()
# Fixed ids for parametrised cases; builders use fresh uuid4 values.
UUID = "0b7c7d4e-5a1f-4c3b-9d2e-8f6a1b2c3d4e"
REQ = "5f0e3c2a9b8d4e7fa1b2c3d4e5f60718"
QUOTA = ErrorInfo("QuotaExceeded", "Quota exceeded for instances", ErrorClass.OUT_OF_RESOURCES)
UNREACHABLE = ErrorInfo("ConnectFailure", "connection refused", ErrorClass.OTHER)


# -- builders -------------------------------------------------------------------------------------


def node_group(
    group_id: str = "workers", min_size: int = 0, max_size: int = 10, **kw
) -> NodeGroupSpec:
    return NodeGroupSpec(
        group_id=group_id,
        min_size=min_size,
        max_size=max_size,
        flavor="m1.medium",
        image="ubuntu-24.04",
        networks=("cluster-net",),
        **kw,
    )


def cluster(*groups: NodeGroupSpec, **kw) -> ClusterSpec:
    return ClusterSpec(
        CLUSTER, groups or (node_group("workers"), node_group("gpu", max_size=3)), **kw
    )


def server(
    group: str = "workers",
    status: str = "ACTIVE",
    *,
    name: str | None = None,
    task_state: str | None = None,
    request_id: str | None = None,
    fault: Fault | None = None,
    server_id: str | None = None,
    created: str = "",  # as Nova writes it
) -> Server:
    server_id = server_id or str(uuid.uuid4())
    return Server(
        server_id=server_id,
        name_stem=name or f"{CLUSTER}-{group}-{server_id[:8]}",
        group_id=group,
        status=status,
        task_state=task_state,
        request_id=request_id,
        fault=fault,
        created=epoch_seconds(created),
    )


def rid() -> str:
    return uuid.uuid4().hex


NOW = 100.0  # the fake monotonic clock most tests run at


def pid(srv: Server, ids: ProviderIdFormat = IDS) -> str:
    return ids.format(srv.server_id)


def fake_node(instance_id: str) -> tuple[str, str]:
    """A node as CA fakes it for DeleteNodes: name == provider id == instance id."""
    return (instance_id, instance_id)


def settle_full(inv: Inventory, generation: int, listed, now: float) -> Orders:
    """A complete listing begun at ``generation`` that showed exactly ``listed``, settled as the
    reconciler settles one: by its difference from the snapshot."""
    listed = list(listed)
    shown = {server.server_id for server in listed}
    gone = [server_id for server_id in inv.snapshot.ids() if server_id not in shown]
    return inv.ledger.settle_complete(generation, listed, gone, now)


def full_sync(inv: Inventory, *servers: Server, now: float = 100.0) -> Orders:
    """A complete listing, begun now and settled at once."""
    return settle_full(inv, inv.ledger.begin_sync(), servers, now)


def changes(
    inv: Inventory, changed: list[Server], gone: list[str] | None = None, now: float = 100.0
) -> Orders:
    """An incremental listing, begun now and settled at once."""
    return inv.ledger.settle_changes(inv.ledger.begin_sync(), changed, gone or [], now)


def inventory(
    spec: ClusterSpec | None = None,
    *servers: Server,
    now: float = 100.0,
    settings: LedgerSettings | None = None,
) -> Inventory:
    inv = Inventory(spec or cluster(), settings)
    full_sync(inv, *servers, now=now)
    return inv


def queued(inv: Inventory, group_id: str = "workers", now: float = NOW) -> str:
    (request_id,) = inv.ledger.accept_creates(group_id, 1, now)
    return request_id


def sending(inv: Inventory, group_id: str = "workers") -> str:
    request_id = queued(inv, group_id)
    assert inv.ledger.take_create(request_id) is not None
    return request_id


def created(inv: Inventory, group_id: str = "workers") -> tuple[str, Server]:
    request_id = sending(inv, group_id)
    srv = server(group_id, "BUILD", request_id=request_id)
    inv.ledger.finish_create(request_id, Created(srv), NOW)
    return request_id, srv


def failed(inv: Inventory, group_id: str = "workers", error: ErrorInfo = QUOTA) -> str:
    request_id = sending(inv, group_id)
    inv.ledger.finish_create(request_id, Refused(error), NOW)
    return request_id


def in_doubt(inv: Inventory, group_id: str = "workers", now: float = NOW) -> str:
    request_id = sending(inv, group_id)
    inv.ledger.finish_create(request_id, InDoubt("read timeout"), now)
    return request_id


def mark(inv: Inventory, *server_ids: str, group_id: str = "workers", now: float = 101.0) -> Orders:
    """CA's DeleteNodes of listed servers, accepted."""
    return inv.ledger.accept_delete(DeletePlan(group_id, servers=server_ids), now)


def give_up(
    inv: Inventory, request_id: str, group_id: str = "workers", now: float = 101.0
) -> Orders:
    """CA's DeleteNodes of the placeholder of a create being sent or in doubt, accepted."""
    return inv.ledger.accept_delete(DeletePlan(group_id, give_ups=(request_id,)), now)


def cancel(inv: Inventory, request_id: str, now: float = 101.0) -> Orders:
    """CA's DecreaseTargetSize of a queued create, accepted."""
    return inv.ledger.accept_decrease(DecreasePlan(failures=(), cancels=(request_id,)), now)


def remove_failure(
    inv: Inventory, request_id: str, group_id: str = "workers", now: float = 101.0
) -> Orders:
    """CA's DeleteNodes of the placeholder of a failed create, accepted."""
    return inv.ledger.accept_delete(DeletePlan(group_id, failures=(request_id,)), now)


def state(inv: Inventory, request_id: str) -> CreateState | None:
    create = inv.ledger.create(request_id)
    return None if create is None else create.state


def by_id(instances: list[Instance]) -> dict[str, Instance]:
    return {instance.instance_id: instance for instance in instances}


# -- ids ------------------------------------------------------------------------------------------


def test_provider_id_round_trip_default_form():
    server_id = str(uuid.uuid4())
    assert IDS.format(server_id) == f"openstack:///{server_id}"
    assert IDS.parse(IDS.format(server_id)) == server_id


def test_provider_id_round_trip_regional_form():
    ids = ProviderIdFormat("RegionOne")
    server_id = str(uuid.uuid4())
    assert ids.format(server_id) == f"openstack://RegionOne/{server_id}"
    assert ids.parse(f"openstack://RegionOne/{server_id}") == server_id
    # Each form only accepts itself: one is configured, and used both ways.
    assert ids.parse(f"openstack:///{server_id}") is None
    assert IDS.parse(f"openstack://RegionOne/{server_id}") is None


@pytest.mark.parametrize(
    "provider_id",
    [
        f"openstack://RegionTwo/{UUID}",
        f"openstack://regionone/{UUID}",
        f"openstack://RegionOne2/{UUID}",
        f"openstack:///{UUID}",
        "openstack://RegionOne/not-a-uuid",
        "openstack://RegionOne/i-0123456789abcdef0",
        f"openstack://RegionOne/{UUID.replace('-', '')}",
        f"openstack://RegionOne/{UUID.upper()}",
        f"openstack://RegionOne/{UUID}x",
        f"openstack://RegionOne/{UUID}/",
        f"openstack://RegionOne/{UUID} ",
        f"openstack://RegionOne/{UUID}/{UUID}",
        f" openstack://RegionOne/{UUID}",
        f"aws://RegionOne/{UUID}",
        f"OPENSTACK://RegionOne/{UUID}",
        "openstack://RegionOne/",
        "",
    ],
)
def test_regional_provider_id_rejects(provider_id):
    assert ProviderIdFormat("RegionOne").parse(provider_id) is None


@pytest.mark.parametrize(
    "provider_id",
    [
        f"openstack://RegionOne/{UUID}",
        f"openstack:////{UUID}",
        f"openstack:///{UUID.upper()}",
        f"openstack:///{UUID[:-1]}",
        f"openstack:///{UUID}0",
        f"openstack:///{UUID}?x=1",
        f"gce:///{UUID}",
        UUID,
    ],
)
def test_default_provider_id_rejects(provider_id):
    assert IDS.parse(provider_id) is None


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(f"openstack:///{UUID}\n", id="provider-id"),
        pytest.param(f"osas://workers/{REQ}\n", id="placeholder"),
    ],
)
def test_ids_reject_trailing_newline(value):
    assert IDS.parse(value) is None
    assert parse_placeholder_id(value) is None


def test_placeholder_id_round_trip():
    request_id = rid()
    value = placeholder_id("workers", request_id)
    assert value == f"osas://workers/{request_id}"
    assert parse_placeholder_id(value) == ("workers", request_id)


@pytest.mark.parametrize(
    "value",
    [
        "osas://workers",
        f"osas://workers{REQ}",
        f"osas:///{REQ}",
        f"osas://Workers/{REQ}",
        f"osas://-workers/{REQ}",
        f"osas://work_ers/{REQ}",
        f"osas://{'a' * 41}/{REQ}",
        f"osas://workers/{REQ[:-1]}",
        f"osas://workers/{REQ}0",
        f"osas://workers/{REQ.upper()}",
        f"osas://workers/{UUID}",
        f"osas://workers/{REQ}/x",
        f"osas://workers/{'g' * 32}",
        f"osas:/workers/{REQ}",
        f"openstack:///{UUID}",
        "",
    ],
)
def test_placeholder_id_rejects(value):
    assert parse_placeholder_id(value) is None


def test_parse_node_server():
    server_id = str(uuid.uuid4())
    provider_id = IDS.format(server_id)
    assert parse_node("node-1", provider_id, IDS) == ServerNode(server_id)
    # CA's fake nodes carry the instance id as both name and provider id.
    assert parse_node(provider_id, provider_id, IDS) == ServerNode(server_id)


def test_parse_node_regional_server():
    ids = ProviderIdFormat("RegionOne")
    server_id = str(uuid.uuid4())
    assert parse_node("n", f"openstack://RegionOne/{server_id}", ids) == ServerNode(server_id)
    with pytest.raises(InvalidRequest):
        parse_node("n", f"openstack:///{server_id}", ids)


def test_parse_node_placeholder():
    request_id = rid()
    value = placeholder_id("gpu", request_id)
    assert parse_node(value, value, IDS) == PlaceholderNode("gpu", request_id)


def test_parse_node_name_only():
    assert parse_node("prod-workers-abc", "", IDS) == NamedNode("prod-workers-abc")


@pytest.mark.parametrize(
    "provider_id",
    [
        "aws:///us-east-1a/i-0123456789abcdef0",
        f"openstack:///{UUID.upper()}",
        "openstack:///not-a-uuid",
        f"osas://workers/{REQ[:10]}",
        "osas://nope",
    ],
)
def test_parse_node_malformed_provider_id(provider_id):
    with pytest.raises(InvalidRequest):
        parse_node("node-1", provider_id, IDS)


def test_parse_node_length_limits():
    provider_id = IDS.format(str(uuid.uuid4()))
    assert parse_node("a" * MAX_NODE_ID_LENGTH, "", IDS) == NamedNode("a" * MAX_NODE_ID_LENGTH)
    with pytest.raises(InvalidRequest):
        parse_node("a" * (MAX_NODE_ID_LENGTH + 1), provider_id, IDS)
    with pytest.raises(InvalidRequest):
        parse_node("node-1", provider_id + "x" * MAX_NODE_ID_LENGTH, IDS)
    with pytest.raises(InvalidRequest):
        parse_node("a" * 10_000, "", IDS)


def test_parse_node_both_empty():
    with pytest.raises(InvalidRequest):
        parse_node("", "", IDS)


# -- ownership ------------------------------------------------------------------------------------


def record(
    *,
    metadata: dict[str, str] | None = None,
    tags: set[str] | None = None,
    status: str = "active",
    task_state: str | None = None,
    fault: Fault | None = None,
) -> ServerRecord:
    marks = OwnershipMarks(CLUSTER)
    return ServerRecord(
        server_id=str(uuid.uuid4()),
        name="prod-workers-0123456789",
        status=status,
        metadata=marks.metadata("workers", REQ) if metadata is None else metadata,
        tags=frozenset(marks.tags(REQ) if tags is None else tags),
        task_state=task_state,
        fault=fault,
    )


@pytest.mark.parametrize(
    ("created", "seconds"),
    [
        pytest.param("2026-01-02T03:04:05Z", 1767323045.0, id="utc"),
        pytest.param("2026-01-02T03:04:05", 1767323045.0, id="no-zone-is-utc"),
        pytest.param("2026-01-02T04:04:05+01:00", 1767323045.0, id="offset"),
        pytest.param("", None, id="none"),
        pytest.param("yesterday", None, id="not-a-time"),
    ],
)
def test_a_claim_keeps_novas_created_time_as_seconds(created: str, seconds: float | None):
    claimed = OwnershipMarks(CLUSTER).claim(dataclasses.replace(record(), created=created))
    assert claimed is not None
    assert claimed.created == seconds


def test_claim_server_with_all_marks():
    fault = Fault(500, "boom")
    rec = record(status="active", task_state="deleting", fault=fault)
    claimed = OwnershipMarks(CLUSTER).claim(rec)
    assert claimed == Server(
        server_id=rec.server_id,
        name_stem=rec.name,
        group_id="workers",
        status="ACTIVE",
        task_state="deleting",
        request_id=REQ,
        fault=fault,
    )


def test_a_name_osas_gives_is_kept_as_one_stem_per_group_and_any_other_name_whole():
    """The names osas gives (cluster, group, the request id's start) share one stem string
    per group; a name given by anyone else, or renamed by hand, is kept as it is."""
    marks = OwnershipMarks(CLUSTER)
    given = [
        marks.claim(
            dataclasses.replace(
                record(metadata=marks.metadata("workers", r), tags=set(marks.tags(r))),
                name=server_name(CLUSTER, "workers", r),
            )
        )
        for r in (rid(), rid())
    ]
    assert all(s is not None and s.name_given for s in given)
    first, second = given
    assert first is not None
    assert second is not None
    assert first.name_stem is second.name_stem
    assert first.name == server_name(CLUSTER, "workers", first.request_id or "")
    for name in ("by-hand", "prod-workers-", "prod-workers-0123456789x", "prod-gpu-0123456789"):
        claimed = marks.claim(dataclasses.replace(record(), name=name))
        assert claimed is not None
        assert (claimed.name, claimed.name_stem, claimed.name_given) == (name, name, False)
    # Listed again unchanged: the same object; renamed by hand: a new one, with its name.
    shown = dataclasses.replace(record(), name=server_name(CLUSTER, "workers", REQ))
    listed = marks.claim(shown)
    assert listed is not None
    assert listed.name_given
    assert marks.claim(dataclasses.replace(shown, metadata=dict(shown.metadata)), listed) is listed
    renamed = marks.claim(dataclasses.replace(shown, name="by-hand"), listed)
    assert renamed is not None
    assert renamed is not listed
    assert (renamed.name, renamed.name_given) == ("by-hand", False)


def test_marks_written_on_create_are_the_ones_claimed():
    marks = OwnershipMarks(CLUSTER)
    assert marks.metadata("gpu", REQ) == {
        META_CLUSTER: CLUSTER,
        META_GROUP: "gpu",
        META_REQUEST: REQ,
    }
    assert marks.tags(REQ) == [f"osas-cluster={CLUSTER}", f"osas-request={REQ}"]
    claimed = marks.claim(record(metadata=marks.metadata("gpu", REQ)))
    assert claimed is not None
    assert claimed.group_id == "gpu"


def test_claim_without_request_id_still_ours():
    claimed = OwnershipMarks(CLUSTER).claim(
        record(metadata={META_CLUSTER: CLUSTER, META_GROUP: "workers"})
    )
    assert claimed is not None
    assert claimed.request_id is None


_IDS = (str(uuid.uuid4()), str(uuid.uuid4()))
# Nova sets a server's ``created`` once: each id has its own, none for the second.
_CREATED = {_IDS[0]: "2026-01-01T00:00:00Z", _IDS[1]: ""}


@st.composite
def listed(draw: st.DrawFn) -> ServerRecord:
    """A record of one of two servers, each field from a few values (equal faults as distinct
    objects too): two draws often agree on all but one field."""
    group = draw(st.sampled_from(["workers", "gpu"]))
    request = draw(st.sampled_from([REQ, "r-other", None]))
    metadata = {META_CLUSTER: CLUSTER, META_GROUP: group}
    if request is not None:
        metadata[META_REQUEST] = request
    server_id = draw(st.sampled_from(_IDS))
    return ServerRecord(
        server_id=server_id,
        name=draw(st.sampled_from(["prod-workers-1", "prod-workers-2"])),
        status=draw(st.sampled_from(["active", "ACTIVE", "BUILD", "ERROR"])),
        metadata=metadata,
        tags=frozenset(OwnershipMarks(CLUSTER).tags(REQ)),
        task_state=draw(st.sampled_from([None, "deleting", "spawning"])),
        fault=draw(
            st.sampled_from([None, "boom", "boom", "gone"]).map(
                lambda text: None if text is None else Fault(500, text)
            )
        ),
        created=_CREATED[server_id],
    )


@given(listed(), listed())
def test_a_claim_hands_back_the_known_server_exactly_when_nothing_changed(before, now):
    """What the inventory holds comes back for a record that shows it as it is, and a new
    server for one that shows any change: the same server either way."""
    marks = OwnershipMarks(CLUSTER)
    known = marks.claim(before)
    assert known is not None
    fresh = marks.claim(now)
    claimed = marks.claim(now, known)
    assert claimed == fresh
    assert (claimed is known) == (fresh == known)


def test_a_claim_refuses_a_record_without_marks_whatever_is_known():
    marks = OwnershipMarks(CLUSTER)
    rec = record(fault=Fault(500, "boom"))
    known = marks.claim(rec)
    again = dataclasses.replace(rec, fault=Fault(500, "boom"))  # listed again: new objects
    assert marks.claim(again, known) is known
    unmarked = dataclasses.replace(rec, tags=frozenset())
    assert marks.claim(unmarked, known) is None


@pytest.mark.parametrize(
    ("metadata", "tags"),
    [
        pytest.param({META_CLUSTER: "other", META_GROUP: "workers"}, None, id="other-cluster"),
        pytest.param(
            {META_CLUSTER: "other", META_GROUP: "workers"},
            {"osas-cluster=other"},
            id="other-cluster-fully",
        ),
        pytest.param({META_CLUSTER: "prod-2", META_GROUP: "workers"}, None, id="lookalike-meta"),
        pytest.param({META_CLUSTER: "Prod", META_GROUP: "workers"}, None, id="case-meta"),
        pytest.param({META_CLUSTER: "pro", META_GROUP: "workers"}, None, id="prefix-meta"),
        pytest.param(None, set(), id="no-tags"),
        pytest.param(None, {f"osas-request={REQ}"}, id="missing-cluster-tag"),
        pytest.param(None, {"osas-cluster=production"}, id="lookalike-tag"),
        pytest.param(None, {"osas-cluster=prod-2"}, id="lookalike-tag-2"),
        pytest.param(None, {"osas-cluster="}, id="empty-tag"),
        pytest.param(None, {"prod"}, id="bare-name-tag"),
        pytest.param({META_CLUSTER: CLUSTER}, None, id="missing-group"),
        pytest.param({META_CLUSTER: CLUSTER, META_GROUP: ""}, None, id="empty-group"),
        pytest.param({META_GROUP: "workers"}, None, id="missing-cluster-meta"),
        pytest.param({}, None, id="no-metadata"),
        pytest.param({"cluster": CLUSTER, "node-group": "workers"}, None, id="lookalike-meta-keys"),
    ],
)
def test_claim_refuses(metadata, tags):
    assert OwnershipMarks(CLUSTER).claim(record(metadata=metadata, tags=tags)) is None


def test_claim_ignores_name_that_looks_like_ours():
    rec = ServerRecord(
        server_id=str(uuid.uuid4()),
        name=f"{CLUSTER}-workers-0123456789",
        status="ACTIVE",
        metadata={},
        tags=frozenset(),
    )
    assert OwnershipMarks(CLUSTER).claim(rec) is None


# -- faults ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("No valid host was found. There are not enough hosts available.", "NoValidHost"),
        ("NO VALID HOST was found", "NoValidHost"),
        (
            "Quota exceeded for cores: Requested 8, but already used 96 of 100 cores",
            "QuotaExceeded",
        ),
        ("Quota exceeded for instances", "QuotaExceeded"),
        ("Maximum number of ports exceeded; exceeded maximum number of ports", "QuotaExceeded"),
        (
            (
                "Build of instance 1b2c aborted: VolumeLimitExceeded: Maximum number of volumes "
                "allowed (10) exceeded for quota 'volumes'."
            ),
            "QuotaExceeded",
        ),
        (
            (
                "Build of instance 1b2c aborted: VolumeSizeExceedsAvailableQuota: Requested volume "
                "or snapshot exceeds allowed gigabytes quota. Requested 20G, quota is 50G and 40G "
                "has been consumed."
            ),
            "QuotaExceeded",
        ),
        ("The number of defined ports: 2 is over the limit: 1", "QuotaExceeded"),
    ],
)
def test_classify_fault_out_of_resources(message, code):
    info = classify_fault(Fault(500, message))
    assert info == ErrorInfo(code, message, ErrorClass.OUT_OF_RESOURCES)
    assert info.error_class == 1


@pytest.mark.parametrize(
    "message",
    ["Build of instance aborted: Failed to allocate the network(s)", "Image not found", ""],
)
def test_classify_fault_other(message):
    info = classify_fault(Fault(500, message))
    assert info.error_class is ErrorClass.OTHER
    assert info.error_class == 99
    assert info.code  # CA ignores error info whose code is empty
    assert info.code not in {"NoValidHost", "QuotaExceeded"}
    assert info.message == message


def test_classify_no_fault():
    info = classify_fault(None)
    assert info.error_class is ErrorClass.OTHER
    assert info.code


# -- target size ----------------------------------------------------------------------------------


def test_target_size_counts_servers_creates_and_failures():
    marked = server()
    spec = cluster()
    inv = inventory(
        spec,
        server(),
        server(),
        server(status="BUILD"),
        server(status="ERROR"),
        server(task_state="deleting"),
        server(status="SOFT_DELETED"),
        marked,
        server("gpu"),
    )
    assert inv.target_size("workers") == 5
    mark(inv, marked.server_id)
    assert inv.target_size("workers") == 4
    queued(inv)
    sending(inv)
    created(inv)
    assert inv.target_size("workers") == 7
    failed(inv)
    assert inv.target_size("workers") == 8
    in_doubt(inv)
    assert inv.target_size("workers") == 9
    given_up = sending(inv)
    give_up(inv, given_up)
    assert inv.target_size("workers") == 9
    assert inv.target_size("gpu") == 1
    assert inv.target_size("nope") == 0


def test_target_size_does_not_count_a_listed_create_twice():
    inv = inventory()
    _, srv = created(inv)
    assert inv.target_size("workers") == 1
    full_sync(inv, srv)
    assert inv.target_size("workers") == 1


# -- instances ------------------------------------------------------------------------------------


def test_instances_states():
    build, active, error, marked = (
        server(status="BUILD"),
        server(),
        server(status="ERROR", fault=Fault(500, "No valid host was found.")),
        server(),
    )
    task_deleting = server(task_state="deleting")
    shutoff = server(status="SHUTOFF")
    inv = inventory(None, build, active, error, marked, task_deleting, shutoff, server("gpu"))
    mark(inv, marked.server_id, error.server_id)
    got = by_id(inv.instances("workers"))
    assert len(got) == 6
    assert got[pid(build)] == Instance(pid(build), InstanceState.CREATING)
    assert got[pid(active)] == Instance(pid(active), InstanceState.RUNNING)
    assert got[pid(marked)] == Instance(pid(marked), InstanceState.DELETING)
    assert got[pid(task_deleting)] == Instance(pid(task_deleting), InstanceState.DELETING)
    assert got[pid(error)].state is InstanceState.DELETING
    assert got[pid(shutoff)].state is InstanceState.RUNNING


def test_instances_error_server_is_creating_with_error_info():
    quota = server(status="ERROR", fault=Fault(403, "Quota exceeded for ram"))
    other = server(status="ERROR", fault=Fault(500, "Failed to allocate the network(s)"))
    silent = server(status="ERROR")
    got = by_id(inventory(None, quota, other, silent).instances("workers"))
    assert got[pid(quota)].state is InstanceState.CREATING
    assert got[pid(quota)].error == ErrorInfo(
        "QuotaExceeded", "Quota exceeded for ram", ErrorClass.OUT_OF_RESOURCES
    )
    assert got[pid(other)].state is InstanceState.CREATING
    assert got[pid(other)].error is not None
    assert got[pid(other)].error.error_class is ErrorClass.OTHER
    assert got[pid(silent)].error is not None
    assert got[pid(silent)].error.code


def test_instances_of_creates_in_hand_omit_given_up_ones():
    inv = inventory()
    queued_id = queued(inv)
    flight_id = sending(inv)
    created_id, created_srv = created(inv)
    failed_id = failed(inv)
    doubt_id = in_doubt(inv)
    given_up_id = sending(inv)
    give_up(inv, given_up_id)
    got = by_id(inv.instances("workers"))
    assert got == {
        f"osas://workers/{queued_id}": Instance(
            f"osas://workers/{queued_id}", InstanceState.CREATING
        ),
        f"osas://workers/{flight_id}": Instance(
            f"osas://workers/{flight_id}", InstanceState.CREATING
        ),
        pid(created_srv): Instance(pid(created_srv), InstanceState.CREATING),
        f"osas://workers/{failed_id}": Instance(
            f"osas://workers/{failed_id}", InstanceState.CREATING, QUOTA
        ),
        f"osas://workers/{doubt_id}": Instance(
            f"osas://workers/{doubt_id}", InstanceState.CREATING
        ),
    }
    assert created_id not in "".join(got)
    assert given_up_id not in "".join(got)
    assert inv.instances("gpu") == []


def test_failed_create_ids_are_stable():
    inv = inventory()
    failed_id = failed(inv)
    first = inv.instances("workers")
    full_sync(inv, now=200.0)
    queued(inv)
    second = inv.instances("workers")
    assert first == [Instance(f"osas://workers/{failed_id}", InstanceState.CREATING, QUOTA)]
    assert first[0] in second


def test_instances_use_the_regional_form():
    srv = server()
    inv = inventory(cluster(provider_id_region="RegionOne"), srv)
    assert [i.instance_id for i in inv.instances("workers")] == [
        f"openstack://RegionOne/{srv.server_id}"
    ]


# -- sync -----------------------------------------------------------------------------------------


def test_not_synced_until_first_full_sync():
    inv = Inventory(cluster())
    assert not inv.synced
    assert inv.age(5.0) is None
    full_sync(inv, now=10.0)
    assert inv.synced
    assert inv.age(12.5) == 2.5


def test_full_sync_replaces_the_servers_whole():
    a, b, c = server(), server(), server("gpu")
    inv = inventory(None, a, b)
    full_sync(inv, b, c, now=110.0)
    assert {s.server_id for s in inv.snapshot.servers()} == {b.server_id, c.server_id}
    assert inv.server(a.server_id) is None
    assert len(inv.snapshot) == 2
    assert inv.ledger.recently_removed(pid(a))
    assert not inv.ledger.recently_removed(pid(b))


def test_full_sync_drops_deleted_status_servers():
    a = server()
    inv = inventory(None, a)
    full_sync(inv, server(status="DELETED", server_id=a.server_id))
    assert list(inv.snapshot.servers()) == []
    assert inv.ledger.recently_removed(pid(a))


def test_incremental_sync_merges():
    a, b, c = server(), server(), server()
    inv = inventory(None, a, b)
    a_error = server(status="ERROR", server_id=a.server_id, name=a.name)
    changes(inv, [a_error, c], [b.server_id], now=120.0)
    assert {s.server_id for s in inv.snapshot.servers()} == {a.server_id, c.server_id}
    assert inv.server(a.server_id) == a_error
    assert len(inv.snapshot) == 2
    assert inv.age(120.0) == 0.0
    assert inv.ledger.recently_removed(pid(b))


def test_server_gone_from_listing_drops_its_deleting_mark():
    a, b = server(), server()
    inv = inventory(None, a, b)
    mark(inv, a.server_id, b.server_id)
    assert inv.ledger.deleting_ids() == sorted([a.server_id, b.server_id])
    orders = full_sync(inv, b, now=110.0)
    assert inv.ledger.deleting_ids() == [b.server_id]
    assert orders.count(EventKind.SERVER_DELETED) == 1
    orders = changes(inv, [], [b.server_id], now=120.0)
    assert inv.ledger.deleting_ids() == []
    assert orders.count(EventKind.SERVER_DELETED) == 1


def test_mark_on_unlisted_server_kept_by_older_sync_dropped_by_newer():
    inv = inventory()
    unseen = str(uuid.uuid4())
    older = inv.ledger.begin_sync()
    mark(inv, unseen, now=101.0)
    settle_full(inv, older, [], 102.0)
    assert inv.ledger.deleting_ids() == [unseen]
    full_sync(inv, now=103.0)
    assert inv.ledger.deleting_ids() == []


def test_stale_delete_is_sent_again():
    a = server()
    retry = LedgerSettings().delete_retry_after
    inv = inventory(None, a)
    requested = DeleteOrder(a.server_id, "workers", DeleteReason.REQUESTED)
    resend = DeleteOrder(a.server_id, "workers", DeleteReason.RESEND)
    assert mark(inv, a.server_id, now=100.0).deletes == (requested,)
    assert mark(inv, a.server_id, now=150.0).deletes == ()  # a repeat keeps the first mark
    assert full_sync(inv, a, now=100.0 + retry - 1).deletes == ()
    assert full_sync(inv, a, now=100.0 + retry).deletes == (resend,)
    assert full_sync(inv, a, now=100.0 + retry + 1).deletes == ()
    # Incremental listings resend too; a delete the worker reports sent restarts the clock.
    assert changes(inv, [], now=100.0 + 2 * retry).deletes == (resend,)
    inv.ledger.finish_delete(a.server_id, DeleteOutcome.SENT, 100.0 + 3 * retry - 1)
    assert changes(inv, [], now=100.0 + 3 * retry).deletes == ()
    assert changes(inv, [], now=100.0 + 4 * retry - 1).deletes == (resend,)


def test_forget_server():
    a = server()
    inv = inventory(None, a)
    mark(inv, a.server_id)
    inv.ledger.finish_delete(a.server_id, DeleteOutcome.GONE, NOW)
    assert inv.server(a.server_id) is None
    assert inv.target_size("workers") == 0
    # The mark outlives listings begun before the 404, and goes with the next one.
    assert inv.ledger.deleting_ids() == [a.server_id]
    full_sync(inv, now=NOW + 1)
    assert inv.ledger.deleting_ids() == []


def test_created_create_settles_once_listed():
    inv = inventory()
    request_id, srv = created(inv)
    assert state(inv, request_id) is CreateState.CREATED
    assert inv.ledger.create_of_server(srv.server_id) is not None
    orders = full_sync(inv, srv, now=110.0)
    assert orders.count(EventKind.CREATE_SETTLED) == 1
    assert inv.ledger.create(request_id) is None
    assert inv.ledger.create_of_server(srv.server_id) is None
    assert inv.target_size("workers") == 1
    assert [i.instance_id for i in inv.instances("workers")] == [pid(srv)]


def test_created_create_settles_by_request_id():
    inv = inventory()
    request_id, _ = created(inv)
    # The listing shows the create's server under another id (its answer was unreliable).
    listed = server(request_id=request_id)
    orders = changes(inv, [listed], now=110.0)
    assert orders.count(EventKind.CREATE_SETTLED) == 1
    assert inv.ledger.create(request_id) is None
    assert inv.target_size("workers") == 1
    assert [i.instance_id for i in inv.instances("workers")] == [pid(listed)]


def test_in_flight_create_listed_by_request_id_is_not_counted_twice():
    inv = inventory()
    request_id = sending(inv)
    listed = server(status="BUILD", request_id=request_id)
    full_sync(inv, listed)
    assert inv.target_size("workers") == 1
    assert [i.instance_id for i in inv.instances("workers")] == [pid(listed)]
    # The answer arrives after the listing: the create is settled already.
    inv.ledger.finish_create(request_id, Created(listed), NOW)
    assert inv.ledger.create(request_id) is None
    assert inv.target_size("workers") == 1


def test_created_create_absent_from_later_full_sync_is_dropped():
    inv = inventory()
    request_id, _ = created(inv)
    orders = full_sync(inv, now=110.0)
    assert orders.count(EventKind.CREATE_VANISHED) == 1
    assert inv.ledger.create(request_id) is None
    assert inv.target_size("workers") == 0
    assert inv.instances("workers") == []


def test_created_create_absent_from_earlier_sync_is_kept():
    inv = inventory()
    older = inv.ledger.begin_sync()
    request_id, srv = created(inv)
    orders = settle_full(inv, older, [], 110.0)
    assert orders.count(EventKind.CREATE_VANISHED) == 0
    assert inv.ledger.create(request_id) is not None
    assert inv.target_size("workers") == 1
    # An incremental listing proves nothing about absence either.
    changes(inv, [], now=111.0)
    assert inv.ledger.create(request_id) is not None
    assert by_id(inv.instances("workers"))[pid(srv)].state is InstanceState.CREATING


def test_queued_and_in_flight_creates_survive_full_syncs():
    inv = inventory()
    waiting, flying = queued(inv), sending(inv)
    full_sync(inv, now=110.0)
    full_sync(inv, now=120.0)
    assert inv.ledger.create(waiting) is not None
    assert inv.ledger.create(flying) is not None
    assert inv.target_size("workers") == 2


def test_failed_create_stays_failed_and_its_server_is_deleted_when_it_shows_up():
    inv = inventory()
    request_id = failed(inv)
    failure = inv.ledger.create(request_id)
    assert failure is not None
    assert failure.state is CreateState.FAILED
    assert inv.target_size("workers") == 1
    listed = server(request_id=request_id)
    orders = full_sync(inv, listed, now=110.0)
    assert orders.deletes == (DeleteOrder(listed.server_id, "workers", DeleteReason.ORPHAN),)
    assert orders.count(EventKind.CREATE_SETTLED) == 0
    assert inv.ledger.failures_of("workers") == [failure]
    assert inv.ledger.deleting_ids() == [listed.server_id]
    assert inv.target_size("workers") == 1
    placeholder = f"osas://workers/{request_id}"
    assert by_id(inv.instances("workers")) == {
        pid(listed): Instance(pid(listed), InstanceState.DELETING),
        placeholder: Instance(placeholder, InstanceState.CREATING, QUOTA),
    }


def test_failed_create_whose_server_is_already_listed_is_not_counted():
    inv = inventory()
    request_id = sending(inv)
    listed = server(status="BUILD", request_id=request_id)
    full_sync(inv, listed, now=110.0)
    assert inv.ledger.finish_create(request_id, Refused(QUOTA), NOW) == Orders()
    assert inv.ledger.failures_of("workers") == []
    assert inv.target_size("workers") == 1
    assert [i.instance_id for i in inv.instances("workers")] == [pid(listed)]


def test_removed_ids_are_forgotten_after_a_while():
    a = server()
    memory = LedgerSettings().removed_memory
    inv = inventory(None, a, now=0.0)
    full_sync(inv, now=10.0)
    assert inv.ledger.recently_removed(pid(a))
    full_sync(inv, now=10.0 + memory)
    assert inv.ledger.recently_removed(pid(a))
    full_sync(inv, now=11.0 + memory)
    assert not inv.ledger.recently_removed(pid(a))


def test_ledger_updates_on_unknown_requests_are_harmless():
    inv = inventory()
    unknown = rid()
    stranger = server()
    ledger = inv.ledger
    assert ledger.take_create(unknown) is None
    assert ledger.finish_create(unknown, Created(stranger), NOW) == Orders()
    assert ledger.finish_create(unknown, Refused(QUOTA), NOW) == Orders()
    assert ledger.finish_create(unknown, NotSent(UNREACHABLE), NOW) == Orders()
    assert ledger.finish_create(unknown, InDoubt("read timeout"), NOW) == Orders()
    assert ledger.accept_decrease(DecreasePlan(failures=(unknown,), cancels=(unknown,)), 101.0) == (
        Orders()
    )
    plan = DeletePlan("workers", failures=(unknown,), cancels=(unknown,), give_ups=(unknown,))
    assert ledger.accept_delete(plan, 101.0) == Orders()
    for outcome in (DeleteOutcome.SENT, DeleteOutcome.FAILED, DeleteOutcome.NOT_OURS):
        assert ledger.finish_delete(stranger.server_id, outcome, 101.0) == Orders()
    assert ledger.deleting_ids() == []
    assert inv.target_size("workers") == 0
    assert inv.instances("workers") == []


def test_cancelled_create_is_never_started():
    inv = inventory()
    request_id = queued(inv)
    cancel(inv, request_id)
    assert inv.ledger.take_create(request_id) is None
    assert inv.ledger.recently_removed(f"osas://workers/{request_id}")


def test_given_up_create_that_fails_reports_nothing():
    inv = inventory()
    request_id = sending(inv)
    give_up(inv, request_id)
    assert inv.ledger.finish_create(request_id, Refused(QUOTA), NOW) == Orders()
    assert inv.ledger.create(request_id) is None
    assert inv.ledger.failures_of("workers") == []
    assert inv.instances("workers") == []


# -- group for node -------------------------------------------------------------------------------


def test_group_for_node():
    a, g = server(name="dup"), server("gpu", name="dup")
    solo = server(name="solo")
    inv = inventory(None, a, g, solo)
    waiting = queued(inv, "gpu")
    _, unlisted = created(inv)
    assert inv.group_for_node("x", pid(a)) == "workers"
    assert inv.group_for_node("x", pid(g)) == "gpu"
    assert inv.group_for_node("x", pid(unlisted)) == "workers"
    assert inv.group_for_node("solo", "") == "workers"
    assert inv.group_for_node("dup", "") is None
    assert inv.group_for_node("x", f"osas://gpu/{waiting}") == "gpu"
    assert inv.group_for_node("x", f"osas://workers/{waiting}") is None
    assert inv.group_for_node("x", IDS.format(str(uuid.uuid4()))) is None
    assert inv.group_for_node("x", "aws:///i-1") is None
    assert inv.group_for_node("", "") is None


# -- plan_increase --------------------------------------------------------------------------------


def test_plan_increase():
    spec = cluster(node_group("workers", max_size=5))
    inv = inventory(spec, server(), server(status="ERROR"))
    queued(inv)
    failed(inv)
    assert plan_increase(spec, inv, "workers", 1, NOW) == IncreasePlan(1)
    assert inv.target_size("workers") == 4  # planning changes nothing
    with pytest.raises(PreconditionFailed):
        plan_increase(spec, inv, "workers", 2, NOW)


@pytest.mark.parametrize("delta", [0, -1, -5])
def test_plan_increase_delta_must_be_positive(delta):
    spec = cluster()
    with pytest.raises(InvalidRequest):
        plan_increase(spec, inventory(spec), "workers", delta, NOW)


def test_plan_increase_up_to_max_exactly():
    spec = cluster(node_group("workers", max_size=3))
    inv = inventory(spec, server(), server(task_state="deleting"))
    assert plan_increase(spec, inv, "workers", 2, NOW) == IncreasePlan(2)
    with pytest.raises(PreconditionFailed):
        plan_increase(spec, inv, "workers", 3, NOW)


def test_plan_increase_unknown_group():
    spec = cluster()
    with pytest.raises(NodeGroupNotFound):
        plan_increase(spec, inventory(spec), "nope", 1, NOW)


# -- plan_decrease --------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [0, 1])
def test_plan_decrease_delta_must_be_negative(delta):
    spec = cluster()
    inv = inventory(spec)
    queued(inv)
    with pytest.raises(InvalidRequest):
        plan_decrease(spec, inv, "workers", delta)


def test_plan_decrease_unknown_group():
    spec = cluster()
    with pytest.raises(NodeGroupNotFound):
        plan_decrease(spec, inventory(spec), "nope", -1)


def test_plan_decrease_limited_to_failed_and_queued():
    spec = cluster()
    inv = inventory(spec)
    failure = failed(inv)
    first, second = queued(inv), queued(inv)
    queued(inv, "gpu")
    with pytest.raises(PreconditionFailed):
        plan_decrease(spec, inv, "workers", -4)
    plan = plan_decrease(spec, inv, "workers", -3)
    assert plan.failures == (failure,)
    assert set(plan.cancels) == {first, second}
    assert inv.target_size("workers") == 3  # planning changes nothing


def test_plan_decrease_never_touches_servers_or_creates_in_flight():
    spec = cluster()
    inv = inventory(spec, server(), server(status="BUILD"), server(status="ERROR"))
    flying = sending(inv)
    created_id, _ = created(inv)
    doubtful = in_doubt(inv)
    waiting = queued(inv)
    plan = plan_decrease(spec, inv, "workers", -1)
    assert plan.cancels == (waiting,)
    assert plan.failures == ()
    with pytest.raises(PreconditionFailed):
        plan_decrease(spec, inv, "workers", -2)
    inv.ledger.accept_decrease(plan, 101.0)
    with pytest.raises(PreconditionFailed):
        plan_decrease(spec, inv, "workers", -1)
    assert state(inv, flying) is CreateState.SENDING
    assert state(inv, created_id) is CreateState.CREATED
    assert state(inv, doubtful) is CreateState.IN_DOUBT


def test_plan_decrease_skips_given_up_creates():
    spec = cluster()
    inv = inventory(spec)
    give_up(inv, sending(inv))
    with pytest.raises(PreconditionFailed):
        plan_decrease(spec, inv, "workers", -1)


def test_plan_decrease_picks_the_newest():
    spec = cluster()
    inv = inventory(spec)
    first, second, third = queued(inv), queued(inv), queued(inv)
    assert plan_decrease(spec, inv, "workers", -1).cancels == (third,)
    assert plan_decrease(spec, inv, "workers", -2).cancels == (second, third)
    assert plan_decrease(spec, inv, "workers", -3).cancels == (first, second, third)


def test_plan_decrease_cancels_queued_before_failures():
    spec = cluster()
    inv = inventory(spec)
    failure = failed(inv)
    waiting = queued(inv)
    one = plan_decrease(spec, inv, "workers", -1)
    assert one.cancels == (waiting,)
    assert one.failures == ()
    two = plan_decrease(spec, inv, "workers", -2)
    assert two.cancels == (waiting,)
    assert two.failures == (failure,)


# -- plan_delete ----------------------------------------------------------------------------------


def test_plan_delete_servers():
    spec = cluster(node_group("workers", min_size=1))
    a, b, c = server(), server(), server()
    inv = inventory(spec, a, b, c)
    plan = plan_delete(spec, inv, "workers", [("node-a", pid(a)), fake_node(pid(b))])
    assert plan.group_id == "workers"
    assert plan.servers == (a.server_id, b.server_id)
    assert plan.removals == 2
    assert plan.repeats == 0
    assert inv.ledger.deleting_ids() == []  # planning changes nothing


def test_plan_delete_empty_request():
    spec = cluster()
    with pytest.raises(InvalidRequest):
        plan_delete(spec, inventory(spec, server()), "workers", [])


def test_plan_delete_unknown_group():
    spec = cluster()
    a = server()
    with pytest.raises(NodeGroupNotFound):
        plan_delete(spec, inventory(spec, a), "nope", [fake_node(pid(a))])


def test_plan_delete_refuses_duplicates():
    spec = cluster()
    a, b = server(name="node-a"), server()
    inv = inventory(spec, a, b)
    request_id = queued(inv)
    placeholder = f"osas://workers/{request_id}"
    for nodes in (
        [fake_node(pid(a)), fake_node(pid(a))],
        [("x", pid(a)), ("y", pid(b)), ("z", pid(a))],
        [fake_node(pid(a)), ("node-a", "")],
        [("node-a", ""), ("node-a", "")],
        [fake_node(placeholder), fake_node(placeholder)],
    ):
        with pytest.raises(InvalidRequest):
            plan_delete(spec, inv, "workers", nodes)


@pytest.mark.parametrize(
    "provider_id",
    ["aws:///us-east-1a/i-0123", "openstack:///not-a-uuid", f"openstack://RegionOne/{UUID}"],
)
def test_plan_delete_malformed_provider_id_refuses_whole_request(provider_id):
    spec = cluster()
    a = server()
    inv = inventory(spec, a)
    with pytest.raises(InvalidRequest):
        plan_delete(spec, inv, "workers", [fake_node(pid(a)), ("n", provider_id)])


def test_plan_delete_node_of_another_group():
    spec = cluster()
    g = server("gpu", name="gpu-node")
    inv = inventory(spec, server(), g)
    gpu_queued = queued(inv, "gpu")
    gpu_failed = failed(inv, "gpu")
    _, gpu_unlisted = created(inv, "gpu")
    for node in (
        fake_node(pid(g)),
        ("gpu-node", ""),
        fake_node(f"osas://gpu/{gpu_queued}"),
        fake_node(f"osas://gpu/{gpu_failed}"),
        fake_node(pid(gpu_unlisted)),
    ):
        with pytest.raises(InvalidRequest):
            plan_delete(spec, inv, "workers", [node])


def test_plan_delete_node_not_ours_but_unknown_placeholder_is_no_error():
    spec = cluster()
    inv = inventory(spec, server(name="ours"))
    for node in (
        fake_node(IDS.format(str(uuid.uuid4()))),
        ("not-ours", ""),
    ):
        with pytest.raises(NodeNotFound):
            plan_delete(spec, inv, "workers", [node])
    # A placeholder of the requested group this process does not know (an earlier process's):
    # nothing to remove, and no error, for CA skips its whole clean-up when DeleteNodes fails.
    unknown = rid()
    plan = plan_delete(spec, inv, "workers", [fake_node(f"osas://workers/{unknown}")])
    assert plan.unknown == (unknown,)
    assert plan.removals == 0
    assert plan.repeats == 0


def test_plan_delete_placeholder_naming_the_wrong_group_is_unknown():
    spec = cluster()
    inv = inventory(spec)
    gpu_queued = queued(inv, "gpu")
    plan = plan_delete(spec, inv, "workers", [fake_node(f"osas://workers/{gpu_queued}")])
    assert plan.unknown == (gpu_queued,)
    assert plan.cancels == ()
    assert plan.removals == 0
    inv.ledger.accept_delete(plan, 101.0)
    assert state(inv, gpu_queued) is CreateState.QUEUED
    assert inv.target_size("gpu") == 1


def test_plan_delete_failed_placeholder_naming_the_wrong_group_is_unknown():
    spec = cluster()
    inv = inventory(spec)
    gpu_failed = failed(inv, "gpu")
    forged = f"osas://workers/{gpu_failed}"
    assert inv.group_for_node(forged, forged) is None
    plan = plan_delete(spec, inv, "workers", [fake_node(forged)])
    assert plan.failures == ()
    assert plan.unknown == (gpu_failed,)
    assert plan.removals == 0
    inv.ledger.accept_delete(plan, 101.0)
    assert [c.request_id for c in inv.ledger.failures_of("gpu")] == [gpu_failed]
    assert inv.target_size("gpu") == 1


def test_plan_delete_by_name():
    spec = cluster()
    a = server(name="node-a")
    inv = inventory(spec, a, server(name="twin"), server(name="twin"))
    assert plan_delete(spec, inv, "workers", [("node-a", "")]).servers == (a.server_id,)
    with pytest.raises(InvalidRequest):
        plan_delete(spec, inv, "workers", [("twin", "")])


def test_plan_delete_respects_min_size_for_healthy_servers():
    spec = cluster(node_group("workers", min_size=2))
    a, b, c = server(), server(), server(status="BUILD")
    inv = inventory(spec, a, b)
    with pytest.raises(PreconditionFailed):
        plan_delete(spec, inv, "workers", [fake_node(pid(a))])
    full_sync(inv, a, b, c)
    assert plan_delete(spec, inv, "workers", [fake_node(pid(c))]).servers == (c.server_id,)
    with pytest.raises(PreconditionFailed):
        plan_delete(spec, inv, "workers", [fake_node(pid(a)), fake_node(pid(c))])


def test_plan_delete_queued_and_in_flight_creates_count_against_min():
    spec = cluster(node_group("workers", min_size=2))
    inv = inventory(spec, server())
    waiting = queued(inv)
    with pytest.raises(PreconditionFailed):
        plan_delete(spec, inv, "workers", [fake_node(f"osas://workers/{waiting}")])


def test_plan_delete_failed_creates_and_error_servers_below_min():
    spec = cluster(node_group("workers", min_size=3))
    a, b, broken = server(), server(), server(status="ERROR")
    inv = inventory(spec, a, b, broken)
    failure = failed(inv)
    plan = plan_delete(
        spec, inv, "workers", [fake_node(pid(broken)), fake_node(f"osas://workers/{failure}")]
    )
    assert plan.servers == (broken.server_id,)
    assert plan.failures == (failure,)
    assert plan.removals == 2
    # Target 4, min 3: one healthy server may go, two may not.
    assert plan_delete(spec, inv, "workers", [fake_node(pid(a)), fake_node(pid(broken))])
    with pytest.raises(PreconditionFailed):
        plan_delete(spec, inv, "workers", [fake_node(pid(a)), fake_node(pid(b))])


@pytest.mark.parametrize("kind", ["failed-create", "error-server"])
def test_plan_delete_errors_removable_when_group_already_below_min(kind):
    spec = cluster(node_group("workers", min_size=2))
    broken = server(status="ERROR", fault=Fault(500, "No valid host was found."))
    inv = inventory(spec, broken) if kind == "error-server" else inventory(spec)
    instance_id = f"osas://workers/{failed(inv)}" if kind == "failed-create" else pid(broken)
    assert inv.target_size("workers") == 1  # below min 2 already
    plan = plan_delete(spec, inv, "workers", [fake_node(instance_id)])
    assert plan.removals == 1


def test_plan_delete_repeats_of_deleting_servers():
    spec = cluster(node_group("workers", min_size=1))
    a, b, nova_deleting = server(), server(), server(task_state="deleting")
    inv = inventory(spec, a, b, nova_deleting)
    mark(inv, b.server_id)
    assert inv.target_size("workers") == 1
    plan = plan_delete(spec, inv, "workers", [fake_node(pid(b)), fake_node(pid(nova_deleting))])
    assert plan.servers == ()
    assert plan.repeats == 2
    assert plan.removals == 0


def test_plan_delete_cancels_queued_and_gives_up_in_flight_creates():
    spec = cluster()
    inv = inventory(spec)
    waiting, flying = queued(inv), sending(inv)
    plan = plan_delete(
        spec,
        inv,
        "workers",
        [fake_node(f"osas://workers/{waiting}"), fake_node(f"osas://workers/{flying}")],
    )
    assert plan.cancels == (waiting,)
    assert plan.give_ups == (flying,)
    assert plan.servers == ()
    assert plan.removals == 2
    assert inv.ledger.accept_delete(plan, 101.0).deletes == ()
    assert inv.target_size("workers") == 0
    # Given up while being sent: forgotten at once, not reported as a DELETING placeholder.
    assert inv.instances("workers") == []
    assert inv.ledger.create(waiting) is None
    assert inv.ledger.create(flying) is None
    assert inv.ledger.is_given_up(flying)


def test_plan_delete_of_created_create_takes_it_out_of_the_target():
    spec = cluster()
    inv = inventory(spec)
    _, unlisted = created(inv)
    plan = plan_delete(spec, inv, "workers", [fake_node(pid(unlisted))])
    assert plan.servers == (unlisted.server_id,)
    assert plan.removals == 1
    orders = inv.ledger.accept_delete(plan, 101.0)
    assert orders.deletes == (DeleteOrder(unlisted.server_id, "workers", DeleteReason.REQUESTED),)
    assert inv.target_size("workers") == 0
    assert inv.ledger.deleting_ids() == [unlisted.server_id]
    # The create is given up and no listing has shown its server: nothing left to report.
    assert inv.instances("workers") == []


def test_plan_delete_already_given_up_create_is_a_repeat():
    spec = cluster()
    inv = inventory(spec)
    flying = sending(inv)
    give_up(inv, flying)
    plan = plan_delete(spec, inv, "workers", [fake_node(f"osas://workers/{flying}")])
    assert plan.repeats == 1
    assert plan.removals == 0


def test_plan_delete_recently_removed_ids_are_repeats():
    spec = cluster()
    gone, kept = server(), server()
    inv = inventory(spec, gone, kept)
    full_sync(inv, kept, now=110.0)
    cancelled = queued(inv)
    cancel(inv, cancelled, now=111.0)
    forgotten = failed(inv)
    remove_failure(inv, forgotten, now=112.0)
    plan = plan_delete(
        spec,
        inv,
        "workers",
        [
            fake_node(pid(gone)),
            fake_node(f"osas://workers/{cancelled}"),
            fake_node(f"osas://workers/{forgotten}"),
        ],
    )
    assert plan.repeats == 3
    assert plan.removals == 0


def test_plan_delete_repeat_after_server_forgotten_on_404():
    spec = cluster()
    a = server()
    inv = inventory(spec, a, server())
    mark(inv, a.server_id)
    inv.ledger.finish_delete(a.server_id, DeleteOutcome.GONE, NOW)
    full_sync(inv, *inv.snapshot.servers(), now=110.0)
    plan = plan_delete(spec, inv, "workers", [fake_node(pid(a))])
    assert plan.repeats == 1


def test_plan_delete_repeat_after_given_up_create_failed():
    spec = cluster()
    inv = inventory(spec)
    flying = sending(inv)
    placeholder = f"osas://workers/{flying}"
    plan = plan_delete(spec, inv, "workers", [fake_node(placeholder)])
    assert plan.give_ups == (flying,)
    inv.ledger.accept_delete(plan, 101.0)
    assert inv.ledger.finish_create(flying, Refused(QUOTA), NOW) == Orders()
    plan = plan_delete(spec, inv, "workers", [fake_node(placeholder)])
    assert plan.repeats == 1


def test_give_up_of_created_create_survives_the_sync_that_lists_it():
    spec = cluster()
    inv = inventory(spec)
    _, srv = created(inv)
    inv.ledger.accept_delete(plan_delete(spec, inv, "workers", [fake_node(pid(srv))]), 101.0)
    assert inv.target_size("workers") == 0
    orders = full_sync(inv, srv, now=110.0)
    assert orders.deletes == ()  # marked already: not ordered twice
    assert inv.target_size("workers") == 0
    assert inv.instances("workers") == [Instance(pid(srv), InstanceState.DELETING)]


# -- ledger invariants ----------------------------------------------------------------------------


def delete_orders(*servers: Server, reason: DeleteReason) -> tuple[DeleteOrder, ...]:
    return tuple(DeleteOrder(s.server_id, s.group_id, reason) for s in servers)


def test_take_create_hands_out_each_send_once_and_never_after_in_doubt():
    inv = inventory()
    request_id = queued(inv)
    taken = inv.ledger.take_create(request_id)
    assert taken is not None
    assert taken.state is CreateState.SENDING
    assert taken.sends == 1
    assert inv.ledger.take_create(request_id) is None  # one send at a time
    # Proof that Nova never saw it: it may be sent again, once.
    assert inv.ledger.finish_create(request_id, NotSent(UNREACHABLE), NOW) == Orders(retry=True)
    again = inv.ledger.take_create(request_id)
    assert again is not None
    assert again.sends == 2
    assert inv.ledger.take_create(request_id) is None
    # Sent, outcome unknown: never POSTed again, whatever comes next.
    orders = inv.ledger.finish_create(request_id, InDoubt("read timeout"), NOW)
    assert not orders.retry
    assert inv.ledger.take_create(request_id) is None
    doubt_window = inv.ledger.settings.create_doubt_window
    full_sync(inv, now=NOW + doubt_window - 1)
    assert state(inv, request_id) is CreateState.IN_DOUBT
    assert inv.ledger.take_create(request_id) is None
    full_sync(inv, now=NOW + doubt_window)
    assert state(inv, request_id) is CreateState.FAILED
    assert inv.ledger.take_create(request_id) is None


def test_not_sent_create_is_queued_again_until_its_attempts_are_spent():
    settings = LedgerSettings(create_attempts=3)
    inv = inventory(settings=settings)
    request_id = queued(inv)
    for _ in range(settings.create_attempts - 1):
        assert inv.ledger.take_create(request_id) is not None
        orders = inv.ledger.finish_create(request_id, NotSent(UNREACHABLE), NOW)
        assert orders == Orders(retry=True)
        assert state(inv, request_id) is CreateState.QUEUED
        assert inv.target_size("workers") == 1
    assert inv.ledger.take_create(request_id) is not None
    orders = inv.ledger.finish_create(request_id, NotSent(UNREACHABLE), NOW)
    assert not orders.retry
    assert orders.count(EventKind.CREATE_FAILED) == 1
    create = inv.ledger.create(request_id)
    assert create is not None
    assert create.state is CreateState.FAILED
    assert create.sends == settings.create_attempts
    assert create.error == UNREACHABLE
    assert inv.ledger.take_create(request_id) is None
    placeholder = f"osas://workers/{request_id}"
    assert inv.instances("workers") == [Instance(placeholder, InstanceState.CREATING, UNREACHABLE)]


def test_in_doubt_create_is_counted_and_reported_creating_without_error():
    spec = cluster()
    inv = inventory(spec)
    request_id = sending(inv)
    orders = inv.ledger.finish_create(request_id, InDoubt("read timeout"), NOW)
    assert orders.count(EventKind.CREATE_IN_DOUBT) == 1
    assert orders.deletes == ()
    assert not orders.retry
    assert state(inv, request_id) is CreateState.IN_DOUBT
    assert inv.target_size("workers") == 1
    placeholder = f"osas://workers/{request_id}"
    assert inv.instances("workers") == [Instance(placeholder, InstanceState.CREATING)]
    assert inv.group_for_node(placeholder, placeholder) == "workers"
    # It may be a server already: DecreaseTargetSize cannot take it back.
    with pytest.raises(PreconditionFailed):
        plan_decrease(spec, inv, "workers", -1)


def test_in_doubt_create_settles_when_a_listing_shows_its_server():
    inv = inventory()
    request_id = in_doubt(inv)
    listed = server(status="BUILD", request_id=request_id)
    orders = changes(inv, [listed], now=NOW + 10)
    assert orders.count(EventKind.CREATE_SETTLED) == 1
    # Nova never answered with the server: the event names the one the listing showed.
    (settled,) = [e for e in orders.events if e.kind is EventKind.CREATE_SETTLED]
    assert settled.server_id == listed.server_id
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert orders.deletes == ()
    assert inv.ledger.create(request_id) is None
    assert inv.target_size("workers") == 1
    assert inv.instances("workers") == [Instance(pid(listed), InstanceState.CREATING)]


def test_in_doubt_create_fails_once_the_doubt_window_passes():
    inv = inventory(settings=LedgerSettings(create_doubt_window=30.0))
    request_id = in_doubt(inv, now=100.0)
    orders = full_sync(inv, now=129.0)
    assert orders.count(EventKind.CREATE_GIVEN_UP) == 0
    assert state(inv, request_id) is CreateState.IN_DOUBT
    orders = changes(inv, [], now=130.0)
    assert orders.count(EventKind.CREATE_GIVEN_UP) == 1
    assert orders.count(EventKind.CREATE_FAILED) == 0
    create = inv.ledger.create(request_id)
    assert create is not None
    assert create.state is CreateState.FAILED
    assert create.error is not None
    assert create.error.code == IN_DOUBT_CODE
    assert create.error.error_class is ErrorClass.OTHER
    assert inv.ledger.failures_of("workers") == [create]
    assert inv.target_size("workers") == 1  # reported failed until CA removes it
    placeholder = f"osas://workers/{request_id}"
    assert inv.instances("workers") == [Instance(placeholder, InstanceState.CREATING, create.error)]
    assert full_sync(inv, now=131.0).count(EventKind.CREATE_GIVEN_UP) == 0  # reported once
    # Its server turning up after all is an orphan: the failure stays as reported.
    late = server(request_id=request_id)
    assert full_sync(inv, late, now=140.0).deletes == delete_orders(
        late, reason=DeleteReason.ORPHAN
    )
    assert state(inv, request_id) is CreateState.FAILED


def test_create_given_up_while_sent_is_forgotten_and_its_late_server_deleted():
    spec = cluster()
    inv = inventory(spec)
    request_id = sending(inv)
    placeholder = f"osas://workers/{request_id}"
    plan = plan_delete(spec, inv, "workers", [fake_node(placeholder)])
    assert plan.give_ups == (request_id,)
    assert inv.ledger.accept_delete(plan, 101.0).deletes == ()
    assert inv.ledger.create(request_id) is None
    assert inv.ledger.is_given_up(request_id)
    assert inv.ledger.recently_removed(placeholder)
    assert inv.target_size("workers") == 0
    assert inv.instances("workers") == []
    # Nova answers with the server after all: it goes.
    late = server(status="BUILD", request_id=request_id)
    orders = inv.ledger.finish_create(request_id, Created(late), 102.0)
    assert orders.deletes == delete_orders(late, reason=DeleteReason.GIVEN_UP)
    assert not orders.retry
    assert inv.ledger.deleting_ids() == [late.server_id]
    assert inv.target_size("workers") == 0
    # The listing that shows it orders nothing more.
    orders = full_sync(inv, late, now=110.0)
    assert orders.deletes == ()
    assert orders.count(EventKind.CREATE_SETTLED) == 0
    assert inv.target_size("workers") == 0
    assert inv.instances("workers") == [Instance(pid(late), InstanceState.DELETING)]


def _cancelled(inv: Inventory) -> str:
    request_id = queued(inv)
    cancel(inv, request_id)
    return request_id


def _dropped(inv: Inventory) -> str:
    request_id = queued(inv)
    inv.ledger.drop_queued([request_id], 101.0)
    return request_id


def _given_up_while_sent(inv: Inventory) -> str:
    request_id = sending(inv)
    give_up(inv, request_id)
    return request_id


def _given_up_in_doubt(inv: Inventory) -> str:
    request_id = in_doubt(inv)
    give_up(inv, request_id)
    return request_id


def _failure_removed(inv: Inventory) -> str:
    request_id = failed(inv)
    remove_failure(inv, request_id)
    return request_id


def _vanished(inv: Inventory) -> str:
    request_id, _ = created(inv)
    full_sync(inv, now=102.0)
    return request_id


@pytest.mark.parametrize(
    "make",
    [
        _cancelled,
        _dropped,
        _given_up_while_sent,
        _given_up_in_doubt,
        _failure_removed,
        _vanished,
        failed,
    ],
)
def test_server_listed_for_a_request_not_wanted_is_an_orphan(make):
    inv = inventory()
    request_id = make(inv)
    target = inv.target_size("workers")
    orphan = server(request_id=request_id)
    orders = full_sync(inv, orphan, now=110.0)
    assert orders.deletes == delete_orders(orphan, reason=DeleteReason.ORPHAN)
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert orders.count(EventKind.CREATE_SETTLED) == 0
    assert inv.target_size("workers") == target  # never counted
    assert inv.ledger.deleting_ids() == [orphan.server_id]
    # Nova's late answer for it, or the next listing, orders nothing more.
    assert inv.ledger.finish_create(request_id, Created(orphan), 111.0).deletes == ()
    assert full_sync(inv, orphan, now=112.0).deletes == ()


def test_target_never_counts_a_request_twice():
    inv = inventory()
    request_id = sending(inv)
    listed = server(status="BUILD", request_id=request_id)
    orders = full_sync(inv, listed, now=110.0)
    assert orders.count(EventKind.CREATE_SETTLED) == 1
    assert inv.ledger.create(request_id) is None
    assert inv.target_size("workers") == 1
    # Nova's answer arrives after the listing: a no-op, the server is not a duplicate.
    assert inv.ledger.finish_create(request_id, Created(listed), 111.0) == Orders()
    assert inv.ledger.create(request_id) is None
    assert inv.ledger.create_of_server(listed.server_id) is None
    assert inv.ledger.deleting_ids() == []
    assert inv.target_size("workers") == 1
    orders = full_sync(inv, listed, now=120.0)
    assert orders == Orders()
    assert inv.target_size("workers") == 1


# Which of two servers of one request is kept: ACTIVE, then BUILD, then the others; then the
# oldest; then the smallest id.
OLD, NEW = "2024-05-01T10:00:00Z", "2024-05-01T10:05:00Z"
ID_A, ID_B = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"


@pytest.mark.parametrize(
    ("keep", "drop"),
    [
        pytest.param(("ACTIVE", NEW, ID_B), ("BUILD", OLD, ID_A), id="active-over-build"),
        pytest.param(("BUILD", NEW, ID_B), ("ERROR", OLD, ID_A), id="build-over-error"),
        pytest.param(("ACTIVE", NEW, ID_B), ("SHUTOFF", OLD, ID_A), id="active-over-shutoff"),
        pytest.param(("ACTIVE", OLD, ID_B), ("ACTIVE", NEW, ID_A), id="oldest"),
        pytest.param(("ERROR", OLD, ID_B), ("SHUTOFF", NEW, ID_A), id="others-oldest"),
        pytest.param(("ACTIVE", OLD, ID_A), ("ACTIVE", OLD, ID_B), id="smallest-id"),
    ],
)
def test_two_servers_of_a_request_this_process_sent_keep_one(keep, drop):
    inv = inventory()
    request_id = in_doubt(inv)  # sent here, its answer lost

    def make(status: str, created: str, server_id: str) -> Server:
        return server(status=status, created=created, server_id=server_id, request_id=request_id)

    kept, duplicate = make(*keep), make(*drop)
    orders = full_sync(inv, duplicate, kept, now=105.0)
    assert orders.deletes == delete_orders(duplicate, reason=DeleteReason.DUPLICATE)
    assert orders.count(EventKind.SHARED_REQUEST_KEPT) == 0
    assert inv.ledger.deleting_ids() == [duplicate.server_id]
    assert inv.target_size("workers") == 1
    assert by_id(inv.instances("workers"))[pid(duplicate)].state is InstanceState.DELETING
    assert full_sync(inv, duplicate, kept, now=110.0).deletes == ()


@pytest.mark.parametrize("listing", ["first", "full", "incremental"])
def test_servers_of_an_earlier_life_sharing_a_request_id_are_kept_and_reported(listing):
    """Another tool, a copied template, an older osas, Nova's multi-create: osas did not send
    this request, so it deletes none of its servers. Problem 2 of the day-two issue: 1,199 of
    1,200 running servers were deleted as duplicates."""
    request_id = rid()
    shared = [server(request_id=request_id, created=f"2024-05-01T10:0{m}:00Z") for m in range(3)]
    if listing == "first":
        inv = Inventory(cluster())
        orders = full_sync(inv, *shared)
    else:
        inv = inventory(None, shared[0])
        orders = (
            full_sync(inv, *shared, now=110.0)
            if listing == "full"
            else changes(inv, shared[1:], now=110.0)
        )
    assert orders.deletes == ()
    assert orders.count(EventKind.SHARED_REQUEST_KEPT) == 1
    assert inv.target_size("workers") == 3
    assert full_sync(inv, *shared, now=120.0).count(EventKind.SHARED_REQUEST_KEPT) == 0


def test_duplicate_of_a_create_of_ours_settles_it_once_and_deletes_the_other():
    inv = inventory()
    request_id, answered = created(inv)  # BUILD
    twin = server(request_id=request_id, created=OLD)  # ACTIVE: kept
    listed_answer = server(
        status="BUILD", server_id=answered.server_id, request_id=request_id, created=NEW
    )
    orders = changes(inv, [listed_answer, twin], now=110.0)
    assert orders.count(EventKind.CREATE_SETTLED) == 1
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert orders.deletes == delete_orders(listed_answer, reason=DeleteReason.DUPLICATE)
    assert inv.ledger.create(request_id) is None
    assert inv.target_size("workers") == 1
    # A third server of it, listed later, goes too.
    third = server(request_id=request_id, created="2024-05-01T10:10:00Z")
    orders = changes(inv, [third], now=120.0)
    assert orders.deletes == delete_orders(third, reason=DeleteReason.DUPLICATE)
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert inv.target_size("workers") == 1


def test_late_second_server_of_a_request_listed_at_start_is_kept_not_a_stray():
    request_id = rid()
    first = server(request_id=request_id, created=OLD)
    inv = inventory(None, first)
    late = server(request_id=request_id, created=NEW)
    orders = changes(inv, [late], now=110.0)
    assert orders.deletes == ()  # an earlier life's request: reported, never deleted
    assert orders.count(EventKind.SHARED_REQUEST_KEPT) == 1
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert inv.target_size("workers") == 2


def test_servers_of_the_first_full_sync_are_not_strays():
    inv = Inventory(cluster())
    orders = full_sync(inv, server(request_id=rid()), server())
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert orders.deletes == ()
    assert inv.target_size("workers") == 2


def test_stray_after_the_first_full_sync_is_adopted_within_max():
    inv = inventory(None, server())
    late, bare = server(request_id=rid()), server()
    request_id, answered = created(inv)
    ours = server(server_id=answered.server_id, request_id=request_id)
    orders = full_sync(inv, *inv.snapshot.servers(), late, bare, ours, now=110.0)
    assert orders.count(EventKind.STRAY_ADOPTED) == 2
    adopted = {e.server_id for e in orders.events if e.kind is EventKind.STRAY_ADOPTED}
    assert adopted == {late.server_id, bare.server_id}
    assert orders.deletes == ()
    assert inv.target_size("workers") == 4
    assert full_sync(inv, *inv.snapshot.servers(), now=120.0).count(EventKind.STRAY_ADOPTED) == 0


def test_a_request_once_known_stays_known_until_a_complete_listing_shows_none_of_it():
    """No stray is a request osas knows: its own settled create, or one whose server was
    listed. A server of it that leaves and comes back before the next complete listing is
    no stray; a stray's second server is its request's (a shared request), not a second
    stray. Once a complete listing shows none of a request, a server of it is a stray again."""
    inv = inventory(None, server())
    request_id, answered = created(inv)
    ours = server(server_id=answered.server_id, request_id=request_id)
    assert changes(inv, [ours], now=110.0).count(EventKind.CREATE_SETTLED) == 1
    # Left and back, before any complete listing: the settled create's, known.
    changes(inv, [], [ours.server_id], now=111.0)
    assert ours.server_id not in inv.snapshot
    assert changes(inv, [ours], now=112.0).count(EventKind.STRAY_ADOPTED) == 0
    # A complete listing shows it: known from now on by being listed.
    full_sync(inv, *inv.snapshot.servers(), now=113.0)
    changes(inv, [], [ours.server_id], now=114.0)
    assert changes(inv, [ours], now=115.0).count(EventKind.STRAY_ADOPTED) == 0
    stray = server(request_id=rid())
    assert changes(inv, [stray], now=116.0).count(EventKind.STRAY_ADOPTED) == 1
    twin = server(request_id=stray.request_id)
    orders = changes(inv, [twin], now=117.0)
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert orders.count(EventKind.SHARED_REQUEST_KEPT) == 1
    assert orders.deletes == ()
    # Gone, and a complete listing without it: forgotten, so its return is a stray again.
    kept = [s for s in inv.snapshot.servers() if s.request_id != request_id]
    changes(inv, [], [ours.server_id], now=118.0)
    full_sync(inv, *kept, now=119.0)
    orders = changes(inv, [ours], now=120.0)
    assert [e.server_id for e in orders.events if e.kind is EventKind.STRAY_ADOPTED] == [
        ours.server_id
    ]


@pytest.mark.parametrize("listing", ["full", "incremental"])
def test_strays_above_max_are_adopted_and_reported_never_deleted(listing):
    """A late server of a create this process never made (an earlier osas's) is not osas's
    to delete on its own: above max_size, it is reported for CA's scale-down or a person."""
    spec = cluster(node_group("workers", max_size=4))
    a, b = server(), server()
    inv = inventory(spec, a, b)
    queued(inv)  # creates in hand count: target 3 of 4
    old, mid, new = (
        server(request_id=rid(), created=f"2024-05-01T10:0{minute}:00Z") for minute in (1, 2, 3)
    )
    if listing == "full":
        orders = full_sync(inv, a, b, mid, new, old, now=110.0)
    else:
        orders = changes(inv, [mid, new, old], now=110.0)
    assert orders.count(EventKind.STRAY_ADOPTED) == 3
    assert orders.deletes == ()
    assert orders.count(EventKind.ABOVE_MAX_KEPT) == 1
    assert inv.target_size("workers") == 6
    assert full_sync(inv, a, b, mid, new, old, now=120.0).count(EventKind.ABOVE_MAX_KEPT) == 0


def test_servers_of_the_first_full_sync_above_max_are_kept():
    spec = cluster(node_group("workers", max_size=2))
    first = [server() for _ in range(3)]
    inv = Inventory(spec)
    orders = full_sync(inv, *first)
    assert orders.deletes == ()
    assert orders.count(EventKind.ABOVE_MAX_KEPT) == 1
    assert inv.target_size("workers") == 3
    orders = full_sync(inv, *first, now=110.0)
    assert orders.deletes == ()
    assert orders.count(EventKind.ABOVE_MAX_KEPT) == 0  # reported once
    # A stray on top of that is kept too, and the group reported no twice.
    stray = server(request_id=rid())
    orders = full_sync(inv, *first, stray, now=120.0)
    assert orders.deletes == ()
    assert orders.count(EventKind.ABOVE_MAX_KEPT) == 0
    assert inv.target_size("workers") == 4


def test_a_stray_adopted_within_max_is_kept_when_max_is_lowered():
    spec = cluster(node_group("workers", max_size=3))
    a, b = server(), server()
    inv = inventory(spec, a, b)
    stray = server(request_id=rid())
    orders = full_sync(inv, a, b, stray, now=110.0)
    assert orders.count(EventKind.STRAY_ADOPTED) == 1
    assert orders.deletes == ()
    orders = inv.ledger.use_cluster(cluster(node_group("workers", max_size=2)), 115.0)
    assert orders.deletes == ()  # a running node, left for CA's scale-down
    assert orders.count(EventKind.ABOVE_MAX_KEPT) == 1  # said by the reload itself
    orders = full_sync(inv, a, b, stray, now=120.0)
    assert orders.deletes == ()
    assert orders.count(EventKind.ABOVE_MAX_KEPT) == 0  # and once
    assert inv.target_size("workers") == 3


def test_a_vanished_creates_server_id_is_a_harmless_repeat():
    spec = cluster()
    inv = inventory(spec)
    _, unlisted = created(inv)
    assert full_sync(inv, now=110.0).count(EventKind.CREATE_VANISHED) == 1
    plan = plan_delete(spec, inv, "workers", [fake_node(pid(unlisted))])
    assert plan.repeats == 1
    assert plan.removals == 0


def test_drop_queued_forgets_only_queued_creates():
    inv = inventory()
    first, second = queued(inv), queued(inv)
    flying = sending(inv)
    doubtful = in_doubt(inv)
    failure = failed(inv)
    created_id, _ = created(inv)
    orders = inv.ledger.drop_queued(
        [first, second, flying, doubtful, failure, created_id, rid()], 101.0
    )
    assert orders.count(EventKind.CREATE_DROPPED) == 2
    assert [e.request_id for e in orders.events] == [first, second]
    assert orders.deletes == ()
    assert inv.ledger.create(first) is None
    assert inv.ledger.create(second) is None
    assert inv.ledger.take_create(first) is None
    assert state(inv, flying) is CreateState.SENDING
    assert state(inv, doubtful) is CreateState.IN_DOUBT
    assert state(inv, failure) is CreateState.FAILED
    assert state(inv, created_id) is CreateState.CREATED
    assert inv.target_size("workers") == 4


def test_finish_delete_gone_drops_the_mark_and_the_server():
    a, b = server(), server()
    inv = inventory(None, a, b)
    mark(inv, a.server_id)
    orders = inv.ledger.finish_delete(a.server_id, DeleteOutcome.GONE, 102.0)
    assert orders.deletes == ()
    assert inv.server(a.server_id) is None
    assert inv.ledger.recently_removed(pid(a))
    assert inv.target_size("workers") == 1
    orders = inv.ledger.settle_changes(inv.ledger.begin_sync(), [], [a.server_id], 103.0)
    assert orders.count(EventKind.SERVER_DELETED) == 1
    assert inv.ledger.deleting_ids() == []


def test_finish_delete_not_ours_drops_the_mark_and_the_server():
    """A fresh read right before the delete showed the server without our marks: not
    deleted, never sent again, and no longer reported (it is not ours); a DeleteNodes naming
    it is refused with the reason."""
    a = server()
    inv = inventory(None, a)
    mark(inv, a.server_id)
    assert inv.target_size("workers") == 0
    orders = inv.ledger.finish_delete(a.server_id, DeleteOutcome.NOT_OURS, 102.0)
    assert orders.count(EventKind.DELETE_REFUSED) == 1
    assert orders.count(EventKind.MARKS_LOST) == 1
    assert orders.deletes == ()
    assert inv.ledger.deleting_ids() == []
    assert inv.server(a.server_id) is None
    assert inv.target_size("workers") == 0
    assert inv.ledger.lost_marks(f"openstack:///{a.server_id}")
    with pytest.raises(PreconditionFailed, match="ownership marks"):
        plan_delete(inv.cluster, inv, "workers", [("n", f"openstack:///{a.server_id}")])


@pytest.mark.parametrize("outcome", [DeleteOutcome.SENT, DeleteOutcome.FAILED])
def test_finish_delete_sent_or_failed_keeps_the_mark(outcome):
    a = server()
    inv = inventory(None, a)
    mark(inv, a.server_id)
    assert inv.ledger.finish_delete(a.server_id, outcome, 102.0) == Orders()
    assert inv.ledger.deleting_ids() == [a.server_id]
    assert inv.target_size("workers") == 0


def test_mark_on_never_listed_server_dropped_by_full_listing_begun_after_it():
    inv = inventory()
    request_id, answered = created(inv)
    older = inv.ledger.begin_sync()
    assert mark(inv, answered.server_id, now=101.0).deletes == delete_orders(
        answered, reason=DeleteReason.REQUESTED
    )
    assert inv.ledger.create(request_id) is None  # given up with its server
    # Neither an incremental listing nor a complete one begun before the mark proves it gone.
    assert changes(inv, [], now=102.0).count(EventKind.SERVER_DELETED) == 0
    assert settle_full(inv, older, [], 103.0).count(EventKind.SERVER_DELETED) == 0
    assert inv.ledger.deleting_ids() == [answered.server_id]
    orders = full_sync(inv, now=104.0)
    assert orders.count(EventKind.SERVER_DELETED) == 1
    assert inv.ledger.deleting_ids() == []
    assert inv.ledger.recently_removed(pid(answered))


def test_unknown_placeholder_is_remembered_and_its_late_server_deleted():
    spec = cluster()
    inv = inventory(spec)
    unknown = rid()
    placeholder = f"osas://workers/{unknown}"
    plan = plan_delete(spec, inv, "workers", [fake_node(placeholder)])
    assert plan.unknown == (unknown,)
    orders = inv.ledger.accept_delete(plan, 101.0)
    assert orders.count(EventKind.UNKNOWN_PLACEHOLDER) == 1
    assert orders.deletes == ()
    assert inv.target_size("workers") == 0
    again = plan_delete(spec, inv, "workers", [fake_node(placeholder)])
    assert again.repeats == 1
    assert again.unknown == ()
    late = server(request_id=unknown)
    orders = full_sync(inv, late, now=110.0)
    assert orders.deletes == delete_orders(late, reason=DeleteReason.ORPHAN)
    assert orders.count(EventKind.STRAY_ADOPTED) == 0
    assert inv.target_size("workers") == 0


def test_unknown_placeholder_of_a_listed_server_leaves_the_server_alone():
    spec = cluster()
    earlier = rid()
    listed = server(request_id=earlier)
    inv = inventory(spec, listed)
    plan = plan_delete(spec, inv, "workers", [fake_node(f"osas://workers/{earlier}")])
    assert plan.unknown == (earlier,)
    assert inv.ledger.accept_delete(plan, 101.0).deletes == ()
    assert full_sync(inv, listed, now=110.0).deletes == ()
    assert inv.ledger.deleting_ids() == []
    assert inv.target_size("workers") == 1


def test_placeholder_naming_the_wrong_group_leaves_the_other_groups_create_alone():
    spec = cluster()
    inv = inventory(spec)
    gpu_create = sending(inv, "gpu")
    plan = plan_delete(spec, inv, "workers", [fake_node(f"osas://workers/{gpu_create}")])
    assert plan.unknown == (gpu_create,)
    inv.ledger.accept_delete(plan, 101.0)
    made = server("gpu", "BUILD", request_id=gpu_create)
    assert inv.ledger.finish_create(gpu_create, Created(made), 102.0).deletes == ()
    orders = full_sync(inv, made, now=110.0)
    assert orders.deletes == ()
    assert inv.target_size("gpu") == 1


def test_listing_begun_before_a_delete_went_gone_does_not_bring_the_server_back():
    a, b = server(), server()
    inv = inventory(None, a, b)
    mark(inv, a.server_id)
    listing = inv.ledger.begin_sync()  # a listing starts; Nova still shows a
    inv.ledger.finish_delete(a.server_id, DeleteOutcome.GONE, 102.0)
    settle_full(inv, listing, [a, b], 103.0)
    assert inv.target_size("workers") == 1
    assert by_id(inv.instances("workers"))[pid(a)].state is InstanceState.DELETING
    orders = full_sync(inv, b, now=104.0)  # a listing begun after the 404
    assert orders.count(EventKind.SERVER_DELETED) == 1
    assert inv.ledger.deleting_ids() == []
    assert pid(a) not in by_id(inv.instances("workers"))


# -- template -------------------------------------------------------------------------------------

FLAVOR = Flavor("f-1", "m1.large", vcpus=4, ram_mib=8192, disk_gib=40, ephemeral_gib=10)


def test_template_capacity_and_labels():
    spec = node_group("workers", availability_zone="az-1", max_pods=58)
    tpl = build_template(cluster(spec), spec, FLAVOR)
    assert tpl.capacity == {
        "cpu": "4",
        "memory": "8192Mi",
        "ephemeral-storage": "50Gi",
        "pods": "58",
    }
    assert tpl.allocatable == tpl.capacity
    assert tpl.labels["kubernetes.io/os"] == "linux"
    assert tpl.labels["kubernetes.io/arch"] == "amd64"
    assert tpl.labels["node.kubernetes.io/instance-type"] == "m1.large"
    assert tpl.labels["topology.kubernetes.io/zone"] == "az-1"
    assert tpl.labels["kubernetes.io/hostname"] == tpl.name
    assert tpl.name == "prod-workers-template"
    assert tpl.operating_system == "linux"
    assert tpl.architecture == "amd64"
    assert tpl.taints == ()
    assert "nvidia.com/gpu" not in tpl.capacity


def test_template_without_zone_has_no_zone_label():
    spec = node_group("workers")
    tpl = build_template(cluster(spec), spec, FLAVOR)
    assert "topology.kubernetes.io/zone" not in tpl.labels
    assert tpl.capacity["pods"] == "110"


def test_template_gpu_taints_arch_and_group_labels():
    taint = Taint("nvidia.com/gpu", "present", TaintEffect.NO_SCHEDULE)
    spec = node_group(
        "gpu",
        gpu=GpuSpec(2, "nvidia-a100"),
        taints=(taint,),
        architecture="arm64",
        labels={"pool": "gpu", "node.kubernetes.io/instance-type": "custom"},
    )
    tpl = build_template(cluster(spec, gpu_label="example.com/gpu"), spec, FLAVOR)
    assert tpl.capacity["nvidia.com/gpu"] == "2"
    assert tpl.allocatable["nvidia.com/gpu"] == "2"
    assert tpl.labels["example.com/gpu"] == "nvidia-a100"
    assert tpl.labels["pool"] == "gpu"
    assert tpl.labels["node.kubernetes.io/instance-type"] == "custom"
    assert tpl.labels["kubernetes.io/arch"] == "arm64"
    assert tpl.architecture == "arm64"
    assert tpl.taints == (taint,)


def test_template_custom_gpu_resource():
    spec = node_group("gpu", gpu=GpuSpec(1, "mi300", resource="amd.com/gpu"))
    tpl = build_template(cluster(spec), spec, FLAVOR)
    assert tpl.capacity["amd.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in tpl.capacity
    assert tpl.labels["nvidia.com/gpu.product"] == "mi300"


def test_template_boot_volume_sets_ephemeral_storage():
    spec = node_group("workers", boot_volume=BootVolume(100, "ssd"))
    volume_flavor = Flavor("f-2", "m1.novol", vcpus=2, ram_mib=4096, disk_gib=0)
    assert (
        build_template(cluster(spec), spec, volume_flavor).capacity["ephemeral-storage"] == "100Gi"
    )
    assert build_template(cluster(spec), spec, FLAVOR).capacity["ephemeral-storage"] == "110Gi"


# -- options --------------------------------------------------------------------------------------

DEFAULTS = AutoscalingOptions(
    scale_down_utilization_threshold=0.5,
    scale_down_gpu_utilization_threshold=0.5,
    scale_down_unneeded_time=timedelta(minutes=10),
    scale_down_unready_time=timedelta(minutes=20),
    max_node_provision_time=timedelta(minutes=15),
    zero_or_max_node_scaling=False,
    ignore_daemonsets_utilization=False,
)


def test_group_options_not_supported_without_overrides():
    with pytest.raises(NotSupported):
        group_options(DEFAULTS, OptionOverrides())


def test_group_options_applies_overrides_and_echoes_the_rest():
    overrides = OptionOverrides(
        scale_down_unneeded_time=timedelta(minutes=20), zero_or_max_node_scaling=True
    )
    got = group_options(DEFAULTS, overrides)
    assert got == AutoscalingOptions(
        scale_down_utilization_threshold=0.5,
        scale_down_gpu_utilization_threshold=0.5,
        scale_down_unneeded_time=timedelta(minutes=20),
        scale_down_unready_time=timedelta(minutes=20),
        max_node_provision_time=timedelta(minutes=15),
        zero_or_max_node_scaling=True,
        ignore_daemonsets_utilization=False,
    )


def test_group_options_falsy_overrides_count():
    overrides = OptionOverrides(
        scale_down_utilization_threshold=0.0, ignore_daemonsets_utilization=False
    )
    assert not overrides.is_empty()
    got = group_options(DEFAULTS, overrides)
    assert got.scale_down_utilization_threshold == 0.0
    assert got.scale_down_gpu_utilization_threshold == 0.5
    assert got.ignore_daemonsets_utilization is False


# -- pricing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2Gi", Decimal(2 * 2**30)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("0", Decimal(0)),
        ("1k", Decimal(1000)),
        ("1Ki", Decimal(1024)),
        ("128974848", Decimal(128974848)),
        ("129M", Decimal(129_000_000)),
        ("123Mi", Decimal(123 * 2**20)),
        ("1E", Decimal(10**18)),
        ("2Ei", Decimal(2 * 2**60)),
        (" 4 ", Decimal(4)),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "abc", "Gi", "1.2.3", ".", "5x", "1ki", "1 Gi", "--1", "1e", "0x10", "1,5"]
)
def test_parse_quantity_rejects(text):
    with pytest.raises(InvalidRequest):
        parse_quantity(text)


def test_parse_quantity_rejects_huge_exponent():
    with pytest.raises(InvalidRequest):
        parse_quantity("1e999999999")


def test_effective_requests_sum_of_containers_vs_init_max_plus_overhead():
    got = effective_requests(
        containers=[{"cpu": "500m", "memory": "1Gi"}, {"cpu": "250m"}],
        init_containers=[{"cpu": "1", "memory": "512Mi"}, {"nvidia.com/gpu": "1"}],
        overhead={"cpu": "100m", "memory": "64Mi"},
    )
    assert got == {
        "cpu": Decimal("1.1"),
        "memory": Decimal(2**30 + 64 * 2**20),
        "nvidia.com/gpu": Decimal(1),
    }


def test_effective_requests_containers_win_over_smaller_init():
    got = effective_requests([{"cpu": "2"}, {"cpu": "2"}], [{"cpu": "3"}])
    assert got == {"cpu": Decimal(4)}
    assert effective_requests([]) == {}
    with pytest.raises(InvalidRequest):
        effective_requests([{"cpu": "lots"}])


PRICING = Pricing(cpu_per_hour=0.02, memory_gib_per_hour=0.01, gpu_per_hour=1.0)


def test_node_price_per_hour_wins():
    spec = node_group("workers", price_per_hour=0.5)
    assert node_price(spec, FLAVOR, PRICING, 0.0, 7200.0) == pytest.approx(1.0)
    assert node_price(spec, None, None, 0.0, 1800.0) == pytest.approx(0.25)


def test_node_price_from_table():
    spec = node_group("gpu", gpu=GpuSpec(1, "a100"))
    # 4 cpu * 0.02 + 8 GiB * 0.01 + 1 gpu * 1.0 = 1.16 per hour, for half an hour.
    assert node_price(spec, FLAVOR, PRICING, 1000.0, 2800.0) == pytest.approx(0.58)
    assert node_price(node_group(), FLAVOR, PRICING, 0.0, 3600.0) == pytest.approx(0.16)


def test_node_price_not_supported_without_a_price():
    with pytest.raises(NotSupported):
        node_price(node_group(), FLAVOR, None, 0.0, 3600.0)
    with pytest.raises(NotSupported):
        node_price(node_group(), None, PRICING, 0.0, 3600.0)


def test_prices_refuse_backwards_periods():
    with pytest.raises(InvalidRequest):
        node_price(node_group(price_per_hour=1.0), FLAVOR, PRICING, 10.0, 5.0)
    with pytest.raises(InvalidRequest):
        pod_price(PRICING, {"cpu": Decimal(1)}, "nvidia.com/gpu", 10.0, 5.0)


def test_pod_price():
    requests = {
        "cpu": Decimal(2),
        "memory": Decimal(4 * 2**30),
        "nvidia.com/gpu": Decimal(1),
        "amd.com/gpu": Decimal(5),
    }
    # 2 * 0.02 + 4 * 0.01 + 1 * 1.0 = 1.08 per hour; unpriced resources cost nothing.
    assert pod_price(PRICING, requests, "nvidia.com/gpu", 0.0, 3600.0) == pytest.approx(1.08)
    assert pod_price(PRICING, requests, "amd.com/gpu", 0.0, 1800.0) == pytest.approx(2.54)
    assert pod_price(PRICING, {}, "nvidia.com/gpu", 0.0, 3600.0) == 0.0


def test_pod_price_not_supported_without_table():
    with pytest.raises(NotSupported):
        pod_price(None, {"cpu": Decimal(1)}, "nvidia.com/gpu", 0.0, 3600.0)


# -- what survives the process: held headroom, CA's deletes not sent, marks lost by hand -------


def test_held_headroom_refuses_scale_ups_and_reports_the_target_as_max():
    """After a start or a takeover, creates an earlier osas sent may still reach Nova: until
    the hold ends (its time over, and a listing begun since settled), IncreaseSize spends no
    headroom, and the max size CA is told is the target (never below min), so that CA plans
    none."""
    spec = cluster(node_group("workers", min_size=1, max_size=10))
    inv = inventory(spec, server(), server())
    inv.ledger.hold_headroom(NOW + 30)
    assert inv.ledger.headroom_held(NOW) == 30
    with pytest.raises(PreconditionFailed, match="held for 30s more"):
        plan_increase(spec, inv, "workers", 1, NOW)
    assert inv.ledger.reported_max("workers", 10, 1, NOW) == 2
    # An earlier life's server shows up meanwhile: the reported max follows, never past max.
    changes(inv, [server()])
    assert inv.ledger.reported_max("workers", 10, 1, NOW + 1) == 3
    empty = inventory(cluster(node_group("workers", min_size=1, max_size=10)))
    empty.ledger.hold_headroom(NOW + 30)
    assert empty.ledger.reported_max("workers", 10, 1, NOW) == 1
    # Its time over, still held until a listing begun since has settled: one begun before
    # (or the place out of reach) may not show what landed meanwhile.
    assert inv.ledger.headroom_held(NOW + 31) == 0
    with pytest.raises(PreconditionFailed, match="held until its place is listed again"):
        plan_increase(spec, inv, "workers", 1, NOW + 31)
    assert inv.ledger.reported_max("workers", 10, 1, NOW + 31) == 3
    begun_before = inv.ledger.begin_sync(NOW + 29)
    begun_after = inv.ledger.begin_sync(NOW + 30)
    inv.ledger.settle_changes(begun_before, [], [], NOW + 31)
    assert inv.ledger.headroom_held(NOW + 31) == 0
    inv.ledger.settle_changes(begun_after, [], [], NOW + 31)
    # Over: everything as configured again.
    assert inv.ledger.headroom_held(NOW + 30) is None
    assert inv.ledger.reported_max("workers", 10, 1, NOW + 30) == 10
    assert plan_increase(spec, inv, "workers", 7, NOW + 30) == IncreasePlan(7)


def test_holding_headroom_moves_every_groups_generation():
    """Cached answers carry the max size: they must not outlive the hold's start."""
    inv = inventory()
    before = {g: inv.generation(g) for g in ("workers", "gpu")}
    inv.ledger.hold_headroom(NOW + 5)
    assert all(inv.generation(g) > before[g] for g in before)


def test_the_promises_are_the_creates_not_failed_and_the_deletes_ca_asked_for():
    """What the record must hold: every create that may still reach Nova (queued, being
    sent, in doubt, answered and not listed), none failed; CA's deletes, not osas's own."""
    a, b = server(), server()
    inv = inventory(None, a, b)
    before = inv.ledger.promised
    may_land = {queued(inv), sending(inv), in_doubt(inv), created(inv)[0]}
    failed(inv)
    mark(inv, a.server_id)
    promises = inv.ledger.promises()
    assert set(promises.creates) == may_land
    assert {group for group, _ in promises.creates.values()} == {"workers"}
    assert dict(promises.deletes) == {a.server_id: "workers"}
    assert inv.ledger.promised > before
    # A listing that shows a create's server, or no longer shows a deleted one, confirms it.
    request_id, made = created(inv)
    changes(inv, [made], [a.server_id], now=102.0)
    promises = inv.ledger.promises()
    assert request_id not in promises.creates
    assert a.server_id not in promises.deletes


def test_a_promise_that_could_not_be_recorded_is_taken_back_whole():
    inv = inventory(None, server())
    request_ids = inv.ledger.accept_creates("workers", 3, NOW)
    assert inv.target_size("workers") == 4
    inv.ledger.withdraw_creates(request_ids)
    assert inv.target_size("workers") == 1
    assert inv.ledger.promises().creates == {}


def test_a_new_holder_counts_an_earlier_holders_creates_until_they_land_or_the_window_passes():
    """Inherited creates hold exactly their own headroom, in their own group, and nothing
    else; one that lands is settled like any create; one that does not is dropped (never
    reported failed: most likely it was never sent), and a late server of it is adopted."""
    landed, lapsed, listed = "r-landed", "r-lapsed", "r-listed"
    already = server(request_id=listed)
    inv = inventory(None, already)
    record = Promises(
        {landed: ("workers", 0.0), lapsed: ("workers", 0.0), listed: ("workers", 0.0)}
    )
    orders = inv.ledger.inherit(record, now=100.0)
    assert orders.count(EventKind.CREATE_INHERITED) == 2  # the listed one is settled already
    assert inv.target_size("workers") == 3
    assert inv.ledger.headroom_held(100.0) is None  # nothing held beyond them
    assert set(inv.ledger.promises().creates) == {landed, lapsed}  # passed on by this holder
    window = inv.ledger.settings.create_doubt_window
    changes(inv, [server(request_id=landed)], now=101.0)
    assert set(inv.ledger.promises().creates) == {lapsed}
    orders = changes(inv, [], now=100.0 + window)
    assert orders.count(EventKind.INHERITED_CREATE_LAPSED) == 1
    assert orders.count(EventKind.CREATE_GIVEN_UP) == 0
    assert inv.target_size("workers") == 2
    late = server(request_id=lapsed)
    assert changes(inv, [late], now=101.0 + window).deletes == ()
    assert inv.target_size("workers") == 3


def test_a_new_holder_sends_an_earlier_holders_accepted_deletes_again():
    a, b = server(), server()
    inv = inventory(None, a, b)
    orders = inv.ledger.inherit(Promises(deletes={a.server_id: "workers"}), now=100.0)
    assert [(o.server_id, o.reason) for o in orders.deletes] == [
        (a.server_id, DeleteReason.REQUESTED)
    ]
    assert inv.target_size("workers") == 1
    assert dict(inv.ledger.promises().deletes) == {a.server_id: "workers"}


def test_a_delete_ca_was_told_failed_is_taken_back():
    """CA's DeleteNodes whose DELETE did not reach Nova before the answer: the server is
    counted again and never deleted later on osas's own."""
    a, b = server(), server()
    inv = inventory(None, a, b)
    mark(inv, a.server_id)
    assert inv.target_size("workers") == 1
    orders = inv.ledger.delete_not_sent(a.server_id, "no answer from Nova within 4.7s", 102.0)
    assert orders.count(EventKind.DELETE_NOT_SENT) == 1
    assert inv.ledger.deleting_ids() == []
    assert inv.target_size("workers") == 2
    retry = inv.ledger.settings.delete_retry_after
    assert full_sync(inv, a, b, now=102.0 + retry).deletes == ()


def test_a_complete_listing_showing_a_server_without_a_mark_takes_it_out_of_view():
    """A metadata mark deleted by hand (Nova leaves updated_at alone, so only a complete
    listing reads it again): the server leaves CA's view, is never deleted, and DeleteNodes
    naming it is refused with the reason rather than answered OK."""
    a, b = server(), server()
    inv = inventory(None, a, b)
    generation = inv.ledger.begin_sync()
    orders = inv.ledger.settle_complete(generation, [], [], NOW, unowned=[a.server_id])
    assert orders.count(EventKind.MARKS_LOST) == 1
    assert orders.deletes == ()
    assert inv.server(a.server_id) is None
    assert inv.target_size("workers") == 1
    assert pid(a) not in {i.instance_id for i in inv.instances("workers")}
    with pytest.raises(PreconditionFailed, match="ownership marks"):
        plan_delete(inv.cluster, inv, "workers", [("n", pid(a))])
    # Its marks put back: a listing adopts it again, as ours.
    changes(inv, [a])
    assert inv.server(a.server_id) == a
    assert plan_delete(inv.cluster, inv, "workers", [("n", pid(a))]).servers == (a.server_id,)


def test_an_incremental_listing_showing_a_mark_changed_takes_the_server_out_of_view():
    a = server()
    inv = inventory(None, a)
    orders = inv.ledger.settle_changes(inv.ledger.begin_sync(), [], [], NOW, unowned=[a.server_id])
    assert orders.count(EventKind.MARKS_LOST) == 1
    assert inv.target_size("workers") == 0
    assert inv.ledger.marks_lost([a.server_id], NOW) == Orders()  # told once


def test_a_standby_adopts_the_writers_servers_silently_and_reports_strays_once_it_writes():
    """A standby's inventory follows the writer's creates: they are not strays, nor shared
    requests, to it. Once it writes, a server of a request it never made is a stray again
    (of its predecessor: a kill -9 with a create on its way)."""
    inv = inventory()
    inv.ledger.set_writer(False)
    first = changes(inv, [server(request_id=rid()), server(request_id=(shared := rid()))])
    second = changes(inv, [server(request_id=shared)])
    for orders in (first, second):
        assert orders.count(EventKind.STRAY_ADOPTED) == 0
        assert orders.count(EventKind.SHARED_REQUEST_KEPT) == 0
    inv.ledger.set_writer(True)
    late = changes(inv, [server(request_id=rid())])
    assert late.count(EventKind.STRAY_ADOPTED) == 1


# -- the project's quota --------------------------------------------------------------------------

LARGE = Flavor("f-large", "m1.large", vcpus=4, ram_mib=8192, disk_gib=80)
SMALL = Flavor("f-small", "m1.small", vcpus=1, ram_mib=2048, disk_gib=20)


def quota(instances=None, cores=None, ram=None, used=(0, 0, 0), members=None) -> ProjectQuota:
    return ProjectQuota(
        Allowance(instances, used[0]),
        Allowance(cores, used[1]),
        Allowance(ram, used[2]),
        members or {},
    )


def two_groups(**big) -> tuple[ClusterSpec, Inventory]:
    spec = cluster(node_group("big", max_size=10, **big), node_group("small", max_size=20))
    inv = inventory(spec)
    inv.snapshot.set_flavor("big", LARGE)
    inv.snapshot.set_flavor("small", SMALL)
    return spec, inv


def test_headroom_is_what_each_resource_holds_of_the_groups_flavor():
    spec, inv = two_groups()
    inv.quota.read(quota(instances=12, cores=40, ram=3 * 8192 + 4096, used=(2, 2, 4096)), {})
    big, small = inv.headroom("big"), inv.headroom("small")
    assert big.by_resource == {"instances": 10, "cores": 9, "ram_mib": 3}
    assert (big.count, big.limiting()) == (3, "ram_mib")
    assert (small.count, small.limiting()) == (10, "instances")
    # CA is told the target plus the headroom, never more than max_size.
    assert inv.reported_max(spec.group("big"), NOW) == 3
    assert inv.reported_max(spec.group("small"), NOW) == 10


def test_a_quota_shared_by_two_groups_is_never_promised_twice():
    spec, inv = two_groups()
    inv.quota.read(quota(instances=10, ram=4 * 8192), {})
    assert inv.headroom("small").count == 10
    plan = plan_increase(spec, inv, "big", 3, NOW)
    assert plan == IncreasePlan(3)
    inv.ledger.accept_creates("big", plan.creates, NOW)
    inv.quota.spend("big", plan.creates)
    # Spent by big at once: 8 GiB left for small, 4 of its servers; and 1 more of big.
    assert inv.headroom("small").count == 4
    assert inv.reported_max(spec.group("small"), NOW) == 4
    assert inv.reported_max(spec.group("big"), NOW) == 3 + 1


def test_increase_beyond_the_headroom_fails_the_rest_at_once_as_out_of_resources():
    spec, inv = two_groups()
    inv.quota.read(quota(ram=3 * 8192 + 4096), {})
    plan = plan_increase(spec, inv, "big", 5, NOW)
    assert (plan.creates, plan.refused) == (3, 2)
    assert plan.error is not None
    assert (plan.error.code, plan.error.error_class) == (
        "QuotaExceeded",
        ErrorClass.OUT_OF_RESOURCES,
    )
    assert "ram_mib" in plan.error.message
    inv.ledger.accept_creates("big", plan.creates, NOW)
    orders = inv.ledger.refuse_creates("big", plan.refused, plan.error, NOW)
    assert [e.kind for e in orders.events] == [EventKind.CREATE_FAILED] * 2
    errors = [i.error for i in inv.instances("big") if i.error is not None]
    assert errors == [plan.error, plan.error]
    assert inv.target_size("big") == 5  # until CA deletes the failed ones, as for Nova's refusals
    assert inv.ledger.creates_in_hand() == {"big": 3}


def test_server_group_members_bound_a_group_that_names_one():
    _spec, inv = two_groups(server_group="anti")
    inv.quota.read(quota(members={"anti": Allowance(10, 8)}), {"big": 1})
    room = inv.headroom("big")
    assert (room.count, room.limiting()) == (1, "server_group_members")
    assert inv.headroom("small").count is None  # no limit applies to it


def test_an_unread_or_unlimited_quota_bounds_nothing():
    spec, inv = two_groups()
    assert inv.headroom("big").count is None
    assert inv.reported_max(spec.group("big"), NOW) == 10
    inv.quota.read(quota(), {})
    assert inv.reported_max(spec.group("big"), NOW) == 10
    inv.quota.read(quota(instances=0, used=(0, 0, 0)), {})
    assert inv.reported_max(spec.group("big"), NOW) == 0
    inv.quota.forget()  # a read that failed: Nova's own refusals decide again
    assert inv.reported_max(spec.group("big"), NOW) == 10


def test_a_read_starts_again_from_novas_count_and_the_creates_in_hand():
    _spec, inv = two_groups()
    inv.quota.read(quota(instances=5), {})
    inv.quota.spend("big", 4)
    assert inv.headroom("big").count == 1
    # Nova counts 4 servers now; 1 create of osas's is still queued.
    inv.quota.read(quota(instances=5, used=(4, 0, 0)), {"big": 1})
    assert inv.headroom("big").count == 0
    inv.quota.refused()
    assert inv.quota.stale


def test_what_novas_usage_may_not_count_yet_is_taken_off_at_a_read():
    """Real Nova counts an instance in /limits only once it is scheduled (in a cell): creates
    in hand and servers still scheduling are taken off the headroom at a read."""
    spec = cluster(node_group("big", max_size=10))
    inv = inventory(
        spec,
        server("big", "BUILD", task_state="scheduling"),
        server("big", "BUILD", task_state="spawning"),
        server("big"),
    )
    queued(inv, "big")
    failed(inv, "big")
    assert inv.not_counted_by_nova() == {"big": 2}
    inv.quota.read(quota(instances=10, used=(3, 0, 0)), inv.not_counted_by_nova())
    assert inv.headroom("big").count == 5


def test_ports_and_boot_volumes_bound_the_groups_that_take_them():
    """Nova makes one port per network (Neutron's quota), and a boot-from-volume group takes
    a volume of its size (Cinder's): each bounds only the groups that take it."""
    spec = cluster(
        node_group("disk", max_size=20, boot_volume=BootVolume(50)),
        NodeGroupSpec("twonet", 0, 20, "m1.small", "img", ("a", "b")),
    )
    inv = inventory(spec)
    quota_read = ProjectQuota(
        Allowance(None),
        Allowance(None),
        Allowance(None),
        ports=Allowance(10, 3),
        volumes=Allowance(10, 0),
        volume_gib=Allowance(120, 0),
    )
    inv.quota.read(quota_read, {})
    disk, twonet = inv.headroom("disk"), inv.headroom("twonet")
    assert disk.by_resource == {"ports": 7, "volumes": 10, "volume_gib": 2}
    assert (disk.count, disk.limiting()) == (2, "volume_gib")
    assert (twonet.count, twonet.limiting()) == (3, "ports")  # 7 ports, 2 a server
    inv.quota.spend("disk", 2)  # 2 ports and 100 GiB gone: 5 ports left for twonet
    assert inv.headroom("twonet").count == 2
    assert inv.headroom("disk").count == 0


def _node(labels=None, annotations=None, name="n"):
    return NodeInfo(name, "openstack:///x", labels or {}, annotations or {})


@pytest.mark.parametrize(
    ("at_bound", "past_bound", "reason"),
    [
        (_node(name="n" * MAX_NODE_ID_LENGTH), _node(name="n" * (MAX_NODE_ID_LENGTH + 1)), "name"),
        (
            _node(labels={f"k{i}": "v" for i in range(MAX_MAP_ENTRIES)}),
            _node(labels={f"k{i}": "v" for i in range(MAX_MAP_ENTRIES + 1)}),
            "more than",
        ),
        (
            _node(annotations={"a": "v", "k" * MAX_KEY_LENGTH: "v"}),
            _node(annotations={"a": "v", "k" * (MAX_KEY_LENGTH + 1): "v"}),
            "keys longer",
        ),
        (
            _node(labels={"a": "v", "b": "v" * MAX_LABEL_VALUE_LENGTH}),
            _node(labels={"a": "v", "b": "v" * (MAX_LABEL_VALUE_LENGTH + 1)}),
            "label values",
        ),
        # Two bytes a character: the exact size, not the character count, is the bound.
        (
            _node(annotations={"a": "é" * ((MAX_ANNOTATIONS_BYTES - 1) // 2)}),
            _node(annotations={"a": "é" * ((MAX_ANNOTATIONS_BYTES - 1) // 2 + 1)}),
            "annotations exceed",
        ),
        (
            _node(annotations={"a": "v" * (MAX_ANNOTATIONS_BYTES - 1)}),
            _node(annotations={"a": "v" * MAX_ANNOTATIONS_BYTES}),
            "annotations exceed",
        ),
    ],
)
def test_a_node_at_each_bound_is_accepted_and_one_past_it_refused(at_bound, past_bound, reason):
    check_node(at_bound)
    with pytest.raises(InvalidRequest, match=reason):
        check_node(past_bound)


def _described(name: str, labels: dict[str, str]) -> NodeInfo:
    """A node with the fingerprint its canonical description would give (map order aside)."""
    pid = "openstack:///x"
    fingerprint = hash((name, pid, frozenset(labels.items())))
    return NodeInfo(name, pid, labels, {}, fingerprint)


_DESCRIPTIONS = [
    {"kubernetes.io/os": "linux"},
    {"kubernetes.io/os": "linux", "zone": "a"},
    {"kubernetes.io/os": "v" * (MAX_LABEL_VALUE_LENGTH + 1)},
    {"k" * (MAX_KEY_LENGTH + 1): "linux"},
]


@given(
    st.lists(
        st.tuples(st.sampled_from(["n0", "n1", "n2"]), st.sampled_from(_DESCRIPTIONS)),
        max_size=40,
    ),
    st.integers(min_value=1, max_value=4),
)
def test_a_remembered_check_refuses_exactly_what_the_check_refuses(calls, limit):
    """Whatever nodes come in whatever order, and however few names are remembered, a node is
    refused exactly when ``check_node`` refuses it."""
    checked = CheckedNodes(limit=limit)
    for name, labels in calls:
        node = _described(name, labels)
        try:
            check_node(node)
        except InvalidRequest as exc:
            with pytest.raises(InvalidRequest, match=re.escape(str(exc))):
                checked.check(node)
        else:
            checked.check(node)


class _ReadCounted(dict[str, str]):
    """Labels that count how often they are walked."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_a_description_that_passed_is_not_read_again_and_a_new_one_is():
    checked = CheckedNodes()
    labels = _ReadCounted({"kubernetes.io/os": "linux"})
    node = _described("n0", labels)
    checked.check(node)
    walked = _ReadCounted.walks
    assert walked > 0
    checked.check(_described("n0", labels))
    assert _ReadCounted.walks == walked  # the same description: not read again
    checked.check(NodeInfo("n0", "openstack:///x", labels, {}))  # no fingerprint: read
    assert _ReadCounted.walks > walked


def test_a_server_answered_and_read_gone_before_any_listing_showed_it_leaves_view():
    """A server Nova answered for, deleted while Nova still scheduled it (no DELETED row for
    changes-since): an incremental sync that reads it gone gives its create up at once,
    rather than wait for a complete listing to miss it."""
    inv = inventory()
    request_id, made = created(inv)
    assert inv.target_size("workers") == 1
    orders = changes(inv, [], [made.server_id], now=101.0)
    assert orders.count(EventKind.CREATE_VANISHED) == 1
    assert inv.target_size("workers") == 0
    assert inv.ledger.create(request_id) is None


def test_a_nodes_answer_is_kept_until_anything_it_is_made_of_changes():
    """NodeGroupForNode's answer is worked out (the node checked, found, its max size) once
    per node description (its fingerprint), and given again until the servers, the ledger, the
    quota or the configuration change; the answers nodes share are one object."""
    spec = cluster(node_group("workers", max_size=10))
    listed = server("workers", name="w-1")
    inv = inventory(spec, listed)
    checked: list[str] = []

    def check(node: NodeInfo) -> None:
        checked.append(node.name)
        check_node(node)

    node = NodeInfo("w-1", f"openstack:///{listed.server_id}", fingerprint=7)
    answer = inv.node_answer(node, NOW, check)
    assert answer == (spec.group("workers"), 10)
    assert inv.node_answer(node, NOW, check) is answer
    assert checked == ["w-1"]
    # Another node: worked out (not ours), and kept too.
    stranger = NodeInfo("x-1", "openstack:///0b7c2a84-8b3a-4c1e-9d7e-1a2b3c4d5e6f", fingerprint=8)
    assert inv.node_answer(stranger, NOW, check) is None
    assert inv.node_answer(stranger, NOW, check) is None
    assert checked == ["w-1", "x-1"]
    # A node of the same group, under its own fingerprint: the same answer object.
    twin = NodeInfo("w-1", f"openstack:///{listed.server_id}", fingerprint=9)
    assert inv.node_answer(twin, NOW, check) is answer
    # The quota read: the max size CA is told moves, and so does the answer.
    inv.snapshot.set_flavor("workers", LARGE)
    inv.quota.read(quota(instances=4, used=(1, 0, 0)), {})
    assert inv.node_answer(node, NOW, check) == (spec.group("workers"), 1 + 3)
    # A create accepted: the target is 2 (the quota not yet spent: still 3 more).
    queued(inv)
    assert inv.node_answer(node, NOW, check) == (spec.group("workers"), 2 + 3)
    assert checked == ["w-1", "x-1", "w-1", "w-1", "w-1"]
    # The server gone from a listing: the node is no longer one of ours.
    full_sync(inv)
    assert inv.node_answer(node, NOW, check) is None
