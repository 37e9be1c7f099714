"""One region of the simulated cloud: its Nova, Glance, Neutron and Cinder, behind the
simulator's one Keystone.

Real clouds with several regions publish one Keystone whose catalogue names an endpoint of
each service per region; a token from that Keystone is good in every region, while each
region's Nova has its own servers, quota, rate limit, clock and failures. A ``SimRegion`` is
that: its own ``FakeNova`` (and so its own lock, ``faults``, ``quota`` and ``clock_offset``),
registries, request counters and rate-limit buckets. The first region is served at the
simulator's root, as a one-region cloud is; every other under ``/regions/<name>``, which its
catalogue entries carry.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

from osas.sim.cinder import Cinder
from osas.sim.control import Control
from osas.sim.glance import FakeImage, Glance
from osas.sim.keystone import Identity, stable_id
from osas.sim.model import FakeKeypair, FakeNova, FakeServerGroup
from osas.sim.neutron import FakeNetwork, FakePort, FakeSecurityGroup, Neutron
from osas.sim.nova import Compute
from osas.sim.nova_schema import Microversion
from osas.sim.routing import Router

DEFAULT_IMAGE = "ubuntu-24.04"
DEFAULT_NETWORK = "cluster-net"
DEFAULT_SECURITY_GROUP = "default"
DEFAULT_KEYPAIR = "ops"
DEFAULT_SERVER_GROUP = "workers-anti-affinity"
# Where a region other than the first is served: its services' paths below it.
REGION_PATH = "/regions/"


class TokenBucket:
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


def stable_uuid(kind: str, name: str) -> str:
    """Default resources keep their ids from run to run, in the dashed form Nova checks for."""
    return str(uuid.UUID(stable_id(kind, name)))


class SimRegion:
    """Nova, Glance, Neutron and Cinder of one region, with what breaks them (``nova.faults``)
    and what they were asked (``calls``, ``throttled``, per operation)."""

    def __init__(
        self,
        name: str,
        nova: FakeNova,
        identity: Identity,
        *,
        first: bool,
        project_id: str,
        user_id: str,
        max_limit: int,
        min_microversion: str,
        max_microversion: str,
    ) -> None:
        self.name = name
        self.nova = nova
        self.lock = nova.lock  # one lock for the region's model and every registry beside it
        self.first = first
        self.prefix = "" if first else f"{REGION_PATH}{name}"
        self.project_id = project_id
        self.calls: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()  # requests answered 429, per operation
        self.buckets = {"create": TokenBucket(), "request": TokenBucket()}
        self.glance = Glance(owner=project_id, clock=nova.clock)
        self.neutron = Neutron(project_id=project_id, clock=nova.clock, nova=nova)
        # The port quota counts the registry's ports besides the servers' own.
        nova.registry_ports = self.neutron.port_devices
        self.cinder = Cinder(project_id=project_id, nova=nova)
        self.compute = Compute(
            nova,
            self.glance,
            self.neutron,
            project_id=project_id,
            user_id=user_id,
            max_limit=max_limit,
            min_version=Microversion.parse(min_microversion),
            max_version=Microversion.parse(max_microversion),
        )
        self.router = Router()
        for service in (self.compute, self.glance, self.neutron, self.cinder):
            service.register(self.router)
        self.control = Router()
        Control(nova, self.calls, identity, self.throttled).register(self.control)
        self._add_defaults()

    def endpoints(self, base_url: str) -> Iterator[tuple[str, str, str]]:
        """(service type, service name, URL) of each service the catalogue names here."""
        root = f"{base_url}{self.prefix}"
        yield "compute", "nova", f"{root}/compute/v2.1"
        yield "image", "glance", f"{root}/image"
        yield "network", "neutron", f"{root}/network"
        # Real clouds publish Cinder under both types, at one endpoint with the project in it.
        yield "block-storage", "cinder", f"{root}/volume/v3/{self.project_id}"
        yield "volumev3", "cinderv3", f"{root}/volume/v3/{self.project_id}"

    def _stable_id(self, kind: str, name: str) -> str:
        # The first region keeps the ids a one-region simulator always had; the others differ,
        # as a real cloud's images and networks do from region to region.
        return stable_uuid(kind, name if self.first else f"{self.name}/{name}")

    def _add_defaults(self) -> None:
        with self.lock:
            self.add_image(DEFAULT_IMAGE, image_id=self._stable_id("image", DEFAULT_IMAGE))
            self.add_network(
                DEFAULT_NETWORK, network_id=self._stable_id("network", DEFAULT_NETWORK)
            )
            self.add_security_group(DEFAULT_SECURITY_GROUP)
            if DEFAULT_KEYPAIR not in self.nova.keypairs:
                self.nova.add_keypair(DEFAULT_KEYPAIR)
            if self.nova.find_server_group(DEFAULT_SERVER_GROUP) is None:
                self.nova.add_server_group(
                    DEFAULT_SERVER_GROUP,
                    group_id=self._stable_id("group", DEFAULT_SERVER_GROUP),
                )

    def rate_limited(self, operation: str, now: float | None = None) -> float | None:
        """None when the region's rate limit lets a request through now, else the wait (s):
        a request above it never reaches Nova. Counted in ``throttled``."""
        faults = self.nova.faults
        limits = [("request", faults.request_rate)]
        if operation == "compute.servers.create":
            limits.append(("create", faults.create_rate))
        moment = time.monotonic() if now is None else now
        with self.lock:
            for name, rate in limits:
                wait = self.buckets[name].take(rate, moment)
                if wait is not None:
                    self.throttled[operation] += 1
                    return wait
        return None

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
