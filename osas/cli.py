"""The ``osas`` command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import structlog

from osas import __version__
from osas.app import App, build_cloud, configure_logging
from osas.config import CONFIG_ENV, ConfigError, load_config

logger = structlog.get_logger(__name__)

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="osas",
        description="OpenStack provider for the Kubernetes Cluster Autoscaler (externalgrpc).",
    )
    parser.add_argument("--version", action="version", version=f"osas {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the provider")
    serve.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(CONFIG_ENV),
        help=f"YAML configuration file (default: ${CONFIG_ENV})",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    serve.add_argument("--log-format", default="json", choices=["json", "console"])
    commands.add_parser("demo", help="a Cluster Autoscaler session against a simulated cloud")
    return parser


async def _serve(app: App) -> None:
    async with anyio.create_task_group() as group:
        group.start_soon(app.run)

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    logger.info("signal received", signal=signal.Signals(signum).name)
                    app.stop()
                    return

        group.start_soon(stop_on_signal)


def _cmd_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    if args.config is None:
        sys.stderr.write(f"osas serve: give --config FILE or set {CONFIG_ENV}\n")
        return EXIT_CONFIG
    try:
        config = load_config(args.config)
        app = App(config, build_cloud(config))
    except ConfigError as exc:
        sys.stderr.write(f"osas: configuration error:\n{exc}\n")
        return EXIT_CONFIG
    except OSError as exc:
        sys.stderr.write(f"osas: cannot start: {exc}\n")
        return EXIT_CONFIG
    anyio.run(_serve, app)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _cmd_serve(args)
    sys.stdout.write(
        "osas demo: coming soon. It needs the simulated OpenStack, which arrives with the\n"
        "OpenStack adapter. Meanwhile `osas serve` runs against the in-memory cloud\n"
        "(cloud_backend: fake); see README.md.\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
