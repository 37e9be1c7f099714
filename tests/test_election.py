"""Leader election on a Kubernetes Lease: real lightkube over HTTP on loopback, against the
stand-in (osas/sim/kubernetes.py) and, when OSAS_TEST_KUBECONFIG names a kubeconfig, against a
real API server (OSAS_TEST_NAMESPACE, default "default", must let it get, create, update and
delete Leases and EndpointSlices).

The holder publishes itself as the one endpoint of CA's Service; the tests play kube-proxy
with the stand-in's ``service_endpoint``, and "CA dials the Service" is a connection to the
address it names, where each candidate's pod (a loopback address of its own) answers its name.

Orderings are asserted on one clock: the elections', the tests' and the stand-in's records of
each write all read time.monotonic() in this process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketListener, SocketStream
from structlog.testing import capture_logs
from support import config_data, write_config

from osas.election import (
    ElectionSettings,
    ElectionSetupError,
    NoElection,
    PreviousHolder,
    default_identity,
    lease_name_for,
    resolve_endpoint,
)
from osas.election.lease import LeaseElection
from osas.sim.kubernetes import DEFAULT_TOKEN, DROP, HANG, KubeStandIn, routes

FAST = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}
# A lease duration of 5 s: what happens within a second is not the periodic check's doing.
SLOW = {"lease_duration": 5.0, "renew_deadline": 3.0, "retry_period": 0.1}
WAIT = 15.0  # the longest any wait may take on a loaded machine; failures show well before
SERVICE = "osas-provider"


@dataclass(frozen=True)
class Pod:
    """A candidate as CA's Service sees it: its pod's name (the identity), IP and the port it
    serves CA on."""

    name: str
    ip: str
    port: int


@dataclass
class Kube:
    """Where the Leases live: the stand-in, or a real API server."""

    kind: str
    kubeconfig: Path
    namespace: str
    standin: KubeStandIn | None = None
    names: list[str] = field(default_factory=list)
    services: list[str] = field(default_factory=list)

    def new_lease(self) -> str:
        name = f"osas-test-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return name

    def new_service(self) -> str:
        name = f"osas-test-{uuid.uuid4().hex[:10]}"
        self.services.append(name)
        return name

    def pod_ip(self, host: int) -> str:
        """A fake pod IP: loopback on the stand-in, so that tests can dial it; a documentation
        address on a real API server, which refuses loopback endpoints."""
        return f"127.0.0.{host}" if self.standin is not None else f"192.0.2.{host}"

    def settings(
        self,
        lease: str,
        who: str | Pod,
        *,
        service: str = "",
        kubeconfig: Path | None = None,
        **timings: float,
    ) -> ElectionSettings:
        endpoint: dict[str, Any] = {}
        if isinstance(who, Pod) and service:
            endpoint = {
                "service_name": service,
                "service_namespace": self.namespace,
                "pod_ip": who.ip,
                "endpoint_port": who.port,
            }
        return ElectionSettings(
            enabled=True,
            lease_name=lease,
            lease_namespace=self.namespace,
            identity=who.name if isinstance(who, Pod) else who,
            kubeconfig=kubeconfig or self.kubeconfig,
            **endpoint,
            **(FAST | timings),
        )

    def endpoint_slice(self, service: str) -> dict[str, Any] | None:
        name = f"{service}-leader"
        if self.standin is not None:
            return self.standin.endpoint_slice(self.namespace, name)
        from lightkube import ApiError, Client, KubeConfig  # noqa: PLC0415 - the real lane only
        from lightkube.resources.discovery_v1 import EndpointSlice  # noqa: PLC0415

        client = Client(KubeConfig.from_file(self.kubeconfig))
        try:
            return client.get(EndpointSlice, name, namespace=self.namespace).to_dict()
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        finally:
            client.close()

    def service_endpoint(self, service: str) -> tuple[str, int] | None:
        """Where kube-proxy sends CA's connections to ``service``."""
        if self.standin is not None:
            return self.standin.service_endpoint(self.namespace, service)
        stored = self.endpoint_slice(service)
        found = {(address, port) for address, port, _ in routes(stored)} if stored else set()
        assert len(found) <= 1, found
        return found.pop() if found else None

    def read(self, lease: str) -> dict[str, Any] | None:
        if self.standin is not None:
            return self.standin.lease(self.namespace, lease)
        from lightkube import ApiError, Client, KubeConfig  # noqa: PLC0415 - the real lane only
        from lightkube.resources.coordination_v1 import Lease  # noqa: PLC0415

        client = Client(KubeConfig.from_file(self.kubeconfig))
        try:
            return client.get(Lease, lease, namespace=self.namespace).to_dict()
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        finally:
            client.close()

    def delete(self, lease: str) -> None:
        """Delete the Lease as a person with kubectl would."""
        if self.standin is not None:
            self.standin.delete_lease(self.namespace, lease)
            return
        from lightkube import Client, KubeConfig  # noqa: PLC0415 - the real lane only
        from lightkube.resources.coordination_v1 import Lease  # noqa: PLC0415

        client = Client(KubeConfig.from_file(self.kubeconfig))
        try:
            client.delete(Lease, lease, namespace=self.namespace)
        finally:
            client.close()

    def clean_up(self) -> None:
        if self.standin is not None or not (self.names or self.services):
            return
        from lightkube import ApiError, Client, KubeConfig  # noqa: PLC0415 - the real lane only
        from lightkube.resources.coordination_v1 import Lease  # noqa: PLC0415
        from lightkube.resources.discovery_v1 import EndpointSlice  # noqa: PLC0415

        client = Client(KubeConfig.from_file(self.kubeconfig))
        made = [(Lease, name) for name in self.names]
        made += [(EndpointSlice, f"{service}-leader") for service in self.services]
        for kind, name in made:
            try:
                client.delete(kind, name, namespace=self.namespace)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
        client.close()


@pytest.fixture
def standin():
    with KubeStandIn() as running:
        yield running


@pytest.fixture(params=["standin", "real"])
def kube(request, tmp_path):
    if request.param == "standin":
        running = request.getfixturevalue("standin")
        yield Kube(
            "standin", running.write_kubeconfig(tmp_path / "kubeconfig"), "kube-system", running
        )
        return
    path = os.environ.get("OSAS_TEST_KUBECONFIG")
    if not path:
        pytest.skip("OSAS_TEST_KUBECONFIG names no kubeconfig: the real API server lane is off")
    real = Kube("real", Path(path), os.environ.get("OSAS_TEST_NAMESPACE", "default"))
    yield real
    real.clean_up()


@pytest.fixture
def on_standin(standin, tmp_path):
    return Kube(
        "standin", standin.write_kubeconfig(tmp_path / "kubeconfig"), "kube-system", standin
    )


@dataclass
class Candidate:
    """One osas's election loop, run as a task; ``crash`` stops it without a release, as a
    SIGKILL would."""

    election: LeaseElection
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    returned_at: float | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def identity(self) -> str:
        return self.election.identity

    async def run(self) -> None:
        with self.scope:
            await self.election.run_election()
            self.returned_at = time.monotonic()
        self.done.set()

    def crash(self) -> None:
        self.scope.cancel()


@asynccontextmanager
async def candidates(
    kube: Kube,
    lease: str,
    *identities: str | Pod,
    service: str = "",
    kubeconfig: Path | None = None,
    **timings: float,
) -> AsyncIterator[list[Candidate]]:
    """One candidate per identity; a Pod publishes itself as ``service``'s endpoint."""
    running = [
        Candidate(
            LeaseElection(
                kube.settings(lease, who, service=service, kubeconfig=kubeconfig, **timings)
            )
        )
        for who in identities
    ]
    async with anyio.create_task_group() as group:
        for candidate in running:
            group.start_soon(candidate.run)
        yield running
        group.cancel_scope.cancel()


@asynccontextmanager
async def serving(*pods: tuple[str, str]) -> AsyncIterator[list[Pod]]:
    """Each (name, ip) as a pod serving CA on a port of its own, answering its name."""

    async def serve(listener: SocketListener, name: str) -> None:
        async def answer(stream: SocketStream) -> None:
            async with stream:
                await stream.send(name.encode())

        async with listener:
            await listener.serve(answer)

    async with anyio.create_task_group() as group:
        made = []
        for name, ip in pods:
            listener = await anyio.create_tcp_listener(local_host=ip, local_port=0)
            group.start_soon(serve, listener, name)
            port = listener.extra(SocketAttribute.local_port)  # noqa: S610 - anyio, not Django
            made.append(Pod(name, ip, port))
        yield made
        group.cancel_scope.cancel()


async def ca_dials(kube: Kube, service: str) -> str:
    """What CA reaches through ``service``: the name its endpoint answers."""
    route = kube.service_endpoint(service)
    assert route is not None, f"service {service} has no endpoint"
    with anyio.fail_after(WAIT):
        async with await anyio.connect_tcp(*route) as stream:
            return (await stream.receive()).decode()


async def until(what: str, check, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await anyio.sleep(0.005)


async def elected(candidate: Candidate) -> None:
    with anyio.fail_after(WAIT):
        await candidate.election.elected.wait()


def spec_of(kube: Kube, lease: str) -> dict[str, Any]:
    stored = kube.read(lease)
    assert stored is not None
    return stored["spec"]


def annotations_of(kube: Kube, lease: str) -> dict[str, str]:
    stored = kube.read(lease)
    assert stored is not None
    return stored["metadata"].get("annotations") or {}


def is_micro_time(text: str) -> bool:
    """RFC 3339 with six fractional digits, as Kubernetes writes a MicroTime."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    return len(fraction) == 6 and fraction.isdigit() and "T" in whole


class TestElection:
    """What client-go's semantics promise, against the stand-in or a real API server."""

    async def test_a_fresh_lease_is_created_and_held(self, kube):
        lease = kube.new_lease()
        async with candidates(kube, lease, "osas-a") as (a,):
            await elected(a)
            assert a.election.may_write()
            assert a.election.previous == PreviousHolder(None, released=False, annotations={})
            spec = spec_of(kube, lease)
            assert spec["holderIdentity"] == "osas-a"
            assert spec["leaseDurationSeconds"] == 1
            assert spec["leaseTransitions"] == 0
            assert is_micro_time(spec["acquireTime"])
            assert is_micro_time(spec["renewTime"])
            first_renew = spec["renewTime"]
            await until("a renew", lambda: spec_of(kube, lease)["renewTime"] != first_renew)
            assert spec_of(kube, lease)["acquireTime"] == spec["acquireTime"]
            status = a.election.status()
            assert status["enabled"] is True
            assert status["identity"] == "osas-a"
            assert status["lease"] == f"{kube.namespace}/{lease}"
            assert status["holder"] == "osas-a"
            assert status["leading"] is True
            assert isinstance(status["since"], float)
            assert status["transitions"] == 0

    async def test_a_second_candidate_stands_by_while_the_holder_renews(self, kube):
        lease = kube.new_lease()
        with capture_logs() as logs:
            async with candidates(kube, lease, "osas-a") as (a,):
                await elected(a)
                async with candidates(kube, lease, "osas-b") as (b,):
                    await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                    # Three lease durations: a standby that judged expiry wrongly would take over.
                    end = time.monotonic() + 3.0
                    while time.monotonic() < end:
                        assert a.election.may_write()
                        assert not b.election.elected.is_set()
                        await anyio.sleep(0.05)
                    assert b.election.status()["leading"] is False
                    assert not b.election.may_write()
        standing_by = [
            entry
            for entry in logs
            if entry["event"] == "another osas holds the lease; standing by"
            and entry["identity"] == "osas-b"
        ]
        assert [entry["holder"] for entry in standing_by] == ["osas-a"]

    async def test_the_standby_takes_over_only_after_the_lease_duration(self, kube):
        lease = kube.new_lease()
        async with candidates(kube, lease, "osas-a") as (a,):
            await elected(a)
            async with candidates(kube, lease, "osas-b") as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                a.crash()
                await a.done.wait()
                last_renew = a.election._renewed_at
                assert last_renew is not None
                await elected(b)
                taken = b.election._renewed_at
                assert taken is not None
                # B judged expiry on its own clock from when it saw A's last renew, which
                # started before B saw it.
                assert taken >= last_renew + 1.0
                assert taken < last_renew + 1.0 + 5.0  # and did not wait for nothing
                assert b.election.previous == PreviousHolder(
                    "osas-a", released=False, annotations={}
                )
                spec = spec_of(kube, lease)
                assert spec["holderIdentity"] == "osas-b"
                assert spec["leaseTransitions"] == 1
                assert b.election.status()["transitions"] == 1
                if kube.standin is not None:  # the same ordering, seen by the server
                    writes = kube.standin.writes
                    a_last = max(w.at for w in writes if w.holder == "osas-a")
                    b_first = min(w.at for w in writes if w.holder == "osas-b")
                    assert b_first - a_last >= 1.0

    async def test_release_hands_over_within_a_retry_period(self, kube):
        lease = kube.new_lease()
        # A lease duration of 5 s: a takeover within one second is the release's doing.
        slow = {"lease_duration": 5.0, "renew_deadline": 3.0, "retry_period": 0.1}
        async with candidates(kube, lease, "osas-a", **slow) as (a,):
            await elected(a)
            a.election.set_annotations({"osas.example/generation": "7"})
            await until(
                "a's annotations on the lease",
                lambda: annotations_of(kube, lease).get("osas.example/generation") == "7",
            )
            async with candidates(kube, lease, "osas-b", **slow) as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                released_at = time.monotonic()
                await a.election.release({"osas.example/handover": "clean"})
                assert not a.election.may_write()
                with anyio.fail_after(WAIT):
                    await a.done.wait()  # the loop returned on its own
                assert not a.election.lost.is_set()
                await elected(b)
                taken = b.election._renewed_at
                assert taken is not None
                assert taken - released_at < 1.0
                previous = b.election.previous
                assert previous is not None
                assert previous.identity == "osas-a"
                assert previous.released is True
                assert previous.annotations["osas.example/generation"] == "7"
                assert previous.annotations["osas.example/handover"] == "clean"
                spec = spec_of(kube, lease)
                assert spec["holderIdentity"] == "osas-b"
                assert spec["leaseTransitions"] == 1

    async def test_two_candidates_racing_for_a_missing_lease_elect_one(self, kube):
        lease = kube.new_lease()
        if kube.standin is not None:
            # Both GETs are answered (404) before either POST is handled: both create.
            kube.standin.latency = 0.15
        timings = {"lease_duration": 3.0, "renew_deadline": 1.5, "retry_period": 0.1}
        async with candidates(kube, lease, "osas-a", "osas-b", **timings) as (a, b):
            await until(
                "a leader", lambda: a.election.elected.is_set() or b.election.elected.is_set()
            )
            winner, loser = (a, b) if a.election.elected.is_set() else (b, a)
            await until(
                "the loser to see the winner",
                lambda: loser.election.status()["holder"] == winner.identity,
            )
            await anyio.sleep(0.5)
            assert winner.election.may_write()
            assert not loser.election.elected.is_set()
            assert spec_of(kube, lease)["holderIdentity"] == winner.identity
        if kube.standin is not None:
            creates = [(e.verb, e.status) for e in kube.standin.history if e.verb == "create"]
            assert sorted(creates) == [("create", 201), ("create", 409)]

    async def test_the_holder_publishes_its_endpoint_right_after_acquiring(self, kube):
        lease, service = kube.new_lease(), kube.new_service()
        pod = Pod("osas-a", kube.pod_ip(11), 50051)
        async with candidates(kube, lease, pod, service=service, **SLOW) as (a,):
            await elected(a)
            acquired = time.monotonic()
            await until("a's endpoint", lambda: kube.service_endpoint(service) == (pod.ip, 50051))
            # Not the periodic check (every 5 s): the write that follows the acquire.
            assert time.monotonic() - acquired < 2.0
            stored = kube.endpoint_slice(service)
            assert stored is not None
            assert stored["metadata"]["name"] == f"{service}-leader"
            assert stored["metadata"]["labels"] == {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "osas.openstack.org",
            }
            assert stored["addressType"] == "IPv4"
            (endpoint,) = stored["endpoints"]
            assert endpoint["addresses"] == [pod.ip]
            assert endpoint["conditions"] == {"ready": True, "serving": True, "terminating": False}
            assert endpoint["targetRef"] == {
                "kind": "Pod",
                "name": "osas-a",
                "namespace": kube.namespace,
            }
            assert "nodeName" not in endpoint  # none given, none in the environment
            assert stored["ports"] == [
                {"name": "grpc", "port": 50051, "protocol": "TCP", "appProtocol": "grpc"}
            ]
            await until("the status to say so", lambda: a.election.status()["endpoint"])
            status = a.election.status()
            assert status["endpoint"] == f"{pod.ip}:50051"
            assert status["service"] == f"{kube.namespace}/{service}"
        if kube.standin is not None:  # the order, seen by the server
            writes = kube.standin.writes
            taken = next(w.at for w in writes if w.resource == "leases")
            published = next(w.at for w in writes if w.resource == "endpointslices")
            assert 0 <= published - taken < 2.0


class Promised:
    """A stand-in for the ledger's record: a revision and the annotation that says it."""

    def __init__(self) -> None:
        self.revision = 0
        self.text = "none"

    def promise(self, text: str) -> int:
        self.revision += 1
        self.text = text
        return self.revision

    def source(self) -> tuple[int, dict[str, str]]:
        return self.revision, {PROMISES: self.text}


PROMISES = "osas.openstack.org/promises"


async def never_two_writers(a: Candidate, b: Candidate, seconds: float) -> None:
    """Sample both candidates' fences for ``seconds``: never both may write."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        both = a.election.may_write() and b.election.may_write()
        assert not both, "two writers"
        await anyio.sleep(0.002)


class TestPromiseRecordAndDeletedLeases:
    """The promise record rides the holder's own writes of the Lease; a Lease deleted by
    hand never gives two writers (issue 31, problems 1 and 2)."""

    async def test_a_lease_deleted_by_hand_never_gives_two_writers(self, kube):
        """Problem 1: the standby found the Lease missing, made it and led at once while the
        holder still wrote. Now the holder makes it again within a retry period (its record
        with it) and the standby, which saw a holder, waits out the lease duration."""
        lease = kube.new_lease()
        async with candidates(kube, lease, "osas-a") as (a,):
            await elected(a)
            record = Promised()
            a.election.carry(record.source)
            assert await a.election.keep_written(record.promise('{"v":1}'), 1.0)
            async with candidates(kube, lease, "osas-b") as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                with capture_logs() as logs:
                    kube.delete(lease)
                    await never_two_writers(a, b, 2.5)  # 2.5 lease durations
                assert a.election.may_write()
                assert not b.election.elected.is_set()
                assert spec_of(kube, lease)["holderIdentity"] == "osas-a"
                assert annotations_of(kube, lease)[PROMISES] == '{"v":1}'
                assert any(
                    entry["event"].startswith("the lease was deleted under its holder")
                    for entry in logs
                )

    async def test_a_lease_deleted_under_a_dead_holder_passes_after_the_lease_duration(self, kube):
        """The holder killed, then its Lease deleted: the standby makes it anew only once the
        lease duration has passed since it last saw the holder renew, and knows the record
        went with it (the previous holder is named, with nothing known of its promises)."""
        lease = kube.new_lease()
        async with candidates(kube, lease, "osas-a") as (a,):
            await elected(a)
            async with candidates(kube, lease, "osas-b") as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                a.crash()
                await a.done.wait()
                last_renew = a.election._renewed_at
                assert last_renew is not None
                kube.delete(lease)
                await elected(b)
                taken = b.election._renewed_at
                assert taken is not None
                assert taken >= last_renew + 1.0
                previous = PreviousHolder("osas-a", released=False, annotations={})
                assert b.election.previous == previous

    async def test_a_record_kept_is_on_the_lease_when_keep_written_returns(self, kube):
        lease = kube.new_lease()
        slow = {"lease_duration": 5.0, "renew_deadline": 3.0, "retry_period": 1.0}
        async with candidates(kube, lease, "osas-a", **slow) as (a,):
            await elected(a)
            record = Promised()
            a.election.carry(record.source)
            for n in range(3):
                revision = record.promise(f"promise {n}")
                assert await a.election.keep_written(revision, 2.0)
                assert annotations_of(kube, lease)[PROMISES] == f"promise {n}"
            # Callers waiting at once share writes: ten promises, far fewer writes.
            writes_before = len(kube.standin.writes) if kube.standin is not None else 0
            revisions = [record.promise(f"many {n}") for n in range(10)]
            results = []

            async def keep(revision: int) -> None:
                results.append(await a.election.keep_written(revision, 2.0))

            async with anyio.create_task_group() as group:
                for revision in revisions:
                    group.start_soon(keep, revision)
            assert results == [True] * 10
            assert annotations_of(kube, lease)[PROMISES] == "many 9"
            if kube.standin is not None:
                assert len(kube.standin.writes) - writes_before <= 2
            # What leaves the record rides the next renew, with no promise made.
            record.text = "confirmed"
            await until(
                "the renew to carry it",
                lambda: annotations_of(kube, lease)[PROMISES] == "confirmed",
                timeout=5.0,
            )

    async def test_a_standby_keeps_nothing_and_a_new_holder_carries_the_old_record_on(self, kube):
        """Problem 2 at its root: the new holder reads its predecessor's record when it takes
        the Lease and writes it over only once it carries a record of its own."""
        lease = kube.new_lease()
        async with candidates(kube, lease, "osas-a") as (a,):
            await elected(a)
            record = Promised()
            a.election.carry(record.source)
            assert await a.election.keep_written(record.promise("a's promises"), 1.0)
            async with candidates(kube, lease, "osas-b") as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                assert not await b.election.keep_written(1, 0.5)  # not the holder
                a.crash()
                await a.done.wait()
                await elected(b)
                previous = b.election.previous
                assert previous is not None
                assert previous.annotations[PROMISES] == "a's promises"
                # Renewed by b, still a's record: had b died now, its successor would keep it.
                await anyio.sleep(0.3)
                assert spec_of(kube, lease)["holderIdentity"] == "osas-b"
                assert annotations_of(kube, lease)[PROMISES] == "a's promises"
                record_b = Promised()
                b.election.carry(record_b.source)
                assert await b.election.keep_written(record_b.promise("b's promises"), 1.0)
                assert annotations_of(kube, lease)[PROMISES] == "b's promises"


class TestOnTheStandIn:
    """Faults only the stand-in can make: partitions, refusals, another writer."""

    async def test_two_candidates_racing_for_a_released_lease_elect_one(self, on_standin):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        standin.put_lease(
            on_standin.namespace,
            lease,
            {"spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 4}},
        )
        standin.latency = 0.15  # both read the same resourceVersion before either writes
        timings = {"lease_duration": 3.0, "renew_deadline": 1.5, "retry_period": 0.1}
        async with candidates(on_standin, lease, "osas-a", "osas-b", **timings) as (a, b):
            await until(
                "a leader", lambda: a.election.elected.is_set() or b.election.elected.is_set()
            )
            winner, loser = (a, b) if a.election.elected.is_set() else (b, a)
            await until(
                "the loser to see the winner",
                lambda: loser.election.status()["holder"] == winner.identity,
            )
            assert not loser.election.elected.is_set()
            assert winner.election.previous == PreviousHolder("", released=True, annotations={})
            assert spec_of(on_standin, lease)["leaseTransitions"] == 5
        refused = [e for e in standin.history if e.verb == "update" and e.status == 409]
        assert len(refused) == 1

    @pytest.mark.parametrize("fault", [HANG, DROP])
    async def test_an_unreachable_api_fences_the_holder_before_its_lease_can_expire(
        self, on_standin, fault
    ):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        with capture_logs() as logs:
            async with candidates(on_standin, lease, "osas-a") as (a,):
                await elected(a)
                await anyio.sleep(0.3)  # a few renews
                standin.unreachable = fault
                samples: list[tuple[float, bool]] = []
                deadline = time.monotonic() + WAIT
                while not a.done.is_set() and time.monotonic() < deadline:
                    samples.append((time.monotonic(), a.election.may_write()))
                    await anyio.sleep(0.002)
                assert a.done.is_set(), "run_election did not return"
                standin.unreachable = None
        last_renew = max(w.at for w in standin.writes if w.holder == "osas-a")
        # may_write() said True only within renew_deadline of the last renew...
        assert samples
        assert all(at < last_renew + 0.6 for at, ok in samples if ok)
        assert not a.election.may_write()
        assert a.election.lost.is_set()
        # ...and the loop stopped before anyone could have taken the lease.
        assert a.returned_at is not None
        assert a.returned_at < last_renew + 1.0
        lost = [entry for entry in logs if entry["event"] == "lost the lease; stopping"]
        assert len(lost) == 1
        assert lost[0]["log_level"] == "error"

    async def test_a_holder_that_finds_another_holder_stops(self, on_standin):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        async with candidates(on_standin, lease, "osas-a") as (a,):
            await elected(a)
            stored = standin.lease(on_standin.namespace, lease)
            assert stored is not None
            stored["spec"]["holderIdentity"] = "intruder"
            standin.put_lease(on_standin.namespace, lease, stored)
            with anyio.fail_after(WAIT):
                await a.done.wait()
            assert a.election.lost.is_set()
            assert not a.election.may_write()
            assert spec_of(on_standin, lease)["holderIdentity"] == "intruder"

    async def test_a_restarted_holder_takes_its_own_lease_back_at_once(self, on_standin):
        lease = on_standin.new_lease()
        slow = {"lease_duration": 5.0, "renew_deadline": 3.0, "retry_period": 0.1}
        async with candidates(on_standin, lease, "pod-a", **slow) as (first,):
            await elected(first)
            first.crash()
        started = time.monotonic()
        async with candidates(on_standin, lease, "pod-a", **slow) as (second,):
            await elected(second)
            assert time.monotonic() - started < 2.0  # not the 5 s of an expiry
            assert second.election.previous == PreviousHolder(
                "pod-a", released=False, annotations={}
            )
            assert spec_of(on_standin, lease)["leaseTransitions"] == 0

    @pytest.mark.parametrize(
        ("token", "code"), [("limited-token", 403), ("unknown-token", 401)], ids=["403", "401"]
    )
    async def test_a_refused_candidate_is_never_elected_and_says_so_once(
        self, standin, tmp_path, token, code
    ):
        standin.grant("limited-token", {"somewhere-else"})
        refused = Kube(
            "standin",
            standin.write_kubeconfig(tmp_path / "kubeconfig", token=token),
            "kube-system",
            standin,
        )
        lease = refused.new_lease()
        with capture_logs() as logs:
            async with candidates(refused, lease, "osas-a") as (a,):
                await anyio.sleep(1.0)  # ten retry periods
                assert not a.election.elected.is_set()
                assert not a.election.may_write()
                assert a.election.status()["leading"] is False
        said = [entry for entry in logs if entry["event"].startswith("the Kubernetes API refuses")]
        assert len(said) == 1
        assert said[0]["log_level"] == "error"
        if code == 403:
            assert "namespace kube-system" in said[0]["fix"]
            assert "Role" in said[0]["fix"]
        tries = [e for e in standin.history if e.status == code]
        assert len(tries) >= 3  # retried all along
        assert standin.lease("kube-system", lease) is None

    async def test_a_standby_release_writes_nothing(self, on_standin):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        async with candidates(on_standin, lease, "osas-a") as (a,):
            await elected(a)
            async with candidates(on_standin, lease, "osas-b") as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                writes = len([w for w in standin.writes if w.holder != "osas-a"])
                await b.election.release({"osas.example/x": "y"})
                with anyio.fail_after(WAIT):
                    await b.done.wait()
                assert len([w for w in standin.writes if w.holder != "osas-a"]) == writes
                assert a.election.may_write()


def repairs(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"].startswith("the endpoint slice had changed")]


class TestEndpoint:
    """CA's Service reaches the holder alone: the slice it publishes, on the stand-in."""

    async def test_the_standby_never_touches_the_endpoint_slice(self, on_standin, tmp_path):
        standin = on_standin.standin
        # The standby may not even read endpoint slices: any request it made would show.
        standin.grant("leases-only", resources={"leases"})
        narrow = standin.write_kubeconfig(tmp_path / "narrow", token="leases-only")
        lease = on_standin.new_lease()
        a_pod = Pod("osas-a", "127.0.0.11", 50051)
        b_pod = Pod("osas-b", "127.0.0.12", 50052)
        async with candidates(on_standin, lease, a_pod, service=SERVICE) as (a,):
            await elected(a)
            await until("a published", lambda: on_standin.service_endpoint(SERVICE) is not None)
            async with candidates(on_standin, lease, b_pod, service=SERVICE, kubeconfig=narrow) as (
                b,
            ):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                await anyio.sleep(2.0)  # two lease durations, two checks by the holder
                assert not b.election.elected.is_set()
                assert b.election.status()["endpoint"] is None
                assert b.election.status()["service"] == f"kube-system/{SERVICE}"
        assert [e for e in standin.history if e.status == 403] == []
        slice_writes = [w for w in standin.writes if w.resource == "endpointslices"]
        assert [w.endpoints for w in slice_writes] == [("127.0.0.11:50051",)]

    async def test_a_new_holder_replaces_the_endpoint_when_the_holder_dies(self, on_standin):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        pods = serving(("osas-a", "127.0.0.11"), ("osas-b", "127.0.0.12"))
        async with (
            pods as (a_pod, b_pod),
            candidates(on_standin, lease, a_pod, service=SERVICE) as (a,),
        ):
            await elected(a)
            await until(
                "a published",
                lambda: on_standin.service_endpoint(SERVICE) == (a_pod.ip, a_pod.port),
            )
            assert await ca_dials(on_standin, SERVICE) == "osas-a"
            async with candidates(on_standin, lease, b_pod, service=SERVICE) as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                a.crash()
                await a.done.wait()
                await elected(b)
                await until(
                    "b published",
                    lambda: on_standin.service_endpoint(SERVICE) == (b_pod.ip, b_pod.port),
                )
                assert await ca_dials(on_standin, SERVICE) == "osas-b"
                assert b.election.status()["endpoint"] == f"127.0.0.12:{b_pod.port}"
        # B wrote its endpoint over A's once it held the lease, and right after.
        taken = next(w.at for w in standin.writes if w.holder == "osas-b")
        b_route = f"127.0.0.12:{b_pod.port}"
        replaced = [w for w in standin.writes if w.endpoints == (b_route,)]
        assert replaced[0].verb == "update"
        assert 0 <= replaced[0].at - taken < 2.0

    async def test_release_withdraws_the_endpoint_before_the_lease(self, on_standin):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        a_pod = Pod("osas-a", "127.0.0.11", 50051)
        b_pod = Pod("osas-b", "127.0.0.12", 50052)
        async with candidates(on_standin, lease, a_pod, service=SERVICE, **SLOW) as (a,):
            await elected(a)
            await until(
                "a published", lambda: on_standin.service_endpoint(SERVICE) == ("127.0.0.11", 50051)
            )
            async with candidates(on_standin, lease, b_pod, service=SERVICE, **SLOW) as (b,):
                await until("b to see a", lambda: b.election.status()["holder"] == "osas-a")
                await a.election.release()
                assert a.election.status()["endpoint"] is None
                await elected(b)
                await until(
                    "b published",
                    lambda: on_standin.service_endpoint(SERVICE) == ("127.0.0.12", 50052),
                )
        writes = standin.writes
        released = next(i for i, w in enumerate(writes) if w.holder == "")
        emptied = next(
            i for i, w in enumerate(writes) if w.resource == "endpointslices" and not w.endpoints
        )
        # The slice named no one before anyone could take the lease...
        assert emptied < released
        assert writes[emptied].verb == "update"
        # ...and named A until then.
        before = [w.endpoints for w in writes[:emptied] if w.resource == "endpointslices"]
        assert before == [("127.0.0.11:50051",)]

    async def test_a_refused_endpoint_slice_leaves_the_holder_elected_until_granted(
        self, standin, tmp_path
    ):
        standin.grant("no-slices", resources={"leases"})
        kube = Kube(
            "standin",
            standin.write_kubeconfig(tmp_path / "kubeconfig", token="no-slices"),
            "kube-system",
            standin,
        )
        lease = kube.new_lease()
        pod = Pod("osas-a", "127.0.0.11", 50051)
        with capture_logs() as logs:
            async with candidates(kube, lease, pod, service=SERVICE, **SLOW) as (a,):
                await elected(a)  # the lease does not wait for the endpoint
                await anyio.sleep(1.0)  # ten retry periods
                assert a.election.may_write()
                assert a.election.status()["endpoint"] is None
                assert kube.service_endpoint(SERVICE) is None
                standin.grant("no-slices")  # the Role is fixed
                granted = time.monotonic()
                await until("a published", lambda: kube.service_endpoint(SERVICE) is not None)
                # With the next renew, not the next check five seconds on.
                assert time.monotonic() - granted < 2.0
                assert kube.service_endpoint(SERVICE) == ("127.0.0.11", 50051)
                # The server stored it; the holder says so once it has read the answer.
                await until("the status to say so", lambda: a.election.status()["endpoint"])
                assert a.election.may_write()
        refused = [e for e in standin.history if e.resource == "endpointslices" and e.status == 403]
        assert len(refused) >= 5  # retried with each renew
        said = [entry for entry in logs if "refuses osas the endpoint slice" in entry["event"]]
        assert len(said) == 1
        assert said[0]["log_level"] == "error"
        assert "endpointslices" in said[0]["fix"]
        assert "namespace kube-system" in said[0]["fix"]
        published = [e for e in logs if e["event"].startswith("published this osas")]
        assert len(published) == 1

    async def test_a_foreign_edit_of_the_slice_is_repaired_within_a_lease_duration(
        self, on_standin
    ):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        pod = Pod("osas-a", "127.0.0.11", 50051)
        name = f"{SERVICE}-leader"
        with capture_logs() as logs:
            async with candidates(on_standin, lease, pod, service=SERVICE) as (a,):
                await elected(a)
                ours = ("127.0.0.11", 50051)
                await until("a published", lambda: on_standin.service_endpoint(SERVICE) == ours)
                stored = standin.endpoint_slice("kube-system", name)
                assert stored is not None
                stored["endpoints"][0]["addresses"] = ["127.0.0.99"]
                standin.put_endpoint_slice("kube-system", name, stored)
                edited = time.monotonic()
                assert on_standin.service_endpoint(SERVICE) == ("127.0.0.99", 50051)
                await until("the repair", lambda: on_standin.service_endpoint(SERVICE) == ours)
                # Checked every lease duration (1 s); the rest is slack for a loaded machine.
                assert time.monotonic() - edited < 1.0 + 1.5
                standin.delete_endpoint_slice("kube-system", name)  # deleted: made again
                deleted = time.monotonic()
                await until("it again", lambda: on_standin.service_endpoint(SERVICE) == ours)
                assert time.monotonic() - deleted < 1.0 + 1.5
                assert a.election.may_write()
                await until("both repairs logged", lambda: len(repairs(logs)) == 2)
        assert [entry["found"] for entry in repairs(logs)] == [["127.0.0.99:50051"], []]

    async def test_a_holder_that_lost_the_lease_writes_no_more_endpoint(self, on_standin):
        standin = on_standin.standin
        lease = on_standin.new_lease()
        pod = Pod("osas-a", "127.0.0.11", 50051)
        async with candidates(on_standin, lease, pod, service=SERVICE) as (a,):
            await elected(a)
            await until("a published", lambda: on_standin.service_endpoint(SERVICE) is not None)
            stored = standin.lease("kube-system", lease)
            assert stored is not None
            stored["spec"]["holderIdentity"] = "intruder"
            standin.put_lease("kube-system", lease, stored)
            with anyio.fail_after(WAIT):
                await a.done.wait()
            # The intruder's endpoint, as a new holder would write it: A must leave it be.
            name = f"{SERVICE}-leader"
            theirs = standin.endpoint_slice("kube-system", name)
            assert theirs is not None
            theirs["endpoints"][0]["addresses"] = ["127.0.0.13"]
            standin.put_endpoint_slice("kube-system", name, theirs)
            lost = time.monotonic()
            await anyio.sleep(2.0)  # two lease durations: A's check would have come
            assert a.election.status()["endpoint"] is None
        assert [w for w in standin.writes if w.at > lost] == []
        assert on_standin.service_endpoint(SERVICE) == ("127.0.0.13", 50051)

    async def test_an_ipv6_pod_publishes_an_ipv6_slice(self, on_standin):
        lease = on_standin.new_lease()
        pod = Pod("osas-a", "fd00:0:0::11", 50051)
        async with candidates(on_standin, lease, pod, service=SERVICE) as (a,):
            await elected(a)
            await until("a published", lambda: on_standin.service_endpoint(SERVICE) is not None)
            stored = on_standin.endpoint_slice(SERVICE)
            assert stored is not None
            assert stored["addressType"] == "IPv6"
            assert stored["endpoints"][0]["addresses"] == ["fd00::11"]  # the canonical form
            await until("the status to say so", lambda: a.election.status()["endpoint"])
            assert a.election.status()["endpoint"] == "[fd00::11]:50051"


class TestTheStandInItself:
    """The stand-in's Kubernetes semantics, over raw HTTP."""

    @staticmethod
    def call(standin, method, path, body=None, token=DEFAULT_TOKEN):
        request = urllib.request.Request(  # noqa: S310 - the stand-in on loopback
            standin.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
                code, content_type, body = (
                    answer.status,
                    answer.headers["Content-Type"],
                    answer.read(),
                )
        except urllib.error.HTTPError as error:
            with error:
                code, content_type, body = error.code, error.headers["Content-Type"], error.read()
        assert content_type == "application/json"  # lightkube reads a Status from nothing else
        return code, json.loads(body)

    def test_optimistic_concurrency_and_the_status_objects(self, standin):
        base = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
        lease = {"metadata": {"name": "l1"}, "spec": {"holderIdentity": "a"}}
        status, created = self.call(standin, "POST", base, lease)
        assert status == 201
        assert created["metadata"]["uid"]
        assert created["metadata"]["creationTimestamp"]
        first = created["metadata"]["resourceVersion"]

        status, again = self.call(standin, "POST", base, lease)
        assert (status, again["kind"], again["reason"]) == (409, "Status", "AlreadyExists")

        created["spec"]["holderIdentity"] = "b"
        status, updated = self.call(standin, "PUT", f"{base}/l1", created)
        assert status == 200
        assert int(updated["metadata"]["resourceVersion"]) > int(first)
        assert updated["metadata"]["uid"] == created["metadata"]["uid"]

        # The same PUT again carries the resourceVersion it read, which is no longer current.
        created["spec"]["holderIdentity"] = "c"
        status, stale = self.call(standin, "PUT", f"{base}/l1", created)
        assert (status, stale["reason"], stale["code"]) == (409, "Conflict", 409)
        assert "the object has been modified" in stale["message"]

        # Leases allow no unconditional update.
        del created["metadata"]["resourceVersion"]
        status, unconditional = self.call(standin, "PUT", f"{base}/l1", created)
        assert (status, unconditional["reason"]) == (422, "Invalid")

        # A write that changes nothing keeps the resourceVersion.
        status, same = self.call(standin, "PUT", f"{base}/l1", updated)
        assert status == 200
        assert same["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]

        assert self.call(standin, "GET", f"{base}/missing")[0] == 404
        status, missing = self.call(standin, "DELETE", f"{base}/missing")
        assert (status, missing["reason"]) == (404, "NotFound")

        # Deleted: a PUT carrying the old uid fails its precondition; one without creates.
        assert self.call(standin, "DELETE", f"{base}/l1")[0] == 200
        status, gone = self.call(standin, "PUT", f"{base}/l1", updated)
        assert (status, gone["reason"]) == (409, "Conflict")
        fresh = {"metadata": {"name": "l1"}, "spec": {"holderIdentity": "d"}}
        assert self.call(standin, "PUT", f"{base}/l1", fresh)[0] == 201

        # MicroTime is parsed as the API server parses it.
        late = {"metadata": {"name": "l2"}, "spec": {"renewTime": "2026-01-01T00:00:00Z"}}
        assert self.call(standin, "POST", base, late)[0] == 400
        late["spec"]["renewTime"] = "2026-01-01T00:00:00.000000+01:00"
        status, timed = self.call(standin, "POST", base, late)
        assert status == 201
        assert timed["spec"]["renewTime"] == "2025-12-31T23:00:00.000000Z"

        status, listing = self.call(standin, "GET", base)
        assert status == 200
        assert [item["metadata"]["name"] for item in listing["items"]] == ["l1", "l2"]

    def test_bearer_tokens_and_namespaces(self, standin):
        standin.grant("narrow", {"elsewhere"})
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l1"
        status, unknown = self.call(standin, "GET", path, token="nobody")
        assert (status, unknown["reason"]) == (401, "Unauthorized")
        status, forbidden = self.call(standin, "GET", path, token="narrow")
        assert (status, forbidden["reason"]) == (403, "Forbidden")
        assert 'in the namespace "kube-system"' in forbidden["message"]
        allowed = "/apis/coordination.k8s.io/v1/namespaces/elsewhere/leases/l1"
        assert self.call(standin, "GET", allowed, token="narrow")[0] == 404

    def test_grants_by_resource(self, standin):
        standin.grant("leases-only", resources={"leases"})
        slices = "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices/s1"
        status, forbidden = self.call(standin, "GET", slices, token="leases-only")
        assert (status, forbidden["reason"]) == (403, "Forbidden")
        assert (
            'cannot get resource "endpointslices" in API group "discovery.k8s.io"'
            in (forbidden["message"])
        )
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l1"
        assert self.call(standin, "GET", leases, token="leases-only")[0] == 404
        standin.grant("leases-only")  # granted again: everything
        assert self.call(standin, "GET", slices, token="leases-only")[0] == 404
        # A resource in the wrong group is no path the server has.
        wrong = "/apis/coordination.k8s.io/v1/namespaces/kube-system/endpointslices/s1"
        assert self.call(standin, "GET", wrong)[0] == 404

    def test_endpoint_slices_and_where_kube_proxy_sends_a_service(self, standin):
        base = "/apis/discovery.k8s.io/v1/namespaces/ca/endpointslices"
        endpoint_slice = {
            "metadata": {"name": "osas-leader", "labels": {"kubernetes.io/service-name": "osas"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.11"], "conditions": {"ready": True}}],
            "ports": [{"name": "grpc", "port": 50051}],
        }
        assert standin.service_endpoint("ca", "osas") is None
        # No create on update: PUT of a missing slice is 404.
        assert self.call(standin, "PUT", f"{base}/osas-leader", endpoint_slice)[0] == 404
        status, created = self.call(standin, "POST", base, endpoint_slice)
        assert status == 201
        assert created["ports"] == [{"name": "grpc", "port": 50051, "protocol": "TCP"}]
        assert self.call(standin, "POST", base, endpoint_slice)[1]["reason"] == "AlreadyExists"
        assert standin.service_endpoint("ca", "osas") == ("127.0.0.11", 50051)
        assert standin.service_endpoint("ca", "osas", "grpc") == ("127.0.0.11", 50051)
        assert standin.service_endpoint("ca", "osas", "metrics") is None
        assert standin.service_endpoint("elsewhere", "osas") is None

        # Unconditional updates are allowed; a stale resourceVersion is not.
        endpoint_slice["endpoints"][0]["addresses"] = ["127.0.0.12"]
        assert self.call(standin, "PUT", f"{base}/osas-leader", endpoint_slice)[0] == 200
        assert standin.service_endpoint("ca", "osas") == ("127.0.0.12", 50051)
        stale = {**endpoint_slice, "metadata": created["metadata"]}
        assert self.call(standin, "PUT", f"{base}/osas-leader", stale)[1]["reason"] == "Conflict"

        # Written without a resourceVersion from here on: unconditionally.
        # addressType is immutable, addresses are of its family, port names unique.
        ipv6 = {**endpoint_slice, "addressType": "IPv6", "endpoints": [{"addresses": ["::1"]}]}
        status, immutable = self.call(standin, "PUT", f"{base}/osas-leader", ipv6)
        assert (status, immutable["reason"]) == (422, "Invalid")
        assert "immutable" in immutable["message"]
        wrong_family = {**endpoint_slice, "endpoints": [{"addresses": ["::1"]}]}
        assert self.call(standin, "PUT", f"{base}/osas-leader", wrong_family)[0] == 422
        twice = {
            **endpoint_slice,
            "ports": [{"name": "grpc", "port": 1}, {"name": "grpc", "port": 2}],
        }
        assert self.call(standin, "PUT", f"{base}/osas-leader", twice)[0] == 422

        # Not ready, or no endpoint at all: the Service leads nowhere.
        not_ready = {**endpoint_slice, "endpoints": [{"addresses": ["127.0.0.12"]}]}
        not_ready["endpoints"][0]["conditions"] = {"ready": False}
        assert self.call(standin, "PUT", f"{base}/osas-leader", not_ready)[0] == 200
        assert standin.service_endpoint("ca", "osas") is None
        status, emptied = self.call(
            standin, "PUT", f"{base}/osas-leader", {**endpoint_slice, "endpoints": []}
        )
        assert status == 200
        assert standin.service_endpoint("ca", "osas") is None
        assert [w.endpoints for w in standin.writes] == [
            ("127.0.0.11:50051",),
            ("127.0.0.12:50051",),
            (),
            (),
        ]

        # Two slices with different endpoints for one Service: kube-proxy would spread CA.
        other = {**endpoint_slice, "metadata": {**endpoint_slice["metadata"], "name": "other"}}
        assert self.call(standin, "POST", base, other)[0] == 201
        labelled = self.call(
            standin, "GET", f"{base}?labelSelector=kubernetes.io/service-name=osas"
        )
        assert [item["metadata"]["name"] for item in labelled[1]["items"]] == [
            "osas-leader",
            "other",
        ]
        none = self.call(standin, "GET", f"{base}?labelSelector=kubernetes.io/service-name=x")
        assert none[1]["items"] == []
        assert standin.service_endpoint("ca", "osas") == ("127.0.0.12", 50051)
        emptied["endpoints"] = [{"addresses": ["127.0.0.11"]}]
        standin.put_endpoint_slice("ca", "osas-leader", emptied)
        with pytest.raises(AssertionError, match="several endpoints"):
            standin.service_endpoint("ca", "osas")
        assert self.call(standin, "DELETE", f"{base}/other")[0] == 200
        assert self.call(standin, "DELETE", f"{base}/other")[0] == 404
        assert standin.service_endpoint("ca", "osas") == ("127.0.0.11", 50051)

    def test_it_runs_as_a_process(self, tmp_path):
        kubeconfig = tmp_path / "kubeconfig"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "osas.sim.kubernetes",
                "--port",
                "0",
                "--kubeconfig",
                str(kubeconfig),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            info = json.loads(process.stdout.readline())
            assert info["url"] == f"http://127.0.0.1:{info['port']}"
            assert kubeconfig.is_file()
            request = urllib.request.Request(  # noqa: S310 - the stand-in on loopback
                info["url"] + "/apis/coordination.k8s.io/v1/namespaces/default/leases/x",
                headers={"Authorization": f"Bearer {info['token']}"},
            )
            with pytest.raises(urllib.error.HTTPError) as raised:
                urllib.request.urlopen(request, timeout=5)  # noqa: S310
            assert raised.value.code == 404
            raised.value.close()
        finally:
            process.terminate()
            process.wait(timeout=10)
            process.stdout.close()


class TestSettings:
    def test_timings_must_leave_room_for_fencing(self):
        with pytest.raises(ElectionSetupError, match="renew_deadline < lease_duration"):
            ElectionSettings(lease_duration=10.0, renew_deadline=10.0)
        with pytest.raises(ElectionSetupError):
            ElectionSettings(renew_deadline=2.0, retry_period=2.0)
        ElectionSettings()  # client-go's defaults: 15, 10, 2

    def test_names(self, monkeypatch):
        assert lease_name_for("prod") == "osas-prod"
        monkeypatch.setenv("POD_NAME", "osas-7d9f-abcde")
        assert default_identity() == "osas-7d9f-abcde"
        monkeypatch.delenv("POD_NAME")
        assert default_identity().endswith(f"_{os.getpid()}")

    def test_the_endpoint_comes_from_the_pods_environment(self, monkeypatch):
        monkeypatch.setenv("POD_NAMESPACE", "autoscaling")
        monkeypatch.setenv("POD_IP", "10.1.2.3")
        monkeypatch.setenv("NODE_NAME", "node-7")
        unpublished = ElectionSettings()
        assert resolve_endpoint(unpublished) is unpublished  # no service: nothing is read
        settings = resolve_endpoint(ElectionSettings(service_name="osas", endpoint_port=8086))
        assert (settings.service_namespace, settings.pod_ip, settings.node_name) == (
            "autoscaling",
            "10.1.2.3",
            "node-7",
        )
        assert resolve_endpoint(settings) == settings  # LeaseElection resolves again
        given = ElectionSettings(
            service_name="osas", endpoint_port=8086, service_namespace="ca", pod_ip="10.9.9.9"
        )
        assert resolve_endpoint(given).service_namespace == "ca"
        assert resolve_endpoint(given).pod_ip == "10.9.9.9"
        with pytest.raises(ElectionSetupError, match="endpoint_port"):
            resolve_endpoint(ElectionSettings(service_name="osas"))

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("service_name", "Osas_CA"),
            ("service_namespace", "kube_system"),
            ("endpoint_port_name", "gRPC"),
            ("endpoint_port", 70000),
            ("pod_ip", "10.0.0"),
        ],
    )
    def test_endpoint_settings_the_api_would_refuse_fail_at_start(self, field, value):
        with pytest.raises(ElectionSetupError, match=field):
            ElectionSettings(**{field: value})

    async def test_without_a_pod_ip_nothing_is_published_and_that_is_said_once(
        self, on_standin, monkeypatch
    ):
        monkeypatch.delenv("POD_IP", raising=False)
        monkeypatch.setenv("POD_NAMESPACE", "kube-system")
        lease = on_standin.new_lease()
        settings = dataclasses.replace(
            on_standin.settings(lease, "osas-a"), service_name=SERVICE, endpoint_port=50051
        )
        with capture_logs() as logs:
            election = LeaseElection(settings)
            candidate = Candidate(election)
            async with anyio.create_task_group() as group:
                group.start_soon(candidate.run)
                await elected(candidate)
                await anyio.sleep(0.5)
                group.cancel_scope.cancel()
        said = [entry for entry in logs if entry["event"].startswith("this osas will not publish")]
        assert len(said) == 1
        assert said[0]["log_level"] == "warning"
        assert said[0]["missing"] == ["pod_ip (or $POD_IP)"]
        assert election.status()["service"] is None
        assert election.status()["endpoint"] is None
        assert [e for e in on_standin.standin.history if e.resource == "endpointslices"] == []

    def test_no_usable_configuration_is_said_at_once(self, tmp_path, monkeypatch):
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        settings = ElectionSettings(enabled=True, lease_name="osas-x", kubeconfig=tmp_path / "no")
        with pytest.raises(ElectionSetupError, match="no usable Kubernetes configuration"):
            LeaseElection(settings)
        with pytest.raises(ElectionSetupError, match="lease name"):
            LeaseElection(ElectionSettings(enabled=True, kubeconfig=tmp_path / "no"))

    def test_annotations_the_api_would_refuse_are_refused_here(self, on_standin):
        election = LeaseElection(on_standin.settings("osas-x", "osas-a"))
        with pytest.raises(ValueError, match="annotation key"):
            election.set_annotations({"not a key": "x"})
        election.set_annotations({"osas.example/ok": "x"})

    async def test_no_election_always_writes(self):
        none = NoElection()
        assert none.enabled is False
        assert none.may_write()
        assert none.elected.is_set()
        assert not none.lost.is_set()
        assert none.previous is None
        assert none.status()["enabled"] is False
        assert none.status()["service"] is None
        assert none.status()["endpoint"] is None
        await none.release({"a": "b"})
        with anyio.move_on_after(0.05) as scope:
            await none.run_election()
        assert scope.cancelled_caught


async def test_the_kubernetes_clients_request_lines_are_debug_detail(on_standin, capsys):
    """Problem 7: every renew logged a request line at INFO (about 30 lines a minute per
    replica, half of each log). They are said at debug level, and only there."""
    import logging  # noqa: PLC0415 - this test alone

    import structlog  # noqa: PLC0415

    from osas.process import configure_logging  # noqa: PLC0415

    def request_lines() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
        return [line for line in lines if line.get("logger") == "httpx2"]

    try:
        for level, expected in (("info", False), ("debug", True)):
            configure_logging(level, "json", cache_loggers=False)
            lease = on_standin.new_lease()
            async with candidates(on_standin, lease, f"osas-{level}") as (a,):
                await elected(a)
                await anyio.sleep(0.5)  # a few renews
            found = request_lines()
            assert bool(found) is expected
            assert all(line["level"] == "debug" for line in found)
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()


def test_only_a_process_that_elects_loads_the_kubernetes_client(on_standin, tmp_path):
    """The Kubernetes client is some 60 modules and 2 MiB: an osas that neither elects nor
    mints join tokens never loads it; one that elects does (the probe sees it)."""
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from osas.app import App, openstack_cloud\n"
        "from osas.config import load_config\n"
        "config = load_config(Path(sys.argv[1]))\n"
        "App(config, openstack_cloud(config))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightkube', 'httpx2'}))\n"
    )
    election = {"enabled": True, "kubeconfig": str(on_standin.kubeconfig)}
    loaded = {}
    for name, data in (
        ("plain", config_data()),
        ("electing", config_data(leader_election=election)),
    ):
        path = write_config(tmp_path, data, f"{name}.yaml")
        answer = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True
        )
        loaded[name] = answer.stdout.strip()
    assert loaded == {"plain": "[]", "electing": "['httpx2', 'lightkube']"}
