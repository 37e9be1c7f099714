"""Cinder's block-storage API v3, as little as reading the project's volume quota needs.

The catalog names it twice, as real clouds publish it: ``block-storage`` and ``volumev3``, both
at ``/volume/v3/{project_id}``. Version discovery answers at the root (``/volume``: 300 Multiple
Choices) and at ``/volume/v3``; ``OpenStack-API-Version: volume X.Y`` is negotiated from 3.0 to
``MAX_VERSION``. ``GET /volume/v3/{project_id}/limits`` (openstacksdk's
``block_storage.get_limits()``) answers Cinder's absolute limits, -1 for unlimited, and no rate
limits.

Cinder's quotas here are ``Quota.volumes`` and ``Quota.gigabytes`` of the shared ``FakeNova``,
and its usage is ``FakeNova.usage()``'s: the boot volumes of the servers holding theirs (a build
aborted over either quota made none). Nova checks them only when a compute host makes a boot
volume, after its API accepted the create (``FakeNova._make_boot_volume``). Snapshots and
backups are not simulated: unlimited, none used.
"""

from __future__ import annotations

from typing import Any

from osas.sim.model import FakeNova
from osas.sim.nova_schema import Microversion, nova_error
from osas.sim.routing import HttpError, Request, Response, Router

MIN_VERSION = Microversion(3, 0)
MAX_VERSION = Microversion(3, 71)


def cinder_error(status: int, message: str) -> HttpError:
    """Cinder's error body: its API kept Nova's fault wrapper, ``{"badRequest": ...}`` and all."""
    return nova_error(status, message)


class Cinder:
    """The Cinder routes over the project's volume quota."""

    def __init__(self, *, project_id: str, nova: FakeNova) -> None:
        self.project_id = project_id
        self.nova = nova

    def register(self, router: Router) -> None:
        router.add("GET", "/volume", "volume.versions", self._versions, authenticated=False)
        router.add("GET", "/volume/v3", "volume.version", self._version, authenticated=False)
        router.add("GET", "/volume/v3/{project_id}/limits", "volume.limits.get", self._limits)

    def _version_document(self, base_url: str) -> dict[str, Any]:
        return {
            "id": "v3.0",
            "status": "CURRENT",
            "version": str(MAX_VERSION),
            "min_version": str(MIN_VERSION),
            "updated": "2023-08-31T00:00:00Z",
            "links": [
                {"rel": "describedby", "type": "text/html", "href": "https://docs.openstack.org/"},
                {"rel": "self", "href": f"{base_url}/volume/v3/"},
            ],
            "media-types": [
                {
                    "base": "application/json",
                    "type": "application/vnd.openstack.volume+json;version=3",
                }
            ],
        }

    def _versions(self, request: Request) -> Response:
        # Cinder's root is a 300 Multiple Choices; v2 is gone since Xena.
        return Response.json(300, {"versions": [self._version_document(request.base_url)]})

    def _version(self, request: Request) -> Response:
        return Response.json(200, {"versions": [self._version_document(request.base_url)]})

    def _negotiate(self, request: Request) -> Microversion:
        """The microversion asked for, as Cinder reads it: none is 3.0, ``latest`` the most."""
        text = None
        for part in (request.header("OpenStack-API-Version") or "").split(","):
            service, _, value = part.strip().partition(" ")
            if service.lower() == "volume":
                text = value.strip()
        if not text:
            return MIN_VERSION
        if text.lower() == "latest":
            return MAX_VERSION
        try:
            version = Microversion.parse(text)
        except ValueError:
            raise cinder_error(
                400,
                f"API Version String {text} is of invalid format. Must be of format "
                "MajorNum.MinorNum.",
            ) from None
        if not MIN_VERSION <= version <= MAX_VERSION:
            raise cinder_error(
                406,
                f"Version {text} is not supported by the API. Minimum is {MIN_VERSION} and "
                f"maximum is {MAX_VERSION}.",
            )
        return version

    def _limits(self, request: Request) -> Response:
        version = self._negotiate(request)
        if request.params["project_id"] != self.project_id:
            # The project in the URL must be the token's.
            raise cinder_error(400, "Malformed request url")
        wanted = request.last("project_id")
        if version >= Microversion(3, 39) and wanted not in {None, self.project_id}:
            # Another project's limits are for admins.
            raise cinder_error(
                403, "Policy doesn't allow limits_extension:used_limits to be performed."
            )
        quota, usage = self.nova.quota, self.nova.usage()
        absolute = {
            "maxTotalVolumes": _limit(quota.volumes),
            "maxTotalSnapshots": -1,
            "maxTotalVolumeGigabytes": _limit(quota.gigabytes),
            "maxTotalBackups": -1,
            "maxTotalBackupGigabytes": -1,
            "totalVolumesUsed": usage["volumes"],
            "totalGigabytesUsed": usage["gigabytes"],
            "totalSnapshotsUsed": 0,
            "totalBackupsUsed": 0,
            "totalBackupGigabytesUsed": 0,
        }
        response = Response.json(200, {"limits": {"rate": [], "absolute": absolute}})
        response.headers.update(
            {"OpenStack-API-Version": f"volume {version}", "Vary": "OpenStack-API-Version"}
        )
        return response


def _limit(value: int | None) -> int:
    return -1 if value is None else value
