"""Nova's API contract as the simulator enforces it: microversions, error bodies, and the
JSON schema of a server create, with the limits and wording Nova uses.

Only what a client of GET/POST/DELETE /servers can run into is modelled; where Nova's schema
accepts a key the simulator does not act on (``personality``, ``accessIPv4``...), it is accepted
and ignored, as a Nova deployment without that feature would.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from osas.sim.routing import HttpError, Response


@dataclass(frozen=True, order=True, slots=True)
class Microversion:
    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Microversion:
        found = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
        if found is None:
            raise ValueError(text)
        return cls(int(found.group(1)), int(found.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


# The microversions at which the behaviour osas depends on changes.
TAGS = Microversion(2, 26)
NETWORKS_REQUIRED = Microversion(2, 37)
FLAVOR_EMBEDDED = Microversion(2, 47)
CREATE_TAGS = Microversion(2, 52)
SERVER_GROUP_POLICY = Microversion(2, 64)
CHANGES_BEFORE = Microversion(2, 66)
STRICT_QUERY = Microversion(2, 75)
UNSHELVE_ZONE = Microversion(2, 77)  # unshelve {"availability_zone": ...}
UNSHELVE_HOST = Microversion(2, 91)  # unshelve {"host": ...}, and a null zone to unpin

# GET /servers query parameters Nova's schema knows (from 2.75 anything else is a 400).
KNOWN_SERVER_QUERY = frozenset(
    {
        "user_id", "project_id", "tenant_id", "launch_index", "image_ref", "image", "kernel_id",
        "ramdisk_id", "hostname", "key_name", "power_state", "vm_state", "task_state", "host",
        "node", "flavor", "reservation_id", "launched_at", "terminated_at", "availability_zone",
        "name", "display_name", "description", "display_description", "locked_by", "uuid",
        "root_device_name", "config_drive", "access_ip_v4", "access_ip_v6", "auto_disk_config",
        "progress", "sort_key", "sort_dir", "all_tenants", "soft_deleted", "deleted", "status",
        "changes-since", "ip", "ip6", "created_at", "block_device_mapping", "services",
        "metadata", "system_metadata", "info_cache", "security_groups", "pci_devices", "limit",
        "marker", "tags", "tags-any", "not-tags", "not-tags-any", "changes-before", "locked",
        "pinned_availability_zone",
    }
)  # fmt: skip

# Keys a create body may hold, and from which microversion (None: from the start).
_CREATE_KEYS: Mapping[str, tuple[Microversion | None, Microversion | None]] = {
    "name": (None, None),
    "imageRef": (None, None),
    "flavorRef": (None, None),
    "adminPass": (None, None),
    "metadata": (None, None),
    "networks": (None, None),
    "OS-DCF:diskConfig": (None, None),
    "accessIPv4": (None, None),
    "accessIPv6": (None, None),
    "personality": (None, Microversion(2, 57)),  # removed at 2.57
    "availability_zone": (None, None),
    "block_device_mapping": (None, None),
    "block_device_mapping_v2": (None, None),
    "config_drive": (None, None),
    "key_name": (None, None),
    "min_count": (None, None),
    "max_count": (None, None),
    "return_reservation_id": (None, None),
    "security_groups": (None, None),
    "user_data": (None, None),
    "description": (Microversion(2, 19), None),
    "tags": (CREATE_TAGS, None),
    "trusted_image_certificates": (Microversion(2, 63), None),
    "host": (Microversion(2, 74), None),
    "hypervisor_hostname": (Microversion(2, 74), None),
    "hostname": (Microversion(2, 90), None),
}
_HINT_KEYS = ("os:scheduler_hints", "OS-SCH-HNT:scheduler_hints")
MAX_TAGS = 50
_MAX_TAG_LENGTH = 60
_MAX_USER_DATA = 65535
_MAX_NAME = 255
METADATA_KEY = re.compile(r"[a-zA-Z0-9\-_:. ]{1,255}")
UUID_PATTERN = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")
_TRUE = frozenset({"true", "1", "t", "on", "y", "yes"})
_FALSE = frozenset({"false", "0", "f", "off", "n", "no", ""})

# Nova's fault names by status (nova.api.openstack.wsgi.Fault).
_FAULT_NAMES = {
    400: "badRequest",
    401: "unauthorized",
    403: "forbidden",
    404: "itemNotFound",
    405: "badMethod",
    409: "conflictingRequest",
    413: "overLimit",
    415: "badMediaType",
    429: "overLimit",
    501: "notImplemented",
    503: "serviceUnavailable",
}


def nova_error(status: int, message: str) -> HttpError:
    name = _FAULT_NAMES.get(status, "computeFault")
    return HttpError(Response.json(status, {name: {"code": status, "message": message}}))


def invalid_body(field: str, value: Any, reason: str) -> HttpError:
    """Nova's wording for a request body that fails its JSON schema."""
    return nova_error(400, f"Invalid input for field/attribute {field}. Value: {value}. {reason}")


def invalid_query(field: str, value: Any, reason: str) -> HttpError:
    return nova_error(400, f"Invalid input for query parameters {field}. Value: {value}. {reason}")


def unexpected_properties(keys: Iterable[str]) -> str:
    names = sorted(keys)
    quoted = ", ".join(f"'{name}'" for name in names)
    verb = "was" if len(names) == 1 else "were"
    return f"Additional properties are not allowed ({quoted} {verb} unexpected)"


def parse_time(name: str, text: str) -> datetime:
    """An ISO 8601 query value, as Nova's iso8601 parser reads it; naive means UTC."""
    # A '+' left unescaped in a query string arrives as a space: try the text as sent first.
    for candidate in (text.strip(), text.strip().replace(" ", "+")):
        try:
            moment = datetime.fromisoformat(candidate)
        except ValueError:
            continue
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise invalid_query(name, text, f"'{text}' is not a 'date-time'")


def ref_id(ref: str) -> str:
    """flavorRef and imageRef may be ids or full links; Nova takes the last path segment."""
    return ref.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class CreateBody:
    """A create request that passed Nova's schema for its microversion."""

    name: str
    flavor_ref: str
    image_ref: str
    networks: list[dict[str, Any]] | str | None
    metadata: dict[str, str]
    tags: list[str]
    user_data: str | None
    key_name: str | None
    security_groups: list[str]
    availability_zone: str | None
    block_devices: list[dict[str, Any]]
    config_drive: bool
    group: str | None

    @classmethod
    def check(cls, document: Any, version: Microversion) -> CreateBody:
        if not isinstance(document, dict) or not isinstance(document.get("server"), dict):
            raise invalid_body("server", document, "'server' is a required property")
        extra_top = set(document) - {"server", *_HINT_KEYS}
        if extra_top:
            raise nova_error(
                400, f"Invalid input for request body. {unexpected_properties(extra_top)}"
            )
        server: dict[str, Any] = document["server"]
        allowed = {
            key
            for key, (since, until) in _CREATE_KEYS.items()
            if (since is None or version >= since) and (until is None or version < until)
        }
        if set(server) - allowed:
            raise invalid_body("server", server, unexpected_properties(set(server) - allowed))
        for required in ("name", "flavorRef"):
            if required not in server:
                raise invalid_body("server", server, f"'{required}' is a required property")
        name = server["name"]
        if not isinstance(name, str) or not 1 <= len(name.strip()) <= _MAX_NAME:
            raise invalid_body("name", name, "Name must be 1-255 printable characters")
        for count in ("min_count", "max_count"):
            if server.get(count, 1) not in (1, "1"):
                raise nova_error(400, f"osas sim: {count} other than 1 is not simulated")
        return cls(
            name=name,
            flavor_ref=str(server["flavorRef"]),
            image_ref=str(server.get("imageRef") or ""),
            networks=_checked_networks(server.get("networks")),
            metadata=checked_metadata(server.get("metadata", {})),
            tags=checked_tags(server.get("tags", []), "tags"),
            user_data=_checked_user_data(server.get("user_data")),
            key_name=_optional_string(server, "key_name"),
            security_groups=_checked_security_groups(server.get("security_groups", [])),
            availability_zone=_optional_string(server, "availability_zone"),
            block_devices=_checked_block_devices(server.get("block_device_mapping_v2", [])),
            config_drive=_checked_boolean("config_drive", server.get("config_drive", False)),
            group=_checked_group_hint(document),
        )


def _checked_group_hint(document: Mapping[str, Any]) -> str | None:
    """The server group named in the scheduler hints (either of Nova's two keys for them)."""
    hints: Any = next((document[key] for key in _HINT_KEYS if key in document), {})
    if not isinstance(hints, dict):
        raise invalid_body("os:scheduler_hints", hints, f"{hints!r} is not of type 'object'")
    group = hints.get("group")
    if group is not None and not (isinstance(group, str) and UUID_PATTERN.match(group)):
        raise invalid_body("os:scheduler_hints/group", group, f"'{group}' is not a 'uuid'")
    return group


def _optional_string(server: Mapping[str, Any], key: str) -> str | None:
    value = server.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise invalid_body(key, value, f"{value!r} is not a valid {key}")
    return value


def _checked_boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise invalid_body(key, value, f"{value!r} is not of type 'boolean'")


def _checked_networks(value: Any) -> list[dict[str, Any]] | str | None:
    if value is None or value in ("auto", "none"):
        return value  # type: ignore[no-any-return]
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise invalid_body(
            "networks", value, f"{value!r} is not valid under any of the given schemas"
        )
    for entry in value:
        extra = set(entry) - {"uuid", "port", "fixed_ip", "tag"}
        if extra:
            raise invalid_body("networks", entry, unexpected_properties(extra))
    return value


def checked_metadata(value: Any, field: str = "metadata") -> dict[str, str]:
    """Nova's ``metadata`` schema: keys of 1 to 255 characters from ``[a-zA-Z0-9-_:. ]``,
    string values of at most 255."""
    if not isinstance(value, dict):
        raise invalid_body(field, value, f"{value!r} is not of type 'object'")
    for key, item in value.items():
        if not METADATA_KEY.fullmatch(key):
            raise invalid_body(field, value, f"'{key}' does not match any of the regexes")
        if not isinstance(item, str) or len(item) > _MAX_NAME:
            raise invalid_body(f"{field}/{key}", item, f"{item!r} is not a string of <= 255 chars")
    return dict(value)


def metadata_body(document: Any, wrapper: str) -> dict[str, str]:
    """The ``{"metadata": {...}}`` or ``{"meta": {...}}`` body of a server metadata call; a
    ``meta`` body holds exactly one key."""
    if not isinstance(document, dict):
        raise invalid_body("body", document, f"{document!r} is not of type 'object'")
    if wrapper not in document:
        raise invalid_body("body", document, f"'{wrapper}' is a required property")
    extra = set(document) - {wrapper}
    if extra:
        raise invalid_body("body", document, unexpected_properties(extra))
    values = checked_metadata(document[wrapper], wrapper)
    if wrapper == "meta" and len(values) != 1:
        reason = "has too many properties" if values else "does not have enough properties"
        raise invalid_body(wrapper, values, f"{values!r} {reason}")
    return values


def checked_tags(value: Any, field: str) -> list[str]:
    if not isinstance(value, list):
        raise invalid_body(field, value, f"{value!r} is not of type 'array'")
    if len(value) > MAX_TAGS:
        raise invalid_body(field, value, f"{value!r} is too long")
    for tag in value:
        if (
            not isinstance(tag, str)
            or not 1 <= len(tag) <= _MAX_TAG_LENGTH
            or "/" in tag
            or "," in tag
        ):
            raise invalid_body(field, tag, f"'{tag}' does not match '^[^,/]*$' or is too long")
    return list(value)


def _checked_user_data(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_body("user_data", value, f"{value!r} is not of type 'string'")
    shown = value if len(value) < 64 else f"{value[:60]}..."  # noqa: PLR2004 - keep errors short
    if len(value) > _MAX_USER_DATA:
        raise invalid_body("user_data", shown, f"'{shown}' is too long")
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid_body("user_data", shown, f"'{shown}' is not a 'base64'") from exc
    return value


def _checked_security_groups(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise invalid_body("security_groups", value, f"{value!r} is not of type 'array'")
    names = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise invalid_body("security_groups", entry, "'name' is a required property")
        names.append(entry["name"])
    return names


def _checked_block_devices(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise invalid_body("block_device_mapping_v2", value, f"{value!r} is not of type 'array'")
    return list(value)


_CONSOLE_LENGTH = re.compile(r"^-?[0-9]+$")


def console_length(value: Any) -> int | None:
    """The ``length`` of an ``os-getConsoleOutput`` body, checked by Nova's schema: the value
    an object with no other key, the length an integer from -1, a string of digits (with an
    optional minus: a string escapes the minimum, as in Nova) or null. None: the whole log."""
    field = "os-getConsoleOutput"
    if not isinstance(value, dict):
        raise invalid_body(field, value, f"{value!r} is not of type 'object'")
    extra = set(value) - {"length"}
    if extra:
        raise invalid_body(field, value, unexpected_properties(extra))
    length = value.get("length")
    if length is None:
        return None
    if isinstance(length, bool) or not isinstance(length, int | str):
        reason = f"{length!r} is not of type 'integer', 'string', 'null'"
        raise invalid_body("length", length, reason)
    if isinstance(length, str):
        if not _CONSOLE_LENGTH.search(length):
            raise invalid_body("length", length, f"{length!r} does not match '^-?[0-9]+$'")
        return int(length)
    if length < -1:
        raise invalid_body("length", length, f"{length} is less than the minimum of -1")
    return length


def unshelve_arguments(value: Any, version: Microversion) -> tuple[bool, str | None, str | None]:
    """What an unshelve body's value asks, checked by Nova's schema for the microversion:
    (whether a zone was given, the zone (None: unpin), the host). Before 2.77 any value is
    taken and means nothing; from 2.77 it is null or ``{"availability_zone": <name>}``; from
    2.91 null or an object with an optional zone (a string, or null) and host."""
    if version < UNSHELVE_ZONE or value is None:
        return False, None, None
    if not isinstance(value, dict):
        raise invalid_body("unshelve", value, f"{value!r} is not of type 'object', 'null'")
    allowed = {"availability_zone", "host"} if version >= UNSHELVE_HOST else {"availability_zone"}
    extra = set(value) - allowed
    if extra:
        raise invalid_body("unshelve", value, unexpected_properties(extra))
    if version < UNSHELVE_HOST:
        if "availability_zone" not in value:
            raise invalid_body("unshelve", value, "'availability_zone' is a required property")
        zone = value["availability_zone"]
        if not isinstance(zone, str):
            raise invalid_body("availability_zone", zone, f"{zone!r} is not of type 'string'")
        if not 1 <= len(zone) <= _MAX_NAME or zone != zone.strip():
            raise nova_error(
                400,
                "An invalid 'name' value was provided. The name must be: printable "
                "characters. Can not start or end with whitespace.",
            )
        return True, zone, None
    zone = value.get("availability_zone")
    if zone is not None and not isinstance(zone, str):
        raise invalid_body("availability_zone", zone, f"{zone!r} is not of type 'string', 'null'")
    host = value.get("host")
    if "host" in value and not isinstance(host, str):
        raise invalid_body("host", host, f"{host!r} is not of type 'string'")
    return "availability_zone" in value, zone, host
