"""``osas demo``: a narrated Cluster Autoscaler session against the simulator."""

from __future__ import annotations

import argparse

from osas.process import configure_logging


def run(args: argparse.Namespace) -> int:  # noqa: ARG001 - it takes no option
    from osas.demo.session import main as run_demo  # noqa: PLC0415 - a kit

    # The demo narrates on stdout; expected refusals (the quota step) need no log lines.
    configure_logging("error", "console")
    return run_demo()
