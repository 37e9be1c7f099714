"""The simulator's HTTP plumbing: requests, responses and a small regex router.

Handlers are plain functions from ``Request`` to ``Response``; a handler refuses a request by
raising ``HttpError`` with the response its service would send, so each API keeps its own error
shape (Nova's ``{"badRequest": ...}``, Keystone's ``{"error": ...}``, Neutron's
``{"NeutronError": ...}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # No answer at all: the server closes the connection without a status line.
    dropped: bool = False

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
        body = json.dumps(payload, separators=(",", ":")).encode()
        return cls(status, body, {"Content-Type": "application/json", **(headers or {})})

    @classmethod
    def empty(cls, status: int, headers: Mapping[str, str] | None = None) -> Response:
        return cls(status, b"", dict(headers or {}))

    @classmethod
    def html(cls, status: int, title: str, text: str) -> Response:
        """What a load balancer in front of an API answers when the API is not there."""
        body = f"<html><body><h1>{title}</h1>\n{text}\n</body></html>\n".encode()
        return cls(status, body, {"Content-Type": "text/html"})

    @classmethod
    def drop(cls) -> Response:
        """Close the connection without answering (status 0 in the simulator's history): the
        client sees the remote end disconnect, as when a proxy or an API worker dies."""
        return cls(0, dropped=True)


class HttpError(Exception):
    """Raised by a handler to answer with ``response`` instead of a success."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]  # names lower-cased
    body: bytes
    base_url: str  # http://127.0.0.1:PORT, for the links APIs put in their answers
    params: dict[str, str] = field(default_factory=dict)  # the route's {placeholders}

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def last(self, name: str) -> str | None:
        """A query parameter; when repeated, the last value wins, as webob hands it to Nova."""
        values = self.query.get(name)
        return values[-1] if values else None

    def json(self, invalid: Callable[[str], HttpError]) -> Any:
        """The JSON body, or the service's own 400 (built by ``invalid``) if it is not JSON."""
        try:
            return json.loads(self.body or b"null")
        except ValueError as exc:
            raise invalid(f"Malformed request body: {exc}") from exc


Handler = Callable[[Request], Response]
Stall = Callable[[], float]  # seconds a route waits, outside the model's lock, before its handler


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    operation: str  # what ``SimulatedOpenStack.calls`` counts, e.g. "compute.servers.list"
    handler: Handler
    authenticated: bool = True
    faulty: bool = False  # subject to the injected latency and 5xx (Nova's API calls)
    stall: Stall | None = None

    @property
    def service(self) -> str:
        return self.operation.split(".", 1)[0]


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class Router:
    """Routes by method and path template; ``{name}`` matches one path segment."""

    def __init__(self) -> None:
        self._routes: list[Route] = []

    def add(
        self,
        method: str,
        template: str,
        operation: str,
        handler: Handler,
        *,
        authenticated: bool = True,
        faulty: bool = False,
        stall: Stall | None = None,
    ) -> None:
        # A trailing slash is optional everywhere: clients join base URLs both ways.
        escaped = re.escape(template.rstrip("/")).replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.compile("^" + _PLACEHOLDER.sub(r"(?P<\1>[^/]+)", escaped) + "/?$")
        self._routes.append(
            Route(
                method,
                pattern,
                operation,
                handler,
                authenticated=authenticated,
                faulty=faulty,
                stall=stall,
            )
        )

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self._routes:
            found = route.pattern.match(path)
            if found is not None and route.method == method:
                return route, found.groupdict()
        return None

    def serves(self, path: str) -> bool:
        """Whether some method is routed for ``path`` (then a miss is a 405, not a 404)."""
        return any(route.pattern.match(path) for route in self._routes)


def timestamp(moment: datetime) -> str:
    """The second-precision UTC form Nova, Glance and Neutron put in their bodies."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_limit(text: str | None, *, default: int, maximum: int) -> int | None:
    """A ``limit`` query value capped at the service's maximum; None if it is not a number."""
    if text is None or text == "":
        return default
    if not text.isdigit():
        return None
    return min(int(text), maximum)
