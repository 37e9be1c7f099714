"""``osas status``: ``/status`` of a running osas, from its metrics port, as one screen."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
import urllib.error
import urllib.parse
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


def _no_answer(url: str, exc: Exception) -> str:
    """Why ``url`` gave no /status, in words, with what to check."""
    where = urllib.parse.urlsplit(url).netloc or url
    check = (
        "is osas running, and is that its metrics_listen? (osas serve logs the port it "
        "listens at as 'metrics listening'; give --url or --config)"
    )
    if isinstance(exc, urllib.error.HTTPError):
        return f"{url}/status answered HTTP {exc.code}: {check}"
    cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(cause, ConnectionRefusedError):
        return f"nothing listens at {where}: {check}"
    if isinstance(cause, TimeoutError):
        return f"{where} accepted the connection but sent no /status in time: {check}"
    if isinstance(cause, socket.gaierror):
        return f"{where}: the host name does not resolve ({cause.strerror}); give --url"
    return f"no answer from {url}/status ({cause}): {check}"


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
            raise CommandError(_no_answer(url, exc), EXIT_CLOUD) from exc
        if status.get("ready") or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    sys.stdout.write(json.dumps(status, indent=1) + "\n" if args.json else render_status(status))
    return 0 if status.get("ready") else 1
