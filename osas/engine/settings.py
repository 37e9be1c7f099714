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
    # A complete listing reads every server's details again (~1.5 kB a server in Nova's
    # answers: 78 MB at 50,000): the safety net for what changes-since cannot show (a mark
    # deleted by hand, a listing that missed a server). Deletions and state changes reach CA
    # through incremental syncs; every 30 min keeps Nova's traffic at 50,000 servers near
    # 2.6 MB a minute.
    full_resync_interval: float = 1800.0
    # Refresh fails, so CA skips its loop, when the last good sync is older than this.
    max_inventory_age: float = 180.0
    retry_backoff: float = 1.0
    # Servers in BUILD, or being deleted, this long are reported (never acted on).
    stuck_build_after: float = 1800.0
    stuck_delete_after: float = 600.0
    # changes-since is taken from Nova's clock (its answers' Date) less this overlap: the host
    # that dates Nova's answers and those that stamp updated_at need not agree to the second.
    changes_since_overlap: float = 60.0
    # After a start or a takeover, scale-ups wait create_doubt_window for creates an earlier
    # osas may still have in Nova's API (they could take a group beyond max_size).
    hold_after_start: bool = True
    # The project's quota (Nova's /limits) is read this often, and after every quota refusal,
    # so that CA is told no max size the project cannot hold. 0: never read.
    quota_interval: float = 60.0


@dataclass(frozen=True, slots=True)
class EngineSettings:
    queue: QueueSettings = field(default_factory=QueueSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
