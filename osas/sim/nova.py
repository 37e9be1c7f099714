"""Nova's compute API v2.1 over a ``FakeNova``, microversions included.

Every compute request negotiates a microversion from ``OpenStack-API-Version: compute X.Y`` (or
the legacy ``X-OpenStack-Nova-API-Version``). No header means Nova's minimum, 2.1, and that is
the trap osas must not fall into: below 2.26 the tag filters are not part of the list schema, so
Nova drops them and returns every server of the project. Behaviour follows real Nova by version:
tags in bodies and filters from 2.26, ``networks`` required on create from 2.37, flavors embedded
in servers from 2.47, tags on create from 2.52, ``changes-before`` from 2.66, unknown list
parameters refused from 2.75 (ignored before).

Refusals use Nova's bodies: ``{"badRequest": {"code": 400, "message": ...}}`` and so on, with the
messages Nova writes, so that clients parsing them (openstacksdk puts ``message`` in ``details``)
see what they would see in production.

The server metadata API (``/servers/{id}/metadata[/{key}]``: list, merge, replace, show, set and
delete one key) follows Nova: 409 unless the server is in a stable state with no task, 403 over
the metadata_items quota, and a set bumps the server's ``updated`` (``changes-since`` sees it)
while a delete does not. Creates obey ``FakeNova.faults``: a stall before storing
(``create_stall``), 403 "Maximum number of ports exceeded" (``ports_exceeded``), and after
storing a lost answer (``lost_create_responses``, with ``lost_create_status``) or no answer at
all, the connection closed (``dropped_create_connections``). The model does the rest: servers
that fail Nova's quota re-check turn ERROR with a 413 fault (``quota_recheck_seconds``), and
pages asked with a marker may start with the marker's server again (``repeated_pages``).

Creates also meet the quotas of Nova's neighbours (``FakeNova.quota``): Neutron's ``ports``
refuses a create whose new ports would not fit (403, as the fault does; a network given as an
existing port needs none), and Cinder's ``volumes`` and ``gigabytes`` are checked only when the
build makes the boot volume, after the 202: the server turns ERROR with a 500 fault
"Build of instance <id> aborted: VolumeLimitExceeded: ..." (or VolumeSizeExceedsAvailableQuota).

``POST /servers/{id}/action`` takes Nova's ``os-start``, ``os-stop``, ``pause``, ``unpause``,
``suspend``, ``resume``, ``shelve``, ``shelveOffload`` and ``unshelve`` bodies (unshelve's
``availability_zone`` from 2.77, ``host`` and a null zone from 2.91, checked by Nova's schema of
each microversion) and answers 202 with no body, or Nova's refusals: 400 for a body naming no
action or several, 404, 403 (the policy, the quota an offloaded server's unshelve re-checks),
409 ``conflictingRequest`` in a state the action does not take. The server view shows the
statuses SHUTOFF, PAUSED, SUSPENDED, SHELVED and SHELVED_OFFLOADED with their vm_state and
power_state, and the task state while an action runs (``FakeNova.server_action``).

``os-getConsoleOutput`` (``{"os-getConsoleOutput": {"length": N}}``, N optional) answers 200
``{"output": ...}``: the guest's console log (``osas.sim.guest``) tailed as Nova's compute
manager does, after Nova's schema (400: N an integer from -1, a string of digits, or null);
404 and 409 where Nova answers them (``FakeNova.console_output``).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Callable
from datetime import UTC
from http import HTTPStatus
from typing import Any
from urllib.parse import urlencode

from osas.cloud.port import CreateServerRequest
from osas.domain.servers import Flavor
from osas.domain.specs import BootVolume
from osas.sim.glance import Glance
from osas.sim.model import (
    OFFLOADED,
    SERVER_ACTIONS,
    VM_STATES,
    FakeKeypair,
    FakeNova,
    FakeServer,
    FakeServerGroup,
    NovaRefusal,
    has_host,
)
from osas.sim.neutron import Neutron, mac_for
from osas.sim.nova_schema import (
    CHANGES_BEFORE,
    FLAVOR_EMBEDDED,
    KNOWN_SERVER_QUERY,
    MAX_TAGS,
    NETWORKS_REQUIRED,
    SERVER_GROUP_POLICY,
    STRICT_QUERY,
    TAGS,
    UUID_PATTERN,
    CreateBody,
    Microversion,
    checked_tags,
    console_length,
    invalid_body,
    invalid_query,
    metadata_body,
    nova_error,
    parse_time,
    ref_id,
    unexpected_properties,
    unshelve_arguments,
)
from osas.sim.routing import HttpError, Request, Response, Router, parse_limit, timestamp

CONSOLE_OUTPUT = "os-getConsoleOutput"
# Nova's power states (nova/compute/power_state.py) by status; anything else is NOSTATE (0).
# libvirt saves a suspended guest and shuts its domain off: Nova reads power state 4 (7 is a
# guest that suspended itself).
_POWER_STATES = {"ACTIVE": 1, "PAUSED": 3, "SHUTOFF": 4, "SUSPENDED": 4}
_POWER_STATES |= {"SHELVED": 4, OFFLOADED: 4}  # powered off before the snapshot
# Statuses whose view lists the server's addresses (its ports are kept, bound or not).
_ADDRESSED = frozenset({"ACTIVE", "SHUTOFF", "PAUSED", "SUSPENDED", "SHELVED", OFFLOADED})


class Compute:
    """The Nova routes. Every handler runs under the simulator's model lock."""

    def __init__(
        self,
        nova: FakeNova,
        glance: Glance,
        neutron: Neutron,
        *,
        project_id: str,
        user_id: str,
        max_limit: int,
        min_version: Microversion,
        max_version: Microversion,
    ) -> None:
        self.nova = nova
        self.glance = glance
        self.neutron = neutron
        self.project_id = project_id
        self.user_id = user_id
        self.max_limit = max_limit
        self.min_version = min_version
        self.max_version = max_version
        # Nova's hostId hashes the project with the host: one simulated host, one value.
        self._host_id = hashlib.sha224(f"{project_id}sim-host".encode()).hexdigest()

    def register(self, router: Router) -> None:
        base = "/compute/v2.1"
        router.add("GET", "/compute", "compute.versions", self._versions, authenticated=False)
        router.add("GET", base, "compute.version", self._version, authenticated=False)
        api: list[tuple[str, str, str, Callable[[Request, Microversion], Response]]] = [
            ("GET", "/servers", "servers.list", self._list_brief),
            ("GET", "/servers/detail", "servers.list", self._list_detailed),
            ("POST", "/servers", "servers.create", self._create),
            ("GET", "/servers/{server_id}", "servers.get", self._show),
            ("DELETE", "/servers/{server_id}", "servers.delete", self._delete),
            ("POST", "/servers/{server_id}/action", "servers.action", self._action),
            ("GET", "/servers/{server_id}/tags", "servers.tags.list", self._tags),
            ("PUT", "/servers/{server_id}/tags", "servers.tags.replace", self._replace_tags),
            ("PUT", "/servers/{server_id}/tags/{tag}", "servers.tags.add", self._add_tag),
            ("DELETE", "/servers/{server_id}/tags/{tag}", "servers.tags.delete", self._drop_tag),
            ("GET", "/servers/{server_id}/metadata", "servers.metadata.list", self._metadata),
            ("POST", "/servers/{server_id}/metadata", "servers.metadata.set", self._merge_meta),
            ("PUT", "/servers/{server_id}/metadata", "servers.metadata.replace", self._put_meta),
            ("GET", "/servers/{server_id}/metadata/{key}", "servers.metadata.get", self._meta),
            (
                "PUT",
                "/servers/{server_id}/metadata/{key}",
                "servers.metadata.set_item",
                self._set_meta,
            ),
            (
                "DELETE",
                "/servers/{server_id}/metadata/{key}",
                "servers.metadata.delete",
                self._del_meta,
            ),
            ("GET", "/flavors", "flavors.list", self._flavors_brief),
            ("GET", "/flavors/detail", "flavors.list", self._flavors_detailed),
            ("GET", "/flavors/{flavor_id}", "flavors.get", self._flavor),
            ("GET", "/flavors/{flavor_id}/os-extra_specs", "flavors.extra_specs", self._specs),
            ("GET", "/os-server-groups", "server_groups.list", self._server_groups),
            ("GET", "/os-server-groups/{group_id}", "server_groups.get", self._server_group),
            ("GET", "/os-keypairs", "keypairs.list", self._keypairs),
            ("GET", "/os-keypairs/{name}", "keypairs.get", self._keypair),
            ("GET", "/os-availability-zone", "availability_zones.list", self._zones),
            ("GET", "/os-quota-sets/{project}", "quotas.get", self._quota_set),
            ("GET", "/os-quota-sets/{project}/detail", "quotas.detail", self._quota_detail),
            ("GET", "/limits", "limits.get", self._limits),
        ]
        stalls = {"servers.create": self._create_stall, "servers.delete": self._delete_stall}
        for method, path, operation, handler in api:
            router.add(
                method,
                base + path,
                f"compute.{operation}",
                self._versioned(handler),
                faulty=True,
                # A stalled API worker: the create is stored late, after the client gave up;
                # a DELETE reaches Nova late.
                stall=stalls.get(operation),
            )

    def _create_stall(self) -> float:
        return self.nova.faults.create_stall

    def _delete_stall(self) -> float:
        return self.nova.faults.delete_stall

    # -- microversions ----------------------------------------------------------------------------

    def _versioned(
        self, handler: Callable[[Request, Microversion], Response]
    ) -> Callable[[Request], Response]:
        def serve(request: Request) -> Response:
            version = self.negotiate(request)
            try:
                response = handler(request, version)
            except HttpError as error:
                response = error.response
            response.headers.update(
                {
                    "OpenStack-API-Version": f"compute {version}",
                    "X-OpenStack-Nova-API-Version": str(version),
                    "Vary": "OpenStack-API-Version, X-OpenStack-Nova-API-Version",
                }
            )
            return response

        return serve

    def negotiate(self, request: Request) -> Microversion:
        """The microversion a request asked for, as Nova reads it; a 406 when out of range."""
        text = None
        for part in (request.header("OpenStack-API-Version") or "").split(","):
            service, _, value = part.strip().partition(" ")
            if service.lower() == "compute":
                text = value.strip()
        if text is None:
            text = request.header("X-OpenStack-Nova-API-Version")
        if not text:
            return self.min_version  # Nova's default is its minimum, not its maximum
        if text.lower() == "latest":
            return self.max_version
        try:
            version = Microversion.parse(text)
        except ValueError:
            raise nova_error(
                400,
                f"API Version String {text} is of invalid format. Must be of format "
                "MajorNum.MinorNum.",
            ) from None
        if not self.min_version <= version <= self.max_version:
            raise nova_error(
                406,
                f"Version {text} is not supported by the API. Minimum is {self.min_version} "
                f"and maximum is {self.max_version}.",
            )
        return version

    def _version_document(self, base_url: str) -> dict[str, Any]:
        return {
            "id": "v2.1",
            "status": "CURRENT",
            "version": str(self.max_version),
            "min_version": str(self.min_version),
            "updated": "2013-07-23T11:33:21Z",
            "links": [{"rel": "self", "href": f"{base_url}/compute/v2.1/"}],
        }

    def _versions(self, request: Request) -> Response:
        return Response.json(200, {"versions": [self._version_document(request.base_url)]})

    def _version(self, request: Request) -> Response:
        document = self._version_document(request.base_url)
        document["links"].append(
            {"rel": "describedby", "type": "text/html", "href": "http://docs.openstack.org/"}
        )
        document["media-types"] = [
            {
                "base": "application/json",
                "type": "application/vnd.openstack.compute+json;version=2.1",
            }
        ]
        return Response.json(200, {"version": document})

    # -- servers: reads ---------------------------------------------------------------------------

    def _list_brief(self, request: Request, version: Microversion) -> Response:
        return self._list(request, version, detailed=False)

    def _list_detailed(self, request: Request, version: Microversion) -> Response:
        return self._list(request, version, detailed=True)

    def _list(self, request: Request, version: Microversion, *, detailed: bool) -> Response:
        if version >= STRICT_QUERY:
            unknown = set(request.query) - KNOWN_SERVER_QUERY
            if unknown:
                raise nova_error(
                    400, f"Invalid input for query parameters. {unexpected_properties(unknown)}"
                )
        limit = parse_limit(request.last("limit"), default=self.max_limit, maximum=self.max_limit)
        if limit is None:
            text = request.last("limit")
            raise invalid_query("limit", text, f"'{text}' does not match '^[0-9]*$'")
        servers = self.nova.list_servers(**self._filters(request, version))
        image, flavor = request.last("image"), request.last("flavor")
        if image is not None:
            servers = [s for s in servers if s.image == ref_id(image)]
        if flavor is not None:
            servers = [s for s in servers if s.flavor_id == ref_id(flavor)]
        try:
            page = self.nova.page_of(servers, limit=limit, marker=request.last("marker"))
        except NovaRefusal as exc:
            raise nova_error(exc.status, str(exc)) from exc
        render = self._server_body if detailed else self._server_brief
        body: dict[str, Any] = {"servers": [render(s, version, request.base_url) for s in page]}
        if page and len(page) == limit:
            body["servers_links"] = _next_page(request, page[-1].server_id)
        return Response.json(200, body)

    def _filters(self, request: Request, version: Microversion) -> dict[str, Any]:
        """The filters FakeNova applies; the ones this microversion lacks are dropped, as Nova
        drops them: silently."""
        filters: dict[str, Any] = {}
        if version >= TAGS:
            for param, keyword in (
                ("tags", "tags"),
                ("tags-any", "tags_any"),
                ("not-tags", "not_tags"),
                ("not-tags-any", "not_tags_any"),
            ):
                value = request.last(param)
                if value is not None:
                    filters[keyword] = value.split(",")
        since = request.last("changes-since")
        if since is not None:
            filters["changes_since"] = parse_time("changes-since", since)
        before = request.last("changes-before") if version >= CHANGES_BEFORE else None
        if before is not None:
            filters["changes_before"] = parse_time("changes-before", before)
            if since is not None and filters["changes_since"] > filters["changes_before"]:
                raise nova_error(
                    400, "The value of changes-since must be less than or equal to changes-before."
                )
        name = request.last("name")
        if name is not None:
            filters["name"] = name
        status = request.last("status")
        if status is not None:
            filters["status"] = status
        return filters

    def _show(self, request: Request, version: Microversion) -> Response:
        server_id = request.params["server_id"]
        server = self.nova.show_server(server_id)
        if server is None:
            raise nova_error(404, f"Instance {server_id} could not be found.")
        return Response.json(200, {"server": self._server_body(server, version, request.base_url)})

    def _server(self, server_id: str) -> FakeServer:
        server = self.nova.get_server(server_id)
        if server is None:
            raise nova_error(404, f"Instance {server_id} could not be found.")
        return server

    def _links(self, base_url: str, collection: str, resource_id: str) -> list[dict[str, str]]:
        return [
            {"rel": "self", "href": f"{base_url}/compute/v2.1/{collection}/{resource_id}"},
            {"rel": "bookmark", "href": f"{base_url}/compute/{collection}/{resource_id}"},
        ]

    def _server_brief(
        self, server: FakeServer, version: Microversion, base_url: str
    ) -> dict[str, Any]:
        del version
        return {
            "id": server.server_id,
            "name": server.name,
            "links": self._links(base_url, "servers", server.server_id),
        }

    def _server_body(
        self, server: FakeServer, version: Microversion, base_url: str
    ) -> dict[str, Any]:
        scheduled = server.status not in {"BUILD", "ERROR"}
        body: dict[str, Any] = {
            "id": server.server_id,
            "name": server.name,
            "status": server.status,
            "tenant_id": self.project_id,
            "user_id": self.user_id,
            # Nova reads a deleted server's metadata as empty (its rows are soft-deleted).
            "metadata": {} if server.status == "DELETED" else dict(server.metadata),
            "hostId": self._host_id if scheduled and has_host(server) else "",
            "image": (
                {"id": server.image, "links": self._links(base_url, "images", server.image)[1:]}
                if server.image
                else ""
            ),
            "flavor": self._embedded_flavor(server, version, base_url),
            "created": timestamp(server.created_at),
            "updated": timestamp(server.updated_at),
            "addresses": self._addresses(server) if server.status in _ADDRESSED else {},
            "accessIPv4": "",
            "accessIPv6": "",
            "links": self._links(base_url, "servers", server.server_id),
            "key_name": server.key_name,
            "config_drive": "True" if server.config_drive else "",
            "OS-DCF:diskConfig": "MANUAL",
            "OS-EXT-AZ:availability_zone": (server.availability_zone or "nova")
            if scheduled
            else "",
            "OS-EXT-STS:task_state": server.task_state,
            "OS-EXT-STS:vm_state": VM_STATES.get(server.status, server.status.lower()),
            "OS-EXT-STS:power_state": _power_state(server),
            "OS-SRV-USG:launched_at": (
                timestamp(server.created_at).replace("Z", ".000000") if scheduled else None
            ),
            "OS-SRV-USG:terminated_at": (
                timestamp(server.updated_at).replace("Z", ".000000")
                if server.status == "DELETED"
                else None
            ),
            "security_groups": [{"name": name} for name in server.security_groups or ("default",)],
            "os-extended-volumes:volumes_attached": (
                [{"id": _volume_id(server), "delete_on_termination": True}]
                if server.boot_volume_gib
                else []
            ),
        }
        if server.status in {"BUILD", "ACTIVE"}:
            body["progress"] = 0
        if server.fault is not None and server.status in {"ERROR", "DELETED"}:
            body["fault"] = {
                "code": server.fault.code,
                "message": server.fault.message,
                "created": timestamp(server.fault_created or server.updated_at),
            }
        self._versioned_fields(body, server, version)
        return body

    def _versioned_fields(
        self, body: dict[str, Any], server: FakeServer, version: Microversion
    ) -> None:
        if version >= Microversion(2, 9):
            body["locked"] = False
        if version >= Microversion(2, 19):
            body["description"] = None
        if version >= TAGS:
            body["tags"] = sorted(server.tags)
        if version >= Microversion(2, 63):
            body["trusted_image_certificates"] = None
        if version >= Microversion(2, 71):
            group = self._group_of(server)
            body["server_groups"] = [group.group_id] if group else []
        if version >= Microversion(2, 73):
            body["locked_reason"] = None
        if version >= Microversion(2, 90):
            body["OS-EXT-SRV-ATTR:hostname"] = server.name.lower()
        if version >= Microversion(2, 96):
            body["pinned_availability_zone"] = None
        if version >= Microversion(2, 100):
            group = self._group_of(server)
            body["scheduler_hints"] = {"group": group.group_id} if group else {}

    def _group_of(self, server: FakeServer) -> FakeServerGroup | None:
        if server.server_group is None:
            return None
        return self.nova.find_server_group(server.server_group)

    def _embedded_flavor(
        self, server: FakeServer, version: Microversion, base_url: str
    ) -> dict[str, Any]:
        flavor = self.nova.flavors.get(server.flavor_id)
        if version < FLAVOR_EMBEDDED or flavor is None:
            return {
                "id": server.flavor_id,
                "links": self._links(base_url, "flavors", server.flavor_id)[1:],
            }
        return {
            "original_name": flavor.name,
            "vcpus": flavor.vcpus,
            "ram": flavor.ram_mib,
            "disk": flavor.disk_gib,
            "ephemeral": flavor.ephemeral_gib,
            "swap": 0,
            "extra_specs": dict(flavor.extra_specs or {}),
        }

    def _addresses(self, server: FakeServer) -> dict[str, list[dict[str, Any]]]:
        addresses: dict[str, list[dict[str, Any]]] = {}
        for network_id in server.networks:
            network = self.neutron.networks.get(network_id)
            if network is None:
                continue
            addresses.setdefault(network.name, []).append(
                {
                    "version": 4,
                    "addr": network.address_for(server.server_id),
                    "OS-EXT-IPS:type": "fixed",
                    "OS-EXT-IPS-MAC:mac_addr": mac_for(f"{server.server_id}/{network_id}"),
                }
            )
        return addresses

    # -- servers: tags ----------------------------------------------------------------------------

    def _require_tags(self, version: Microversion) -> None:
        if version < TAGS:
            raise nova_error(404, "The resource could not be found.")

    def _tags(self, request: Request, version: Microversion) -> Response:
        self._require_tags(version)
        server = self._server(request.params["server_id"])
        return Response.json(200, {"tags": sorted(server.tags)})

    def _replace_tags(self, request: Request, version: Microversion) -> Response:
        self._require_tags(version)
        server = self._server(request.params["server_id"])
        body = request.json(lambda message: nova_error(400, message))
        tags = body.get("tags") if isinstance(body, dict) else None
        server.tags = set(checked_tags(tags, "tags"))
        return Response.json(200, {"tags": sorted(server.tags)})

    def _add_tag(self, request: Request, version: Microversion) -> Response:
        self._require_tags(version)
        server = self._server(request.params["server_id"])
        tag = request.params["tag"]
        checked_tags([tag], "tag")
        if tag in server.tags:
            return Response.empty(204)
        if len(server.tags) >= MAX_TAGS:
            raise nova_error(400, f"The number of tags exceeded the per-server limit {MAX_TAGS}")
        server.tags.add(tag)
        location = f"{request.base_url}/compute/v2.1/servers/{server.server_id}/tags/{tag}"
        return Response.empty(201, {"Location": location})

    def _drop_tag(self, request: Request, version: Microversion) -> Response:
        self._require_tags(version)
        server = self._server(request.params["server_id"])
        tag = request.params["tag"]
        if tag not in server.tags:
            raise nova_error(404, f"Tag {tag} could not be found.")
        server.tags.discard(tag)
        return Response.empty(204)

    # -- servers: metadata ------------------------------------------------------------------------

    def _metadata_call(self, call: Callable[[], Response]) -> Response:
        try:
            return call()
        except NovaRefusal as exc:
            raise nova_error(exc.status, str(exc)) from exc

    def _metadata_of(self, server_id: str) -> FakeServer:
        """The server a metadata call names (not counted as a servers.get)."""
        server = self.nova.find_server(server_id)
        if server is None or server.status == "DELETED":
            raise nova_error(404, f"Instance {server_id} could not be found.")
        return server

    def _metadata(self, request: Request, version: Microversion) -> Response:
        del version
        server = self._metadata_of(request.params["server_id"])
        return Response.json(200, {"metadata": dict(server.metadata)})

    def _meta(self, request: Request, version: Microversion) -> Response:
        del version
        server, key = self._metadata_of(request.params["server_id"]), request.params["key"]
        if key not in server.metadata:
            raise nova_error(404, "Metadata item was not found")
        return Response.json(200, {"meta": {key: server.metadata[key]}})

    def _merge_meta(self, request: Request, version: Microversion) -> Response:
        return self._update_meta(request, version, replace=False)

    def _put_meta(self, request: Request, version: Microversion) -> Response:
        return self._update_meta(request, version, replace=True)

    def _update_meta(self, request: Request, version: Microversion, *, replace: bool) -> Response:
        del version
        values = metadata_body(request.json(lambda m: nova_error(400, m)), "metadata")
        server_id = request.params["server_id"]
        return self._metadata_call(
            lambda: Response.json(
                200, {"metadata": self.nova.set_metadata(server_id, values, replace=replace)}
            )
        )

    def _set_meta(self, request: Request, version: Microversion) -> Response:
        del version
        server_id, key = request.params["server_id"], request.params["key"]
        values = metadata_body(request.json(lambda m: nova_error(400, m)), "meta")
        self._metadata_of(server_id)
        if key not in values:
            raise nova_error(400, "Request body and URI mismatch")

        def store() -> Response:
            self.nova.set_metadata(server_id, values)
            return Response.json(200, {"meta": values})

        return self._metadata_call(store)

    def _del_meta(self, request: Request, version: Microversion) -> Response:
        del version
        server_id, key = request.params["server_id"], request.params["key"]

        def delete() -> Response:
            self.nova.delete_metadata_key(server_id, key)
            return Response.empty(204)

        return self._metadata_call(delete)

    # -- servers: writes --------------------------------------------------------------------------

    def _delete(self, request: Request, version: Microversion) -> Response:
        del version
        server_id = request.params["server_id"]
        if not self.nova.delete_asked(server_id):
            raise nova_error(404, f"Instance {server_id} could not be found.")
        return Response.empty(204)

    def _action(self, request: Request, version: Microversion) -> Response:
        """A server action, dispatched as Nova's WSGI layer does: by the one key of the body
        (before the server is looked up), then the action's schema, then the server."""
        try:
            document = request.json(lambda message: nova_error(400, message))
        except HttpError:
            document = None
        if not isinstance(document, dict) or len(document) != 1:
            raise nova_error(400, "Malformed request body")
        action, value = next(iter(document.items()))
        server_id = request.params["server_id"]
        if action == CONSOLE_OUTPUT:
            length = console_length(value)
            try:
                output = self.nova.console_output(server_id, length)
            except NovaRefusal as exc:
                raise nova_error(exc.status, str(exc)) from exc
            return Response.json(200, {"output": output})
        if action not in SERVER_ACTIONS:
            raise nova_error(400, f"There is no such action: {action}")
        try:
            if action == "unshelve":
                zone_given, zone, host = unshelve_arguments(value, version)
                self.nova.unshelve_server(
                    server_id, availability_zone=zone, zone_given=zone_given, host=host
                )
            else:
                self.nova.server_action(server_id, action)
        except NovaRefusal as exc:
            raise nova_error(exc.status, str(exc)) from exc
        return Response.empty(202)

    def _create(self, request: Request, version: Microversion) -> Response:
        document = request.json(lambda message: nova_error(400, message))
        spec = CreateBody.check(document, version)
        flavor = self.nova.flavors.get(ref_id(spec.flavor_ref))
        if flavor is None:
            raise nova_error(400, "Invalid flavorRef provided.")
        image_id, boot_volume = self._boot_source(spec)
        networks = self._networks(spec, version)
        security_groups = self._security_groups(spec)
        group = self._placement(spec)
        create = CreateServerRequest(
            name=spec.name,
            flavor=flavor.flavor_id,
            image=image_id,
            networks=networks,
            metadata=spec.metadata,
            tags=spec.tags,
            user_data=spec.user_data,  # kept as Nova keeps it: base64
            key_name=spec.key_name,
            security_groups=security_groups,
            availability_zone=spec.availability_zone,
            server_group=None if group is None else group.group_id,
            boot_volume=boot_volume,
        )
        given = spec.networks if isinstance(spec.networks, list) else []
        try:
            server = self.nova.create_server(
                create, ports_given=sum(1 for entry in given if entry.get("port") is not None)
            )
        except NovaRefusal as exc:
            raise nova_error(exc.status, str(exc)) from exc
        server.config_drive = spec.config_drive
        for entry in given:
            port = self.neutron.ports.get(str(entry.get("port")))
            if port is not None:
                port.device_id = server.server_id  # bound until Neutron is told otherwise
        if self.nova.take_fault("dropped_create_connections"):
            return Response.drop()
        if self.nova.take_fault("lost_create_responses"):
            status = self.nova.faults.lost_create_status
            return Response.html(
                status,
                f"{status} {_reason(status)}",
                "The server was created; this answer was lost (injected).",
            )
        links = self._links(request.base_url, "servers", server.server_id)
        body = {
            "id": server.server_id,
            "links": links,
            "OS-DCF:diskConfig": "MANUAL",
            "security_groups": [{"name": name} for name in security_groups],
            "adminPass": secrets.token_urlsafe(9),
        }
        return Response.json(202, {"server": body}, {"Location": links[0]["href"]})

    def _boot_source(self, spec: CreateBody) -> tuple[str, BootVolume | None]:
        """The image to boot, and the volume to make from it when booting from volume."""
        root = next(
            (m for m in spec.block_devices if str(m.get("boot_index")) == "0"),
            None,
        )
        if root is None:
            if not spec.image_ref:
                raise nova_error(400, "Missing imageRef attribute")
            image_id = ref_id(spec.image_ref)
            if image_id not in self.glance.images:
                raise nova_error(400, f"Image {image_id} could not be found.")
            return image_id, None
        image_id = str(root.get("uuid") or root.get("image_id") or "")
        if root.get("source_type") != "image" or root.get("destination_type") != "volume":
            raise nova_error(
                400,
                "Only boot from an image to a new volume is simulated (source_type image, "
                "destination_type volume).",
            )
        if image_id not in self.glance.images:
            raise nova_error(400, f"Image {image_id} could not be found.")
        size = root.get("volume_size")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise nova_error(
                400,
                "Images with destination_type 'volume' need to have a non-zero size specified",
            )
        # With boot from volume the instance itself has no image: Nova shows "".
        return "", BootVolume(size, root.get("volume_type"))

    def _placement(self, spec: CreateBody) -> FakeServerGroup | None:
        """Check the key, zone and server group a create names; the group, if any."""
        if spec.key_name is not None and spec.key_name not in self.nova.keypairs:
            raise nova_error(400, "Invalid key_name provided.")
        if (
            spec.availability_zone is not None
            and spec.availability_zone not in self.nova.availability_zones
        ):
            raise nova_error(400, "The requested availability zone is not available")
        if spec.group is None:
            return None
        group = self.nova.server_groups.get(spec.group)
        if group is None:
            raise nova_error(400, f"Instance group {spec.group} could not be found.")
        return group

    def _networks(self, spec: CreateBody, version: Microversion) -> list[str]:
        requested = spec.networks
        if requested is None or requested == "auto":
            if requested is None and version >= NETWORKS_REQUIRED:
                raise invalid_body("server", "{...}", "'networks' is a required property")
            available = list(self.neutron.networks)
            if len(available) > 1:
                raise nova_error(
                    409,
                    "Multiple possible networks found, use a Network ID to be more specific.",
                )
            return available
        if isinstance(requested, str):  # "none"
            return []
        return [self._network_of(entry, version) for entry in requested]

    def _network_of(self, entry: dict[str, Any], version: Microversion) -> str:
        """The network one ``networks`` entry attaches to, by port or by network id."""
        if entry.get("port") is not None:
            port = self.neutron.ports.get(str(entry["port"]))
            if port is None:
                raise nova_error(400, f"Port {entry['port']} could not be found.")
            if port.device_id:
                raise nova_error(409, f"Port {port.port_id} is still in use.")
            return port.network_id
        network_id = str(entry.get("uuid", ""))
        if version >= NETWORKS_REQUIRED and not UUID_PATTERN.match(network_id):
            raise invalid_body("uuid", network_id, f"'{network_id}' is not a 'uuid'")
        if network_id not in self.neutron.networks:
            raise nova_error(400, f"Network {network_id} could not be found.")
        return network_id

    def _security_groups(self, spec: CreateBody) -> list[str]:
        names = []
        for name in spec.security_groups or ["default"]:
            group = self.neutron.find_security_group(name)
            if group is None:
                raise nova_error(
                    400, f"Security group {name} not found for project {self.project_id}."
                )
            names.append(group.name)
        return names

    # -- flavors ----------------------------------------------------------------------------------

    def _flavor_list(self, request: Request) -> list[Flavor]:
        flavors = sorted(self.nova.flavors.values(), key=lambda flavor: flavor.flavor_id)
        for param, attribute in (("minDisk", "disk_gib"), ("minRam", "ram_mib")):
            text = request.last(param)
            if text is not None:
                if not text.isdigit():
                    raise nova_error(400, f"Invalid {param} filter [{text}]")
                flavors = [f for f in flavors if getattr(f, attribute) >= int(text)]
        marker = request.last("marker")
        if marker is not None:
            ids = [flavor.flavor_id for flavor in flavors]
            if marker not in ids:
                raise nova_error(400, f"marker [{marker}] not found")
            flavors = flavors[ids.index(marker) + 1 :]
        limit = parse_limit(request.last("limit"), default=self.max_limit, maximum=self.max_limit)
        if limit is None:
            raise nova_error(400, "limit param must be an integer")
        return flavors[:limit]

    def _flavor_page(self, request: Request, bodies: list[dict[str, Any]]) -> Response:
        body: dict[str, Any] = {"flavors": bodies}
        limit = parse_limit(request.last("limit"), default=self.max_limit, maximum=self.max_limit)
        if bodies and len(bodies) == limit:
            body["flavors_links"] = _next_page(request, str(bodies[-1]["id"]))
        return Response.json(200, body)

    def _flavors_brief(self, request: Request, version: Microversion) -> Response:
        bodies = []
        for flavor in self._flavor_list(request):
            body: dict[str, Any] = {
                "id": flavor.flavor_id,
                "name": flavor.name,
                "links": self._links(request.base_url, "flavors", flavor.flavor_id),
            }
            if version >= Microversion(2, 55):
                body["description"] = None
            bodies.append(body)
        return self._flavor_page(request, bodies)

    def _flavors_detailed(self, request: Request, version: Microversion) -> Response:
        bodies = [
            self._flavor_body(flavor, version, request.base_url)
            for flavor in self._flavor_list(request)
        ]
        return self._flavor_page(request, bodies)

    def _flavor(self, request: Request, version: Microversion) -> Response:
        flavor = self._flavor_by_id(request.params["flavor_id"])
        return Response.json(200, {"flavor": self._flavor_body(flavor, version, request.base_url)})

    def _specs(self, request: Request, version: Microversion) -> Response:
        del version
        flavor = self._flavor_by_id(request.params["flavor_id"])
        return Response.json(200, {"extra_specs": dict(flavor.extra_specs or {})})

    def _flavor_by_id(self, flavor_id: str) -> Flavor:
        # By id only: Nova does not resolve names (openstacksdk's find_flavor lists for that).
        flavor = self.nova.flavors.get(flavor_id)
        if flavor is None:
            raise nova_error(404, f"Flavor {flavor_id} could not be found.")
        self.nova.calls["flavors.get"] += 1
        return flavor

    def _flavor_body(self, flavor: Flavor, version: Microversion, base_url: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": flavor.flavor_id,
            "name": flavor.name,
            "vcpus": flavor.vcpus,
            "ram": flavor.ram_mib,
            "disk": flavor.disk_gib,
            "OS-FLV-EXT-DATA:ephemeral": flavor.ephemeral_gib,
            "swap": 0 if version >= STRICT_QUERY else "",  # 2.75 made an empty swap a 0
            "rxtx_factor": 1.0,
            "OS-FLV-DISABLED:disabled": False,
            "os-flavor-access:is_public": True,
            "links": self._links(base_url, "flavors", flavor.flavor_id),
        }
        if version >= Microversion(2, 55):
            body["description"] = None
        if version >= Microversion(2, 61):
            body["extra_specs"] = dict(flavor.extra_specs or {})
        return body

    # -- server groups, keypairs, zones -----------------------------------------------------------

    def _group_body(self, group: FakeServerGroup, version: Microversion) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": group.group_id,
            "name": group.name,
            "members": self.nova.server_group_members(group),
        }
        if version >= SERVER_GROUP_POLICY:
            body["policy"] = group.policy
            body["rules"] = dict(group.rules)
        else:
            body["policies"] = [group.policy]
            body["metadata"] = {}
        if version >= Microversion(2, 13):
            body["project_id"] = self.project_id
            body["user_id"] = self.user_id
        return body

    def _server_groups(self, request: Request, version: Microversion) -> Response:
        del request
        groups = [self._group_body(g, version) for g in self.nova.server_groups.values()]
        return Response.json(200, {"server_groups": groups})

    def _server_group(self, request: Request, version: Microversion) -> Response:
        group = self.nova.server_groups.get(request.params["group_id"])
        if group is None:
            raise nova_error(
                404, f"Instance group {request.params['group_id']} could not be found."
            )
        return Response.json(200, {"server_group": self._group_body(group, version)})

    def _keypair_body(self, keypair: FakeKeypair, version: Microversion) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": keypair.name,
            "public_key": keypair.public_key,
            "fingerprint": keypair.fingerprint,
        }
        if version >= Microversion(2, 2):
            body["type"] = keypair.key_type
        return body

    def _keypairs(self, request: Request, version: Microversion) -> Response:
        del request
        # Nova wraps every listed keypair in its own {"keypair": ...}.
        bodies = [{"keypair": self._keypair_body(k, version)} for k in self.nova.keypairs.values()]
        return Response.json(200, {"keypairs": bodies})

    def _keypair(self, request: Request, version: Microversion) -> Response:
        name = request.params["name"]
        keypair = self.nova.keypairs.get(name)
        if keypair is None:
            raise nova_error(404, f"Keypair {name} not found for user {self.user_id}")
        body = self._keypair_body(keypair, version)
        body |= {
            "user_id": self.user_id,
            "created_at": keypair.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f"),
            "deleted": False,
            "deleted_at": None,
            "updated_at": None,
            "id": list(self.nova.keypairs).index(name) + 1,
        }
        return Response.json(200, {"keypair": body})

    def _zones(self, request: Request, version: Microversion) -> Response:
        del request, version
        zones = [
            {"zoneName": zone, "zoneState": {"available": True}, "hosts": None}
            for zone in self.nova.availability_zones
        ]
        return Response.json(200, {"availabilityZoneInfo": zones})

    # -- quotas -----------------------------------------------------------------------------------

    def _quota_limits(self) -> dict[str, int]:
        quota = self.nova.quota
        instances = self.nova.instance_limit()
        return {
            "instances": -1 if instances is None else instances,
            "cores": -1 if quota.cores is None else quota.cores,
            "ram": -1 if quota.ram is None else quota.ram,
            "metadata_items": quota.metadata_items,
            "key_pairs": quota.key_pairs,
            "server_groups": quota.server_groups,
            "server_group_members": quota.server_group_members,
        }

    def _quota_set(self, request: Request, version: Microversion) -> Response:
        del version
        body: dict[str, Any] = {"id": request.params["project"], **self._quota_limits()}
        return Response.json(200, {"quota_set": body})

    def _quota_detail(self, request: Request, version: Microversion) -> Response:
        del version
        usage = self.nova.usage()
        usage["key_pairs"] = len(self.nova.keypairs)
        usage["server_groups"] = len(self.nova.server_groups)
        body: dict[str, Any] = {"id": request.params["project"]}
        for resource, limit in self._quota_limits().items():
            body[resource] = {"limit": limit, "in_use": usage.get(resource, 0), "reserved": 0}
        return Response.json(200, {"quota_set": body})

    def _limits(self, request: Request, version: Microversion) -> Response:
        del request, version
        limits, usage = self._quota_limits(), self.nova.usage()
        absolute = {
            "maxTotalInstances": limits["instances"],
            "maxTotalCores": limits["cores"],
            "maxTotalRAMSize": limits["ram"],
            "maxServerMeta": limits["metadata_items"],
            "maxTotalKeypairs": limits["key_pairs"],
            "maxServerGroups": limits["server_groups"],
            "maxServerGroupMembers": limits["server_group_members"],
            "totalInstancesUsed": usage["instances"],
            "totalCoresUsed": usage["cores"],
            "totalRAMUsed": usage["ram"],
            "totalServerGroupsUsed": len(self.nova.server_groups),
        }
        return Response.json(200, {"limits": {"rate": [], "absolute": absolute}})


def _power_state(server: FakeServer) -> int:
    """Nova's power state by status; 4 (shutdown) for an ACTIVE server whose guest powered
    itself off, as Nova's power-state sync saves it before it stops the instance."""
    if server.status == "ACTIVE" and server.guest.powered_off:
        return _POWER_STATES["SHUTOFF"]
    return _POWER_STATES.get(server.status, 0)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _next_page(request: Request, marker: str) -> list[dict[str, str]]:
    """The ``*_links`` of a full page: Nova links the next page whenever a page is full, even
    if nothing follows; the link keeps the query and moves the marker."""
    params = [(k, v) for k, values in request.query.items() if k != "marker" for v in values]
    params.append(("marker", marker))
    return [
        {"rel": "next", "href": f"{request.base_url}{request.path.rstrip('/')}?{urlencode(params)}"}
    ]


def _volume_id(server: FakeServer) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"volume/{server.server_id}"))
