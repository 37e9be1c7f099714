"""Tunables of the engine, as plain values. The configuration builds them from the file's
``queue`` and ``reconcile`` blocks, whose keys carry the same names."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class QueueSettings:
    capacity: int = 1000
    workers: int = 10  # tasks in hand at once: as many creates as the cloud takes at once
    delete_attempts: int = 3  # sends of one delete task before it is left to the ledger


@dataclass(frozen=True, slots=True)
class ReconcileSettings:
    # Incremental (changes-since) sync period, and how often a complete listing replaces it.
    interval: float = 10.0
    # A complete listing (ids only, ~300 bytes a server: 15 MB at 50,000) is the safety net
    # for what incremental syncs could miss; every 10 min keeps Nova's traffic at 50,000
    # servers near 1.5 MB a minute.
    full_resync_interval: float = 600.0
    # Refresh fails, so CA skips its loop, when the last good sync is older than this.
    max_inventory_age: float = 180.0
    retry_backoff: float = 1.0
    # Servers in BUILD, or being deleted, this long are reported (never acted on).
    stuck_build_after: float = 1800.0
    stuck_delete_after: float = 600.0
    # changes-since is compared with Nova's clock; overlap windows to absorb clock skew.
    changes_since_overlap: float = 60.0


@dataclass(frozen=True, slots=True)
class EngineSettings:
    queue: QueueSettings = field(default_factory=QueueSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
