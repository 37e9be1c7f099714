"""The benchmark's OpenStack: the simulator in a process of its own, seeded with the cluster's
servers, logging every request with the bytes of its answer.

``python -m osas.bench.cloud --servers N --groups G --cluster NAME --others M`` prints one
JSON line (``auth_url``) once it serves, and stops when its standard input closes. ``--others``
adds M servers of another cluster to the project (what else a project holds). ``--region NAME
SERVERS GROUPS`` (repeatable) adds a region behind the same Keystone (``RegionOne`` is the
first, seeded by ``--servers``), its own Nova seeded with SERVERS of the cluster's servers over
GROUPS node groups named ``<name in lower case>-g<i>`` (``g<i>`` in the first); its control
API is under ``/regions/<name>/_sim/``. Besides the
simulator's own API it answers ``GET /_bench/log?since=I`` (requests from index I: start and
end time, method, target, status, bytes), ``GET /_bench/creates`` (the most creates it had in
hand at once), ``GET /_bench/count?group=G`` (live servers of a group) and
``GET /_bench/churn?per_minute=K`` (from now on, K of the other servers change each minute:
a metadata key set, which Nova's ``changes-since`` sees; 0 stops it).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from osas.domain.servers import META_CLUSTER, META_GROUP, META_REQUEST, OwnershipMarks
from osas.sim import SimulatedOpenStack
from osas.sim.model import FakeNova
from osas.sim.routing import Response


class MeteredOpenStack(SimulatedOpenStack):
    """The simulator, with a log of what it served."""

    def __init__(self, nova: FakeNova) -> None:
        super().__init__(nova)
        self._log: list[tuple[float, float, str, str, int, int]] = []
        self._log_lock = threading.Lock()
        self._creating = 0
        self._creates_peak = 0
        self.others: list[str] = []  # servers of another cluster in the project
        self._churn = 0.0  # other servers changed per minute
        self._churner: threading.Thread | None = None

    def dispatch(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> Response:
        if target.startswith("/_bench/"):
            return self._bench(target)
        create = method == "POST" and urlsplit(target).path.rstrip("/").endswith("/servers")
        started = time.time()
        if create:
            with self._log_lock:
                self._creating += 1
                self._creates_peak = max(self._creates_peak, self._creating)
        try:
            response = super().dispatch(method, target, headers, body)
        finally:
            if create:
                with self._log_lock:
                    self._creating -= 1
        with self._log_lock:
            entry = (started, time.time(), method, target, response.status, len(response.body))
            self._log.append(entry)
        return response

    def _bench(self, target: str) -> Response:
        split = urlsplit(target)
        query = parse_qs(split.query)
        if split.path == "/_bench/log":
            since = int(query.get("since", ["0"])[0])
            with self._log_lock:
                entries = self._log[since:]
            return Response.json(200, {"entries": entries, "next": since + len(entries)})
        if split.path == "/_bench/creates":
            with self._log_lock:
                peak, self._creates_peak = self._creates_peak, 0
            return Response.json(200, {"peak": peak})
        if split.path == "/_bench/count":
            group = query.get("group", [""])[0]
            count = sum(1 for s in self.nova.live_servers() if s.metadata.get(META_GROUP) == group)
            return Response.json(200, {"count": count})
        if split.path == "/_bench/churn":
            self._churn = float(query.get("per_minute", ["0"])[0])
            if self._churn and self._churner is None:
                self._churner = threading.Thread(target=self._touch, daemon=True, name="churn")
                self._churner.start()
            return Response.json(200, {"per_minute": self._churn})
        return Response.json(404, {"error": "not served"})

    def _touch(self) -> None:
        """Other servers changing, evenly over each minute, in turn."""
        index = 0
        while self.others:
            if not self._churn:
                time.sleep(0.1)
                continue
            server_id = self.others[index % len(self.others)]
            index += 1
            self.nova.set_metadata(server_id, {"touched": str(index)})
            time.sleep(60.0 / self._churn)


def seed(
    nova: FakeNova, cluster: str, servers: int, groups: int, others: int, prefix: str = "g"
) -> list[str]:
    """Servers an earlier osas made an hour ago, spread over the groups (``<prefix><i>``), and
    ``others`` of another cluster made then too: an idle project. The others' ids."""
    marks = OwnershipMarks(cluster)
    nova.clock = lambda: datetime.now(UTC) - timedelta(hours=1)
    other_ids = [
        nova.seed(name=f"other-{index}", metadata={META_CLUSTER: "other"}).server_id
        for index in range(others)
    ]
    for index in range(servers):
        group = f"{prefix}{index % groups}"
        request_id = uuid.uuid4().hex
        nova.seed(
            name=f"{cluster}-{group}-{request_id[:10]}",
            metadata={META_CLUSTER: cluster, META_GROUP: group, META_REQUEST: request_id},
            tags=marks.tags(request_id),
        )
    nova.clock = lambda: datetime.now(UTC)
    return other_ids


def region_groups(region: str) -> str:
    """The prefix of the node groups seeded in a region other than the first."""
    return f"{region.lower()}-g"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=0)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--cluster", default="bench")
    parser.add_argument("--others", type=int, default=0)
    parser.add_argument(
        "--region",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "SERVERS", "GROUPS"),
        help="another region, seeded with SERVERS of the cluster's servers over GROUPS groups",
    )
    args = parser.parse_args(argv)
    nova = FakeNova()
    others = seed(nova, args.cluster, args.servers, max(1, args.groups), args.others)
    simulator = MeteredOpenStack(nova)
    simulator.others = others
    for name, servers, groups in args.region:
        region = simulator.add_region(name)
        seed(region.nova, args.cluster, int(servers), max(1, int(groups)), 0, region_groups(name))
    with simulator:
        info: dict[str, Any] = {"auth_url": simulator.auth_url, "base_url": simulator.base_url}
        sys.stdout.write(json.dumps(info) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the benchmark closes it (or dies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
