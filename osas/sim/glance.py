"""Glance v2, read-only: the images Nova boots from, listed and shown the way Glance does.

Listings are paginated with ``limit`` (25 by default, at most 1000) and ``marker``; a full page
carries a ``next`` link relative to the endpoint (``/v2/images?...``), which openstacksdk follows
after stripping the ``/v2``. Hidden images are left out unless ``os_hidden=true`` is asked for.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from osas.sim.routing import HttpError, Request, Response, Router, parse_limit, timestamp

DEFAULT_PAGE = 25
MAX_PAGE = 1000
_CURRENT_VERSION = "v2.16"


@dataclass(slots=True)
class FakeImage:
    image_id: str
    name: str
    created_at: datetime
    min_disk: int = 0  # GiB
    min_ram: int = 0  # MiB
    size: int = 2_361_393_152
    disk_format: str = "qcow2"
    container_format: str = "bare"
    visibility: str = "public"
    hidden: bool = False
    status: str = "active"


def _not_found(message: str) -> HttpError:
    # Glance answers errors as a small HTML page, not JSON.
    return HttpError(Response.html(404, "404 Not Found", message))


def _bad_request(message: str) -> HttpError:
    return HttpError(Response.html(400, "400 Bad Request", message))


class Glance:
    """The image registry and the Glance routes over it."""

    def __init__(self, *, owner: str, clock: Callable[[], datetime]) -> None:
        self.owner = owner
        self.clock = clock
        self.images: dict[str, FakeImage] = {}

    def add_image(self, name: str, *, image_id: str | None = None, **details: Any) -> FakeImage:
        image = FakeImage(image_id or str(uuid.uuid4()), name, self.clock(), **details)
        self.images[image.image_id] = image
        return image

    def register(self, router: Router) -> None:
        router.add("GET", "/image", "image.versions", self._versions, authenticated=False)
        router.add("GET", "/image/versions", "image.versions", self._versions, authenticated=False)
        router.add("GET", "/image/v2/images", "image.images.list", self._list)
        router.add("GET", "/image/v2/images/{image_id}", "image.images.get", self._get)

    def _versions(self, request: Request) -> Response:
        versions = [
            {
                "id": version,
                "status": "CURRENT" if version == _CURRENT_VERSION else "SUPPORTED",
                "links": [{"rel": "self", "href": f"{request.base_url}/image/v2/"}],
            }
            for version in (_CURRENT_VERSION, "v2.15", "v2.9", "v2.0")
        ]
        # Glance's root is a 300 Multiple Choices, like Keystone's.
        return Response.json(300, {"versions": versions})

    def _get(self, request: Request) -> Response:
        image = self.images.get(request.params["image_id"])
        if image is None:
            raise _not_found(f"No image found with ID {request.params['image_id']}")
        return Response.json(200, self._body(image))

    def _list(self, request: Request) -> Response:
        limit = parse_limit(request.last("limit"), default=DEFAULT_PAGE, maximum=MAX_PAGE)
        if limit is None:
            raise _bad_request("limit param must be an integer")
        images = [image for image in self.images.values() if _matches(image, request)]
        images.sort(key=lambda image: (image.created_at, image.image_id), reverse=True)
        marker = request.last("marker")
        if marker is not None:
            position = next((i for i, im in enumerate(images) if im.image_id == marker), None)
            if position is None:
                raise _bad_request(f"Invalid marker. Image {marker} could not be found.")
            images = images[position + 1 :]
        page = images[:limit]
        body: dict[str, Any] = {
            "images": [self._body(image) for image in page],
            "first": "/v2/images",
            "schema": "/v2/schemas/images",
        }
        if page and len(page) == limit:
            params = [
                (k, v) for k, values in request.query.items() if k != "marker" for v in values
            ]
            params.append(("marker", page[-1].image_id))
            body["next"] = f"/v2/images?{urlencode(params)}"
        return Response.json(200, body)

    def _body(self, image: FakeImage) -> dict[str, Any]:
        digest = hashlib.sha512(image.image_id.encode()).hexdigest()
        return {
            "id": image.image_id,
            "name": image.name,
            "status": image.status,
            "visibility": image.visibility,
            "os_hidden": image.hidden,
            "protected": False,
            "owner": self.owner,
            "size": image.size,
            "virtual_size": None,
            "min_disk": image.min_disk,
            "min_ram": image.min_ram,
            "disk_format": image.disk_format,
            "container_format": image.container_format,
            "checksum": hashlib.md5(digest.encode(), usedforsecurity=False).hexdigest(),
            "os_hash_algo": "sha512",
            "os_hash_value": digest,
            "tags": [],
            "created_at": timestamp(image.created_at),
            "updated_at": timestamp(image.created_at),
            "self": f"/v2/images/{image.image_id}",
            "file": f"/v2/images/{image.image_id}/file",
            "schema": "/v2/schemas/image",
        }


def _matches(image: FakeImage, request: Request) -> bool:
    """Glance's equality filters; ``in:a,b`` lists alternatives for name and id."""
    for key, value in (("name", image.name), ("id", image.image_id)):
        wanted = request.last(key)
        if wanted is None:
            continue
        options = wanted[3:].split(",") if wanted.startswith("in:") else [wanted]
        if value not in options:
            return False
    for key, value in (("status", image.status), ("visibility", image.visibility)):
        wanted = request.last(key)
        if wanted is not None and wanted != value:
            return False
    hidden = (request.last("os_hidden") or "false").lower() == "true"
    return image.hidden == hidden
