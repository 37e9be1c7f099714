"""What Nova last showed of the cluster's servers, kept indexed the way every read needs it.

Listings are applied as differences: a server that did not change is not touched, so a sync
that brings nothing new costs nothing and one that brings k servers costs O(k). Every change to
a node group's servers bumps that group's generation, in the two methods that change them and
nowhere else, so answers derived from a group can be reused until it changes. Per group the
snapshot also counts the servers Nova is not deleting, so a target size is O(1) rather than a
walk over the group. Nothing here decides anything; the ``Ledger`` does, on top of it (and holds
its own deletion marks: the snapshot knows only what Nova showed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from osas.domain.servers import Flavor, Server

# Nova shows these while a server is deleted; they are not servers any more.
_GONE_STATUSES = frozenset({"DELETED"})


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """What one listing changed: servers new to the snapshot, changed ones, and ids gone."""

    added: tuple[Server, ...] = ()
    changed: tuple[Server, ...] = ()
    gone: tuple[Server, ...] = ()

    def touched(self) -> Iterator[Server]:
        yield from self.added
        yield from self.changed
        yield from self.gone


# A name or request id almost always belongs to one server: the index holds that id alone, and
# a tuple only for the rare duplicates (a set per server would cost more than the server).
_Ids = str | tuple[str, ...]


def _ids(entry: _Ids | None) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else entry


def _with(entry: _Ids | None, server_id: str) -> _Ids:
    if entry is None:
        return server_id
    ids = _ids(entry)
    return ids if server_id in ids else (*ids, server_id)


def _without(entry: _Ids, server_id: str) -> _Ids | None:
    left = tuple(i for i in _ids(entry) if i != server_id)
    if not left:
        return None
    return left[0] if len(left) == 1 else left


@dataclass(slots=True)
class Snapshot:
    """Servers by id, with indexes by node group and request id, and by name once asked."""

    _servers: dict[str, Server] = field(default_factory=dict)
    _by_group: dict[str, dict[str, Server]] = field(default_factory=dict)
    # Built at the first look-up by name, kept from then on: only a node without a provider id
    # is looked up by name, and at 50,000 servers the index is 2 MiB no other read needs.
    _by_name: dict[str, _Ids] | None = None
    _by_request: dict[str, _Ids] = field(default_factory=dict)
    _generations: dict[str, int] = field(default_factory=dict)
    _flavors: dict[str, Flavor] = field(default_factory=dict)
    # Per group, the listed servers Nova is not deleting.
    _counted: dict[str, int] = field(default_factory=dict)
    # Ids of servers listed BUILD: few, and read again by every incremental sync.
    _building: set[str] = field(default_factory=set)
    # Ids of servers claimed from a warm pool whose claim is not finished: few.
    _claimed: set[str] = field(default_factory=set)
    listed_at: float | None = None  # when the last listing was applied; None before the first
    flavors_version: int = 0  # bumped whenever a group's flavor changes
    changes: int = 0  # bumped with every group's generation: any server added, changed or gone

    # -- reads ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._servers)

    def __contains__(self, server_id: object) -> bool:
        return server_id in self._servers

    def get(self, server_id: str) -> Server | None:
        return self._servers.get(server_id)

    def getter(self) -> Callable[[str], Server | None]:
        """``get`` without a call of Python code in between, for a caller that looks up every
        server a complete listing shows; valid for as long as this snapshot."""
        return self._servers.get

    def servers(self) -> Iterable[Server]:
        return self._servers.values()

    def ids(self) -> list[str]:
        """Every listed server id, copied: safe to walk while the snapshot changes."""
        return list(self._servers)

    def of_group(self, group_id: str) -> Iterable[Server]:
        return self._by_group.get(group_id, {}).values()

    def building(self) -> list[str]:
        """Ids of the servers last listed BUILD."""
        return list(self._building)

    def claimed(self) -> list[Server]:
        """Servers claimed from a warm pool whose claim is not finished (the claim mark)."""
        return [self._servers[server_id] for server_id in self._claimed]

    def named(self, name: str) -> list[Server]:
        by_name = self._by_name
        if by_name is None:
            by_name = self._by_name = {}
            for server_id, server in self._servers.items():
                _add(by_name, server.name, server_id)
        return [self._servers[server_id] for server_id in _ids(by_name.get(name))]

    def of_request(self, request_id: str) -> list[Server]:
        """Every listed server made for one create request (more than one is a duplicate)."""
        return [self._servers[server_id] for server_id in _ids(self._by_request.get(request_id))]

    def has_request(self, request_id: str) -> bool:
        return request_id in self._by_request

    def counted(self, group_id: str) -> int:
        """Listed servers of the group that Nova is not deleting."""
        return self._counted.get(group_id, 0)

    def generation(self, group_id: str) -> int:
        """Bumped by every change to the group's servers or flavor."""
        return self._generations.get(group_id, 0)

    def _touch(self, group_id: str) -> None:
        self._generations[group_id] = self._generations.get(group_id, 0) + 1
        self.changes += 1

    def flavor(self, group_id: str) -> Flavor | None:
        return self._flavors.get(group_id)

    def set_flavor(self, group_id: str, flavor: Flavor | None) -> None:
        if flavor == self._flavors.get(group_id):
            return
        if flavor is None:
            del self._flavors[group_id]
        else:
            self._flavors[group_id] = flavor
        self.flavors_version += 1
        self._touch(group_id)

    # -- changes ----------------------------------------------------------------------------------

    def apply_changes(
        self, changed: Iterable[Server], gone_ids: Iterable[str], now: float
    ) -> SnapshotDiff:
        """Servers that changed, and ids known to be gone: from an incremental listing, or a
        complete one reduced to its difference."""
        self.listed_at = now
        live: list[Server] = []
        gone_ids = set(gone_ids)
        for server in changed:
            if server.status in _GONE_STATUSES:
                gone_ids.add(server.server_id)
            else:
                live.append(server)
        added, updated = self._merge(live)
        gone = [self._servers[server_id] for server_id in gone_ids if server_id in self._servers]
        for server in gone:
            self._remove(server)
        return SnapshotDiff(tuple(added), tuple(updated), tuple(gone))

    def forget(self, server_id: str) -> Server | None:
        """Nova answered 404 for this server: it is gone, whatever the last listing said."""
        server = self._servers.get(server_id)
        if server is not None:
            self._remove(server)
        return server

    def _merge(self, servers: Iterable[Server]) -> tuple[list[Server], list[Server]]:
        added: list[Server] = []
        changed: list[Server] = []
        for server in servers:
            old = self._servers.get(server.server_id)
            if old is server or old == server:
                continue
            if old is None:
                added.append(server)
            else:
                self._remove(old)
                changed.append(server)
            self._insert(server)
        return added, changed

    def _count(self, server: Server, delta: int) -> None:
        if not server.is_deleting:
            self._counted[server.group_id] = self._counted.get(server.group_id, 0) + delta

    def _insert(self, server: Server) -> None:
        server_id, group_id = server.server_id, server.group_id
        self._servers[server_id] = server
        self._by_group.setdefault(group_id, {})[server_id] = server
        if self._by_name is not None:
            _add(self._by_name, server.name, server_id)
        if server.request_id:
            _add(self._by_request, server.request_id, server_id)
        self._count(server, +1)
        if server.status == "BUILD":
            self._building.add(server_id)
        if server.claimed_at is not None:
            self._claimed.add(server_id)
        self._touch(group_id)

    def _remove(self, server: Server) -> None:
        server_id = server.server_id
        del self._servers[server_id]
        group = self._by_group[server.group_id]
        del group[server_id]
        if not group:
            del self._by_group[server.group_id]
        if self._by_name is not None:
            _drop(self._by_name, server.name, server_id)
        if server.request_id:
            _drop(self._by_request, server.request_id, server_id)
        self._count(server, -1)
        self._building.discard(server_id)
        self._claimed.discard(server_id)
        self._touch(server.group_id)


def _add(index: dict[str, _Ids], key: str, server_id: str) -> None:
    index[key] = _with(index.get(key), server_id)


def _drop(index: dict[str, _Ids], key: str, server_id: str) -> None:
    left = _without(index[key], server_id)
    if left is None:
        del index[key]
    else:
        index[key] = left
