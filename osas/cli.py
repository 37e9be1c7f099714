"""The ``osas`` command."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import structlog
from prometheus_client import CollectorRegistry

from osas import __version__
from osas.app import App, configure_logging
from osas.backend import build_cloud
from osas.check import EXIT_CLOUD, EXIT_CONFIG, EXIT_FAILED, EXIT_TLS, check_config
from osas.cloud.errors import CloudError
from osas.config import CONFIG_ENV, ConfigError, OsasConfig, load_config
from osas.demo.certs import CLIENT_NAME, write_local_certs
from osas.demo.session import main as run_demo
from osas.engine.status import render_status
from osas.service.ops_server import fetch_status
from osas.service.server import BindError
from osas.service.tls import CertificateError
from osas.sim import run_sim

logger = structlog.get_logger(__name__)

EXIT_BIND = 5

_EXIT_CODES = f"""\
exit codes of serve and check-config:
  0  ran and stopped cleanly (serve); everything checked out (check-config)
  1  check-config: a name the configuration uses is not found in the cloud, or user data
     cannot be built;
     serve: an unexpected failure (a bug; the log holds its traceback as JSON)
  {EXIT_CONFIG}  the configuration is invalid (file, key and reason are printed)
  {EXIT_CLOUD}  the cloud cannot be used: credentials, endpoint, cloud name, clouds.yaml
     missing, compute microversion
  {EXIT_TLS}  the TLS files cannot serve: missing or unreadable, key and certificate do not
     match, expired or not yet valid, tls.server_names not covered
  {EXIT_BIND}  serve: cannot listen on listen, health_listen or metrics_listen (address in
     use, not an address of this host)

A startup failure prints one line "osas: ..." on stderr naming the cause and what to fix, after
the JSON log events (one of them, "startup failed", carries the same reason), and no traceback.
"""


@dataclass(frozen=True, slots=True)
class StartupFailure:
    """Why osas could not start, as the one line an operator reads and its exit code."""

    cause: str
    exit_code: int
    message: str

    def report(self) -> int:
        logger.error(
            "startup failed", cause=self.cause, reason=self.message, exit_code=self.exit_code
        )
        sys.stderr.write(f"osas: {self.message}\n")
        return self.exit_code


def _leaves(error: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups, the task groups' wrapping removed."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def startup_failure(error: BaseException) -> StartupFailure | None:
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
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="osas",
        description="OpenStack provider for the Kubernetes Cluster Autoscaler (externalgrpc).",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"osas {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the provider",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(CONFIG_ENV),
        help=f"YAML configuration file (default: ${CONFIG_ENV})",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    serve.add_argument("--log-format", default="json", choices=["json", "console"])
    check = commands.add_parser(
        "check-config",
        help="validate the configuration and its TLS files, and resolve its names in the cloud",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("--config", type=Path, default=os.environ.get(CONFIG_ENV))
    check.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="while the cloud cannot be used (starting, clouds.yaml not yet written), try "
        "again every second for up to SECONDS before reporting it (default: 0)",
    )
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
    certs = commands.add_parser(
        "certs",
        help="certificates for a local try: a CA, osas's server certificate, CA's client one",
    )
    certs.add_argument("--out", type=Path, required=True, help="the folder to write them to")
    certs.add_argument(
        "--name",
        action="append",
        default=[],
        help="another DNS name or IP address the server certificate covers (repeatable); "
        "localhost and 127.0.0.1 always are",
    )
    certs.add_argument("--days", type=int, default=30, help="how long they are valid")
    status = commands.add_parser(
        "status",
        help="what a running osas is doing, read from /status on its metrics_listen",
        epilog="exit codes: 0 ready, 1 not ready, 2 no address to ask (no --url, or no "
        "metrics_listen in the configuration), 3 osas did not answer",
    )
    status.add_argument("--url", help="the metrics port, e.g. http://127.0.0.1:9090")
    status.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(CONFIG_ENV),
        help=f"or the configuration, to find metrics_listen in (default: ${CONFIG_ENV})",
    )
    status.add_argument("--json", action="store_true", help="print the /status document")
    status.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for osas to answer and be ready (for scripts)",
    )
    commands.add_parser("demo", help="a Cluster Autoscaler session against a simulated cloud")
    bench = commands.add_parser(
        "bench", help="osas against the bare gRPC limit at 1k-50k servers (osas bench --help)"
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, metavar="...")
    return parser


async def _serve(config: OsasConfig, path: Path | None = None) -> None:
    # Built inside the event loop: grpc.aio binds its servers to the running loop. One
    # registry for the app and the cloud adapter: both record into it.
    registry = CollectorRegistry()
    app = App(config, build_cloud(config, registry), registry=registry, config_path=path)
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


def _cmd_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    if args.config is None:
        message = f"configuration error: give --config FILE or set {CONFIG_ENV}"
        return StartupFailure("config", EXIT_CONFIG, message).report()
    try:
        anyio.run(_serve, load_config(args.config), args.config)
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


def _config_for(command: str, path: Path | None, give: str) -> OsasConfig | None:
    """The configuration a command reads; None once the reason is on stderr (exit 2)."""
    if path is None:
        sys.stderr.write(f"osas {command}: give {give} or set {CONFIG_ENV}\n")
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        sys.stderr.write(f"osas {command}: configuration error:\n{exc}\n")
        return None


def _cmd_check(args: argparse.Namespace) -> int:
    configure_logging("warning", "console")
    config = _config_for("check-config", args.config, "--config FILE")
    if config is None:
        return EXIT_CONFIG
    return anyio.run(partial(check_config, wait=args.wait), config, build_cloud(config), sys.stdout)


def status_url(metrics_listen: str) -> str:
    """Where this host reaches a metrics_listen address."""
    host, _, port = metrics_listen.rpartition(":")
    local = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}  # noqa: S104 - not a bind
    return f"http://{local.get(host, host)}:{port}"


def _cmd_status(args: argparse.Namespace) -> int:
    url = args.url
    if url is None:
        config = _config_for("status", args.config, "--url URL, --config FILE")
        if config is None:
            return EXIT_CONFIG
        if config.metrics_listen is None:
            sys.stderr.write(f"osas status: {args.config} sets no metrics_listen; give --url\n")
            return EXIT_CONFIG
        url = status_url(config.metrics_listen)
    deadline = time.monotonic() + args.wait
    while True:
        try:
            status = fetch_status(url)
        except (OSError, ValueError) as exc:
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            sys.stderr.write(f"osas status: no answer from {url}/status: {exc}\n")
            return EXIT_CLOUD
        if status.get("ready") or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    sys.stdout.write(json.dumps(status, indent=1) + "\n" if args.json else render_status(status))
    return 0 if status.get("ready") else 1


def _cmd_sim(args: argparse.Namespace) -> int:
    configure_logging("info", "console")
    run_sim(args.port, args.clouds_yaml, args.build_seconds, delete_seconds=args.delete_seconds)
    return 0


def _cmd_certs(args: argparse.Namespace) -> int:
    names = tuple(dict.fromkeys(("localhost", "127.0.0.1", *args.name)))
    written = write_local_certs(args.out, names, args.days)
    out = args.out
    sys.stdout.write(
        f"wrote {', '.join(str(p) for p in written)}\n"
        f"server certificate for {', '.join(names)}; client certificate for {CLIENT_NAME};\n"
        f"valid {args.days} days. For a local try, not for production (docs/install.md).\n\n"
        "osas's configuration:\n"
        "tls:\n"
        f"  cert_file: {out / 'tls.crt'}\n"
        f"  key_file: {out / 'tls.key'}\n"
        f"  client_ca_file: {out / 'ca.crt'}\n\n"
        "the Cluster Autoscaler's cloud-config:\n"
        "address: localhost:8086\n"
        f"cert: {out / 'client.crt'}\n"
        f"key: {out / 'client.key'}\n"
        f"cacert: {out / 'ca.crt'}\n"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["bench"]:
        # Its options are its own; imported here, so that its dependencies stay out of every
        # other command's start.
        from osas.bench.run import main as run_bench  # noqa: PLC0415

        return run_bench(arguments[1:])
    args = _parser().parse_args(arguments)
    commands = {
        "serve": _cmd_serve,
        "check-config": _cmd_check,
        "sim": _cmd_sim,
        "status": _cmd_status,
        "certs": _cmd_certs,
    }
    command = commands.get(args.command)
    if command is not None:
        return command(args)
    # The demo narrates on stdout; expected refusals (the quota step) need no log lines.
    configure_logging("error", "console")
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())
