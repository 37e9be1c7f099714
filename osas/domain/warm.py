"""The servers waiting in node groups' warm pools, as Nova last showed them.

A warm server carries this cluster's marks and the warm mark (``META_WARM``): it is not a
node of its group until claimed, so the ``Snapshot`` (every read CA makes) never holds it, and
nothing that acts on the group's servers (targets, deletes, problems) sees it. The pool keeps
them apart, per group, from the same listings: a complete listing replaces it whole, an
incremental one changes what it shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from osas.domain.servers import WarmServer


class WarmPool:
    """Warm servers by node group."""

    def __init__(self) -> None:
        self._by_group: dict[str, dict[str, WarmServer]] = {}
        self._group_of: dict[str, str] = {}  # server id -> group id

    def __len__(self) -> int:
        return len(self._group_of)

    def __contains__(self, server_id: object) -> bool:
        return server_id in self._group_of

    def of_group(self, group_id: str) -> list[WarmServer]:
        return list(self._by_group.get(group_id, {}).values())

    def census(self, group_id: str) -> dict[str, int]:
        """The group's warm servers by Nova's status (SHUTOFF, BUILD, SHELVED_OFFLOADED...)."""
        return dict(Counter(s.status for s in self._by_group.get(group_id, {}).values()))

    def replace(self, servers: Iterable[WarmServer]) -> None:
        """A complete listing: every warm server it showed, and no other."""
        self._by_group.clear()
        self._group_of.clear()
        self.update(servers, ())

    def update(self, changed: Iterable[WarmServer], gone: Iterable[str]) -> None:
        """An incremental listing: warm servers it showed, and ids that are no longer warm
        (deleted, or claimed: the warm mark taken off)."""
        for server_id in gone:
            self._drop(server_id)
        for server in changed:
            self._drop(server.server_id)
            if server.status == "DELETED":
                continue
            self._by_group.setdefault(server.group_id, {})[server.server_id] = server
            self._group_of[server.server_id] = server.group_id

    def _drop(self, server_id: str) -> None:
        group_id = self._group_of.pop(server_id, None)
        if group_id is None:
            return
        group = self._by_group[group_id]
        del group[server_id]
        if not group:
            del self._by_group[group_id]
