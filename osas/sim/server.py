"""``SimulatedOpenStack``: Keystone, Nova, Glance, Neutron, Cinder on 127.0.0.1 over one FakeNova.

One model, two front ends: the tests' in-memory ``FakeCloud`` and this HTTP server serve the same
``FakeNova``, so what a test seeds or breaks in the model, unmodified openstacksdk sees over real
HTTP. The server is the standard library's ``ThreadingHTTPServer`` in a daemon thread, speaking
HTTP/1.1 with keep-alive as keystoneauth's session expects. Every request is routed, counted in
``calls`` (by operation, e.g. ``compute.servers.list``), delayed and failed as ``nova.faults``
asks (Nova's API calls only), authenticated against Keystone's tokens, then handled under the
model's lock. The fault's latency is slept outside the lock, so slow calls overlap as they would
in front of a real cloud; so is a route's stall (``faults.create_stall`` for creates, which are
then stored and answered late, usually after the client gave up). A handler may answer
``Response.drop()``: the connection is then closed without a status line, as a dying proxy does.
"""

from __future__ import annotations

import contextlib
import email.utils
import ipaddress
import logging
import math
import os
import random
import signal
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from osas.sim.glance import FakeImage
from osas.sim.keystone import CatalogEntry, Identity, unauthorized
from osas.sim.model import FakeKeypair, FakeNova, FakeServerGroup
from osas.sim.neutron import FakeNetwork, FakePort, FakeSecurityGroup
from osas.sim.region import REGION_PATH, SimRegion
from osas.sim.routing import HttpError, Request, Response, Route
from osas.sim.serving import BackgroundHttp, TrackedHandler, TrackedHttpServer

logger = logging.getLogger(__name__)

DEFAULT_USER = "osas"
DEFAULT_PASSWORD = "secret-password"  # noqa: S105 - the simulator's documented test credential
DEFAULT_PROJECT = "k8s"
DEFAULT_DOMAIN = "Default"
APP_CREDENTIAL_ID = "app-cred-id"
APP_CREDENTIAL_SECRET = "app-cred-secret"  # noqa: S105 - documented test credential
CLOUD_NAME = "osas-sim"
HISTORY_SIZE = 10_000
_SEED = 0  # fault injection draws from a seeded generator so runs repeat


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request the simulator answered, as ``history`` keeps it."""

    operation: str  # "" when no route matched
    method: str
    target: str  # path and query string, as sent
    status: int  # 0 when the connection was closed without an answer


class _HttpServer(TrackedHttpServer):
    def __init__(self, address: tuple[str, int], simulator: SimulatedOpenStack) -> None:
        self.simulator = simulator
        super().__init__(address, _Handler)


class _Handler(TrackedHandler):
    server: _HttpServer
    _region_nova: FakeNova | None = None  # the Nova of the region the request is for

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        simulator = self.server.simulator
        self._region_nova = simulator.region_of(self.path).nova
        response = simulator.dispatch(self.command, self.path, headers, body)
        if response.dropped:
            # Nothing written: finish() and the server close the socket, the client reads EOF.
            self.close_connection = True
            return
        try:
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up first (a stalled create outlived its timeout).
            self.close_connection = True

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header, by the clock of the region's Nova (the front server of a real cloud
        shares its host's clock, which is what osas takes changes-since from)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        nova = self._region_nova or self.server.simulator.nova
        return email.utils.format_datetime(nova.clock(), usegmt=True)

    # The stdlib dispatches on these names.
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        logger.debug("%s %s", self.address_string(), format % args)


class SimulatedOpenStack(BackgroundHttp):
    """Keystone v3, Nova v2.1, Glance v2, Neutron v2.0 and Cinder v3 on 127.0.0.1, for tests and
    demos (Cinder only for the volume quota).

    ``nova`` is the shared model (tests seed and inspect it directly); ``calls`` counts requests
    per operation. Defaults: user ``osas``/``secret-password`` in project ``k8s`` (domain
    ``Default``), application credential ``app-cred-id``/``app-cred-secret``, image
    ``ubuntu-24.04``, network ``cluster-net``, security group ``default``, keypair ``ops`` and
    server group ``workers-anti-affinity`` (anti-affinity).
    """

    def __init__(
        self,
        nova: FakeNova | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        region: str = "RegionOne",
        max_limit: int = 1000,
        min_microversion: str = "2.1",
        max_microversion: str = "2.100",
        seed: int = _SEED,
    ) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the simulator serves loopback only, not {host}")
        # The latest requests in order (control API excluded), for tests that look at paging.
        self.history: deque[Exchange] = deque(maxlen=HISTORY_SIZE)
        self.host = host
        self._requested_port = port
        self._random = random.Random(seed)  # noqa: S311 - fault injection, not security
        super().__init__()  # `stopping` cuts stalls short when the simulator stops
        self._port: int | None = None  # kept after stop, for messages about a past run
        self._region_settings = {
            "max_limit": max_limit,
            "min_microversion": min_microversion,
            "max_microversion": max_microversion,
        }

        self.identity = Identity(catalog=self._catalog)
        user = self.identity.add_user(DEFAULT_USER, DEFAULT_PASSWORD, DEFAULT_PROJECT)
        self.identity.add_application_credential(APP_CREDENTIAL_ID, APP_CREDENTIAL_SECRET, user)
        self.project_id = user.project.project_id
        self._user_id = user.user_id
        self.regions: dict[str, SimRegion] = {}
        first = self.add_region(region, nova if nova is not None else FakeNova())
        # The first region is the simulator as a one-region cloud: served at the root, with
        # Keystone, and named by the attributes below.
        self.identity.register(first.router)
        self.region = region
        self.nova = first.nova
        self.lock = first.lock
        self.calls = first.calls
        self.throttled = first.throttled
        self.glance, self.neutron, self.cinder = first.glance, first.neutron, first.cinder
        self.compute = first.compute

    def add_region(self, name: str, nova: FakeNova | None = None) -> SimRegion:
        """Another region behind this Keystone: its own Nova (servers, quota, faults, clock),
        Glance, Neutron and Cinder, served under ``/regions/<name>`` and named in every token's
        catalogue from now on (openstacksdk reads the catalogue when it authenticates)."""
        if name in self.regions:
            raise ValueError(f"region {name!r} is there already")
        if not name or "/" in name:
            raise ValueError(f"a region name is a path segment, not {name!r}")
        made = SimRegion(
            name,
            nova if nova is not None else FakeNova(),
            self.identity,
            first=not self.regions,
            project_id=self.project_id,
            user_id=self._user_id,
            **self._region_settings,  # type: ignore[arg-type]
        )
        self.regions[name] = made
        return made

    # -- registries beside Nova (the first region's) ---------------------------------------------

    def add_image(self, name: str, **details: Any) -> FakeImage:
        return self.regions[self.region].add_image(name, **details)

    def add_network(
        self, name: str, *, cidr: str = "10.0.0.0/24", network_id: str | None = None
    ) -> FakeNetwork:
        return self.regions[self.region].add_network(name, cidr=cidr, network_id=network_id)

    def add_security_group(self, name: str, *, description: str = "") -> FakeSecurityGroup:
        return self.regions[self.region].add_security_group(name, description=description)

    def add_port(self, network_id: str, *, name: str = "") -> FakePort:
        return self.regions[self.region].add_port(network_id, name=name)

    def add_keypair(self, name: str, public_key: str | None = None) -> FakeKeypair:
        return self.regions[self.region].add_keypair(name, public_key)

    def add_server_group(self, name: str, *, policy: str = "anti-affinity") -> FakeServerGroup:
        return self.regions[self.region].add_server_group(name, policy=policy)

    def images(self) -> list[FakeImage]:
        return self.regions[self.region].images()

    def networks(self) -> list[FakeNetwork]:
        return self.regions[self.region].networks()

    def security_groups(self) -> list[FakeSecurityGroup]:
        return self.regions[self.region].security_groups()

    def keypairs(self) -> list[FakeKeypair]:
        return self.regions[self.region].keypairs()

    def server_groups(self) -> list[FakeServerGroup]:
        return self.regions[self.region].server_groups()

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen and serve in a daemon thread; returns once the socket accepts connections."""
        self._serve(_HttpServer((self.host, self._requested_port), self), "osas-sim")
        self._port = self.serving_port

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the simulator has not been started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def auth_url(self) -> str:
        return f"{self.base_url}/identity/v3"

    def _catalog(self, base_url: str) -> Iterator[CatalogEntry]:
        first = self.region
        yield CatalogEntry("identity", "keystone", first, f"{base_url}/identity")
        for region in list(self.regions.values()):
            for service_type, name, url in region.endpoints(base_url):
                yield CatalogEntry(service_type, name, region.name, url)

    # -- clouds.yaml ------------------------------------------------------------------------------

    def clouds_yaml_entry(
        self, *, application_credential: bool = False, region: str | None = None
    ) -> dict[str, Any]:
        """A ``clouds.<name>`` entry for openstacksdk: the default user, or the application
        credential when asked; in the first region, or the one named."""
        if application_credential:
            auth: dict[str, Any] = {
                "auth_url": self.auth_url,
                "application_credential_id": APP_CREDENTIAL_ID,
                "application_credential_secret": APP_CREDENTIAL_SECRET,
            }
        else:
            auth = {
                "auth_url": self.auth_url,
                "username": DEFAULT_USER,
                "password": DEFAULT_PASSWORD,
                "project_name": DEFAULT_PROJECT,
                "user_domain_name": DEFAULT_DOMAIN,
                "project_domain_name": DEFAULT_DOMAIN,
            }
        entry: dict[str, Any] = {
            "auth": auth,
            "region_name": region or self.region,
            "interface": "public",
            "identity_api_version": 3,
        }
        if len(self.regions) > 1:
            # openstacksdk accepts a region_name only among the entry's regions.
            entry["regions"] = list(self.regions)
        if application_credential:
            entry["auth_type"] = "v3applicationcredential"
        return entry

    def write_clouds_yaml(
        self, path: Path | str, name: str = CLOUD_NAME, *, region: str | None = None
    ) -> None:
        """Add (or replace) ``clouds.<name>`` in a clouds.yaml, keeping its other clouds. The
        file holds a password, so it is written readable by its owner only."""
        target = Path(path)
        document: dict[str, Any] = {}
        if target.exists():
            try:
                loaded = yaml.safe_load(target.read_text()) or {}
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" (line {mark.line + 1})" if mark is not None else ""
                raise ValueError(f"{target} is not YAML{where}") from exc
            if not isinstance(loaded, dict):
                raise ValueError(f"{target} is not a clouds.yaml mapping")
            document = loaded
        clouds = document.setdefault("clouds", {})
        clouds[name] = self.clouds_yaml_entry(region=region)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed into place: a reader started alongside (the README runs
        # `osas check-config --wait` right after `osas sim &`) sees no file or a whole one.
        descriptor, staging = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            os.fchmod(descriptor, 0o600)  # it holds a password: readable by its owner only
            with os.fdopen(descriptor, "w") as stream:
                yaml.safe_dump(document, stream, sort_keys=False)
            Path(staging).replace(target)
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise

    # -- serving ----------------------------------------------------------------------------------

    def region_of(self, target: str) -> SimRegion:
        """The region that serves a request target (path and query)."""
        return self._region_of(urlsplit(target).path)[0]

    def _region_of(self, path: str) -> tuple[SimRegion, str]:
        """The region a path is served by, and the path within it."""
        if path.startswith(REGION_PATH):
            name, _, rest = path[len(REGION_PATH) :].partition("/")
            region = self.regions.get(name)
            if region is not None and not region.first:
                return region, f"/{rest}"
        return self.regions[self.region], path

    def dispatch(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> Response:
        """Answer one HTTP request (called on the server's threads)."""
        split = urlsplit(target)
        region, path = self._region_of(split.path)
        request = Request(
            method=method,
            path=path,
            query=parse_qs(split.query, keep_blank_values=True),
            headers=headers,
            body=body,
            base_url=f"{self.base_url}{region.prefix}",
        )
        control = request.path == "/_sim" or request.path.startswith("/_sim/")
        router = region.control if control else region.router
        matched = router.match(request.method, request.path)
        if matched is None:
            status = 405 if router.serves(request.path) else 404
            response = Response.json(status, {"error": {"code": status, "message": "not served"}})
        else:
            route, params = matched
            request.params = {name: unquote(value) for name, value in params.items()}
            if not control:
                with region.lock:
                    region.calls[route.operation] += 1
            response = self._answer(region, route, request)
        if not control:
            operation = "" if matched is None else matched[0].operation
            self.history.append(Exchange(operation, method, target, response.status))
        response.headers.setdefault("X-Openstack-Request-Id", f"req-{uuid.uuid4()}")
        return response

    def _answer(self, region: SimRegion, route: Route, request: Request) -> Response:
        if route.faulty:
            failure = self._rate_limited(region, route) or self._injected_failure(region)
            if failure is not None:
                return failure
        if route.authenticated and self.identity.token(request.header("X-Auth-Token")) is None:
            return unauthorized(self.base_url)
        if route.stall is not None:
            with region.lock:
                stall = route.stall()
            # Outside the lock, so other calls go on; a simulator stopping meanwhile answers
            # nothing and stores nothing.
            if stall > 0 and self.stopping.wait(stall):
                return Response.drop()
        with region.lock:
            try:
                return route.handler(request)
            except HttpError as error:
                return error.response
            except Exception:
                logger.exception("simulator failed on %s %s", request.method, request.path)
                return Response.json(
                    500, {"computeFault": {"code": 500, "message": "simulator error"}}
                )

    def _rate_limited(self, region: SimRegion, route: Route) -> Response | None:
        """The region's rate limit, in front of its Nova: a request above it never reaches Nova."""
        wait = region.rate_limited(route.operation)
        if wait is None:
            return None
        # Whole seconds, as rate limiters send it (RFC 9110 delay-seconds).
        status = region.nova.faults.rate_limit_status
        return Response.json(
            status,
            {"overLimit": {"code": status, "message": "Rate limit exceeded"}},
            {"Retry-After": str(max(1, math.ceil(wait)))},
        )

    def _injected_failure(self, region: SimRegion) -> Response | None:
        faults = region.nova.faults
        if faults.latency > 0:
            time.sleep(faults.latency)  # outside the lock: slow calls overlap
        with region.lock:
            failed = faults.error_rate > 0 and self._random.random() < faults.error_rate
        if failed:
            return Response.html(
                503,
                "503 Service Unavailable",
                "No server is available for this request (injected).",
            )
        return None


class CannotListen(Exception):
    """``osas sim`` cannot bind its port."""


class CloudsYamlUnwritable(Exception):
    """``osas sim`` cannot write its entry into the clouds.yaml it was given."""


def run_sim(
    port: int,
    clouds_yaml: Path | None,
    build_seconds: float,
    stop: threading.Event | None = None,
    *,
    delete_seconds: float = 0.0,
    regions: tuple[str, ...] = (),
    cloud_name: str = CLOUD_NAME,
) -> None:
    """Serve a simulated OpenStack until interrupted (Ctrl-C, SIGTERM) or ``stop`` is set.

    Servers stay BUILD for ``build_seconds`` and, once deleted, ACTIVE with task_state
    ``deleting`` for ``delete_seconds``. ``regions`` (RegionOne alone by default) each have
    a Nova of their own behind the one Keystone. Prints the Keystone URL on stdout, and writes
    the ``cloud_name`` clouds.yaml entry (in the first region) if asked.
    """
    stop = stop or threading.Event()

    def nova() -> FakeNova:
        return FakeNova(build_seconds=build_seconds, delete_seconds=delete_seconds)

    first, *others = regions or ("RegionOne",)
    simulator = SimulatedOpenStack(nova(), port=port, region=first)
    for region in others:
        simulator.add_region(region, nova())
    try:
        simulator.start()
    except OSError as exc:
        raise CannotListen(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from exc
    try:
        with _stop_on_sigterm(stop):
            if clouds_yaml is not None:
                try:
                    simulator.write_clouds_yaml(clouds_yaml, cloud_name)
                except (OSError, ValueError) as exc:
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                    raise CloudsYamlUnwritable(f"cannot write {clouds_yaml}: {reason}") from exc
            print(describe(simulator, clouds_yaml, cloud_name), flush=True)  # noqa: T201 - the CLI's output
            with contextlib.suppress(KeyboardInterrupt):
                while not stop.wait(0.2):
                    pass
    finally:
        simulator.stop()


def describe(
    simulator: SimulatedOpenStack, clouds_yaml: Path | None, cloud_name: str = CLOUD_NAME
) -> str:
    """What ``osas sim`` tells a person: where it is, how to reach it, what it offers."""
    nova = simulator.nova
    flavors = ", ".join(
        f"{f.name} ({f.vcpus} vCPU, {f.ram_mib} MiB)" for f in nova.flavors.values()
    )
    lines = [
        f"osas sim: keystone at {simulator.auth_url}",
        f"  cloud name: {cloud_name}"
        + (
            f" (written to {clouds_yaml}; OS_CLIENT_CONFIG_FILE={clouds_yaml})"
            if clouds_yaml
            else " (no clouds.yaml written: give --clouds-yaml FILE)"
        ),
        (
            f"  user {DEFAULT_USER}, project {DEFAULT_PROJECT}, domain {DEFAULT_DOMAIN}; "
            f"application credential {APP_CREDENTIAL_ID}"
        ),
        f"  flavors: {flavors}",
        f"  images: {', '.join(i.name for i in simulator.images())}",
        f"  networks: {', '.join(n.name for n in simulator.networks())}",
        f"  security groups: {', '.join(g.name for g in simulator.security_groups())}",
        f"  keypairs: {', '.join(k.name for k in simulator.keypairs())}",
        f"  server groups: {', '.join(g.name for g in simulator.server_groups())}",
        f"  control API: {simulator.base_url}/_sim/ (GET it: faults, quota, servers...)",
    ]
    if len(simulator.regions) > 1:
        lines.insert(2, f"  regions: {', '.join(simulator.regions)} (each its own Nova)")
        lines.append(f"  other regions' control APIs: {simulator.base_url}/regions/<name>/_sim/")
    return "\n".join(lines)


@contextlib.contextmanager
def _stop_on_sigterm(stop: threading.Event) -> Iterator[None]:
    """Turn SIGTERM into ``stop`` while serving (only the main thread may install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
