"""The simulator's own control API under ``/_sim``, for processes that cannot reach the object.

No authentication, JSON in and out, never counted in ``calls``. It seeds servers behind osas's
back, sets faults and quotas, finishes builds, reads and resets the request counts, and lists
the servers compactly:

- ``POST /_sim/servers`` ``{"name", "metadata", "tags", "status", "flavor", "count"}``, a list of
  those, or ``{"servers": [...]}``; with ``count`` > 1 names get ``-1``, ``-2``... suffixes.
- ``GET /_sim/servers`` (``?deleted=true`` keeps deleted ones), ``DELETE /_sim/servers/{id}``.
- ``GET|POST /_sim/faults`` and ``GET|POST /_sim/quota``: any field of ``Faults`` / ``Quota``
  (non-negative finite numbers; ints for counters, ``lost_create_status`` a 5xx status).
  Besides the old counters, ``Faults`` holds ``create_stall`` (seconds every create waits before
  it is stored and answered), ``quota_recheck_seconds`` (the scheduling window after which
  Nova's conductor re-checks quota and fails servers over it with a 413 fault),
  ``repeated_pages`` (pages asked with a marker that start with the marker's server again),
  ``skipped_servers`` (listing pages that leave out their first server),
  ``ports_exceeded`` (creates refused with 403 "Maximum number of ports exceeded"),
  ``lost_create_status`` and ``dropped_create_connections`` (creates stored, then the
  connection closed without an answer), ``deletes_while_scheduling_vanish`` (true: a server
  deleted while Nova still schedules it leaves no DELETED row for ``changes-since``, as real
  Nova's does; false by default: it stays ``deleting``, then DELETED). For server actions:
  ``start_fails`` (next starts end back in SHUTOFF, their fault recorded but not shown, as
  Nova's API shows faults only on ERROR servers), ``start_stalls`` (next starts stay
  ``powering-on`` until ``POST /_sim/activate {"id": ...}``), ``unshelve_quota_exceeded``
  (next unshelves of an offloaded server refused 403 "Quota exceeded", where Nova checks) and
  ``unshelve_no_valid_host`` (next unshelves of an offloaded server find no host and leave it
  SHELVED_OFFLOADED). For the guests: ``warm_prepare_hangs`` (the next warm guests'
  preparations never end: no ``osas-warm-prepared`` on the console, no poweroff). Besides
  Nova's, ``Quota`` holds Neutron's ``ports`` and Cinder's ``volumes`` and ``gigabytes``
  (each a non-negative integer, or null: unlimited), and
  ``count_usage_from_placement`` (true by default: a SHELVED_OFFLOADED server holds no cores
  or RAM and its unshelve re-checks them; false: Nova's legacy counting).
- ``GET|POST /_sim/nova``: ``build_seconds`` (null: BUILD until activated),
  ``delete_seconds`` (how long a deleted server stays ACTIVE with task_state ``deleting``),
  ``clock_offset`` (seconds Nova's clock is off the real one, negative when behind: Nova stamps
  ``updated``, judges ``changes-since`` and dates its answers by it), how long each server
  action runs (``start_seconds``, ``stop_seconds``, ``pause_seconds``, ``unpause_seconds``,
  ``suspend_seconds``, ``resume_seconds``, ``shelve_seconds``, ``shelve_offload_seconds``,
  ``unshelve_seconds``), ``shelved_offload_time`` (Nova's option: 0 offloads a shelved server
  at once, more after that many seconds, -1 never), ``allow_shelve_offload`` (false: 403 for
  shelveOffload, Nova's default policy being admin only), ``warm_prepare_seconds`` (how long a
  guest booted with the warm mark runs its boot script before it prints ``osas-warm-prepared``
  and, in a pool kept shut off, powers itself off, a later boot waiting as long again to read
  its metadata once more first; 0.2 by default) and
  ``serial_console`` (true: ``os-getConsoleOutput`` reads the last run's log of a server whose
  guest does not run, as with Nova's serial console; false by default: 404, as libvirt's pty).
- ``GET|POST /_sim/identity``: ``token_lifetime`` (seconds: the ``expires_at`` of new tokens;
  keystoneauth renews a token that ends within two minutes before each request),
  ``refuse_after`` (seconds, or null: every API refuses a token once it is this old, while its
  ``expires_at`` says it is valid, as a revocation seen through keystonemiddleware's cache
  does), ``refuse_credentials`` (true: every password and application credential is refused);
  ``POST /_sim/identity/revoke``: every token issued so far is refused from now on.
- ``POST /_sim/activate`` (optionally ``{"id": ...}``: that server also finishes the action
  it runs, a stalled start included), ``GET /_sim/calls`` (and the
  requests the rate limit answered 429, ``throttled``), ``POST /_sim/calls/reset``.
- ``GET /_sim/``: the list of these, each with its method, path and what it does.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from osas.sim.keystone import Identity
from osas.sim.model import FakeNova, FakeServer, Faults, Quota
from osas.sim.routing import HttpError, Request, Response, Router, timestamp

_SEED_KEYS = frozenset({"name", "metadata", "tags", "status", "flavor", "count", "image"})
_MAX_SEED = 100_000


def _refuse(status: int, message: str) -> HttpError:
    return HttpError(Response.json(status, {"error": message}))


def compact(server: FakeServer) -> dict[str, Any]:
    return {
        "id": server.server_id,
        "name": server.name,
        "status": server.status,
        "task_state": server.task_state,
        "tags": sorted(server.tags),
        "metadata": dict(server.metadata),
        "flavor": server.flavor_id,
        "created": timestamp(server.created_at),
        "updated": timestamp(server.updated_at),
        "fault": None if server.fault is None else server.fault.message,
    }


class Control:
    def __init__(
        self,
        nova: FakeNova,
        calls: Counter[str],
        identity: Identity,
        throttled: Counter[str] | None = None,
    ) -> None:
        self.nova = nova
        self.calls = calls
        self.throttled = throttled if throttled is not None else Counter()
        self.identity = identity

    def register(self, router: Router) -> None:
        # (method, path, handler, what it does): the index at /_sim/ is made of the last part.
        routes = [
            ("GET", "/_sim/", self._index, "this list"),
            ("POST", "/_sim/servers", self._seed, "seed servers behind osas's back"),
            ("GET", "/_sim/servers", self._servers, "list servers (?deleted=true: with deleted)"),
            ("DELETE", "/_sim/servers/{server_id}", self._delete, "delete a server"),
            ("GET", "/_sim/faults", self._faults, "the faults injected"),
            ("POST", "/_sim/faults", self._set_faults, "inject faults"),
            ("GET", "/_sim/quota", self._quota, "Nova's, Neutron's and Cinder's quotas"),
            ("POST", "/_sim/quota", self._set_quota, "set quotas"),
            ("GET", "/_sim/nova", self._timings, "Nova's timings, clock and shelve settings"),
            ("POST", "/_sim/nova", self._set_timings, "set Nova's timings and clock"),
            ("GET", "/_sim/identity", self._identity, "token lifetime and refusals"),
            ("POST", "/_sim/identity", self._set_identity, "set token lifetime and refusals"),
            ("POST", "/_sim/identity/revoke", self._revoke_tokens, "revoke every token issued"),
            (
                "POST",
                "/_sim/activate",
                self._activate,
                'finish builds (all, or {"id": ...}: its build or action)',
            ),
            ("GET", "/_sim/calls", self._calls, "requests counted by operation, and throttled"),
            ("POST", "/_sim/calls/reset", self._reset_calls, "reset the counts"),
        ]
        self._endpoints = [
            {"method": method, "path": path, "does": does} for method, path, _, does in routes
        ]
        for method, path, handler, _ in routes:
            router.add(method, path, "control", handler, authenticated=False)

    def _index(self, request: Request) -> Response:
        del request
        return Response.json(200, {"endpoints": self._endpoints})

    def _body(self, request: Request) -> Any:
        return request.json(lambda message: _refuse(400, message))

    def _seed(self, request: Request) -> Response:
        body = self._body(request)
        if isinstance(body, dict) and "servers" in body:
            body = body["servers"]
        specs = body if isinstance(body, list) else [body]
        checked = [self._checked_seed(spec) for spec in specs]
        seeded = []
        for spec in checked:
            count = int(spec.get("count", 1))
            for index in range(count):
                name = str(spec["name"]) if count == 1 else f"{spec['name']}-{index + 1}"
                server = self.nova.seed(
                    name=name,
                    metadata=spec.get("metadata") or {},
                    tags=spec.get("tags") or (),
                    status=str(spec.get("status", "ACTIVE")).upper(),
                    flavor_id=spec["flavor"],
                    image=str(spec.get("image", "image")),
                )
                seeded.append(compact(server))
        return Response.json(201, {"servers": seeded})

    def _checked_seed(self, spec: Any) -> dict[str, Any]:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _refuse(400, "each server needs a name")
        unknown = set(spec) - _SEED_KEYS
        if unknown:
            raise _refuse(400, f"unknown fields {sorted(unknown)}; known: {sorted(_SEED_KEYS)}")
        count = spec.get("count", 1)
        if not isinstance(count, int) or not 1 <= count <= _MAX_SEED:
            raise _refuse(400, f"count must be an integer from 1 to {_MAX_SEED}")
        if not isinstance(spec.get("metadata", {}), dict) or not isinstance(
            spec.get("tags", []), list
        ):
            raise _refuse(400, "metadata must be an object and tags a list")
        wanted = str(spec.get("flavor", "f-small"))
        flavor = self.nova.flavors.get(wanted) or next(
            (f for f in self.nova.flavors.values() if f.name == wanted), None
        )
        if flavor is None:
            raise _refuse(400, f"no flavor {spec.get('flavor')!r}")
        return {**spec, "flavor": flavor.flavor_id}

    def _servers(self, request: Request) -> Response:
        with_deleted = (request.last("deleted") or "").lower() in {"1", "true", "yes"}
        servers = self.nova.all_servers() if with_deleted else self.nova.live_servers()
        return Response.json(200, {"servers": [compact(server) for server in servers]})

    def _delete(self, request: Request) -> Response:
        if not self.nova.delete_server(request.params["server_id"]):
            raise _refuse(404, f"no server {request.params['server_id']}")
        return Response.empty(204)

    def _faults(self, request: Request) -> Response:
        del request
        return Response.json(200, {"faults": dataclasses.asdict(self.nova.faults)})

    def _set_faults(self, request: Request) -> Response:
        _assign(self.nova.faults, self._body(request))
        return self._faults(request)

    def _quota(self, request: Request) -> Response:
        del request
        return Response.json(200, {"quota": dataclasses.asdict(self.nova.quota)})

    def _set_quota(self, request: Request) -> Response:
        _assign(self.nova.quota, self._body(request))
        return self._quota(request)

    def _timings(self, request: Request) -> Response:
        del request
        timings = {name: getattr(self.nova, name) for name in _NOVA_TIMINGS}
        return Response.json(200, {"nova": timings})

    def _set_timings(self, request: Request) -> Response:
        values = self._body(request)
        _check(values, _NOVA_TIMINGS)
        for name, value in values.items():
            setattr(self.nova, name, value)
        return self._timings(request)

    def _identity(self, request: Request) -> Response:
        del request
        identity = self.identity
        refuse_after = identity.refuse_after
        return Response.json(
            200,
            {
                "identity": {
                    "token_lifetime": identity.token_lifetime.total_seconds(),
                    "refuse_after": None if refuse_after is None else refuse_after.total_seconds(),
                    "refuse_credentials": identity.refuse_credentials,
                }
            },
        )

    def _set_identity(self, request: Request) -> Response:
        values = self._body(request)
        if not isinstance(values, dict):
            raise _refuse(400, "expected a JSON object")
        refuse = values.pop("refuse_credentials", None)
        if refuse is not None and not isinstance(refuse, bool):
            raise _refuse(400, "refuse_credentials must be true or false")
        _check(values, _IDENTITY_TIMES)
        identity = self.identity
        if "token_lifetime" in values:
            identity.token_lifetime = timedelta(seconds=values["token_lifetime"])
        if "refuse_after" in values:
            after = values["refuse_after"]
            identity.refuse_after = None if after is None else timedelta(seconds=after)
        if refuse is not None:
            identity.refuse_credentials = refuse
        return self._identity(request)

    def _revoke_tokens(self, request: Request) -> Response:
        del request
        return Response.json(200, {"revoked": self.identity.revoke_all()})

    def _activate(self, request: Request) -> Response:
        body = self._body(request) if request.body else {}
        server_id = body.get("id") if isinstance(body, dict) else None

        def busy() -> set[str]:
            return {
                s.server_id
                for s in self.nova.live_servers()
                if s.status == "BUILD" or (s.server_id == server_id and s.phase is not None)
            }

        with self.nova.lock:
            before = busy()
            self.nova.activate(server_id)
            return Response.json(200, {"activated": sorted(before - busy())})

    def _calls(self, request: Request) -> Response:
        del request
        return Response.json(
            200,
            {
                "calls": dict(sorted(self.calls.items())),
                "throttled": dict(sorted(self.throttled.items())),
            },
        )

    def _reset_calls(self, request: Request) -> Response:
        del request
        self.calls.clear()
        self.throttled.clear()
        return Response.empty(204)


# FakeNova's own timings the control API sets, with their types as Faults and Quota spell them.
_NOVA_TIMINGS = {
    "build_seconds": "float | None",
    "delete_seconds": "float",
    "clock_offset": "signed float",
    "start_seconds": "float",
    "stop_seconds": "float",
    "pause_seconds": "float",
    "unpause_seconds": "float",
    "suspend_seconds": "float",
    "resume_seconds": "float",
    "shelve_seconds": "float",
    "shelve_offload_seconds": "float",
    "unshelve_seconds": "float",
    "shelved_offload_time": "signed float",
    "allow_shelve_offload": "bool",
    "warm_prepare_seconds": "float",
    "serial_console": "bool",
}
_IDENTITY_TIMES = {"token_lifetime": "float", "refuse_after": "float | None"}
# Fields whose values are bounded beyond "non-negative" (a "signed" one may be negative).
_DAY = 86_400.0
_RANGES = {
    "lost_create_status": (500, 599),
    "clock_offset": (-_DAY, _DAY),
    "shelved_offload_time": (-1, _DAY),
}


def _assign(target: Faults | Quota, values: Any) -> None:
    """Set fields of a Faults or Quota from JSON, checking every name and type first."""
    _check(values, {field.name: str(field.type) for field in dataclasses.fields(target)})
    for name, value in values.items():
        setattr(target, name, value)


def _check(values: Any, types: Mapping[str, str]) -> None:
    """Refuse (400) anything but a JSON object of known names with values of their type:
    ``float`` takes any finite non-negative number, ``int`` a non-negative integer (not a
    boolean), ``bool`` true or false only, ``signed float`` a negative number too,
    ``... | None`` also null."""
    if not isinstance(values, Mapping):
        raise _refuse(400, "expected a JSON object")
    unknown = set(values) - set(types)
    if unknown:
        raise _refuse(400, f"unknown fields {sorted(unknown)}; known: {sorted(types)}")
    for name, value in values.items():
        kind = types[name]
        if value is None and kind.endswith("| None"):
            continue
        if kind == "bool":
            if not isinstance(value, bool):
                raise _refuse(400, f"{name} must be true or false")
            continue
        signed = kind.startswith("signed ")
        base = kind.removeprefix("signed ").split(" ")[0]
        number = int | float if base == "float" else int
        if (
            isinstance(value, bool)
            or not isinstance(value, number)
            or not math.isfinite(value)
            or (value < 0 and not signed)
        ):
            raise _refuse(400, f"{name} must be a {'' if signed else 'non-negative '}{base}")
        low, high = _RANGES.get(name, (0, math.inf))
        if not low <= value <= high:
            raise _refuse(400, f"{name} must be from {low} to {high}")
