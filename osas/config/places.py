"""Where the node groups live: each (cloud, region) they name, with the OpenStack settings that
reach it and the groups it holds.

A group without its own ``openstack`` block lives where the top-level block says. One that names
only a ``region_name`` lives in that region of the same cloud, reached with the same credentials,
TLS and interface. One that names another cloud (a clouds.yaml entry, or an ``auth`` block) takes
that cloud's credentials, and its own TLS and interface (or the defaults): the top-level block's
CA file means nothing to another cloud. Timeouts, pace and attempts are the top-level block's,
each place held to them apart. Groups that resolve to the same cloud and region share a place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from urllib.parse import urlsplit

from osas.cloud.openstack_settings import OpenStackAuth, OpenStackSettings
from osas.config.schema import GroupOpenStackConfig, OsasConfig

# What a place's cloud is called when the credentials come from OS_* variables.
ENVIRONMENT = "environment"


@dataclass(frozen=True, slots=True)
class Place:
    """A cloud and a region, as status, metrics and messages name them (``cloud`` is the
    clouds.yaml entry, the host and project of an ``auth`` block, or ``environment``;
    ``region`` is empty for the cloud's default), with the settings that reach it and the
    ids of the node groups that live there."""

    cloud: str
    region: str
    settings: OpenStackSettings
    group_ids: tuple[str, ...]
    # The region in the provider ids of the nodes here ("" for ``openstack:///<uuid>``).
    provider_id_region: str = ""

    def __str__(self) -> str:
        return f"{self.cloud}, region {self.region or '(the default)'}"

    @property
    def key(self) -> PlaceKey:
        """(cloud, region): how metrics label the place, and how the app finds its parts."""
        return (self.cloud, self.region)


PlaceKey = tuple[str, str]


def places_of(config: OsasConfig) -> tuple[Place, ...]:
    """Every place the configuration names, the top-level one first (also with no group in
    it), then in the order of the groups that name them. Raises ValueError when groups of
    one place say different ways to reach it (verify, cacert, interface), and when two places
    would go by one name (the same cloud and region with other credentials)."""
    top = config.openstack_settings()
    found: dict[tuple[object, ...], tuple[str, str, OpenStackSettings, str, list[str]]] = {}
    found[_key(top)] = (*_names(top), top, config.provider_id_region, [])
    for group in config.node_groups:
        block = group.openstack
        settings = top if block is None else _settings(top, block)
        ids = config.provider_id_region
        if block is not None and block.provider_id_region is not None:
            ids = block.provider_id_region
        key = _key(settings)
        if key not in found:
            found[key] = (*_names(settings), settings, ids, [])
        cloud, region, first, first_ids, groups = found[key]
        where = groups[0] if groups else "the top-level openstack block"
        if _reach(settings) != _reach(first):
            raise ValueError(
                f"node group {group.group_id!r} lives in {cloud}, region {region or '(default)'} "
                f"as {where} does, but says another verify, cacert or interface: one place is "
                "reached one way"
            )
        if ids != first_ids:
            raise ValueError(
                f"node group {group.group_id!r} lives in {cloud}, region {region or '(default)'} "
                f"as {where} does, but says its nodes' provider ids name region {ids!r}, not "
                f"{first_ids!r}: cloud-provider-openstack spells the ids of one place one way"
            )
        groups.append(group.group_id)
    places = tuple(
        Place(cloud, region, settings, tuple(groups), ids)
        for cloud, region, settings, ids, groups in found.values()
    )
    named: dict[PlaceKey, Place] = {}
    for place in places:
        other = named.setdefault(place.key, place)
        if other is not place:
            raise ValueError(
                f"two places go by the name {place}: node groups {list(other.group_ids)} and "
                f"{list(place.group_ids)} reach it with other credentials; give one of them a "
                "clouds.yaml entry of its own (openstack.cloud) so that each place has a name"
            )
    return places


def _settings(top: OpenStackSettings, block: GroupOpenStackConfig) -> OpenStackSettings:
    if not (block.cloud or block.auth):
        return dataclasses.replace(top, region_name=block.region_name)
    return dataclasses.replace(
        top,
        cloud=block.cloud,
        clouds_file=block.clouds_file,
        auth=block.auth,
        region_name=block.region_name,
        interface=block.interface,
        verify=True if block.verify is None else block.verify,
        cacert=block.cacert,
    )


def _source(settings: OpenStackSettings) -> tuple[object, ...]:
    """What tells one cloud (and identity in it) from another."""
    auth = settings.auth
    if auth is not None:
        return ("auth", *_auth_identity(auth))
    if settings.cloud:
        return ("cloud", settings.cloud, settings.clouds_file)
    return (ENVIRONMENT,)


def _auth_identity(auth: OpenStackAuth) -> tuple[str | None, ...]:
    return (
        auth.auth_url,
        auth.project_id or auth.project_name,
        auth.project_domain_name,
        auth.application_credential_id or auth.username,
        auth.user_domain_name,
    )


def _reach(settings: OpenStackSettings) -> tuple[object, ...]:
    return (settings.verify, settings.cacert, settings.interface)


def _key(settings: OpenStackSettings) -> tuple[object, ...]:
    return (*_source(settings), settings.region_name or "")


def _names(settings: OpenStackSettings) -> tuple[str, str]:
    auth = settings.auth
    if auth is not None:
        host = urlsplit(auth.auth_url).netloc or auth.auth_url
        project = auth.project_name or auth.project_id
        cloud = f"{host}/{project}" if project else host
    else:
        cloud = settings.cloud or ENVIRONMENT
    return cloud, settings.region_name or ""
