"""The kinds of value the ``osas`` command line takes: argparse types that refuse a wrong
value with a line saying what is expected (argparse then exits 2, usage first)."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

_PORT_MAX = 65535


def port(text: str) -> int:
    number = int(text) if text.isdigit() else -1
    if not 0 <= number <= _PORT_MAX:
        raise argparse.ArgumentTypeError(f"not a port number (0 to {_PORT_MAX}): {text!r}")
    return number


def count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not 0 <= number < float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds (0 or more): {text!r}")
    return number


def sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(count(part.strip()) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of server counts: {text!r}"
        ) from None


def http_url(text: str) -> str:
    """An http:// or https:// URL with a host; a bare HOST:PORT is refused with the URL
    it most likely means, rather than failing later as an unreachable address."""
    if "://" not in text:
        raise argparse.ArgumentTypeError(
            f"not a URL: {text!r} (write http://{text.removeprefix('//')})"
        )
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"}:
        raise argparse.ArgumentTypeError(f"not an http:// or https:// URL: {text!r}")
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"no host in the URL: {text!r}")
    return text


def _plain(text: str) -> bool:
    return bool(text) and all(c.isascii() and (c.isalnum() or c in "._-") for c in text)


def label(text: str) -> str:
    """A benchmark run's name: kept in a file name, so letters, digits, '.', '_' and '-'."""
    if not _plain(text):
        raise argparse.ArgumentTypeError(
            f"not a run name (letters, digits, '.', '_', '-'): {text!r}"
        )
    return text


def name(text: str) -> str:
    """A cloud's or a region's name: a clouds.yaml key and a URL path segment, so letters,
    digits, '.', '_' and '-'."""
    if not _plain(text):
        raise argparse.ArgumentTypeError(f"not a name (letters, digits, '.', '_', '-'): {text!r}")
    return text
