"""Property-based tests: every RPC, fed random, malformed and oversized messages.

For every call, whatever it carries: the answer is OK or a deliberate refusal (never INTERNAL or
UNKNOWN), the server still answers afterwards, an OK answer parses as the RPC's response, and a
refused call (or any call that only reads) leaves the observable state exactly as it was: target
sizes and instances of both groups, the servers Nova has, the queue, Nova's create/delete counts.

Hypothesis drives synchronous code, so the provider runs in a thread of its own, with its own
event loop, and the tests call it through a synchronous channel. Every test runs against two
worlds: a settled one, and a busy one with creates and deletes in flight. A call that succeeds
and may change state (a mutation) makes the world dirty: the next example starts on a fresh
FakeNova and a fresh App (starting one takes a few tens of milliseconds).

Requests are sent as bytes, so that the same path carries well-formed messages with hostile
values, raw random bytes, damaged encodings and another RPC's request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import structlog
from fake_cloud import FakeCloud
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import CLUSTER, make_config, provider_id

from osas.app import App
from osas.config import OsasConfig
from osas.domain.servers import META_CLUSTER, META_GROUP, TAG_CLUSTER_PREFIX, Fault
from osas.domain.template import LABEL_INSTANCE_TYPE
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import k8s_pb2 as k8s
from osas.sim.model import FakeNova

OK = grpc.StatusCode.OK
# Every answer a hostile request may get. INTERNAL and UNKNOWN are bugs (a crash, an unhandled
# exception, a request gRPC could not decode); DEADLINE_EXCEEDED is a hang.
ALLOWED = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAVAILABLE,
    }
)
SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"]
METHODS = tuple(method.name for method in SERVICE.methods)
REQUEST_TYPES: dict[str, type[Message]] = {
    method.name: getattr(pb, method.input_type.name) for method in SERVICE.methods
}
RESPONSE_TYPES: dict[str, type[Message]] = {
    method.name: getattr(pb, method.output_type.name) for method in SERVICE.methods
}
MUTATIONS = frozenset(
    {"NodeGroupIncreaseSize", "NodeGroupDeleteNodes", "NodeGroupDecreaseTargetSize"}
)
MAX_MESSAGE = 4 * 1024 * 1024  # the server's max receive size
MAX_REQUEST = MAX_MESSAGE - 4096  # what generated requests stay under
CALL_TIMEOUT = 20.0
# cluster-autoscaler is a Go client, which accepts response headers and trailers up to 16 MiB;
# grpc-python's defaults (8 KiB soft, 16 KiB hard) would turn long status details into a
# client-side RESOURCE_EXHAUSTED. Look at the server as CA sees it.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_metadata_size", 16 * 1024 * 1024),
    ("grpc.absolute_max_metadata_size", 16 * 1024 * 1024),
]
PRICING = {"cpu_per_hour": 0.01, "memory_gib_per_hour": 0.005, "gpu_per_hour": 1.5}

INT32 = st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, -1, 2**31 - 1, -(2**31)])
# Seconds at the edges: protobuf's valid Duration/Timestamp range, Python's timedelta/datetime.
SECONDS_EDGES = [
    0,
    -1,
    315_576_000_000,
    315_576_000_001,
    -315_576_000_001,
    253_402_300_799,
    253_402_300_800,
    86_399_999_999_999,
    86_400_000_000_000,
    -86_400_000_000_000,
    2**63 - 1,
    -(2**63),
]
INT64 = st.integers(-(2**63), 2**63 - 1) | st.sampled_from(SECONDS_EDGES)
HEX = "0123456789abcdef"

SETTINGS = settings(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)


# -- the provider, in a thread ---------------------------------------------------------------------


class Running:
    """One App on a FakeNova, served from its own thread and event loop on 127.0.0.1."""

    def __init__(self, config: OsasConfig, nova: FakeNova) -> None:
        self.config = config
        self.nova = nova
        self.app: App | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="osas-under-test", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.app = App(self.config, FakeCloud(self.nova))
            await self.app.run()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by the tests, not lost in a thread
            self.error = exc

    def start(self, timeout: float = 15.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while self.app is None or not self.app.serving.is_set():
            assert self.error is None, f"the provider died while starting: {self.error!r}"
            assert time.monotonic() < deadline, "the provider did not start serving"
            time.sleep(0.002)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def address(self) -> str:
        assert self.app is not None
        return f"127.0.0.1:{self.app.server.port}"

    def stop(self) -> None:
        if self.loop is not None and self.app is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.app.stop)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the provider did not stop"
        assert self.error is None, f"the provider failed: {self.error!r}"


@dataclass
class Call:
    code: grpc.StatusCode
    details: str
    answer: bytes | None


class World:
    """The provider under test, with servers of both groups, strangers and one failed create.

    Seeded: workers 3 ACTIVE + 1 BUILD + 2 sharing a name, gpu 1 ACTIVE + 1 ERROR, one server
    whose name is also used in the other group, one of another cluster, one without our marks,
    one of ours in a group that is not configured; then a create refused by Nova's quota, which
    leaves a placeholder instance (osas://workers/<hex32>) with error info.

    A busy world has work in flight on top of that: a worker and the ERROR gpu server being
    deleted (DeleteNodes sent their DELETEs before answering; no listing has shown them gone),
    then, frozen by an hour of Nova latency, three creates of workers (two taken by the two
    workers, one queued).
    """

    def __init__(self, config: OsasConfig, *, busy: bool = False) -> None:
        self.config = config
        self.busy = busy
        self.running: Running | None = None
        self.channel: grpc.Channel | None = None
        self.methods: dict[str, Callable[..., Any]] = {}
        self.dirty = True
        self.resets = 0
        self.ours: list[str] = []  # server ids, both groups
        self.strangers: list[str] = []  # server ids not ours to touch
        self.names: list[str] = []  # server names, ours and strangers
        self.placeholders: list[str] = []

    def __repr__(self) -> str:
        kind = "busy" if self.busy else "settled"
        address = self.running.address if self.running else "stopped"
        return f"World({kind}, {address}, resets={self.resets})"

    @property
    def nova(self) -> FakeNova:
        assert self.running is not None
        return self.running.nova

    # -- lifecycle --

    def start(self) -> None:
        nova = FakeNova()
        self.ours, self.strangers, self.names, self.placeholders = [], [], [], []

        def seed(name: str, group: str | None, cluster: str = CLUSTER, **kwargs: Any) -> str:
            metadata = {} if group is None else {META_CLUSTER: cluster, META_GROUP: group}
            tags = [f"{TAG_CLUSTER_PREFIX}{cluster}"]
            server = nova.seed(name=name, metadata=metadata, tags=tags, **kwargs)
            self.names.append(name)
            return server.server_id

        self.ours += [seed(f"{CLUSTER}-workers-{i}", "workers") for i in range(3)]
        self.ours.append(seed(f"{CLUSTER}-workers-3", "workers", status="BUILD"))
        self.ours += [seed(f"{CLUSTER}-twin", "workers") for _ in range(2)]
        self.ours.append(seed(f"{CLUSTER}-gpu-0", "gpu"))
        self.ours.append(seed(f"{CLUSTER}-gpu-1", "gpu", status="ERROR", fault=Fault(500, "x")))
        self.ours.append(seed(f"{CLUSTER}-both", "gpu"))
        self.strangers.append(seed(f"{CLUSTER}-workers-9", "workers", cluster="other"))
        self.strangers.append(seed(f"{CLUSTER}-workers-8", None))
        self.strangers.append(seed(f"{CLUSTER}-ghost-0", "ghost"))
        self.strangers.append(seed(f"{CLUSTER}-both", "workers", cluster="other"))

        self.running = Running(self.config, nova)
        self.running.start()
        self.channel = grpc.insecure_channel(self.running.address, options=CHANNEL_OPTIONS)
        self.methods = {
            name: self.channel.unary_unary(
                f"/{SERVICE.full_name}/{name}",
                request_serializer=None,
                response_deserializer=None,
            )
            for name in METHODS
        }
        self._add_failed_create()
        if self.busy:
            self._add_work_in_flight()
        self.dirty = False

    def _add_failed_create(self) -> None:
        """A create Nova refuses (quota): CA sees a placeholder in creating with error info."""
        self.nova.faults.quota_exceeded = 1
        increase = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1)
        call = self.call("NodeGroupIncreaseSize", increase.SerializeToString())
        assert call.code is OK, call
        deadline = time.monotonic() + 10
        while not self.placeholders:
            assert time.monotonic() < deadline, "the failed create never showed"
            self.placeholders = [
                i.id
                for i in self.instances("workers")
                if i.id.startswith("osas://") and i.status.errorInfo.errorCode
            ]
            time.sleep(0.005)

    def _must(self, method: str, request: Message) -> None:
        call = self.call(method, request.SerializeToString())
        assert call.code is OK, f"setting up: {method} answered {call}"

    def _add_work_in_flight(self) -> None:
        for group, server_id in (("workers", self.ours[0]), ("gpu", self.ours[7])):
            node = pb.ExternalGrpcNode(name="n", providerID=provider_id(server_id))
            self._must(
                "NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id=group, nodes=[node])
            )
        self.nova.faults.latency = 3600.0
        self._must("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id="workers", delta=3))
        assert self.running is not None
        assert self.running.app is not None
        queue = self.running.app.queue
        deadline = time.monotonic() + 10
        # Of 3 creates, the 2 workers hold one each.
        while len(queue) != 1:
            assert time.monotonic() < deadline, f"queue never settled: {len(queue)} tasks"
            time.sleep(0.002)
        self.placeholders = [i.id for i in self.instances("workers") if i.id.startswith("osas://")]

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.running is not None:
            self.running.stop()
            self.running = None

    def ready(self) -> None:
        """A clean world for the next example: restarted if the last one may have changed it."""
        if self.dirty or self.running is None or not self.running.alive:
            self.stop()
            self.resets += 1
            self.start()

    # -- calls --

    def call(self, method: str, payload: bytes) -> Call:
        try:
            answer = self.methods[method](payload, timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            error: Any = exc
            return Call(error.code(), error.details() or "", None)
        return Call(OK, "", answer)

    def typed(self, method: str, request: Message) -> Message:
        """A call that must succeed (the tests' own reads), its answer parsed."""
        call = self.call(method, request.SerializeToString())
        assert call.code is OK, f"{method} for the snapshot answered {call.code.name}: {call}"
        assert call.answer is not None
        return RESPONSE_TYPES[method].FromString(call.answer)

    def instances(self, group: str) -> list[Any]:
        answer: Any = self.typed("NodeGroupNodes", pb.NodeGroupNodesRequest(id=group))
        return list(answer.instances)

    def snapshot(self) -> tuple[object, ...]:
        """Everything a call could change that CA or Nova would notice."""
        sizes = []
        for group in ("workers", "gpu"):
            size: Any = self.typed("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group))
            instances = sorted(
                (i.id, i.status.instanceState, i.status.errorInfo.errorCode)
                for i in self.instances(group)
            )
            sizes.append((group, size.targetSize, instances))
        nova = self.nova
        with nova.lock:
            servers = sorted(server.server_id for server in nova.live_servers())
            calls = (nova.calls["servers.create"], nova.calls["servers.delete"])
        assert self.running is not None
        assert self.running.app is not None
        return (*sizes, servers, calls, len(self.running.app.queue))

    def still_answers(self) -> None:
        assert self.running is not None
        assert self.running.alive, f"the provider died: {self.running.error!r}"
        answer: Any = self.typed("NodeGroups", pb.NodeGroupsRequest())
        assert sorted(group.id for group in answer.nodeGroups) == ["gpu", "workers"]


@contextlib.contextmanager
def errors_only_in_logs() -> Iterator[None]:
    """Thousands of refusals, logged with the hostile values in them, would bury the one
    traceback that matters: keep errors only, with plain tracebacks, while these tests run."""
    previous = structlog.get_config()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(
                colors=False, exception_formatter=structlog.dev.plain_traceback
            ),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.configure(**previous)


@pytest.fixture(scope="module", params=["settled", "busy"])
def world(request, tmp_path_factory):
    # A short grace: stopping a busy world must not wait for creates Nova takes an hour over.
    config = make_config(
        tmp_path_factory.mktemp("properties"), pricing=PRICING, shutdown_grace="0.05s"
    )
    built = World(config, busy=request.param == "busy")
    with errors_only_in_logs():
        built.start()
        yield built
        built.stop()


def shown(payload: bytes | Message, limit: int = 300) -> str:
    text = repr(payload)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def check(world: World, method: str, payload: bytes) -> Call:
    """Send one request and check every property; the call's outcome for further checks."""
    world.ready()
    before = world.snapshot()
    world.dirty = True  # until proven otherwise: a failure below leaves the world suspect
    call = world.call(method, payload)
    world.still_answers()
    if call.code is not OK or method not in MUTATIONS:
        after = world.snapshot()
        assert after == before, (
            f"{method} answered {call.code.name} ({call.details[:300]!r}) but changed the state:"
            f"\nbefore {before}\nafter  {after}\nrequest: {len(payload)} bytes {shown(payload)}"
        )
        world.dirty = False
    assert call.code in ALLOWED, (
        f"{method} answered {call.code.name}: {call.details[:500]!r} "
        f"to {len(payload)} bytes {shown(payload)}"
    )
    if call.code is OK:
        assert call.answer is not None
        RESPONSE_TYPES[method].FromString(call.answer)  # an answer CA can read
    return call


# -- strategies: values ----------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8"), max_size=80)
UNITS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=3)


def long_text(min_size: int = 64, max_size: int = 300_000) -> st.SearchStrategy[str]:
    """A long string made of a short repeated unit (cheap to draw, up to ~1 MB of UTF-8)."""
    return st.builds(
        lambda unit, size: (unit * (size // len(unit) + 1))[:size],
        UNITS,
        st.integers(min_size, max_size) | st.sampled_from([253, 254, 317, 318, 1000, 300_000]),
    )


GROUP_IDS = [
    "workers",
    "gpu",
    "",
    "WORKERS",
    "Workers",
    "workers ",
    " workers",
    "worker",
    "workerss",
    "workers\x00",
    "\x00",
    "gpu\n",
    "gpu/",
    "workers/gpu",
    "w\u00f6rkers",
    "\uff57orkers",  # fullwidth w
    "workers\u200b",
    f"{CLUSTER}-workers",
    "ghost",
    "a" * 40,
    "a" * 41,
    "a" * 63,
    "a" * 64,
    "*",
    ".*",
    "%s%n",
    "../workers",
]


def group_ids() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["workers", "gpu"]), st.sampled_from(GROUP_IDS), TEXT, long_text()
    )


def hex32() -> st.SearchStrategy[str]:
    return st.text(HEX, min_size=32, max_size=32)


def malformed_ids(server_id: str) -> list[str]:
    return [
        "openstack://",
        "openstack:///",
        "openstack:////",
        f"openstack://RegionOne/{server_id}",
        f"openstack:///{server_id.upper()}",
        f"OPENSTACK:///{server_id}",
        f"openstack:///{server_id}/",
        f"openstack:///{server_id} ",
        f" openstack:///{server_id}",
        f"openstack:///{server_id}\x00",
        f"openstack:///{server_id[:-1]}",
        f"openstack:///{server_id}0",
        f"openstack:///{server_id.replace('-', '')}",
        server_id,
        "aws:///us-east-1a/i-0123456789abcdef0",
        "gce://project/zone/instance",
        "osas://",
        "osas://workers",
        "osas://workers/",
        f"osas://workers/{'z' * 32}",
        f"osas://workers/{'a' * 31}",
        f"osas://workers/{'a' * 33}",
        f"osas:///{'a' * 32}",
        f"osas://WORKERS/{'a' * 32}",
        f"osas://workers/{'A' * 32}",
        f"osas://workers//{'a' * 32}",
    ]


def provider_ids(world: World) -> st.SearchStrategy[str]:
    real = [provider_id(s) for s in world.ours + world.strangers]
    return st.one_of(
        st.sampled_from(real),
        st.sampled_from(world.placeholders),
        st.builds(
            lambda group, request: f"osas://{group}/{request}",
            st.sampled_from(["workers", "gpu", "ghost", ""]) | group_ids(),
            hex32() | TEXT,
        ),
        st.uuids().map(lambda u: provider_id(str(u))),
        st.sampled_from(world.ours).flatmap(lambda s: st.sampled_from(malformed_ids(s))),
        st.just(""),
        TEXT,
        long_text(),
    )


def node_names(world: World) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(world.names), st.just(""), TEXT, long_text())


def big_map(count: int, key_size: int, value_size: int, prefix: str) -> dict[str, str]:
    """``count`` entries with keys of ``key_size`` and values of ``value_size`` characters,
    clamped to about 800 KB in all."""
    budget = 800_000
    count = min(count, budget // max(key_size, 1))
    value_size = min(value_size, (budget - count * key_size) // max(count, 1))
    return {f"{prefix}{i}".ljust(key_size, "k"): "v" * value_size for i in range(count)}


def string_maps() -> st.SearchStrategy[dict[str, str]]:
    return st.one_of(
        st.dictionaries(TEXT, TEXT, max_size=6),
        st.fixed_dictionaries(
            {
                LABEL_INSTANCE_TYPE: st.sampled_from(
                    ["m1.medium", "g1.xlarge", "f-medium", "f-gpu", "m1.small", "nope", ""]
                )
            }
        ),
        st.builds(
            big_map,
            st.integers(0, 3000) | st.sampled_from([512, 513, 1000]),
            st.integers(1, 400) | st.sampled_from([63, 64, 317, 318]),
            st.integers(0, 300_000) | st.sampled_from([63, 64, 256 * 1024, 256 * 1024 + 1]),
            st.sampled_from(["", "example.com/", "kubernetes.io/"]),
        ),
    )


def nodes(world: World, maps: st.SearchStrategy[dict[str, str]] | None = None) -> Any:
    maps = string_maps() if maps is None else maps
    return st.builds(
        pb.ExternalGrpcNode,
        name=node_names(world),
        providerID=provider_ids(world),
        labels=maps,
        annotations=maps,
    )


def bulk_nodes(world: World, template: Any, count: int, mode: str) -> list[Any]:
    """Many nodes, cheaply: one pattern, ``count`` times."""
    ours = [provider_id(s) for s in world.ours]

    # Never build more than fits in one request: the server's limit would cut it anyway.
    count = min(count, MAX_REQUEST // (template.ByteSize() + 8))

    def one(i: int) -> Any:
        node = pb.ExternalGrpcNode()
        node.CopyFrom(template)
        if mode == "uuids":
            node.providerID = provider_id(str(uuid.UUID(int=i + 1)))
        elif mode == "placeholders":
            node.providerID = f"osas://workers/{i:032x}"
        elif mode == "names":
            node.providerID, node.name = "", f"{CLUSTER}-workers-{i}"
        elif mode == "ours":
            node.providerID = ours[i % len(ours)]
        return node

    return [one(i) for i in range(count)]


def node_lists(world: World) -> Any:
    small_maps = st.dictionaries(TEXT, TEXT, max_size=3)
    return st.one_of(
        st.lists(nodes(world), max_size=12),
        st.builds(
            lambda *args: bulk_nodes(world, *args),
            nodes(world, small_maps),
            st.integers(0, 2000) | st.sampled_from([999, 1000, 1001, 2000]),
            st.sampled_from(["same", "uuids", "placeholders", "names", "ours"]),
        ),
    )


def periods() -> st.SearchStrategy[dict[str, Any]]:
    """The time window of a price request, in every shape: the 1.35+ timestamps, the legacy
    times, both, one bound only, none; backwards and at the edges of every range."""
    new = st.builds(Timestamp, seconds=INT64, nanos=INT32)
    legacy = st.builds(pb.LegacyTime, seconds=INT64, nanos=INT32)
    whole = {"startTimestamp": new, "endTimestamp": new}
    old = {"startTime": legacy, "endTime": legacy}
    ordinary = st.tuples(st.integers(0, 2**33), st.integers(0, 10**6)).map(
        lambda pair: {
            "startTimestamp": Timestamp(seconds=pair[0]),
            "endTimestamp": Timestamp(seconds=pair[0] + pair[1]),
        }
    )
    return st.one_of(
        ordinary,
        st.fixed_dictionaries(whole),
        st.fixed_dictionaries(old),
        st.fixed_dictionaries({**whole, **old}),
        st.fixed_dictionaries({}, optional={**whole, **old}),
    )


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(field_number: int, data: bytes) -> bytes:
    return varint(field_number << 3 | 2) + varint(len(data)) + data


QUANTITIES = [
    "1",
    "500m",
    "2Gi",
    "1e3",
    "1E3Ki",
    "0",
    "-1",
    "+1",
    "0.5",
    ".5",
    ".",
    "",
    "1.2.3",
    "1e400",
    "1e-400",
    "1e9999999999",
    "9" * 40,
    "999999999999999999999999Ei",
    "1Ei",
    "nan",
    "inf",
    "1 Gi",
    " 1Gi ",
    "1gi",
]


def pods() -> st.SearchStrategy[bytes]:
    quantity = st.sampled_from(QUANTITIES) | st.text(st.characters(codec="utf-8"), max_size=24)
    resources = st.dictionaries(
        st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"]) | TEXT,
        quantity,
        max_size=4,
    )

    def container(requests: dict[str, str]) -> Any:
        built = k8s.Container(name="c")
        for name, value in requests.items():
            built.resources.requests[name].string = value
        return built

    def pod(containers: list[Any], init: list[Any], overhead: dict[str, str]) -> bytes:
        built = k8s.Pod()
        built.spec.containers.extend(containers)
        built.spec.initContainers.extend(init)
        for name, value in overhead.items():
            built.spec.overhead[name].string = value
        return built.SerializeToString()

    def wire_pod(key: bytes, value: bytes, where: int) -> bytes:
        """A Pod encoded by hand, so that its strings need not be UTF-8 (the k8s messages are
        proto2: the parser lets such strings through)."""
        entry = length_delimited(1, key) + length_delimited(2, length_delimited(1, value))
        if where == 0:  # spec.overhead
            return length_delimited(2, length_delimited(32, entry))
        resources = length_delimited(8, length_delimited(2, entry))  # resources.requests
        return length_delimited(2, length_delimited(where, resources))  # (init)containers

    raw_strings = st.sampled_from([b"cpu", b"memory", b"1", b"\x80", b"\xff", b"\xed\xa0\x80"])
    containers = st.lists(st.builds(container, resources), max_size=4)
    valid = st.builds(pod, containers, containers, resources)
    many = st.builds(
        lambda one, count: pod([one] * count, [], {}),
        st.builds(container, resources),
        st.integers(0, 5000),
    )
    return st.one_of(
        valid,
        many,
        st.builds(
            wire_pod,
            raw_strings | st.binary(max_size=8),
            raw_strings | st.binary(max_size=8),
            st.sampled_from([0, 2, 20]),
        ),
        st.binary(max_size=200),
        st.builds(lambda data, junk: data + junk, valid, st.binary(min_size=1, max_size=16)),
        st.builds(lambda data, cut: data[:cut], valid, st.integers(0, 40)),
    )


def durations() -> Any:
    return st.none() | st.builds(Duration, seconds=INT64, nanos=INT32)


def options() -> Any:
    floats = st.floats(allow_nan=True, allow_infinity=True)

    def build(values: dict[str, Any]) -> Any:
        message = pb.NodeGroupAutoscalingOptions()
        for name, value in values.items():
            if value is None:
                continue
            if isinstance(value, Message):
                getattr(message, name).CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    legacy = st.none() | st.builds(pb.LegacyDuration, duration=INT64)
    return st.none() | st.builds(
        build,
        st.fixed_dictionaries(
            {
                "scaleDownUtilizationThreshold": floats,
                "scaleDownGpuUtilizationThreshold": floats,
                "scaleDownUnneededTime": legacy,
                "scaleDownUnreadyTime": legacy,
                "MaxNodeProvisionTime": legacy,
                "zeroOrMaxNodeScaling": st.booleans(),
                "ignoreDaemonSetsUtilization": st.booleans(),
                "scaleDownUnneededDuration": durations(),
                "scaleDownUnreadyDuration": durations(),
                "MaxNodeProvisionDuration": durations(),
            }
        ),
    )


# -- strategies: requests --------------------------------------------------------------------------


def build(message_type: type[Message], **fields: Any) -> Message:
    """A message from fields, leaving out the ones drawn as None (unset, not empty)."""
    message = message_type()
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, Message):
            getattr(message, name).CopyFrom(value)
        elif isinstance(value, list):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return message


def fit(message: Message) -> Message:
    """Drop nodes until the request fits the server's receive limit."""
    if isinstance(message, pb.NodeGroupDeleteNodesRequest):
        while message.ByteSize() > MAX_REQUEST and len(message.nodes) > 1:
            del message.nodes[len(message.nodes) // 2 :]
    return message


def deltas() -> st.SearchStrategy[int]:
    edges = [0, 1, -1, 2, -2, 9, 10, 11, -9, -10, 2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1]
    return st.sampled_from(edges) | INT32


def typed_requests(world: World, method: str) -> st.SearchStrategy[Message]:  # noqa: PLR0911
    """Request messages of ``method`` with hostile values in every field."""
    match method:
        case "NodeGroupForNode":
            return st.builds(pb.NodeGroupForNodeRequest, node=st.none() | nodes(world))
        case "PricingNodePrice":
            return st.builds(
                lambda node, period: build(pb.PricingNodePriceRequest, node=node, **period),
                st.none() | nodes(world),
                periods(),
            )
        case "PricingPodPrice":
            return st.builds(
                lambda pod, pod_bytes, period: build(
                    pb.PricingPodPriceRequest, pod=pod, pod_bytes=pod_bytes, **period
                ),
                st.none() | pods(),
                st.none() | pods(),
                periods(),
            )
        case "NodeGroupIncreaseSize" | "NodeGroupDecreaseTargetSize":
            return st.builds(REQUEST_TYPES[method], id=group_ids(), delta=deltas())
        case "NodeGroupDeleteNodes":
            return st.builds(
                lambda group, node_list: fit(
                    pb.NodeGroupDeleteNodesRequest(id=group, nodes=node_list)
                ),
                group_ids(),
                node_lists(world),
            )
        case "NodeGroupTargetSize" | "NodeGroupNodes" | "NodeGroupTemplateNodeInfo":
            return st.builds(REQUEST_TYPES[method], id=group_ids())
        case "NodeGroupGetOptions":
            return st.builds(
                lambda group, defaults: build(
                    pb.NodeGroupAutoscalingOptionsRequest, id=group, defaults=defaults
                ),
                group_ids(),
                options(),
            )
        case _:
            # No fields: what arrives can only be unknown fields, e.g. another RPC's request.
            others = [m for m in METHODS if REQUEST_TYPES[m].DESCRIPTOR.fields]
            return st.just(REQUEST_TYPES[method]()) | st.sampled_from(others).flatmap(
                lambda other: typed_requests(world, other)
            )


def typed_payloads(world: World, method: str) -> st.SearchStrategy[bytes]:
    return typed_requests(world, method).map(lambda message: message.SerializeToString())


# -- strategies: raw bytes -------------------------------------------------------------------------


def pseudo_random(seed: int, size: int) -> bytes:
    return hashlib.shake_256(seed.to_bytes(8, "little")).digest(size)


def flip(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    changed = bytearray(data)
    for position, mask in edits:
        if changed:
            changed[position % len(changed)] ^= mask
    return bytes(changed)


def raw_payloads(world: World, method: str) -> st.SearchStrategy[bytes]:
    valid = typed_payloads(world, method)
    not_utf8 = st.binary(min_size=1, max_size=16).map(lambda b: b"\xff" + b)
    return st.one_of(
        st.binary(max_size=64),
        st.binary(min_size=65, max_size=4096),
        st.builds(pseudo_random, st.integers(0, 2**32), st.integers(0, 1_000_000)),
        # A valid request, bit-flipped, truncated, or with junk after it.
        st.builds(flip, valid, st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 255)))),
        st.builds(lambda data, cut: data[: max(len(data) - cut, 0)], valid, st.integers(1, 64)),
        st.builds(lambda data, junk: data + junk, valid, st.binary(min_size=1, max_size=32)),
        # Another RPC's request, or a string field that is not UTF-8.
        st.sampled_from(METHODS).flatmap(lambda other: typed_payloads(world, other)),
        st.builds(length_delimited, st.integers(1, 6), not_utf8),
        st.builds(
            lambda inner, field_number: length_delimited(field_number, length_delimited(2, inner)),
            not_utf8,
            st.integers(1, 4),
        ),
        # A length that runs past the end, a varint that never ends, a deprecated group.
        st.builds(lambda n: varint(n << 3 | 2) + varint(2**40), st.integers(1, 6)),
        st.just(b"\x08" + b"\xff" * 11),
        st.just(b"\x0b\x0c"),
        st.just(b"\x0f"),
    )


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@settings(SETTINGS, max_examples=40)
@given(data=st.data())
def test_every_rpc_survives_hostile_messages(world, method, data):
    world.ready()
    payload = data.draw(typed_payloads(world, method), label="request")
    assume(len(payload) <= MAX_REQUEST)
    check(world, method, payload)


@pytest.mark.parametrize("method", METHODS)
@settings(SETTINGS, max_examples=30)
@given(data=st.data())
def test_every_rpc_survives_raw_bytes(world, method, data):
    # Bytes that do not decode must be refused by osas (INVALID_ARGUMENT), not answered with
    # grpc-python's default for a failing deserializer (UNKNOWN/INTERNAL).
    world.ready()
    payload = data.draw(raw_payloads(world, method), label="body")
    assume(len(payload) <= MAX_REQUEST)
    check(world, method, payload)


@pytest.mark.parametrize("world", ["settled"], indirect=True)
@pytest.mark.parametrize("method", METHODS)
def test_oversized_requests_are_refused_by_grpc(world, method):
    # A request that would be accepted (IncreaseSize would succeed), padded past the limit
    # with an unknown field: gRPC refuses it before osas sees it, and nothing changes.
    request = REQUEST_TYPES[method]()
    if "id" in request.DESCRIPTOR.fields_by_name:
        request.id = "workers"
    if "delta" in request.DESCRIPTOR.fields_by_name:
        request.delta = 1
    body = request.SerializeToString()
    padding = length_delimited(1000, b"x" * (MAX_MESSAGE - len(body)))
    call = check(world, method, body + padding)
    assert call.code is grpc.StatusCode.RESOURCE_EXHAUSTED, call


def test_the_world_is_what_the_properties_assume(world):
    """The seeded state the strategies aim at: if this breaks, the properties aim at nothing."""
    world.ready()
    workers = world.instances("workers")
    gpu = world.instances("gpu")
    # 3 ACTIVE, 1 BUILD, 2 twins, 1 failed create (+ 3 creates in flight when busy)
    assert len(workers) == (10 if world.busy else 7)
    assert len(gpu) == 3  # ACTIVE, ERROR, one sharing its name with a stranger
    assert len(world.placeholders) == (4 if world.busy else 1)
    deleting = pb.InstanceStatus.instanceDeleting
    assert sum(i.status.instanceState == deleting for i in workers + gpu) == (
        2 if world.busy else 0
    )
    assert all(provider_id(s) in {i.id for i in workers + gpu} for s in world.ours)
    assert not {provider_id(s) for s in world.strangers} & {i.id for i in workers + gpu}
