"""``osas status``: ``/status`` of a running osas, from its metrics port, as one screen."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from osas.cli.exit_codes import EXIT_CLOUD, EXIT_CONFIG, CommandError
from osas.cli.status_table import render_status
from osas.config import CONFIG_ENV, ConfigError
from osas.config.metrics_port import metrics_listen_in
from osas.service.ops_server import fetch_status


def status_url(metrics_listen: str) -> str:
    """Where this host reaches a metrics_listen address."""
    host, _, port = metrics_listen.rpartition(":")
    local = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}  # noqa: S104 - not a bind
    return f"http://{local.get(host, host)}:{port}"


def _url_from(path: Path | None) -> str:
    if path is None:
        raise CommandError(f"give --url URL, --config FILE or set {CONFIG_ENV}", EXIT_CONFIG)
    try:
        listen = metrics_listen_in(path)
    except ConfigError as exc:
        raise CommandError(f"{exc}: no metrics_listen to read; give --url", EXIT_CONFIG) from exc
    if listen is None:
        raise CommandError(f"{path} sets no metrics_listen; give --url", EXIT_CONFIG)
    return status_url(listen)


def run(args: argparse.Namespace) -> int:
    url = args.url if args.url is not None else _url_from(args.config)
    deadline = time.monotonic() + args.wait
    while True:
        try:
            status = fetch_status(url)
        except (OSError, ValueError) as exc:
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise CommandError(f"no answer from {url}/status: {exc}", EXIT_CLOUD) from exc
        if status.get("ready") or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    sys.stdout.write(json.dumps(status, indent=1) + "\n" if args.json else render_status(status))
    return 0 if status.get("ready") else 1
