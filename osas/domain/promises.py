"""What the writer promised the Cluster Autoscaler and Nova has not confirmed yet.

The ledger decides what is in it (``Ledger.promises``); the election's record keeps it in
Kubernetes beside the leader Lease, written before IncreaseSize or DeleteNodes answers OK, so
that the next holder keeps the promises of a holder killed at any instant (``Ledger.inherit``).

- a **create** is promised from the moment IncreaseSize accepts it until a listing shows its
  request id, Nova refuses it, or it is cancelled: until then it may reach Nova, and the next
  holder counts it in its group's target (the headroom it may occupy is held);
- a **delete** is promised from the moment DeleteNodes accepts it until a listing no longer
  shows the server: the next holder sends it again (a DELETE of a gone server is harmless, and
  one that lost this cluster's marks is still never sent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Entries a record may hold: about 60 bytes each when written, so that a full record stays
# well inside the 256 KiB Kubernetes allows for an object's annotations. At the bound, a call
# that would add to it is refused whole (RESOURCE_EXHAUSTED) with nothing promised.
RECORD_CAPACITY = 2_000


@dataclass(frozen=True, slots=True)
class Promises:
    """``creates``: request id -> (group id, since when it is in hand, by the clock of the
    one who reads it: the ledger's monotonic clock, or seconds since the epoch once written);
    ``deletes``: server id -> group id."""

    creates: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    deletes: Mapping[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.creates) + len(self.deletes)

    def creates_per_group(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for group_id, _ in self.creates.values():
            counts[group_id] = counts.get(group_id, 0) + 1
        return counts


NO_PROMISES = Promises()
