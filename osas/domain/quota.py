"""The project's quota, and how many more servers of each node group it can hold.

Nova refuses a create over quota (403), or accepts concurrent ones that race past its check and
turns them ERROR (413); either way CA learns of the quota by failing, and backs the whole group
off although another group, or a smaller request, would fit. osas reads the project's limits
and usage (``ProjectQuota``, from Nova's ``/limits`` and the members of each group's server
group) and works out each group's headroom from its flavor: CA is told ``min(max_size, target +
headroom)`` as the group's max size, so it plans no scale-up the project cannot hold, and an
IncreaseSize that asks for more anyway (two groups in one loop) has the part that cannot fit
failed at once, as out of resources, without a POST.

Usage is as Nova counted it when read. Creates osas has in hand then, and every create it
accepts afterwards, are taken off the headroom until the next read (some may be in Nova's count
already: the error is on the safe side, and each read starts again). Deletes free quota at the
next read. A quota shared by several groups is thus never promised twice: what one group's
IncreaseSize takes is gone from every other's headroom at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from osas.domain.servers import Flavor
from osas.domain.specs import NodeGroupSpec

__all__ = ["Allowance", "GroupHeadroom", "ProjectQuota", "QuotaBook"]


@dataclass(frozen=True, slots=True)
class Allowance:
    """One resource of the project's quota: its limit (None: unlimited) and what is in use."""

    limit: int | None
    used: int = 0


@dataclass(frozen=True, slots=True)
class ProjectQuota:
    """What Nova's ``/limits`` answered, each configured server group's members, Neutron's
    port quota and Cinder's volume quota (read only for groups that boot from a volume)."""

    instances: Allowance
    cores: Allowance
    ram_mib: Allowance
    # Per server group (as a node group names it): Nova's maxServerGroupMembers, and members.
    server_group_members: Mapping[str, Allowance] = field(default_factory=dict)
    ports: Allowance = Allowance(None)  # Nova makes one port per network of a server
    volumes: Allowance = Allowance(None)
    volume_gib: Allowance = Allowance(None)
    # Resources that could not be read (a service that refuses or lacks the call), and why:
    # they bound nothing.
    unread: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupHeadroom:
    """How many more servers of one group the project can hold: ``count`` (None: no limit
    applies), and per resource (``instances``, ``cores``, ``ram_mib``, ``server_group_members``,
    ``ports``, ``volumes``, ``volume_gib``)."""

    count: int | None
    by_resource: Mapping[str, int | None]

    def limiting(self) -> str | None:
        """The resource that bounds the count, if any."""
        bounded = {r: n for r, n in self.by_resource.items() if n is not None}
        return min(bounded, key=lambda r: bounded[r]) if bounded else None


_UNLIMITED = GroupHeadroom(None, {})


def _needs(spec: NodeGroupSpec, flavor: Flavor | None) -> dict[str, int]:
    """What one server of the group takes of each resource (cores and RAM unknown until its
    flavor is read: nothing then)."""
    needs = {"instances": 1, "ports": len(spec.networks)}
    if flavor is not None:
        needs["cores"] = flavor.vcpus
        needs["ram_mib"] = flavor.ram_mib
    if spec.boot_volume is not None:
        needs["volumes"] = 1
        needs["volume_gib"] = spec.boot_volume.size_gib
    return needs


class QuotaBook:
    """The last quota read, and what osas has spent of it since."""

    def __init__(self) -> None:
        self._quota: ProjectQuota | None = None
        self._spent: dict[str, int] = {}  # per group: creates in hand at the read, and since
        self._stale = False
        self.version = 0  # bumped by every read, spend and forget: headroom may have changed

    @property
    def quota(self) -> ProjectQuota | None:
        return self._quota

    def read(self, quota: ProjectQuota, in_hand: Mapping[str, int]) -> None:
        """A fresh read of the project's quota, with the creates each group had in hand then."""
        self._quota = quota
        self._spent = {group: count for group, count in in_hand.items() if count}
        self._stale = False
        self.version += 1

    def forget(self) -> None:
        """The quota can no longer be read: no headroom is reported until it can."""
        self._quota = None
        self._spent = {}
        self.version += 1

    def spend(self, group_id: str, count: int) -> None:
        """IncreaseSize accepted ``count`` creates of the group."""
        if count > 0:
            self._spent[group_id] = self._spent.get(group_id, 0) + count
            self.version += 1

    def refused(self) -> None:
        """Nova refused a create for quota: read again at the next sync."""
        self._stale = True

    @property
    def stale(self) -> bool:
        return self._stale

    def headroom(
        self,
        spec: NodeGroupSpec,
        groups: Iterable[NodeGroupSpec],
        flavor_of: Mapping[str, Flavor | None],
    ) -> GroupHeadroom:
        """How many more servers of ``spec``'s group fit in what is left of the quota after
        what every group spent since the read."""
        quota = self._quota
        if quota is None:
            return _UNLIMITED
        need = _needs(spec, flavor_of.get(spec.group_id))
        allowances = {
            "instances": quota.instances,
            "cores": quota.cores,
            "ram_mib": quota.ram_mib,
            "ports": quota.ports,
            "volumes": quota.volumes,
            "volume_gib": quota.volume_gib,
        }
        specs = {group.group_id: group for group in groups}
        by_resource: dict[str, int | None] = {}
        for resource, allowance in allowances.items():
            per_server = need.get(resource, 0)
            if allowance.limit is None or per_server <= 0:
                continue
            spent = sum(
                count * _needs(specs[group], flavor_of.get(group)).get(resource, 0)
                for group, count in self._spent.items()
                if group in specs
            )
            free = allowance.limit - allowance.used - spent
            by_resource[resource] = max(0, math.floor(free / per_server))
        members = quota.server_group_members.get(spec.server_group or "")
        if spec.server_group and members is not None and members.limit is not None:
            spent = sum(
                count
                for group, count in self._spent.items()
                if group in specs and specs[group].server_group == spec.server_group
            )
            by_resource["server_group_members"] = max(0, members.limit - members.used - spent)
        bounded = [n for n in by_resource.values() if n is not None]
        return GroupHeadroom(min(bounded) if bounded else None, by_resource)
