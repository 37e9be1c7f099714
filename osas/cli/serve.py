"""``osas serve``: the provider, from start to a clean stop, and the one line an operator
reads when it cannot start."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import structlog
from prometheus_client import CollectorRegistry

from osas.app import App, LeaseLost, openstack_clouds
from osas.cli.exit_codes import (
    EXIT_BIND,
    EXIT_CLOUD,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_LEASE_LOST,
    EXIT_TLS,
)
from osas.cloud.errors import CloudError
from osas.config import CONFIG_ENV, ConfigError, OsasConfig, load_config
from osas.election.port import ElectionSetupError
from osas.process import configure_logging, tune_process
from osas.service.server import BindError
from osas.service.tls import CertificateError

logger = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class StartupFailure:
    """Why osas could not start, as the one line an operator reads and its exit code."""

    cause: str
    exit_code: int
    message: str
    event: str = "startup failed"

    def report(self) -> int:
        logger.error(self.event, cause=self.cause, reason=self.message, exit_code=self.exit_code)
        sys.stderr.write(f"osas: {self.message}\n")
        return self.exit_code


def _leaves(error: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups, the task groups' wrapping removed."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def startup_failure(error: BaseException) -> StartupFailure | None:  # noqa: PLR0911 - one case each
    """The failure an operator can act on, or None for anything else (a bug)."""
    if isinstance(error, ConfigError):
        problems = "; ".join(str(error).splitlines())
        return StartupFailure("config", EXIT_CONFIG, f"configuration error: {problems}")
    if isinstance(error, CloudError):
        return StartupFailure("cloud", EXIT_CLOUD, f"the cloud cannot be used: {error}")
    if isinstance(error, CertificateError):
        return StartupFailure(
            "tls",
            EXIT_TLS,
            f"the TLS files cannot serve: {error} (tls.cert_file, tls.key_file, "
            "tls.client_ca_file: fix them or the Secret mounted there)",
        )
    if isinstance(error, BindError):
        return StartupFailure("bind", EXIT_BIND, str(error))
    if isinstance(error, ElectionSetupError):
        return StartupFailure(
            "config", EXIT_CONFIG, f"leader election cannot start: {error} (leader_election)"
        )
    if isinstance(error, LeaseLost):
        return StartupFailure("lease", EXIT_LEASE_LOST, str(error), event="stopped")
    return None


async def _serve(config: OsasConfig, path: Path | None = None) -> None:
    # Built inside the event loop: grpc.aio binds its servers to the running loop. One
    # registry for the app and the cloud adapter: both record into it.
    registry = CollectorRegistry()
    app = App(config, openstack_clouds(config, registry), registry=registry, config_path=path)
    async with anyio.create_task_group() as group:
        group.start_soon(app.run)

        async def stop_on_signal() -> None:
            signals_wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
            with anyio.open_signal_receiver(*signals_wanted) as signals:
                async for signum in signals:
                    logger.info("signal received", signal=signal.Signals(signum).name)
                    if signum == signal.SIGHUP:
                        app.request_reload()
                        continue
                    app.stop()
                    return

        group.start_soon(stop_on_signal)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    if args.config is None:
        message = f"configuration error: give --config FILE or set {CONFIG_ENV}"
        return StartupFailure("config", EXIT_CONFIG, message).report()
    tune_process()
    try:
        config = load_config(args.config)
        anyio.run(
            _serve,
            config,
            args.config,
            backend_options={"use_uvloop": config.transport.event_loop == "uvloop"},
        )
    except BaseException as error:  # sorted below; interrupts are re-raised
        failures = [startup_failure(leaf) for leaf in _leaves(error)]
        known = [failure for failure in failures if failure is not None]
        if known:
            return known[0].report()
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise
        logger.exception("osas failed")
        causes = "; ".join(repr(leaf) for leaf in _leaves(error))
        sys.stderr.write(f"osas: failed: {causes} (the log event 'osas failed' has the rest)\n")
        return EXIT_FAILED
    return 0
