"""Neutron v2.0, read-only: networks, security groups and ports, as Nova's creates name them.

Neutron filters a collection by any attribute of its resources (``name=a&name=b`` is either),
sorts by id and paginates with ``limit``/``marker`` and ``<collection>_links``.

The quota details (``GET /v2.0/quotas/{project_id}/details``, ``.json`` or not, as
openstacksdk's ``get_quota(project, details=True)`` reads it) answer every resource's ``limit``,
``used`` and ``reserved``, -1 for unlimited. Only the port quota is enforced (``Quota.ports``,
checked by Nova's creates); its ``used`` is ``FakeNova.usage()``'s: the ports of the servers
holding theirs plus this registry's. The ports Nova makes for its servers are counted but not
listed under ``/ports``. The other resources are unlimited, their usage what the registry holds.
Another project's quota is a 403 ``AdminRequired``, as Neutron answers a non-admin.
"""

from __future__ import annotations

import hashlib
import ipaddress
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from osas.sim.model import FakeNova
from osas.sim.routing import HttpError, Request, Response, Router, parse_limit, timestamp

MAX_PAGE = 1000
# Query keys that steer a listing rather than filter it.
_NOT_FILTERS = frozenset({"limit", "marker", "page_reverse", "sort_key", "sort_dir", "fields"})


@dataclass(slots=True)
class FakeNetwork:
    network_id: str
    name: str
    created_at: datetime
    cidr: str = "10.0.0.0/24"
    shared: bool = False
    subnet_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def address_for(self, server_id: str) -> str:
        """A fixed IP that stays the same for a server, inside the network's subnet."""
        subnet = ipaddress.ip_network(self.cidr)
        room = max(subnet.num_addresses - 3, 1)
        offset = 2 + int(hashlib.sha256(server_id.encode()).hexdigest(), 16) % room
        return str(subnet.network_address + offset)


@dataclass(slots=True)
class FakeSecurityGroup:
    group_id: str
    name: str
    created_at: datetime
    description: str = ""


@dataclass(slots=True)
class FakePort:
    port_id: str
    network_id: str
    name: str
    created_at: datetime
    device_id: str = ""


def mac_for(server_id: str) -> str:
    digest = hashlib.sha256(server_id.encode()).hexdigest()
    return "fa:16:3e:" + ":".join(digest[i : i + 2] for i in range(0, 6, 2))


def neutron_error(status: int, kind: str, message: str) -> HttpError:
    body = {"NeutronError": {"type": kind, "message": message, "detail": ""}}
    return HttpError(Response.json(status, body))


class Neutron:
    """Networks, security groups and ports, and the Neutron routes over them. ``nova`` holds the
    port quota and counts the ports in use."""

    def __init__(self, *, project_id: str, clock: Callable[[], datetime], nova: FakeNova) -> None:
        self.project_id = project_id
        self.clock = clock
        self.nova = nova
        self.networks: dict[str, FakeNetwork] = {}
        self.security_groups: dict[str, FakeSecurityGroup] = {}
        self.ports: dict[str, FakePort] = {}

    # -- registry ---------------------------------------------------------------------------------

    def add_network(
        self, name: str, *, cidr: str = "10.0.0.0/24", network_id: str | None = None
    ) -> FakeNetwork:
        network = FakeNetwork(network_id or str(uuid.uuid4()), name, self.clock(), cidr)
        self.networks[network.network_id] = network
        return network

    def add_security_group(
        self, name: str, *, description: str = "", group_id: str | None = None
    ) -> FakeSecurityGroup:
        group = FakeSecurityGroup(group_id or str(uuid.uuid4()), name, self.clock(), description)
        self.security_groups[group.group_id] = group
        return group

    def add_port(self, network_id: str, *, name: str = "", port_id: str | None = None) -> FakePort:
        if network_id not in self.networks:
            raise KeyError(f"no network {network_id}")
        port = FakePort(port_id or str(uuid.uuid4()), network_id, name, self.clock())
        self.ports[port.port_id] = port
        return port

    def find_security_group(self, name_or_id: str) -> FakeSecurityGroup | None:
        if name_or_id in self.security_groups:
            return self.security_groups[name_or_id]
        return next((g for g in self.security_groups.values() if g.name == name_or_id), None)

    def port_devices(self) -> list[str]:
        """The device id of every port in the registry ("" when unbound): what the port quota
        counts besides the servers' own ports (``FakeNova.registry_ports``)."""
        return [port.device_id for port in self.ports.values()]

    # -- routes -----------------------------------------------------------------------------------

    def register(self, router: Router) -> None:
        router.add("GET", "/network", "network.versions", self._versions, authenticated=False)
        router.add("GET", "/network/v2.0", "network.extensions", self._resources)
        collections: list[tuple[str, str, Callable[[], list[dict[str, Any]]], str]] = [
            ("networks", "network", self._networks, "Network {} could not be found."),
            (
                "security-groups",
                "security_group",
                self._security_groups,
                "Security group {} does not exist",
            ),
            ("ports", "port", self._ports, "Port {} could not be found."),
        ]
        for path, singular, bodies, missing in collections:
            plural = f"{singular}s"
            router.add(
                "GET",
                f"/network/v2.0/{path}",
                f"network.{plural}.list",
                self._lister(plural, bodies),
            )
            router.add(
                "GET",
                f"/network/v2.0/{path}/{{resource_id}}",
                f"network.{plural}.get",
                self._getter(singular, bodies, missing),
            )
        for suffix in ("", ".json"):
            router.add(
                "GET",
                f"/network/v2.0/quotas/{{project_id}}/details{suffix}",
                "network.quotas.details",
                self._quota_details,
            )

    def _versions(self, request: Request) -> Response:
        link = {"rel": "self", "href": f"{request.base_url}/network/v2.0/"}
        return Response.json(
            200, {"versions": [{"id": "v2.0", "status": "CURRENT", "links": [link]}]}
        )

    def _resources(self, request: Request) -> Response:
        resources = [
            {
                "name": singular,
                "collection": plural,
                "links": [{"rel": "self", "href": f"{request.base_url}/network/v2.0/{plural}"}],
            }
            for singular, plural in (
                ("network", "networks"),
                ("security_group", "security-groups"),
                ("port", "ports"),
            )
        ]
        return Response.json(200, {"resources": resources})

    def _quota_details(self, request: Request) -> Response:
        if request.params["project_id"] != self.project_id:
            raise neutron_error(
                403,
                "AdminRequired",
                "User does not have admin privileges: Only admin is authorized to access quotas "
                "for another tenant.",
            )
        ports = self.nova.quota.ports
        groups = len(self.security_groups)
        limits_and_usage = {
            "network": (None, len(self.networks)),
            "subnet": (None, len(self.networks)),  # one subnet each
            "subnetpool": (None, 0),
            "port": (ports, self.nova.usage()["ports"]),
            "router": (None, 0),
            "floatingip": (None, 0),
            "security_group": (None, groups),
            "security_group_rule": (None, 2 * groups),  # an egress and an ingress rule each
            "rbac_policy": (None, 0),
        }
        quota = {
            resource: {"limit": -1 if limit is None else limit, "used": used, "reserved": 0}
            for resource, (limit, used) in limits_and_usage.items()
        }
        return Response.json(200, {"quota": quota})

    def _lister(
        self, plural: str, bodies: Callable[[], list[dict[str, Any]]]
    ) -> Callable[[Request], Response]:
        def serve(request: Request) -> Response:
            items = sorted(
                (body for body in bodies() if _matches(body, request)), key=lambda b: b["id"]
            )
            limit = parse_limit(request.last("limit"), default=MAX_PAGE, maximum=MAX_PAGE)
            if limit is None:
                raise neutron_error(400, "HTTPBadRequest", "Bad limit request: must be integer.")
            marker = request.last("marker")
            if marker is not None:
                items = [body for body in items if body["id"] > marker]
            page = items[:limit]
            answer: dict[str, Any] = {plural: page}
            if page and len(page) == limit and request.last("limit") is not None:
                params = [
                    (k, v) for k, values in request.query.items() if k != "marker" for v in values
                ]
                params.append(("marker", page[-1]["id"]))
                href = f"{request.base_url}{request.path.rstrip('/')}?{urlencode(params)}"
                answer[f"{plural}_links"] = [{"rel": "next", "href": href}]
            return Response.json(200, answer)

        return serve

    def _getter(
        self, singular: str, bodies: Callable[[], list[dict[str, Any]]], missing: str
    ) -> Callable[[Request], Response]:
        kind = "".join(part.title() for part in singular.split("_")) + "NotFound"

        def serve(request: Request) -> Response:
            wanted = request.params["resource_id"]
            for body in bodies():
                if body["id"] == wanted:
                    return Response.json(200, {singular: body})
            raise neutron_error(404, kind, missing.format(wanted))

        return serve

    # -- bodies -----------------------------------------------------------------------------------

    def _common(self, resource_id: str, name: str, created_at: datetime) -> dict[str, Any]:
        return {
            "id": resource_id,
            "name": name,
            "tenant_id": self.project_id,
            "project_id": self.project_id,
            "description": "",
            "tags": [],
            "created_at": timestamp(created_at),
            "updated_at": timestamp(created_at),
            "revision_number": 1,
        }

    def _networks(self) -> list[dict[str, Any]]:
        return [
            {
                **self._common(n.network_id, n.name, n.created_at),
                "status": "ACTIVE",
                "admin_state_up": True,
                "shared": n.shared,
                "subnets": [n.subnet_id],
                "mtu": 1450,
                "router:external": False,
                "port_security_enabled": True,
                "availability_zone_hints": [],
                "availability_zones": ["nova"],
                "ipv4_address_scope": None,
                "ipv6_address_scope": None,
                "l2_adjacency": True,
            }
            for n in self.networks.values()
        ]

    def _security_groups(self) -> list[dict[str, Any]]:
        return [
            {
                **self._common(g.group_id, g.name, g.created_at),
                "description": g.description,
                "stateful": True,
                "shared": False,
                "security_group_rules": [
                    {
                        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{g.group_id}/{direction}")),
                        "security_group_id": g.group_id,
                        "direction": direction,
                        "ethertype": "IPv4",
                        "protocol": None,
                        "port_range_min": None,
                        "port_range_max": None,
                        "remote_ip_prefix": None,
                        "remote_group_id": g.group_id if direction == "ingress" else None,
                    }
                    for direction in ("egress", "ingress")
                ],
            }
            for g in self.security_groups.values()
        ]

    def _ports(self) -> list[dict[str, Any]]:
        bodies = []
        for port in self.ports.values():
            network = self.networks[port.network_id]
            bodies.append(
                {
                    **self._common(port.port_id, port.name, port.created_at),
                    "network_id": port.network_id,
                    "mac_address": mac_for(port.port_id),
                    "fixed_ips": [
                        {
                            "subnet_id": network.subnet_id,
                            "ip_address": network.address_for(port.port_id),
                        }
                    ],
                    "device_id": port.device_id,
                    "device_owner": "compute:nova" if port.device_id else "",
                    "status": "ACTIVE" if port.device_id else "DOWN",
                    "admin_state_up": True,
                    "security_groups": [],
                }
            )
        return bodies


def _matches(body: dict[str, Any], request: Request) -> bool:
    """Neutron's attribute filters: every given key must match one of its values."""
    for key, values in request.query.items():
        if key in _NOT_FILTERS or key not in body:
            continue
        actual = body[key]
        text = str(actual).lower() if isinstance(actual, bool) else str(actual)
        if text not in values:
            return False
    return True
