"""``osas check-config``: the configuration validated, and its names looked up in the cloud."""

from __future__ import annotations

import argparse
import sys
from functools import partial

import anyio

from osas.app import openstack_cloud
from osas.check import CHECK_REQUEST_TIMEOUT, EXIT_OK, Report, check_config
from osas.cli.exit_codes import EXIT_CONFIG, CommandError
from osas.config import CONFIG_ENV, ConfigError, load_config, places_of
from osas.process import configure_logging


def run(args: argparse.Namespace) -> int:
    configure_logging("warning", "console")
    if args.config is None:
        raise CommandError(f"give --config FILE or set {CONFIG_ENV}", EXIT_CONFIG)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        problems = str(exc)  # one per line: on the same line when there is one
        separator = "\n" if "\n" in problems else " "
        raise CommandError(f"configuration error:{separator}{problems}", EXIT_CONFIG) from exc
    # Each request bounded and sent once: it answers soon even against a silent Keystone.
    clouds = [
        (place, openstack_cloud(config, request_timeout=CHECK_REQUEST_TIMEOUT, place=place))
        for place in places_of(config)
    ]
    report = Report(sys.stdout)
    code = anyio.run(partial(check_config, wait=args.wait), config, clouds, report)
    if code != EXIT_OK:
        sys.stdout.flush()  # the rows first: the line on stderr comes last
        raise CommandError(report.summary(), code)
    return code
