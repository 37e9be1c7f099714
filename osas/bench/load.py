"""Load on osas's metrics port, from a process of its own (so that its threads do not slow the
benchmark's own client): idle connections, clients that send half a request line and stop, and
clients polling ``/status`` and ``/metrics`` as fast as they are answered.

``python -m osas.bench.load --port P --idle 200 --slow 64 --pollers 50`` prints one JSON line
(``{"ready": true}``) once every connection is open and every poller runs, and stops when its
standard input closes.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import urllib.request
from contextlib import suppress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--slow", type=int, default=64)
    parser.add_argument("--pollers", type=int, default=50)
    args = parser.parse_args(argv)
    address = ("127.0.0.1", args.port)
    held = [socket.create_connection(address) for _ in range(args.idle)]
    for _ in range(args.slow):
        slow = socket.create_connection(address)
        slow.sendall(b"GET /metr")
        held.append(slow)
    stop = threading.Event()

    def poll(path: str) -> None:
        url = f"http://127.0.0.1:{args.port}{path}"
        while not stop.is_set():
            with suppress(OSError), urllib.request.urlopen(url, timeout=10) as answer:
                answer.read()

    pollers = [
        threading.Thread(target=poll, args=(path,), daemon=True)
        for path in ("/status", "/metrics") * (args.pollers // 2)
    ]
    for thread in pollers:
        thread.start()
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the benchmark closes it (or dies)
    stop.set()
    for connection in held:
        connection.close()
    for thread in pollers:
        thread.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
