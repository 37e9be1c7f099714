"""The composition root: builds every part from the configuration and runs their lifecycle.

Start: gRPC up and NOT_SERVING (RPCs answer UNAVAILABLE) -> first full sync -> reconciler
(the inventory is kept warm from now on, leader or not) and ready (kubelet's readiness) ->
the leader lease (at once when election is off) -> the previous holder's promise record taken
over (its creates counted until they land, its deletes sent again; with no record to read,
headroom held while an earlier osas's creates may still reach Nova) -> workers -> SERVING.
A standby is ready (its pod counts for rollouts and disruption budgets) but no endpoint of
CA's Service (the leader publishes itself as that), its provider service NOT_SERVING, and it
answers every RPC UNAVAILABLE. A leader that loses the lease has stopped writing already
(fencing by time) and stops (``LeaseLost``). Stop, all within ``shutdown_grace``: mutations
refused at once, queued creates dropped with one warning; a holder then withdraws from CA's
Service and releases the Lease with its promise record (the standby takes over at once and
sends the deletes still queued); with election off, queued deletes are sent; in-flight RPCs
and cloud calls get the rest of the grace, then whatever is left is abandoned (cloud calls
run in daemon threads, so nothing holds the process) and the cloud client is closed.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, ProcessCollector
from structlog.contextvars import bind_contextvars

from osas import __version__
from osas.cloud.errors import CloudConfigurationError, CloudError
from osas.cloud.metrics import CloudMetrics, PlaceCloudMetrics
from osas.cloud.openstack import OpenStackCloud
from osas.cloud.port import Cloud
from osas.config import (
    ConfigError,
    OsasConfig,
    Place,
    PlaceKey,
    load_config,
    places_of,
    reloaded,
    restart_only_changes,
    startup_summary,
)
from osas.domain.inventory import Inventory
from osas.domain.promises import Promises
from osas.domain.servers import OwnershipMarks
from osas.domain.specs import ClusterSpec
from osas.election.port import ElectionSetupError, JoinTokens, Leadership, NoElection
from osas.election.record import PromiseRecord, inherited
from osas.engine.collector import EngineCollector
from osas.engine.controller import Controller
from osas.engine.deletes import ServerDeleter
from osas.engine.events import carry_out
from osas.engine.metrics import EngineMetrics
from osas.engine.places import PlacesController
from osas.engine.queue import TaskQueue
from osas.engine.reconciler import Reconciler
from osas.engine.status import (
    PlaceSources,
    ReloadOutcome,
    StatusSources,
    build_status,
    refresh_census,
)
from osas.engine.warm import WarmKeeper
from osas.engine.workers import Workers
from osas.service.metrics import ServiceCollector, register_build_info
from osas.service.ops_server import OperationsServer
from osas.service.server import ProviderServer

logger = structlog.get_logger(__name__)

_FIRST_SYNC_MAX_BACKOFF = 30.0
# While the first sync waits for OpenStack, the log says so after this long, then this often.
_FIRST_SYNC_FIRST_REPORT = 5.0
_FIRST_SYNC_REPORT_EVERY = 30.0


class LeaseLost(Exception):
    """This process held the leader lease and lost it: it stopped writing before the lease
    could pass to another (renew_deadline < lease_duration), and stops."""


async def _essential(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Run a background loop; if it dies, say so loudly and take the process down with it,
    rather than serve from an inventory nobody updates."""
    try:
        await run()
    except anyio.get_cancelled_exc_class():
        raise
    except Exception:
        logger.exception("background task died", task=name)
        raise


_CONFIG_POLL_SECONDS = 5.0


def _digest(path: Path | None) -> str | None:
    """The configuration file's content, digested; None when it cannot be read (a reload
    then reports why)."""
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def openstack_cloud(
    config: OsasConfig,
    registry: CollectorRegistry | None = None,
    *,
    request_timeout: float | None = None,
    place: Place | None = None,
) -> Cloud:
    """The cloud osas runs against: OpenStack through openstacksdk (tests hand ``App`` a fake
    of their own); the top-level ``openstack`` block's place, or ``place``. With a registry,
    its requests are counted there (the app's). With ``request_timeout``, each request waits
    at most that long (or ``openstack.api_timeout`` when shorter) and is sent once: a check
    that answers soon, whatever the cloud does."""
    place = place or places_of(config)[0]
    metrics = CloudMetrics(registry).at(*place.key) if registry is not None else None
    return _cloud_at(place, metrics, request_timeout)


def openstack_clouds(config: OsasConfig, registry: CollectorRegistry) -> dict[PlaceKey, Cloud]:
    """A cloud adapter for each place ``osas serve`` runs (``served_places``), their requests
    counted in ``registry`` by cloud and region."""
    metrics = CloudMetrics(registry)
    return {
        place.key: _cloud_at(place, metrics.at(*place.key), None) for place in served_places(config)
    }


def _cloud_at(
    place: Place, metrics: PlaceCloudMetrics | None, request_timeout: float | None
) -> Cloud:
    settings = place.settings
    if request_timeout is not None:
        settings = dataclasses.replace(
            settings, api_timeout=min(settings.api_timeout, request_timeout), attempts=1
        )
    return OpenStackCloud(settings, metrics=metrics)


def served_places(config: OsasConfig) -> tuple[Place, ...]:
    """The places ``osas serve`` keeps: each where node groups live (the top-level block's
    alone when it has them all; check-config also checks a top-level place left empty)."""
    places = places_of(config)
    return tuple(place for place in places if place.group_ids) or places[:1]


def _restricted(cluster: ClusterSpec, place: Place, group_ids: Collection[str]) -> ClusterSpec:
    """The cluster as one place's engine sees it: the groups living there (``group_ids``), and
    provider ids spelt as its nodes' are."""
    groups = tuple(spec for spec in cluster.node_groups if spec.group_id in group_ids)
    return dataclasses.replace(
        cluster, node_groups=groups, provider_id_region=place.provider_id_region
    )


def check_layout(before: OsasConfig, after: OsasConfig) -> None:
    """Raise ConfigError when a reload cannot apply ``after``'s places: a group that moves to
    another place, a place osas does not run yet, a place whose provider ids change form
    (each needs a restart)."""
    running = {place.key: place for place in served_places(before)}
    was = {group: place.key for place in places_of(before) for group in place.group_ids}
    for place in served_places(after):
        if place.key not in running:
            raise ConfigError(
                f"node groups {list(place.group_ids)} live in {place}, a place osas does not "
                "run yet: restart osas to apply it"
            )
        ids = running[place.key].provider_id_region
        if place.provider_id_region != ids:
            raise ConfigError(
                f"the provider ids of {place} name region {place.provider_id_region!r}, not "
                f"{ids!r}: restart osas to apply it"
            )
        for group in place.group_ids:
            if was.get(group, place.key) != place.key:
                raise ConfigError(
                    f"node group {group!r} moves to {place}: restart osas to apply it"
                )


def join_tokens_for(config: OsasConfig, made: JoinTokens | None) -> JoinTokens | None:
    """What mints the join tokens of groups with ``bootstrap_token``: ``made`` if there is
    one, else a new connection to the Kubernetes API (leader_election.kubeconfig, else the
    pod's service account); None while no group needs one. Raises ConfigError when there
    is no usable Kubernetes configuration."""
    groups = [group.group_id for group in config.node_groups if group.bootstrap_token]
    if made is not None or not groups:
        return made
    # The Kubernetes client (lightkube, 60-odd modules, some 2 MiB) is loaded by a process
    # that uses it, not by every osas.
    from osas.election.tokens import BootstrapTokens  # noqa: PLC0415 - only when minting

    try:
        return BootstrapTokens(config.leader_election.kubeconfig, cluster_name=config.cluster_name)
    except ElectionSetupError as exc:
        raise ConfigError(
            f"node groups {groups} mint join tokens (bootstrap_token), which needs the "
            f"Kubernetes API: {exc} (outside a pod, name a kubeconfig in "
            "leader_election.kubeconfig)"
        ) from exc


def _leadership(config: OsasConfig) -> Leadership:
    """Leader election under a Lease, or none. The Kubernetes client is loaded only by a
    process that elects (or mints join tokens)."""
    if not config.leader_election.enabled:
        return NoElection()
    from osas.election.lease import LeaseElection  # noqa: PLC0415 - only when electing

    return LeaseElection(config.election_settings())


class PlaceEngine:
    """What keeps the servers of one place (a cloud and region): the cloud adapter that
    reaches it, the inventory of the node groups living there (snapshot and ledger), the task
    queue and the workers that send its creates and deletes, the reconciler that lists it,
    and the controller CA's calls on those groups reach. A place's listing, clock, pace,
    quota, credentials and doubt window are its own; the election, the promise record, the
    metrics registry and the gRPC servers are the process's (``App``), which runs one engine
    per place its node groups live in."""

    def __init__(
        self,
        place: Place,
        cloud: Cloud,
        cluster: ClusterSpec,
        config: OsasConfig,
        *,
        leadership: Leadership,
        metrics: EngineMetrics,
        join_tokens: JoinTokens | None,
        keep_promises: Callable[[float], Awaitable[None]] | None,
        standby: Callable[[], str | None],
    ) -> None:
        settings = config.engine_settings()
        self.place = place
        self.cloud = cloud
        self.first_sync_failures = 0  # attempts of the first sync that failed so far
        self.first_sync_retry_at: float | None = None  # while the first sync pauses
        self.inventory = Inventory(cluster, config.ledger_settings())
        # A standby adopts the writer's servers silently; it writes once elected.
        self.inventory.ledger.set_writer(not leadership.enabled)
        self.queue = TaskQueue(settings.queue.capacity)
        deleter = ServerDeleter(cloud, OwnershipMarks(cluster.cluster_name), leadership.may_write)
        self.reconciler = Reconciler(
            cloud,
            self.inventory,
            self.queue,
            settings,
            leading=leadership.may_write,
            metrics=metrics,
            place=place.key,
        )
        metrics.add_place(place.key)
        self.workers = Workers(
            cloud,
            self.inventory,
            self.queue,
            settings,
            deleter=deleter,
            may_write=leadership.may_write,
            metrics=metrics,
            join_tokens=join_tokens,
        )
        self.controller = Controller(
            self.inventory,
            self.queue,
            self.reconciler,
            settings,
            deleter=deleter,
            keep_promises=keep_promises,
            standby=standby,
            metrics=metrics,
        )
        self.keeper = WarmKeeper(
            cloud,
            self.inventory,
            self.queue,
            may_write=leadership.may_write,
            keep_promises=self.controller.keep_promises,
            interval=settings.reconcile.interval,
            metrics=metrics,
        )
        self.workers.keeper = self.keeper


class App:
    """One osas process: inventory, queue, workers, reconciler, controller, gRPC servers, and
    the metrics registry every part records into (give the cloud adapter the same one)."""

    def __init__(
        self,
        config: OsasConfig,
        cloud: Cloud | Mapping[PlaceKey, Cloud],
        *,
        registry: CollectorRegistry | None = None,
        config_path: Path | None = None,
    ) -> None:
        """``cloud``: the cloud of the one place the node groups live in, or a cloud for each
        place (``openstack_clouds``; ``served_places`` says which)."""
        self.config = config
        # Watched for changes (and re-read on SIGHUP): the node groups reload without a restart.
        self.config_path = config_path
        self._config_digest = _digest(config_path)
        self._reload_requested = anyio.Event()
        self.registry = registry if registry is not None else CollectorRegistry()
        cluster = config.cluster_spec()
        settings = config.engine_settings()
        self.settings = settings
        metrics = EngineMetrics(self.registry, cluster)
        self._engine_metrics = metrics
        self._reloads = Counter(
            "osas_config_reloads",
            "Configuration reloads, by result: applied, rejected (the file does not load; the "
            "configuration in force stays), unchanged.",
            ["result"],
            registry=self.registry,
        )
        for result in ("applied", "rejected", "unchanged"):
            self._reloads.labels(result)
        self.leadership = _leadership(config)
        self.lease_lost = False
        self.join_tokens = join_tokens_for(config, None)
        # Made before the place, whose controller keeps promises through it; it reads the
        # place's ledger when it writes (``_promises``).
        self.record = PromiseRecord(
            self.leadership, self._promises, self._promised, clock=anyio.current_time
        )
        places = served_places(config)
        clouds = cloud if isinstance(cloud, Mapping) else {places[0].key: cloud}
        if len(places) > 1 and set(clouds) != {place.key for place in places}:
            raise ValueError(f"a cloud for each of {[str(place) for place in places]}")
        self.places = [
            PlaceEngine(
                place,
                clouds[place.key],
                _restricted(cluster, place, place.group_ids),
                config,
                leadership=self.leadership,
                metrics=metrics,
                join_tokens=self.join_tokens,
                keep_promises=self.record.keep if self.leadership.enabled else None,
                standby=self._standby,
            )
            for place in places
        ]
        # The first place's parts, by the names the rest of the app (and its tests) use; the
        # only ones where the node groups live in one place.
        first = self.places[0]
        self.cloud = first.cloud
        self.inventory = first.inventory
        self.queue = first.queue
        self.reconciler = first.reconciler
        self.workers = first.workers
        self.controller: Controller | PlacesController = (
            first.controller
            if len(self.places) == 1
            else PlacesController(
                [engine.controller for engine in self.places],
                [str(engine.place) for engine in self.places],
                standby=self._standby,
            )
        )
        server_settings = config.server_settings()
        self.server = ProviderServer(self.controller, server_settings, registry=self.registry)
        self._last_reload: ReloadOutcome | None = None
        # Top-level keys the file changes that only a restart applies, since this process
        # started (a later reload that puts them back clears them).
        self._restart_needed: tuple[str, ...] = ()
        self._restart_needed_gauge = Gauge(
            "osas_config_restart_needed",
            "1 while the configuration file changes keys a reload cannot apply (listen, "
            "openstack, reconcile...): they wait for a restart",
            registry=self.registry,
        )
        self._status_sources = StatusSources(
            version=__version__,
            config_file=None if config_path is None else str(config_path),
            places=tuple(
                PlaceSources.of(
                    *engine.place.key,
                    engine.inventory,
                    engine.queue,
                    engine.reconciler,
                    keeper=engine.keeper,
                )
                for engine in self.places
            ),
            workers=settings.queue.workers,
            clock=anyio.current_time,
            readiness=self.readiness,
            rejected_certificate_reloads=self._rejected_reloads,
            leadership=self._leadership_status,
            last_reload=lambda: self._last_reload,
            restart_needed=lambda: self._restart_needed,
        )
        self._register_collectors()
        self.ops = (
            OperationsServer(
                server_settings.metrics_listen,
                self.registry,
                readiness=self.readiness,
                status=self.status,
                prepare=partial(refresh_census, self._status_sources),
            )
            if server_settings.metrics_listen
            else None
        )
        self._stop = anyio.Event()
        self._workers_done = anyio.Event()
        self.serving = anyio.Event()

    def _register_collectors(self) -> None:
        sources, registry = self._status_sources, self.registry
        self._collector = EngineCollector(
            places=sources.places,
            workers=sources.workers,
            clock=anyio.current_time,
            leading=self.leadership.may_write,
        )
        registry.register(self._collector)
        registry.register(ServiceCollector(self.readiness, self._rejected_reloads))
        register_build_info(registry, __version__)
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)

    def _promises(self) -> Promises:
        """Every place's promises in one record (a place's ledger takes back its own groups'
        at a takeover, ``Ledger.inherit``)."""
        if len(self.places) == 1:
            return self.inventory.ledger.promises()
        creates: dict[str, tuple[str, float]] = {}
        deletes: dict[str, str] = {}
        for engine in self.places:
            promises = engine.inventory.ledger.promises()
            creates.update(promises.creates)
            deletes.update(promises.deletes)
        return Promises(creates, deletes)

    def _promised(self) -> int:
        return sum(engine.inventory.ledger.promised for engine in self.places)

    def _leadership_status(self) -> dict[str, object]:
        """The election's status, with the entries of the promise record last written."""
        return {**self.leadership.status(), "promises": self.record.entries}

    def _rejected_reloads(self) -> int:
        certificates = self.server.certificates
        return 0 if certificates is None else certificates.rejected_reloads

    def _standby(self) -> str | None:
        """Why this process may not answer CA: it does not hold the leader lease (or its
        renewal is overdue). None when it may: called on every RPC, so kept cheap."""
        if self.leadership.may_write():
            return None
        status = self.leadership.status()
        return (
            f"this osas is a standby: the leader lease {status.get('lease')} is held by "
            f"{status.get('holder') or 'no one yet'}; CA's Service reaches the holder"
        )

    def readiness(self) -> str | None:
        """None when ready (/readyz 200), else why not. An OpenStack outage makes osas not
        ready, never not alive (/healthz): a restart would not bring OpenStack back. A warm
        standby is ready: kubelet's readiness keeps rollouts and disruption budgets working,
        and CA's Service reaches the leader alone through the endpoint the leader publishes."""
        if self._stop.is_set():
            return "shutting down"
        if not any(engine.inventory.synced for engine in self.places):
            return f"first sync with OpenStack not done yet: {self._first_sync_wait()}"
        refused = [
            (engine, reason)
            for engine in self.places
            if (reason := engine.reconciler.status.credentials_refused) is not None
        ]
        if len(refused) == len(self.places):  # one place refusing leaves the others working
            return "; ".join(
                f"OpenStack refuses osas's credentials{self._at(engine)}: {reason}"
                for engine, reason in refused
            )
        return self.controller.staleness()

    def _at(self, engine: PlaceEngine) -> str:
        """`` in <place>`` where the node groups live in several places, else nothing."""
        return f" in {engine.place}" if len(self.places) > 1 else ""

    def status(self) -> dict[str, Any]:
        """The /status document."""
        return build_status(self._status_sources)

    def stop(self) -> None:
        self._stop.set()

    # -- configuration reload ----------------------------------------------------------------------

    def request_reload(self) -> None:
        """SIGHUP: read the configuration file again now."""
        self._reload_requested.set()

    async def reload_once(self, *, force: bool = False) -> str:
        """Read the configuration file; apply it if it changed (or ``force``) and loads.
        "applied", "unchanged" or "rejected" (the configuration in force stays)."""
        # The files OpenStack's credentials come from (a rotated application credential):
        # the adapter watches them itself; on SIGHUP they are read at once.
        credentials = (
            [name for engine in self.places for name in engine.cloud.reload_credentials()]
            if force
            else []
        )
        path = self.config_path
        if path is None:
            return "unchanged"
        digest = _digest(path)
        if digest == self._config_digest and not force:
            return "unchanged"
        self._config_digest = digest
        try:
            new = load_config(path)
            check_layout(self.config, new)
            # A first group that mints join tokens needs the Kubernetes API from now on.
            self.join_tokens = join_tokens_for(new, self.join_tokens)
        except ConfigError as exc:
            logger.error(
                "configuration reload rejected; the configuration in force stays",
                reason=str(exc),
            )
            self._reloads.labels("rejected").inc()
            self._last_reload = ReloadOutcome(applied=False, at=time.time(), reason=str(exc))
            return "rejected"
        for engine in self.places:
            engine.workers.join_tokens = self.join_tokens
        restart_only = restart_only_changes(self.config, new)
        if restart_only:
            logger.warning(
                "configuration changes that need a restart are not applied; restart osas to "
                "apply them",
                keys=restart_only,
            )
        self._restart_needed = tuple(restart_only)
        self._restart_needed_gauge.set(1 if restart_only else 0)
        await self.use_cluster(new)
        self._reloads.labels("applied").inc()
        self._last_reload = ReloadOutcome(applied=True, at=time.time())
        logger.info(
            "configuration reloaded",
            node_groups=[group.group_id for group in new.node_groups],
            openstack_credentials=credentials or "unchanged",
            restart_needed=restart_only,
        )
        return "applied"

    async def use_cluster(self, config: OsasConfig) -> None:
        """Apply the reloadable part of ``config``: the flavors of new and changed groups are
        fetched first, each in its place (a new group answers NodeGroupTemplateNodeInfo at
        once), then every place's ledger takes its share of the new cluster and plans what it
        means for the work in hand, in one step with no await inside, so no call sees half of
        it. ``check_layout`` has said the places stay as they are."""
        cluster = config.cluster_spec()
        # A place the new file leaves with no group keeps its engine, with no group in it.
        living = {place.key: place.group_ids for place in places_of(config)}
        parts = []
        for engine in self.places:
            share = _restricted(cluster, engine.place, living.get(engine.place.key, ()))
            before = {spec.group_id: spec.flavor for spec in engine.inventory.cluster.node_groups}
            fresh = [s for s in share.node_groups if before.get(s.group_id) != s.flavor]
            try:
                flavors = await engine.reconciler.flavors_of(fresh)
            except CloudError as exc:
                logger.warning(
                    "flavors of reloaded node groups not fetched yet",
                    error=str(exc),
                    **self._place_fields(engine),
                )
                flavors = [(spec, None) for spec in fresh]
                engine.reconciler.want_flavors(spec.group_id for spec in fresh)
            parts.append((engine, share, flavors))
        self.config = reloaded(self.config, config)
        now = anyio.current_time()
        for engine, share, flavors in parts:
            orders = engine.inventory.ledger.use_cluster(share, now)
            for spec, flavor in flavors:
                engine.inventory.snapshot.set_flavor(spec.group_id, flavor)
            carry_out(orders, engine.queue, self._engine_metrics)
        self._engine_metrics.add_groups(cluster)
        for engine in self.places:
            engine.workers.report_unfilled_placeholders()
            engine.reconciler.nudge()  # flavors that could not be fetched, and a fresh review

    def _place_fields(self, engine: PlaceEngine) -> dict[str, str]:
        """The place a log line is about, where the node groups live in several."""
        if len(self.places) == 1:
            return {}
        return {"place": str(engine.place)}

    async def run_config_watcher(self) -> None:
        """Reload when the file's content changes (a ConfigMap update swaps a symlink, so the
        content is compared, not the modification time), or at once on SIGHUP."""
        while True:
            with anyio.move_on_after(_CONFIG_POLL_SECONDS):
                await self._reload_requested.wait()
            forced = self._reload_requested.is_set()
            self._reload_requested = anyio.Event()
            result = await self.reload_once(force=forced)
            if result == "unchanged" and forced:
                self._reloads.labels("unchanged").inc()

    def _first_sync_wait(self) -> str:
        """What the first sync waits for and since when, in each place not synced yet."""
        if len(self.places) == 1:
            return self._first_sync_wait_of(self.places[0])
        waiting = [engine for engine in self.places if not engine.inventory.synced]
        return "; ".join(f"{e.place}: {self._first_sync_wait_of(e)}" for e in waiting)

    def _first_sync_wait_of(self, engine: PlaceEngine) -> str:
        """What one place's first sync waits for and since when, counted from its first
        attempt: a cloud that never answers fails an attempt only at its timeout, a refused
        one at once."""
        sync, now = engine.reconciler.status, anyio.current_time()
        openstack = engine.place.settings
        parts = []
        if sync.failing_since is not None and sync.last_error is not None:
            parts.append(
                f"failing for {now - sync.failing_since:.0f}s "
                f"({sync.consecutive_failures} attempt(s) failed), the last: {sync.last_error}"
            )
        if sync.waiting_for is not None and sync.waiting_since is not None:
            retrying = engine.reconciler.retrying()
            answer = (
                f"no answer yet (each request waits up to openstack.api_timeout, "
                f"{openstack.api_timeout:g}s, and is sent up to "
                f"openstack.attempts, {openstack.attempts}, times)"
                if retrying is None
                else retrying
            )
            parts.append(
                f"{'now ' if parts else ''}waiting {now - sync.waiting_since:.0f}s for "
                f"{sync.waiting_for} from OpenStack: {answer}"
            )
        elif engine.first_sync_retry_at is not None:
            parts.append(f"next attempt in {max(0.0, engine.first_sync_retry_at - now):.0f}s")
        return "; ".join(parts) or "starting"

    async def _first_sync(self, background: anyio.abc.TaskGroup) -> None:
        """Each place checked and listed, all at once, each retried until its OpenStack
        answers; a cloud that cannot be used as configured (credentials, microversion) stops
        the process instead. Returns when every place has done it, or when one has and every
        other has failed once: a place that is down never holds the others, it goes on
        trying, its groups out of CA's view until it is done (it then starts its reconciler
        itself). While it waits, the log says for what and since when: first after a few
        seconds, then every half minute."""
        settled = anyio.Event()

        def check() -> None:
            synced = [engine.inventory.synced for engine in self.places]
            tried = all(e.inventory.synced or e.first_sync_failures for e in self.places)
            if all(synced) or (any(synced) and tried):
                settled.set()

        async with anyio.create_task_group() as reporting:
            reporting.start_soon(self._report_first_sync_wait, settled)
            for engine in self.places:
                # Not _essential: what ends it (a cloud that cannot be used as configured)
                # is the startup failure serve reports, not a crash to log with a traceback.
                background.start_soon(self._first_sync_of, engine, check, background)
            await settled.wait()
            reporting.cancel_scope.cancel()

    async def _report_first_sync_wait(self, settled: anyio.Event) -> None:
        began = anyio.current_time()
        await anyio.sleep(_FIRST_SYNC_FIRST_REPORT)
        while not settled.is_set():
            logger.warning(
                "still waiting for OpenStack: the first sync is not done",
                waiting_seconds=round(anyio.current_time() - began),
                state=self._first_sync_wait(),
            )
            await anyio.sleep(_FIRST_SYNC_REPORT_EVERY)

    async def _first_sync_of(
        self, engine: PlaceEngine, check: Callable[[], None], background: anyio.abc.TaskGroup
    ) -> None:
        delay = self.settings.reconcile.retry_backoff
        # Every line of this task and of the reconciler it starts says which place it is of.
        bind_contextvars(**self._place_fields(engine))
        while True:
            begun = anyio.current_time()
            try:
                described = await engine.reconciler.verify_cloud()
                logger.info("cloud ready", cloud=described)
                await engine.reconciler.reconcile_once(full=True)
            except CloudConfigurationError:
                raise
            except CloudError as exc:
                now = anyio.current_time()
                # The attempt's own length (its requests' timeouts and retries) said with the
                # pause after it: the two make the gap between these lines.
                logger.warning(
                    "first sync failed; retrying",
                    error=str(exc),
                    attempt_seconds=round(now - begun, 1),
                    retry_in=delay,
                )
                engine.first_sync_failures += 1
                check()
                engine.first_sync_retry_at = now + delay
                await anyio.sleep(delay)
                engine.first_sync_retry_at = None
                delay = min(delay * 2, _FIRST_SYNC_MAX_BACKOFF)
            else:
                logger.info("first sync done", servers=len(engine.inventory.snapshot))
                # Leader or standby, the inventory is kept warm: a standby takes over in step.
                background.start_soon(_essential, "reconciler", engine.reconciler.run_reconciler)
                background.start_soon(_essential, "warm pools", engine.keeper.run_warm_pools)
                check()
                return

    async def run(self) -> None:
        """Run until ``stop``; ``serving`` is set once health says SERVING. Stopping works at
        any point, also while the first sync is still waiting for OpenStack."""
        logger.info("settings", **startup_summary(self.config))
        if self.config.cloud_backend is not None:
            logger.warning(
                "cloud_backend is retired and ignored: osas runs against OpenStack; remove it"
            )
        for engine in self.places:
            engine.workers.report_unfilled_placeholders()
        await self.server.start()
        try:
            if self.ops is not None:
                await self.ops.start()
            async with anyio.create_task_group() as background:
                background.start_soon(self._start_serving, background)
                await self._stop.wait()
                await self._shutdown(background)
        finally:
            # Also when cancelled: release the ports and connections, whatever happened.
            with anyio.CancelScope(shield=True):
                gc.unfreeze()  # so that an app run inside a longer process is collected
                await self.server.close()
                if self.ops is not None:
                    await self.ops.close()
                for engine in self.places:
                    await engine.cloud.close()
        if self.lease_lost:
            raise LeaseLost(
                "lost the leader lease (another osas took it or made it anew, or the "
                "Kubernetes API was out of reach for renew_deadline): writes stopped; "
                "restarted, osas stands by until the Lease is free"
            )

    async def _start_serving(self, background: anyio.abc.TaskGroup) -> None:
        await self._first_sync(background)
        # What exists now (modules, the inventory) lives as long as the process: the garbage
        # collector's full passes skip it, instead of walking it for tens of milliseconds.
        gc.freeze()
        await self.server.set_warm()
        if self.config_path is not None:
            background.start_soon(_essential, "config watcher", self.run_config_watcher)
        leadership = self.leadership
        if leadership.enabled:
            background.start_soon(self._run_election)
            status = leadership.status()
            logger.info(
                "waiting for the leader lease", lease=status["lease"], identity=status["identity"]
            )
        else:
            logger.info(
                "leader election is off: this osas takes itself for the only writer of "
                "cluster_name's servers (run it in Kubernetes with leader_election.enabled "
                "for a standby)",
                cluster=self.config.cluster_name,
            )
        await leadership.elected.wait()
        if leadership.enabled:
            for engine in self.places:
                engine.inventory.ledger.set_writer(True)
                # A standby's inventory had incremental syncs only.
                engine.reconciler.want_complete()
        self._take_over()
        background.start_soon(_essential, "workers", self._run_workers)
        await self.server.set_serving()
        self.serving.set()

    async def _run_election(self) -> None:
        """The election loop; when it ends with the lease lost, the process stops: it stopped
        writing already, and a fresh start as a standby is the clean way back."""
        await self.leadership.run_election()
        if self.leadership.lost.is_set() and not self._stop.is_set():
            logger.error("lost the leader lease; stopping")
            self.lease_lost = True
            self.stop()

    def _take_over(self) -> None:
        """What the previous holder promised and Nova has not confirmed is kept: its record's
        creates are counted in their groups until they land or create_doubt_window passes,
        its deletes are sent again. Nothing else is held. Where no record can be read (election
        off, a Lease without one or deleted under its holder), creates an earlier osas sent
        may still reach Nova: no scale-up spends headroom until create_doubt_window passes and
        then, in each place, until a listing of that place begun since has settled (a place
        out of reach stays held). From here on this holder's writes carry its own record."""
        now = anyio.current_time()
        promises = inherited(self.leadership.previous)
        if promises is not None:
            for engine in self.places:  # each place takes back its own groups' promises
                orders = engine.inventory.ledger.inherit(promises, now)
                carry_out(orders, engine.queue, self._engine_metrics)
            logger.info(
                "took over the previous leader's promise record",
                creates=len(promises.creates),
                deletes=len(promises.deletes),
            )
        elif self.settings.reconcile.hold_after_start:
            window = self.config.reconcile.create_doubt_window.total_seconds()
            for engine in self.places:
                engine.inventory.ledger.hold_headroom(now + window)
            logger.warning(
                "scale-ups held until creates an earlier osas may have sent can no longer "
                "reach Nova (no promise record to say which); each group's max size is "
                "reported as its target meanwhile",
                seconds=round(window),
            )
        self.record.start()

    async def _run_workers(self) -> None:
        try:
            async with anyio.create_task_group() as workers:
                for engine in self.places:
                    workers.start_soon(self._run_workers_of, engine)
        finally:
            self._workers_done.set()

    async def _run_workers_of(self, engine: PlaceEngine) -> None:
        bind_contextvars(**self._place_fields(engine))  # each line says which place
        await engine.workers.run_workers()

    async def _shutdown(self, background: anyio.abc.TaskGroup) -> None:
        grace = self.server_grace
        logger.info("shutting down", grace_seconds=grace)
        self.controller.stop_accepting()
        dropped: dict[str, int] = {}
        for engine in self.places:
            dropped.update(engine.workers.drain())  # each place's groups are its own
        if dropped:
            logger.warning(
                "queued creates dropped at shutdown; the Cluster Autoscaler asks again",
                dropped=sum(dropped.values()),
                groups=dropped,
            )
        deadline = anyio.current_time() + grace
        if self.leadership.enabled and not self.lease_lost:
            # Out of CA's Service and the Lease given up first, with the record of what is
            # still in flight: the standby takes over at once and sends the deletes left
            # queued here, while this process lets its in-flight calls finish.
            await self.leadership.release()
        with anyio.move_on_after(max(deadline - anyio.current_time(), 0.0)) as scope:
            async with anyio.create_task_group() as stopping:
                stopping.start_soon(self.server.stop)
                if self.serving.is_set():
                    await self._workers_done.wait()
        if scope.cancelled_caught:
            queues = [engine.queue for engine in self.places]
            logger.error(
                "shutdown grace over; work abandoned",
                deletes_not_sent=sum(queue.queued_deletes() for queue in queues),
                tasks_in_flight=sum(queue.in_hand_count() - len(queue) for queue in queues),
            )
        if self.join_tokens is not None:
            with anyio.CancelScope(shield=True):
                await self.join_tokens.aclose()
        background.cancel_scope.cancel()

    @property
    def server_grace(self) -> float:
        return self.config.shutdown_grace.total_seconds()
