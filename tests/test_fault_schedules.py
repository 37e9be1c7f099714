"""Random fault schedules and operator actions, with the invariants checked after every
convergence.

A hypothesis state machine plays the Cluster Autoscaler against a real osas (gRPC on
127.0.0.1) and the simulated OpenStack (HTTP, unmodified openstacksdk) while it breaks Nova in
every way osas must survive (5xx, latency, creates Nova stores only after the client gave up,
DELETEs its API takes late,
lost answers, its quota re-check, Nova's clock jumping back and forth by up to ten minutes,
restarts by kill and by SIGTERM, a kill -9 at a random instant of a scale-up or a scale-down)
and while operators and the world act on it: configuration reloads (max_size down and up, the
group removed and added back, its flavor changed, a file that does not load), Keystone revoking
every token, a server deleted by hand (gone from CA's view after one incremental sync), a
server's ownership mark removed by hand, servers of an earlier life sharing a request id seeded
before a restart, a second osas process started against the same cluster and stopped, the
project's instance quota changed, the application credential rotated (the clouds.yaml osas
reads replaced, the old credential deleted). osas runs under a leader Lease (the test suite's
Kubernetes API stand-in), as in Kubernetes, and reads its credentials from a clouds.yaml.
Whenever the faults stop and CA's loop has converged, these must hold:

- no kept duplicate: at most one live server per create request osas sent, and no create made
  twice; servers an earlier life left sharing a request id are kept until CA scales them down;
- never above max_size: servers of the group (not being deleted) plus creates in hand;
- osas deletes on its own only what it asked Nova for: an earlier life's servers go only when
  CA asks;
- no foreign server touched: look-alikes of other clusters, and unmarked ones, are untouched;
- no create reported failed for refused tokens;
- a DeleteNodes answered OK is carried out, even when osas was killed right after answering;
- never above max_size, also across a kill -9 with creates in Nova's API (unless Nova took
  longer to store them than the doubt window, which voids the promise by definition);
- a second osas never writes: it stands by while the first holds the Lease;
- target and servers agree: CA's target, the running instances and Nova's servers are equal,
  and CA's view is Nova's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support import (
    CLUSTER,
    TAG,
    Provider,
    ServedOsas,
    config_data,
    kept,
    ours,
    rotate_application_credential,
    seed_earlier,
    write_clouds_yaml,
    write_config,
)

from osas.cloud.errors import CloudError
from osas.cloud.openstack import OpenStackCloud
from osas.cloud.openstack_settings import OpenStackSettings
from osas.config import load_config
from osas.demo.client import CaClient, connect
from osas.domain.servers import (
    META_CLUSTER,
    META_GROUP,
    META_REQUEST,
    TAG_CLUSTER_PREFIX,
)
from osas.election.port import lease_name_for
from osas.election.record import PROMISES_ANNOTATION
from osas.sim import SimulatedOpenStack
from osas.sim.kubernetes import KubeStandIn
from osas.sim.model import FakeNova, NovaRefusal
from osas.sim.server import APP_CREDENTIAL_ID, CLOUD_NAME

MAX_SIZE = 5
API_TIMEOUT = 0.4
DOUBT_WINDOW = 1.0
STALLS = (0.0, 0.6, 1.5)  # shorter and longer than the client's timeout and the doubt window
CONVERGE_SECONDS = 40.0
CLOCK_JUMPS = (-600.0, -180.0, 0.0, 180.0, 600.0)  # Nova's clock off the real one


def owned(sim: SimulatedOpenStack) -> list:
    """Servers of this cluster's group, with its marks (no look-alike), not being deleted."""
    return [
        s
        for s in ours(sim)
        if s.deleting_since is None and s.metadata.get(META_CLUSTER) == CLUSTER and TAG in s.tags
    ]


def live_requests(sim: SimulatedOpenStack) -> Counter[str]:
    """Servers of this cluster's group not being deleted, per create request id."""
    return Counter(s.metadata.get(META_REQUEST, s.server_id) for s in owned(sim))


GROUP = {
    "id": "big",
    "min_size": 0,
    "max_size": MAX_SIZE,
    "flavor": "m1.small",
    "image": "ubuntu-24.04",
    "networks": ["cluster-net"],
}
FLAVORS = ("m1.small", "m1.medium")


class FaultSchedule(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.Runner()
        # Removed by teardown: a run makes 20 of them.
        self._tmp = tempfile.TemporaryDirectory(prefix="osas-faults-", ignore_cleanup_errors=True)
        self.tmp = Path(self._tmp.name)
        self.sim = SimulatedOpenStack(FakeNova(build_seconds=0.05, delete_seconds=0.1))
        self.sim.start()
        self.kube = KubeStandIn()
        self.kube.start()
        kubeconfig = self.kube.write_kubeconfig(self.tmp / "kubeconfig")
        self.data = config_data(
            node_groups=[dict(GROUP)],
            queue={"capacity": 50, "workers": 3},
            reconcile={
                "interval": "0.1s",
                "full_resync_interval": "0.5s",
                "max_inventory_age": "1h",
                "retry_backoff": "0.01s",
                "delete_retry_after": "0.5s",
                "create_doubt_window": f"{DOUBT_WINDOW}s",
                "quota_interval": "0.5s",
            },
            # The auth block is for a second osas process started against the same cloud.
            openstack={
                "api_timeout": f"{API_TIMEOUT}s",
                "auth": self.sim.clouds_yaml_entry()["auth"],
            },
            shutdown_grace="2s",
            # As in Kubernetes: one writer under a Lease. A restart of this osas takes its own
            # Lease back at once (the same identity, host and pid, as a restarted container
            # keeps its pod's name).
            leader_election={
                "enabled": True,
                "kubeconfig": str(kubeconfig),
                "lease_namespace": "kube-system",
                "lease_duration": "3s",
                "renew_deadline": "2s",
                "retry_period": "0.2s",
            },
        )
        self.path = write_config(self.tmp, self.data)
        self.config = load_config(self.path)
        self.clouds = self.tmp / "clouds.yaml"
        self.credential = APP_CREDENTIAL_ID
        write_clouds_yaml(self.sim, self.clouds)
        self._clouds_env = os.environ.get("OS_CLIENT_CONFIG_FILE")
        os.environ["OS_CLIENT_CONFIG_FILE"] = str(self.clouds)
        self.foreign = self._seed_foreign()
        self.want = 0  # what CA wants the group to hold
        self.max_size = MAX_SIZE  # the group's max_size in force
        self.bound = MAX_SIZE  # what the target may reach before CA converges again
        self.earlier_life: set[str] = set()  # servers an earlier life left sharing a request
        self.ca_deleted: set[str] = set()  # instance ids CA asked osas to delete
        self.by_hand: set[str] = set()  # server ids deleted behind osas's back
        self.promised: set[str] = set()  # server ids of DeleteNodes answered OK
        self.failure_codes: Counter[str] = Counter()  # what CA saw failed creates report
        self.longest_stall = 0.0
        self.provider: Provider | None = None
        self.ca: CaClient | None = None
        self._ca_context: contextlib.AbstractAsyncContextManager[CaClient] | None = None
        self.loop.run(self._start())

    # -- plumbing ---------------------------------------------------------------------------------

    def _seed_foreign(self) -> dict[str, dict[str, str]]:
        nova, tag = self.sim.nova, f"{TAG_CLUSTER_PREFIX}{CLUSTER}"
        look_alikes = [
            nova.seed(
                name=f"{CLUSTER}-big-x",
                metadata={META_CLUSTER: "other", META_GROUP: "big"},
                tags=[tag],
            ),
            nova.seed(name=f"{CLUSTER}-big-y", metadata={META_CLUSTER: CLUSTER, META_GROUP: "big"}),
            nova.seed(name=f"{CLUSTER}-big-z", tags=[tag]),
        ]
        return {s.server_id: dict(s.metadata) for s in look_alikes}

    async def _start(self) -> None:
        self.config = load_config(self.path)
        # Credentials from a clouds.yaml, as the chart mounts them from a Secret (rotated by
        # ``credential_rotated``).
        settings = OpenStackSettings(
            cloud=CLOUD_NAME, api_timeout=API_TIMEOUT, rate_limit=1000.0, backoff=0.05
        )
        self.provider = Provider(self.config, OpenStackCloud(settings), config_path=self.path)
        await self.provider.start(wait_serving=False)
        await self.provider.wait_serving(timeout=30)
        self._ca_context = connect(self.provider.address, None)
        self.ca = await self._ca_context.__aenter__()

    async def _disconnect(self) -> None:
        if self._ca_context is not None:
            await self._ca_context.__aexit__(None, None, None)
        self._ca_context = self.ca = None

    async def _kill(self) -> None:
        await self._disconnect()
        await self._cut()

    async def _cut(self) -> None:
        """The process gone at once: no shutdown, no release of the Lease, nothing flushed;
        what it had sent to Nova goes on there."""
        assert self.provider is not None
        task = self.provider._task
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self.longest_stall > DOUBT_WINDOW:
            # Nova stores creates later than the doubt window says it may: what a killed
            # process sent can land after the next one's hold. No promise holds then.
            self.bound += MAX_SIZE

    async def _sigterm(self) -> None:
        await self._disconnect()
        assert self.provider is not None
        await self.provider.stop()

    async def _call(self, call) -> tuple[bool, object]:
        """A CA call and whether it succeeded; CA logs a failure and carries on."""
        try:
            return True, await call
        except grpc.aio.AioRpcError:
            return False, None

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    # -- faults -----------------------------------------------------------------------------------

    @rule(error_rate=st.sampled_from([0.0, 0.2, 0.5]), latency=st.sampled_from([0.0, 0.05]))
    def flaky_nova(self, error_rate: float, latency: float) -> None:
        self.sim.nova.faults.error_rate = error_rate
        self.sim.nova.faults.latency = latency

    @rule(stall=st.sampled_from(STALLS))
    def slow_creates(self, stall: float) -> None:
        self.sim.nova.faults.create_stall = stall
        self.longest_stall = max(self.longest_stall, stall)

    @rule(stall=st.sampled_from(STALLS))
    def slow_deletes(self, stall: float) -> None:
        """Nova's API slow to take a DELETE and not a create: a scale-up CA asks right after
        a scale-down must not land before the DELETE and leave Nova beyond the bound."""
        self.sim.nova.faults.delete_stall = stall
        self.longest_stall = max(self.longest_stall, stall)

    @rule(count=st.integers(1, 3), status=st.sampled_from([502, 503]))
    def lost_answers(self, count: int, status: int) -> None:
        self.sim.nova.faults.lost_create_responses = count
        self.sim.nova.faults.lost_create_status = status

    @rule()
    def quota_race(self) -> None:
        """Room for one more server, and Nova's re-check of concurrent creates."""
        self.sim.nova.quota.instances = len(self.sim.nova.live_servers()) + 1
        self.sim.nova.faults.quota_recheck_seconds = 0.2

    # -- CA ---------------------------------------------------------------------------------------

    @precondition(lambda self: self.ca is not None)
    @rule(delta=st.integers(1, MAX_SIZE))
    def scale_up(self, delta: int) -> None:
        async def run() -> None:
            assert self.ca is not None
            ok, target = await self._call(self.ca.target_size("big"))
            if ok and isinstance(target, int) and target + delta <= self.max_size:
                increased, _ = await self._call(self.ca.increase("big", delta))
                if increased:
                    self.want = max(self.want, target + delta)
            await self._pause(0.2)

        self.loop.run(run())

    @precondition(lambda self: self.ca is not None)
    @rule(count=st.integers(1, 3))
    def scale_down(self, count: int) -> None:
        async def run() -> None:
            assert self.ca is not None
            ok, instances = await self._call(self.ca.nodes("big"))
            if not ok or not isinstance(instances, list):
                return
            running = kept(instances)[:count]
            if running:
                # Asked, whatever the answer: a call that fails may have sent some DELETEs.
                self.ca_deleted.update(i.id for i in running)
                deleted, _ = await self._call(
                    self.ca.delete("big", [(i.id, i.id) for i in running])
                )
                if deleted:
                    self.want = max(0, self.want - len(running))
                    self.promised.update(i.id.removeprefix("openstack:///") for i in running)
            await self._pause(0.2)

        self.loop.run(run())

    @precondition(lambda self: self.ca is not None)
    @rule()
    def let_time_pass(self) -> None:
        self.loop.run(self._pause(0.5))

    @rule()
    def restart_by_kill(self) -> None:
        self.loop.run(self._kill())
        self.loop.run(self._start_despite_faults())

    @rule()
    def restart_by_sigterm(self) -> None:
        self.loop.run(self._sigterm())
        self.loop.run(self._start_despite_faults())

    @precondition(lambda self: self.ca is not None)
    @rule(
        scale_up=st.booleans(),
        count=st.integers(1, 3),
        delay=st.sampled_from([0.0, 0.01, 0.05, 0.2, 0.5]),
    )
    def kill_at_a_random_instant(self, scale_up: bool, count: int, delay: float) -> None:
        """kill -9 while CA's scale-up or scale-down is in flight, or just answered: an OK is
        a promise the next process keeps (deletes already in Nova; headroom held while the
        killed process's creates may still land)."""

        async def run() -> None:
            assert self.ca is not None
            ca = self.ca
            ok, target = await self._call(ca.target_size("big"))
            ok_nodes, instances = await self._call(ca.nodes("big"))
            running = kept(instances)[:count] if ok_nodes else []
            if scale_up and ok and isinstance(target, int) and target + count <= self.max_size:
                call = asyncio.ensure_future(ca.increase("big", count))
            elif not scale_up and running:
                # Asked, whatever the answer: the kill may come with the DELETEs on the wire.
                self.ca_deleted.update(i.id for i in running)
                call = asyncio.ensure_future(ca.delete("big", [(i.id, i.id) for i in running]))
            else:
                call = None  # nothing to ask: the kill comes between two calls
            await asyncio.sleep(delay)
            await self._cut()
            try:
                if call is not None:
                    await call
            except grpc.aio.AioRpcError:
                return  # no answer, or an error: nothing was promised
            finally:
                await self._disconnect()
            if call is None:
                return
            if scale_up:
                assert isinstance(target, int)
                self.want = max(self.want, target + count)
            else:
                self.want = max(0, self.want - len(running))
                self.promised.update(i.id.removeprefix("openstack:///") for i in running)

        self.loop.run(run())
        self.loop.run(self._start_despite_faults())

    @precondition(lambda self: self.ca is not None)
    @rule()
    def a_second_osas_started_and_stopped(self) -> None:
        """Another osas process against the same project and cluster (a partition left the old
        pod running, kubectl scale, a copy of the Deployment): it stands by and writes
        nothing while this one holds the Lease, even when CA's calls reach it."""
        env = {**os.environ, "POD_NAME": "second-osas"}
        with ServedOsas(self.path, env) as second:
            # Waited for on a thread, with this osas's event loop running meanwhile, as its
            # process's loop would: frozen for the second one's start, on a busy machine it
            # missed its renew_deadline and rightly stopped.
            standing_by = "another osas holds the lease; standing by"
            self.loop.run(asyncio.to_thread(second.wait_for, standing_by, 60))

            async def reach_it() -> None:
                async with connect(second.address, None) as wrong:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await wrong.increase("big", 1)
                        raise AssertionError("a standby accepted IncreaseSize")

            self.loop.run(reach_it())
            self.scale_up(1)  # the holder goes on meanwhile
            assert self.loop.run(asyncio.to_thread(second.stop)) == 0
            assert second.seen("became the leader") == []
            refusals = [e for e in second.seen("rpc") if e.get("code") != "UNAVAILABLE"]
            assert refusals == []

    @precondition(lambda self: self.ca is not None)
    @rule(count=st.integers(1, 3))
    def sigterm_of_a_holder_still_holding(self, count: int) -> None:
        """kill -9 right after a scale-up, a restart that counts the killed process's creates
        (the promise record), then a SIGTERM of that holder while it still does, and another
        start: the doubt is handed on by the record, and the group never passes max_size."""

        async def run() -> None:
            assert self.ca is not None
            ok, target = await self._call(self.ca.target_size("big"))
            if ok and isinstance(target, int) and target + count <= self.max_size:
                increased, _ = await self._call(self.ca.increase("big", count))
                if increased:
                    self.want = max(self.want, target + count)
            await self._pause(0.05)
            await self._kill()
            await self._start_despite_faults()
            await self._sigterm()
            await self._start_despite_faults()

        self.loop.run(run())

    @precondition(lambda self: self.ca is not None)
    @rule(latency=st.sampled_from([1.0, 2.0, 4.0]), count=st.integers(1, 3))
    def slow_nova_during_delete_nodes(self, latency: float, count: int) -> None:
        """Nova at 1 to 4 s a call while CA scales down: DeleteNodes answers OK at the
        Kubernetes API's speed all the same (the deletes go from the record)."""

        async def run() -> None:
            assert self.ca is not None
            ok, instances = await self._call(self.ca.nodes("big"))
            running = kept(instances)[:count] if ok and isinstance(instances, list) else []
            if not running:
                return
            before = self.sim.nova.faults.latency
            self.sim.nova.faults.latency = latency
            try:
                self.ca_deleted.update(i.id for i in running)
                deleted, _ = await self._call(
                    self.ca.delete("big", [(i.id, i.id) for i in running])
                )
            finally:
                self.sim.nova.faults.latency = before
            assert deleted, "DeleteNodes failed while Nova was slow"
            self.want = max(0, self.want - len(running))
            self.promised.update(i.id.removeprefix("openstack:///") for i in running)

        self.loop.run(run())

    @precondition(lambda self: self.ca is not None)
    @rule()
    def lease_deleted_by_hand(self) -> None:
        """kubectl delete lease: the holder makes it again at its next renew, with its promise
        record, and stays the one writer."""
        assert self.provider is not None
        leadership = self.provider.app.leadership
        self.kube.delete_lease("kube-system", lease_name_for(CLUSTER))
        self.loop.run(self._pause(0.6))
        lease = self.kube.lease("kube-system", lease_name_for(CLUSTER))
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == leadership.status()["identity"]
        assert PROMISES_ANNOTATION in lease["metadata"]["annotations"]
        assert leadership.may_write()

    async def _start_despite_faults(self) -> None:
        # The first sync is retried until Nova answers; a very flaky Nova may take a while.
        await self._start()

    # -- operators and the world ------------------------------------------------------------------

    async def _reload(self) -> str:
        """The file written, and read again at once, as on SIGHUP (osas's own watcher may
        have read it first)."""
        write_config(self.tmp, self.data)
        assert self.provider is not None
        return await self.provider.app.reload_once(force=True)

    @precondition(lambda self: self.ca is not None)
    @rule(max_size=st.sampled_from([1, 3, MAX_SIZE]))
    def reload_max_size(self, max_size: int) -> None:
        """max_size lowered (unsent creates beyond it cancelled, nothing deleted) or raised."""
        self.data["node_groups"][0]["max_size"] = max_size
        assert self.loop.run(self._reload()) == "applied"
        self.max_size = max_size
        self.bound = max(self.bound, max_size)
        self.want = min(self.want, max_size)  # CA sees the new max at its next Refresh

    @precondition(lambda self: self.ca is not None)
    @rule(flavor=st.sampled_from(FLAVORS))
    def reload_flavor(self, flavor: str) -> None:
        """The template follows at once (no complete listing needed)."""
        self.data["node_groups"][0]["flavor"] = flavor
        assert self.loop.run(self._reload()) == "applied"

        async def template() -> bytes:
            assert self.ca is not None
            return bytes((await self.ca.template("big")).nodeBytes)

        ok, node = self.loop.run(self._call(template()))
        assert not ok or flavor.encode() in node

    @precondition(lambda self: self.ca is not None)
    @rule()
    def reload_group_removed_and_added_back(self) -> None:
        group = self.data["node_groups"].pop()
        self.data["node_groups"].append({**group, "id": "spare"})
        assert self.loop.run(self._reload()) == "applied"
        self.data["node_groups"] = [group]
        assert self.loop.run(self._reload()) == "applied"

    @precondition(lambda self: self.ca is not None)
    @rule()
    def reload_an_invalid_file(self) -> None:
        """Refused whole: the configuration in force stays."""
        self.path.write_text("node_groups: [\n")
        assert self.provider is not None
        assert self.loop.run(self.provider.app.reload_once(force=True)) == "rejected"
        assert self.loop.run(self._reload()) == "applied"

    @rule()
    def keystone_revokes_every_token(self) -> None:
        self.sim.identity.revoke_all()

    @precondition(lambda self: self.ca is not None)
    @rule(data=st.data())
    def server_deleted_by_hand(self, data: st.DataObject) -> None:
        """Someone deletes a running server in Horizon: while Nova answers, it leaves CA's view
        within one incremental sync."""
        pick = data.draw(st.integers(0, 255))  # drawn first: what runs depends on timing
        running = [s for s in owned(self.sim) if s.status == "ACTIVE"]
        if not running:
            return
        server = running[pick % len(running)]
        self.sim.nova.delete_server(server.server_id)
        self.by_hand.add(server.server_id)
        faults = self.sim.nova.faults
        if faults.error_rate or faults.latency or faults.repeated_pages or faults.skipped_servers:
            return

        async def freshness() -> None:
            assert self.provider is not None
            assert self.ca is not None
            await asyncio.sleep(0.15)  # Nova's delete window: DELETED after 0.1 s
            try:
                await self.provider.app.reconciler.reconcile_once(full=False)
            except CloudError:
                return  # Nova did not answer this time: the next sync will do
            instances = {i.id for i in await self.ca.nodes("big")}
            assert f"openstack:///{server.server_id}" not in instances

        self.loop.run(freshness())

    @rule(room=st.integers(0, 3))
    def project_quota_changes(self, room: int) -> None:
        """An operator sets the project's instance quota to ``room`` more than Nova counts:
        osas reads it within a sync or two, tells CA the max the project holds, and fails
        what cannot fit at once, without a POST."""
        self.sim.nova.quota.instances = len(self.sim.nova.live_servers()) + room

    @rule()
    def credential_rotated(self) -> None:
        """The application credential rotated: a new one made, the clouds.yaml osas reads
        replaced, the old one deleted (its tokens with it). osas carries on, no restart."""
        new_id = f"rotated-{os.urandom(4).hex()}"
        rotate_application_credential(self.sim, self.clouds, self.credential, new_id)
        self.credential = new_id

    @rule(offset=st.sampled_from(CLOCK_JUMPS))
    def novas_clock_jumps(self, offset: float) -> None:
        """Nova's clock set back or forward (a host corrected by NTP, a failover to a host
        whose clock is off): no change may be lost for it, whichever way it went."""
        self.sim.nova.clock_offset = offset

    @rule(data=st.data())
    def a_mark_removed_by_hand(self, data: st.DataObject) -> None:
        """`openstack server unset --property osas-cluster`: the server is not this cluster's
        any more. It leaves CA's view (a complete listing reads marks again, DeleteNodes reads
        them before deleting) and osas never deletes it."""
        pick = data.draw(st.integers(0, 255))  # drawn first: what runs depends on timing
        running = [s for s in owned(self.sim) if s.status == "ACTIVE" and s.task_state is None]
        if not running:
            return
        server = running[pick % len(running)]
        try:
            self.sim.nova.delete_metadata_key(server.server_id, META_CLUSTER)
        except NovaRefusal:
            return  # it got busy meanwhile (a delete, a build): Nova refuses with 409
        self.foreign[server.server_id] = dict(server.metadata)

    @rule(count=st.integers(2, 3))
    def earlier_life_servers_then_restart(self, count: int) -> None:
        """Servers of one request id (a copied template, an older osas, Nova's multi-create),
        found by a restart: kept and reported; they go only when CA scales them down."""
        request_id = f"e{len(self.earlier_life):031x}"
        for index in range(count):
            name = f"{CLUSTER}-big-earlier-{request_id[:6]}-{index}"
            server = seed_earlier(self.sim.nova, "big", request_id, name=name)
            self.earlier_life.add(server.server_id)
        self.bound += count
        self.loop.run(self._kill())
        self.loop.run(self._start_despite_faults())

    # -- convergence and the invariants -----------------------------------------------------------

    @invariant()
    def target_never_passes_max_size(self) -> None:
        """osas never takes the group past max_size: between convergences only what was
        already there may stay above a lowered max_size (and an earlier life's servers)."""
        if self.ca is None:
            return
        ok, target = self.loop.run(self._call(self.ca.target_size("big")))
        assert not ok or (isinstance(target, int) and target <= self.bound)
        if self.longest_stall <= DOUBT_WINDOW:
            # Nova itself: a server stored past the doubt window is an orphan osas deletes,
            # and may stand there a moment; within it, never one too many.
            assert sum(live_requests(self.sim).values()) <= self.bound, self._state()

    @rule()
    def converge(self) -> None:
        self.loop.run(self._converge())

    async def _converge(self) -> None:
        faults = self.sim.nova.faults
        faults.error_rate = faults.latency = faults.create_stall = faults.delete_stall = 0.0
        faults.lost_create_responses = 0
        self.sim.nova.clock_offset = 0.0
        faults.quota_recheck_seconds = 0.0
        self.sim.nova.quota.instances = None
        # A create or DELETE stalled in Nova lands at most this long after the faults stopped.
        await asyncio.sleep(self.longest_stall + 0.2)
        self.longest_stall = 0.0
        assert self.ca is not None
        assert self.provider is not None
        ca, ledger = self.ca, self.provider.app.inventory.ledger
        deadline = time.monotonic() + CONVERGE_SECONDS
        while True:
            assert time.monotonic() < deadline, self._state()
            await ca.refresh()
            instances = list(await ca.nodes("big"))
            failed = [i for i in instances if i.status.HasField("errorInfo")]
            self.failure_codes.update(i.status.errorInfo.errorCode for i in failed)
            if failed:
                self.ca_deleted.update(i.id for i in failed)
                await ca.delete("big", [(i.id, i.id) for i in failed])
            target = await ca.target_size("big")
            running = kept(instances)
            if target < self.want:
                # Refused while headroom is held after a restart: CA asks again next loop.
                await self._call(ca.increase("big", self.want - target))
            elif target > self.want and len(running) > self.want:
                # Servers CA did not ask for (adopted after a restart, above a lowered
                # max_size): scaled down.
                extra = running[: target - self.want]
                self.ca_deleted.update(i.id for i in extra)
                await self._call(ca.delete("big", [(i.id, i.id) for i in extra]))
            settled = not list(ledger.creates()) and not ledger.deleting_ids()
            if settled and target == self.want == len(running) == sum(
                live_requests(self.sim).values()
            ):
                break
            await asyncio.sleep(0.1)
        await self.provider.sync(full=True)
        self._check_invariants({i.id for i in await ca.nodes("big")})
        self.bound = self.max_size

    def _state(self) -> str:
        return f"want={self.want} nova={dict(live_requests(self.sim))}"

    def _check_invariants(self, nodes: set[str]) -> None:
        assert self.provider is not None
        requests = live_requests(self.sim)
        earlier = {
            s.metadata[META_REQUEST]
            for s in self.sim.nova.all_servers()
            if s.server_id in self.earlier_life
        }
        # No kept duplicate; and in fact no create made twice: nothing in this schedule resends
        # a POST but osas itself (and only after a 401, when Nova did nothing), so no request
        # osas sent ever made two servers, even short-lived ones.
        duplicates = {r: n for r, n in requests.items() if n > 1 and r not in earlier}
        assert not duplicates, requests
        made = Counter(
            s.metadata[META_REQUEST]
            for s in self.sim.nova.all_servers()
            if s.metadata.get(META_CLUSTER) == CLUSTER
            and META_REQUEST in s.metadata
            and s.server_id not in self.earlier_life
        )
        assert max(made.values(), default=0) <= 1, made
        # Never above max_size.
        ledger = self.provider.app.inventory.ledger
        pending = sum(1 for _ in ledger.creates_of("big"))
        assert sum(requests.values()) + pending <= self.max_size
        assert ledger.target_size("big") <= self.max_size
        # An earlier life's servers go only when CA asks.
        gone = {
            s.server_id
            for s in self.sim.nova.all_servers()
            if s.server_id in self.earlier_life and s.deleting_since is not None
        }
        assert {f"openstack:///{i}" for i in gone - self.by_hand} <= self.ca_deleted
        # Refused tokens cost an authentication, never a failed create.
        assert "CredentialsRefused" not in self.failure_codes
        # A DeleteNodes answered OK was carried out, kill -9 right after it or not; but for
        # a server whose mark a person removed before its DELETE went (never deleted).
        for server_id in self.promised - set(self.foreign):
            server = self.sim.nova.find_server(server_id)
            assert server is None or server.deleting_since is not None, server_id
        # Every DELETE osas sent followed a read of that server showing it this cluster's and
        # the group's. Nova has no conditional delete: a mark a person removes after that
        # read, while the DELETE is on its way (seconds, with Nova slow), cannot stop it.
        raced = set()
        for asked in self.sim.nova.deletes_asked:
            assert asked.read_metadata is not None, f"{asked.server_id}: deleted unread"
            read = {key: asked.read_metadata.get(key) for key in (META_CLUSTER, META_GROUP)}
            assert read == {META_CLUSTER: CLUSTER, META_GROUP: "big"}, asked
            assert TAG in (asked.read_tags or ()), asked
            raced.add(asked.server_id)
        # No foreign server touched: but for a mark removed after osas's read of the server
        # before its DELETE, no server lacking this cluster's marks when osas read it.
        for server_id, metadata in self.foreign.items():
            server = self.sim.nova.find_server(server_id)
            if server_id in raced:
                continue
            assert server is not None
            assert server.deleting_since is None
            assert server.metadata == metadata
        # Target and servers agree, and CA's view is Nova's.
        assert ledger.target_size("big") == sum(requests.values()) == self.want
        assert nodes == {f"openstack:///{s.server_id}" for s in owned(self.sim)}

    def teardown(self) -> None:
        try:
            if self.provider is not None and self.ca is not None:
                self.loop.run(self._converge())
        finally:
            with contextlib.suppress(Exception):
                self.loop.run(self._sigterm())
            self.loop.close()
            self.sim.stop()
            self.kube.stop()
            if self._clouds_env is None:
                os.environ.pop("OS_CLIENT_CONFIG_FILE", None)
            else:
                os.environ["OS_CLIENT_CONFIG_FILE"] = self._clouds_env
            self._tmp.cleanup()


# The schedules in two parts seeded apart, so that parallel workers run them side by side (the
# one run of twenty took two minutes). Every run of hypothesis starts with its simplest
# schedule, the first rule by name fifteen times, sometimes twice: the two parts of eleven ran
# 20 different sequences of rules, where the one run of twenty ran 18.
SCHEDULE_PARTS = 2
SCHEDULES_PER_PART = 11
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.mark.long
class TestFaultSchedules:
    @pytest.mark.parametrize("part", range(SCHEDULE_PARTS))
    def test_schedules(self, part: int) -> None:
        machine = seed(part)(type(f"FaultSchedulePart{part}", (FaultSchedule,), {}))
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=SCHEDULES_PER_PART,
                stateful_step_count=15,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            ),
        )


def test_a_schedule_leaves_no_folder_behind():
    """Its start and its teardown, as hypothesis runs them around each schedule."""
    schedule = FaultSchedule()
    folder = schedule.tmp
    assert (folder / "kubeconfig").is_file()
    schedule.teardown()
    assert not folder.exists()
