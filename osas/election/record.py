"""The promise record: what the writer promised and Nova has not confirmed, kept in Kubernetes.

It lives in one annotation of the leader Lease (``PROMISES_ANNOTATION``), not an object of
its own, because there it is fenced for free: every write of it is the holder's own write of
the Lease, made with the resourceVersion the holder's last write returned, so it lands only
while this process holds the Lease, and it renews the Lease as it lands. It needs no grant
beyond the Lease's, and the next holder reads it in the same request that takes the Lease.
(A Lease deleted by hand takes the record with it: the next holder then holds headroom as
though every group had creates in flight, for ``create_doubt_window``.)

The ledger decides what is in it (``Ledger.promises``); this room only keeps it. Renews carry
the record as it is at each write, so entries leave it within a ``retry_period`` of leaving
the ledger; a call that adds a promise waits for a write carrying it (``keep``), and callers
waiting at once share one write.

The annotation's value is JSON, grouped by node group, readable with kubectl::

    {"v": 1, "creates": {"<group>": {"<request id>": "<since, UTC>"}},
     "deletes": {"<group>": ["<server id>", ...]}}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from osas.domain.promises import NO_PROMISES, Promises
from osas.election.port import Leadership, PreviousHolder, PromisesNotKept

PROMISES_ANNOTATION = "osas.openstack.org/promises"
# Written by osas releases before the record: 0 said no create could still land.
CREATES_IN_FLIGHT_ANNOTATION = "osas.openstack.org/creates-in-flight"
_VERSION = 1


def encode(promises: Promises, wall_of: Callable[[float], datetime]) -> str:
    """The annotation's value; ``wall_of`` turns the ledger's clock into UTC time."""
    creates: dict[str, dict[str, str]] = {}
    for request_id, (group_id, since) in promises.creates.items():
        moment = wall_of(since).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        creates.setdefault(group_id, {})[request_id] = moment
    deletes: dict[str, list[str]] = {}
    for server_id, group_id in promises.deletes.items():
        deletes.setdefault(group_id, []).append(server_id)
    return json.dumps(
        {"v": _VERSION, "creates": creates, "deletes": deletes}, separators=(",", ":")
    )


def decode(text: str) -> Promises:
    """The record an annotation holds; ValueError for anything else. Times come back as
    seconds since the epoch."""
    try:
        document = json.loads(text)
        if document.get("v") != _VERSION:
            raise ValueError(f"record version {document.get('v')!r} is not {_VERSION}")
        creates = {
            str(request_id): (str(group_id), _epoch(str(since)))
            for group_id, entries in dict(document.get("creates") or {}).items()
            for request_id, since in dict(entries).items()
        }
        deletes = {
            str(server_id): str(group_id)
            for group_id, server_ids in dict(document.get("deletes") or {}).items()
            for server_id in list(server_ids)
        }
    except (AttributeError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a promise record: {exc}") from exc
    return Promises(creates, deletes)


def _epoch(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def inherited(previous: PreviousHolder | None) -> Promises | None:
    """What the new holder must keep of its predecessor's promises: the record it left;
    nothing after a first install (no Lease ever) or a release by an older osas saying no
    create was in flight; None when it cannot be known (no election, a Lease without a
    record, or one deleted under its holder): the caller then holds every group."""
    if previous is None:
        return None
    text = previous.annotations.get(PROMISES_ANNOTATION)
    if text is not None:
        try:
            return decode(text)
        except ValueError:
            return None
    if previous.identity is None:
        return NO_PROMISES
    if previous.released and previous.annotations.get(CREATES_IN_FLIGHT_ANNOTATION) == "0":
        return NO_PROMISES
    return None


class PromiseRecord:
    """Keeps the ledger's promises on the Lease through ``leadership``. ``source`` gives the
    promises, ``revision`` the ledger's count of promises made (``Ledger.promised``);
    ``clock`` is the ledger's clock and ``wall_clock`` the time written for people."""

    def __init__(
        self,
        leadership: Leadership,
        source: Callable[[], Promises],
        revision: Callable[[], int],
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._leadership = leadership
        self._source = source
        self._revision = revision
        self._clock = clock
        self._wall_clock = wall_clock
        self._entries = 0

    @property
    def entries(self) -> int:
        """Entries in the record as last written (for /status and the metrics)."""
        return self._entries

    def start(self) -> None:
        """From now on the holder's writes carry the ledger's record (call it once the
        predecessor's record is taken into the ledger)."""
        self._leadership.carry(self._annotations)

    def _annotations(self) -> tuple[int, Mapping[str, str]]:
        revision = self._revision()  # read first: a later promise is never claimed kept
        promises = self._source()
        self._entries = len(promises)
        now, wall = self._clock(), self._wall_clock()

        def wall_of(moment: float) -> datetime:
            return datetime.fromtimestamp(wall.timestamp() - (now - moment), UTC)

        return revision, {PROMISES_ANNOTATION: encode(promises, wall_of)}

    async def keep(self, budget: float) -> None:
        """Return once the API server has acknowledged a record holding every promise made
        so far; PromisesNotKept when that did not happen within ``budget`` seconds."""
        revision = self._revision()
        if not await self._leadership.keep_written(revision, budget):
            raise PromisesNotKept(
                f"the promise record could not be written to Kubernetes within {budget:.1f}s "
                "(or this osas no longer holds the leader lease): nothing was promised"
            )
