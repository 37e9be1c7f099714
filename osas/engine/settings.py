"""Tunables of the engine, as plain values (the config layer builds them from the file)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineSettings:
    queue_capacity: int = 1000
    workers: int = 4
    # Incremental (changes-since) sync period, and how often a complete listing replaces it.
    reconcile_interval: float = 10.0
    full_resync_interval: float = 300.0
    # Refresh fails, so CA skips its loop, when the last good sync is older than this.
    max_inventory_age: float = 180.0
    # changes-since is compared with Nova's clock; overlap windows to absorb clock skew.
    changes_since_overlap: float = 60.0
    delete_attempts: int = 3
    retry_backoff: float = 1.0
