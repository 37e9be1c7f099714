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
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from osas.sim.cinder import Cinder
from osas.sim.control import Control
from osas.sim.glance import FakeImage, Glance
from osas.sim.keystone import Identity, stable_id, unauthorized
from osas.sim.model import FakeKeypair, FakeNova, FakeServerGroup
from osas.sim.neutron import FakeNetwork, FakePort, FakeSecurityGroup, Neutron
from osas.sim.nova import Compute
from osas.sim.nova_schema import Microversion
from osas.sim.routing import HttpError, Request, Response, Route, Router
from osas.sim.serving import BackgroundHttp, TrackedHandler, TrackedHttpServer

logger = logging.getLogger(__name__)

DEFAULT_USER = "osas"
DEFAULT_PASSWORD = "secret-password"  # noqa: S105 - the simulator's documented test credential
DEFAULT_PROJECT = "k8s"
DEFAULT_DOMAIN = "Default"
APP_CREDENTIAL_ID = "app-cred-id"
APP_CREDENTIAL_SECRET = "app-cred-secret"  # noqa: S105 - documented test credential
DEFAULT_IMAGE = "ubuntu-24.04"
DEFAULT_NETWORK = "cluster-net"
DEFAULT_SECURITY_GROUP = "default"
DEFAULT_KEYPAIR = "ops"
DEFAULT_SERVER_GROUP = "workers-anti-affinity"
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

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        response = self.server.simulator.dispatch(self.command, self.path, headers, body)
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
        """The Date header, by Nova's clock (the front server of a real cloud shares its host's
        clock, which is what osas takes changes-since from)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        return email.utils.format_datetime(self.server.simulator.nova.clock(), usegmt=True)

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
        self.nova = nova if nova is not None else FakeNova()
        self.lock = self.nova.lock  # one lock for the model and every registry beside it
        self.calls: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()  # requests answered 429, per operation
        self._buckets = {"create": _TokenBucket(), "request": _TokenBucket()}
        # The latest requests in order (control API excluded), for tests that look at paging.
        self.history: deque[Exchange] = deque(maxlen=HISTORY_SIZE)
        self.host = host
        self.region = region
        self._requested_port = port
        self._random = random.Random(seed)  # noqa: S311 - fault injection, not security
        super().__init__()  # `stopping` cuts stalls short when the simulator stops
        self._port: int | None = None  # kept after stop, for messages about a past run

        self.identity = Identity(region=region, catalog=self._catalog)
        user = self.identity.add_user(DEFAULT_USER, DEFAULT_PASSWORD, DEFAULT_PROJECT)
        self.identity.add_application_credential(APP_CREDENTIAL_ID, APP_CREDENTIAL_SECRET, user)
        self.project_id = user.project.project_id
        self.glance = Glance(owner=self.project_id, clock=self.nova.clock)
        self.neutron = Neutron(project_id=self.project_id, clock=self.nova.clock, nova=self.nova)
        # The port quota counts the registry's ports besides the servers' own.
        self.nova.registry_ports = self.neutron.port_devices
        self.cinder = Cinder(project_id=self.project_id, nova=self.nova)
        self.compute = Compute(
            self.nova,
            self.glance,
            self.neutron,
            project_id=self.project_id,
            user_id=user.user_id,
            max_limit=max_limit,
            min_version=Microversion.parse(min_microversion),
            max_version=Microversion.parse(max_microversion),
        )
        self._router = Router()
        for service in (self.identity, self.compute, self.glance, self.neutron, self.cinder):
            service.register(self._router)
        self._control = Router()
        Control(self.nova, self.calls, self.identity, self.throttled).register(self._control)
        self._add_defaults()

    def _add_defaults(self) -> None:
        with self.lock:
            self.add_image(DEFAULT_IMAGE, image_id=_stable_uuid("image", DEFAULT_IMAGE))
            self.add_network(DEFAULT_NETWORK, network_id=_stable_uuid("network", DEFAULT_NETWORK))
            self.add_security_group(DEFAULT_SECURITY_GROUP)
            if DEFAULT_KEYPAIR not in self.nova.keypairs:
                self.nova.add_keypair(DEFAULT_KEYPAIR)
            if self.nova.find_server_group(DEFAULT_SERVER_GROUP) is None:
                self.nova.add_server_group(
                    DEFAULT_SERVER_GROUP, group_id=_stable_uuid("group", DEFAULT_SERVER_GROUP)
                )

    # -- registries beside Nova -------------------------------------------------------------------

    def add_image(self, name: str, **details: Any) -> FakeImage:
        with self.lock:
            return self.glance.add_image(name, **details)

    def add_network(
        self, name: str, *, cidr: str = "10.0.0.0/24", network_id: str | None = None
    ) -> FakeNetwork:
        with self.lock:
            return self.neutron.add_network(name, cidr=cidr, network_id=network_id)

    def add_security_group(self, name: str, *, description: str = "") -> FakeSecurityGroup:
        with self.lock:
            return self.neutron.add_security_group(name, description=description)

    def add_port(self, network_id: str, *, name: str = "") -> FakePort:
        with self.lock:
            return self.neutron.add_port(network_id, name=name)

    def add_keypair(self, name: str, public_key: str | None = None) -> FakeKeypair:
        return self.nova.add_keypair(name, public_key)

    def add_server_group(self, name: str, *, policy: str = "anti-affinity") -> FakeServerGroup:
        return self.nova.add_server_group(name, policy=policy)

    def images(self) -> list[FakeImage]:
        with self.lock:
            return list(self.glance.images.values())

    def networks(self) -> list[FakeNetwork]:
        with self.lock:
            return list(self.neutron.networks.values())

    def security_groups(self) -> list[FakeSecurityGroup]:
        with self.lock:
            return list(self.neutron.security_groups.values())

    def keypairs(self) -> list[FakeKeypair]:
        with self.lock:
            return list(self.nova.keypairs.values())

    def server_groups(self) -> list[FakeServerGroup]:
        with self.lock:
            return list(self.nova.server_groups.values())

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

    def _catalog(self, base_url: str) -> Mapping[str, tuple[str, str]]:
        return {
            "identity": ("keystone", f"{base_url}/identity"),
            "compute": ("nova", f"{base_url}/compute/v2.1"),
            "image": ("glance", f"{base_url}/image"),
            "network": ("neutron", f"{base_url}/network"),
            # Real clouds publish Cinder under both types, at one endpoint with the project in it.
            "block-storage": ("cinder", f"{base_url}/volume/v3/{self.project_id}"),
            "volumev3": ("cinderv3", f"{base_url}/volume/v3/{self.project_id}"),
        }

    # -- clouds.yaml ------------------------------------------------------------------------------

    def clouds_yaml_entry(self, *, application_credential: bool = False) -> dict[str, Any]:
        """A ``clouds.<name>`` entry for openstacksdk: the default user, or the application
        credential when asked."""
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
            "region_name": self.region,
            "interface": "public",
            "identity_api_version": 3,
        }
        if application_credential:
            entry["auth_type"] = "v3applicationcredential"
        return entry

    def write_clouds_yaml(self, path: Path | str, name: str = CLOUD_NAME) -> None:
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
        clouds[name] = self.clouds_yaml_entry()
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

    def dispatch(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> Response:
        """Answer one HTTP request (called on the server's threads)."""
        split = urlsplit(target)
        request = Request(
            method=method,
            path=split.path,
            query=parse_qs(split.query, keep_blank_values=True),
            headers=headers,
            body=body,
            base_url=self.base_url,
        )
        control = request.path == "/_sim" or request.path.startswith("/_sim/")
        router = self._control if control else self._router
        matched = router.match(request.method, request.path)
        if matched is None:
            status = 405 if router.serves(request.path) else 404
            response = Response.json(status, {"error": {"code": status, "message": "not served"}})
        else:
            route, params = matched
            request.params = {name: unquote(value) for name, value in params.items()}
            if not control:
                with self.lock:
                    self.calls[route.operation] += 1
            response = self._answer(route, request)
        if not control:
            operation = "" if matched is None else matched[0].operation
            self.history.append(Exchange(operation, method, target, response.status))
        response.headers.setdefault("X-Openstack-Request-Id", f"req-{uuid.uuid4()}")
        return response

    def _answer(self, route: Route, request: Request) -> Response:
        if route.faulty:
            failure = self._rate_limited(route) or self._injected_failure()
            if failure is not None:
                return failure
        if route.authenticated and self.identity.token(request.header("X-Auth-Token")) is None:
            return unauthorized(request.base_url)
        if route.stall is not None:
            with self.lock:
                stall = route.stall()
            # Outside the lock, so other calls go on; a simulator stopping meanwhile answers
            # nothing and stores nothing.
            if stall > 0 and self.stopping.wait(stall):
                return Response.drop()
        with self.lock:
            try:
                return route.handler(request)
            except HttpError as error:
                return error.response
            except Exception:
                logger.exception("simulator failed on %s %s", request.method, request.path)
                return Response.json(
                    500, {"computeFault": {"code": 500, "message": "simulator error"}}
                )

    def _rate_limited(self, route: Route) -> Response | None:
        """The cloud's rate limit, in front of Nova: a request above it never reaches Nova."""
        faults = self.nova.faults
        limits = [("request", faults.request_rate)]
        if route.operation == "compute.servers.create":
            limits.append(("create", faults.create_rate))
        now = time.monotonic()
        with self.lock:
            for name, rate in limits:
                wait = self._buckets[name].take(rate, now)
                if wait is not None:
                    self.throttled[route.operation] += 1
                    # Whole seconds, as rate limiters send it (RFC 9110 delay-seconds).
                    retry_after = str(max(1, math.ceil(wait)))
                    status = faults.rate_limit_status
                    return Response.json(
                        status,
                        {"overLimit": {"code": status, "message": "Rate limit exceeded"}},
                        {"Retry-After": retry_after},
                    )
        return None

    def _injected_failure(self) -> Response | None:
        faults = self.nova.faults
        if faults.latency > 0:
            time.sleep(faults.latency)  # outside the lock: slow calls overlap
        with self.lock:
            failed = faults.error_rate > 0 and self._random.random() < faults.error_rate
        if failed:
            return Response.html(
                503,
                "503 Service Unavailable",
                "No server is available for this request (injected).",
            )
        return None


class _TokenBucket:
    """``rate`` requests a second, with a burst of one second's worth."""

    def __init__(self) -> None:
        self._tokens = 0.0
        self._at: float | None = None

    def take(self, rate: float, now: float) -> float | None:
        """None when a request may pass (and takes its token); else seconds to wait."""
        if rate <= 0:
            self._at = None
            return None
        capacity = max(1.0, rate)
        if self._at is None:
            self._tokens = capacity
        else:
            self._tokens = min(capacity, self._tokens + (now - self._at) * rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / rate


def _stable_uuid(kind: str, name: str) -> str:
    """Default resources keep their ids from run to run, in the dashed form Nova checks for."""
    return str(uuid.UUID(stable_id(kind, name)))


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
) -> None:
    """Serve a simulated OpenStack until interrupted (Ctrl-C, SIGTERM) or ``stop`` is set.

    Servers stay BUILD for ``build_seconds`` and, once deleted, ACTIVE with task_state
    ``deleting`` for ``delete_seconds``. Prints the Keystone URL on stdout, and writes the
    ``osas-sim`` clouds.yaml entry if asked.
    """
    stop = stop or threading.Event()
    nova = FakeNova(build_seconds=build_seconds, delete_seconds=delete_seconds)
    simulator = SimulatedOpenStack(nova, port=port)
    try:
        simulator.start()
    except OSError as exc:
        raise CannotListen(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from exc
    try:
        with _stop_on_sigterm(stop):
            if clouds_yaml is not None:
                try:
                    simulator.write_clouds_yaml(clouds_yaml)
                except (OSError, ValueError) as exc:
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                    raise CloudsYamlUnwritable(f"cannot write {clouds_yaml}: {reason}") from exc
            print(describe(simulator, clouds_yaml), flush=True)  # noqa: T201 - the CLI's output
            with contextlib.suppress(KeyboardInterrupt):
                while not stop.wait(0.2):
                    pass
    finally:
        simulator.stop()


def describe(simulator: SimulatedOpenStack, clouds_yaml: Path | None) -> str:
    """What ``osas sim`` tells a person: where it is, how to reach it, what it offers."""
    nova = simulator.nova
    flavors = ", ".join(
        f"{f.name} ({f.vcpus} vCPU, {f.ram_mib} MiB)" for f in nova.flavors.values()
    )
    lines = [
        f"osas sim: keystone at {simulator.auth_url}",
        f"  cloud name: {CLOUD_NAME}"
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
