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
from osas.app import App, configure_logging
from osas.backend import build_cloud
from osas.check import check_cloud
from osas.cloud.errors import CloudConfigurationError
from osas.config import CONFIG_ENV, ConfigError, OsasConfig, load_config
from osas.demo.session import main as run_demo
from osas.sim import run_sim

logger = structlog.get_logger(__name__)

EXIT_CONFIG = 2
EXIT_CLOUD = 3


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
    check = commands.add_parser(
        "check-config", help="validate the configuration and resolve its names in the cloud"
    )
    check.add_argument("--config", type=Path, default=os.environ.get(CONFIG_ENV))
    sim = commands.add_parser("sim", help="serve a simulated OpenStack on 127.0.0.1")
    sim.add_argument("--port", type=int, default=0, help="0 picks a free port")
    sim.add_argument(
        "--clouds-yaml", type=Path, help="write a clouds.yaml with an 'osas-sim' entry here"
    )
    sim.add_argument(
        "--build-seconds", type=float, default=3.0, help="how long servers stay in BUILD"
    )
    sim.add_argument(
        "--delete-seconds",
        type=float,
        default=0.0,
        help="how long a deleted server stays ACTIVE with task_state 'deleting' (real Nova: 0.5-2)",
    )
    commands.add_parser("demo", help="a Cluster Autoscaler session against a simulated cloud")
    return parser


async def _serve(config: OsasConfig) -> None:
    # Built inside the event loop: grpc.aio binds its servers to the running loop.
    app = App(config, build_cloud(config))
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
    config = _load(args.config, "serve")
    if config is None:
        return EXIT_CONFIG
    status = 0
    try:
        anyio.run(_serve, config)
    except* CloudConfigurationError as refused:
        for reason in refused.exceptions:
            sys.stderr.write(f"osas: the cloud cannot be used as configured: {reason}\n")
        status = EXIT_CLOUD
    except* OSError as failed:
        for error in failed.exceptions:
            sys.stderr.write(f"osas: cannot start: {error}\n")
        status = EXIT_CONFIG
    return status


def _load(path: Path | None, command: str) -> OsasConfig | None:
    if path is None:
        sys.stderr.write(f"osas {command}: give --config FILE or set {CONFIG_ENV}\n")
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        sys.stderr.write(f"osas: configuration error:\n{exc}\n")
        return None


def _cmd_check(args: argparse.Namespace) -> int:
    configure_logging("warning", "console")
    config = _load(args.config, "check-config")
    if config is None:
        return EXIT_CONFIG
    cloud = build_cloud(config)
    return anyio.run(check_cloud, config, cloud, sys.stdout)


def _cmd_sim(args: argparse.Namespace) -> int:
    configure_logging("info", "console")
    run_sim(args.port, args.clouds_yaml, args.build_seconds, delete_seconds=args.delete_seconds)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _cmd_serve(args)
    if args.command == "check-config":
        return _cmd_check(args)
    if args.command == "sim":
        return _cmd_sim(args)
    # The demo narrates on stdout; expected refusals (the quota step) need no log lines.
    configure_logging("error", "console")
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())
