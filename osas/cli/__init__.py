"""The ``osas`` command."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import structlog
from prometheus_client import CollectorRegistry

from osas import __version__
from osas.app import App, LeaseLost, openstack_cloud
from osas.check import (
    CHECK_REQUEST_TIMEOUT,
    EXIT_CLOUD,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_TLS,
    check_config,
)
from osas.cli.status_table import render_status
from osas.cloud.errors import CloudError
from osas.config import CONFIG_ENV, ConfigError, OsasConfig, load_config
from osas.election.port import ElectionSetupError
from osas.process import configure_logging, tune_process
from osas.service.ops_server import fetch_status
from osas.service.server import BindError
from osas.service.tls import CertificateError

logger = structlog.get_logger(__name__)

EXIT_USAGE = 2  # argparse's own code for a command line it refuses
EXIT_BIND = 5
EXIT_OUTPUT = 6
EXIT_EXTRA = 7
EXIT_LEASE_LOST = 8
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
# The modules of the optional extra `bench` (pyproject.toml) that osas bench imports.
_BENCH_EXTRA = frozenset({"trustme", "pyinstrument"})
# How to get it: osas is not on PyPI (the name "osas" there is another project's), so from a
# clone, as the README installs osas.
BENCH_INSTALL = "pip install -e '.[bench]'"

_EXIT_CODES = f"""\
exit codes (docs/cli.md):
  0  ran and stopped cleanly (serve, sim); everything checked out (check-config); ready (status)
  1  check-config: a name the configuration uses is not found in the cloud, or user data
     cannot be built or leaves a ${{name}} as written; status: not ready;
     serve: an unexpected failure (a bug; the log holds its traceback as JSON)
  {EXIT_CONFIG}  the command line or the configuration is invalid (what, and why, is printed)
  {EXIT_CLOUD}  the cloud cannot be used: credentials, endpoint, cloud name, clouds.yaml
     missing, compute microversion; status: osas did not answer
  {EXIT_TLS}  the TLS files cannot serve: missing or unreadable, key and certificate do not
     match, expired or not yet valid, tls.server_names not covered
  {EXIT_BIND}  serve, sim: cannot listen (address in use, not an address of this host)
  {EXIT_OUTPUT}  certs, sim, bench: a file or folder it must write cannot be written
  {EXIT_EXTRA}  bench: the optional extra it needs is not installed
  {EXIT_LEASE_LOST}  serve: lost the leader lease (another osas took it, or the Kubernetes API
     was out of reach for renew_deadline); it stopped writing first, and a restart makes it
     a standby
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C) before it was done

Every failure ends in one line "osas ...: ..." on stderr that names the cause and what to fix
(serve prints it after its JSON log events, one of which, "startup failed", carries the same
reason); a traceback means a bug.
"""


class CommandError(Exception):
    """What stops a command, said in one line, with the exit code it ends with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _port(text: str) -> int:
    port = int(text) if text.isdigit() else -1
    if not 0 <= port <= 65535:  # noqa: PLR2004 - the port range
        raise argparse.ArgumentTypeError(f"not a port number (0 to 65535): {text!r}")
    return port


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds (0 or more): {text!r}")
    return seconds


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(_count(part.strip()) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of server counts: {text!r}"
        ) from None


def _writable_folder(folder: Path, what: str) -> None:
    """Refuse at once, not after the work, when ``folder`` cannot take the output."""
    existing = next((f for f in (folder, *folder.parents) if f.exists()), folder)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        reason = "not a folder" if not existing.is_dir() else "not writable"
        raise CommandError(f"cannot write {what} in {folder}: {existing} is {reason}", EXIT_OUTPUT)


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


def _command_on_config(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str
) -> argparse.ArgumentParser:
    """A command that reads osas's configuration file and exits with osas's exit codes."""
    command = commands.add_parser(
        name, help=summary, epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    command.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(CONFIG_ENV),
        help=f"YAML configuration file (default: ${CONFIG_ENV})",
    )
    return command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="osas",
        description="OpenStack provider for the Kubernetes Cluster Autoscaler (externalgrpc).",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"osas {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = _command_on_config(commands, "serve", "run the provider")
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning"],
        help="the least severe events written to stderr (default: info)",
    )
    serve.add_argument(
        "--log-format",
        default="json",
        choices=["json", "console"],
        help="one JSON object per line, or lines for people (default: json)",
    )
    check = _command_on_config(
        commands,
        "check-config",
        "validate the configuration and its TLS files, and resolve its names in the cloud",
    )
    check.add_argument(
        "--wait",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="while the cloud cannot be used (starting, clouds.yaml not yet written), try "
        "again every second for up to SECONDS before reporting it (default: 0)",
    )
    sim = commands.add_parser(
        "sim",
        help="serve a simulated OpenStack on 127.0.0.1",
        description="A simulated OpenStack (Keystone, Nova, Glance, Neutron) on 127.0.0.1, "
        "for a local try of osas or the openstack CLI; it runs until Ctrl-C or SIGTERM.",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument("--port", type=_port, default=0, help="0 picks a free port")
    sim.add_argument(
        "--clouds-yaml", type=Path, help="write a clouds.yaml with an 'osas-sim' entry here"
    )
    sim.add_argument(
        "--build-seconds", type=_seconds, default=3.0, help="how long servers stay in BUILD"
    )
    sim.add_argument(
        "--delete-seconds",
        type=_seconds,
        default=0.0,
        help="how long a deleted server stays ACTIVE with task_state 'deleting' (real Nova: 0.5-2)",
    )
    certs = commands.add_parser(
        "certs",
        help="certificates for a local try: a CA, osas's server certificate, CA's client one",
        description="A private CA, a server certificate for osas and a client certificate for "
        "the Cluster Autoscaler, for a local try (production: cert-manager, docs/install.md).",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    certs.add_argument("--out", type=Path, required=True, help="the folder to write them to")
    certs.add_argument(
        "--name",
        action="append",
        default=[],
        help="another DNS name or IP address the server certificate covers (repeatable); "
        "localhost and 127.0.0.1 always are",
    )
    certs.add_argument("--days", type=_count, default=30, help="how long they are valid")
    status = commands.add_parser(
        "status",
        help="what a running osas is doing, read from /status on its metrics_listen",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for osas to answer and be ready (for scripts)",
    )
    commands.add_parser(
        "demo",
        help="a Cluster Autoscaler session against a simulated cloud",
        description="Starts a simulated OpenStack and osas with fresh mTLS certificates on "
        "127.0.0.1, and plays a short Cluster Autoscaler session against them, narrated: a "
        "scale-up, a quota failure reported and cleaned up, a scale-down. No options.",
    )
    bench = commands.add_parser(
        "bench",
        help="osas against the bare gRPC limit at 1k-50k servers (needs the bench extra)",
        description="Runs the simulated OpenStack, osas and a bare gRPC server side by side "
        "on 127.0.0.1, replays the Cluster Autoscaler's calls against both, and writes a report "
        "(some 20 minutes on 2 cores). Needs the bench extra: in osas's clone, "
        f"{BENCH_INSTALL}.",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--quick", action="store_true", help="1k and 5k servers, 2 rounds")
    bench.add_argument(
        "--sizes",
        type=_sizes,
        metavar="N,N,...",
        help="server counts to measure at (default: 1000,10000,50000)",
    )
    bench.add_argument(
        "--rounds", type=_count, metavar="N", help="rounds per size (default: 5, --quick 2)"
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("docs/BENCHMARKS.md"),
        help="the report to write (default: docs/BENCHMARKS.md)",
    )
    bench.add_argument(
        "--compare-with",
        type=Path,
        metavar="CHECKOUT",
        help="another checkout of osas (e.g. before a change) whose start-up is measured too",
    )
    bench.add_argument(
        "--start-up-only",
        action="store_true",
        help="measure only the start-up of osas serve, and rewrite only that section of --out",
    )
    return parser


async def _serve(config: OsasConfig, path: Path | None = None) -> None:
    # Built inside the event loop: grpc.aio binds its servers to the running loop. One
    # registry for the app and the cloud adapter: both record into it.
    registry = CollectorRegistry()
    app = App(config, openstack_cloud(config, registry), registry=registry, config_path=path)
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
    tune_process()
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


def _config_for(path: Path | None, give: str, *, read_files: bool = True) -> OsasConfig:
    """The configuration a command reads; a CommandError (exit 2) saying why it cannot."""
    if path is None:
        raise CommandError(f"give {give} or set {CONFIG_ENV}", EXIT_CONFIG)
    try:
        return load_config(path, read_files=read_files)
    except ConfigError as exc:
        problems = str(exc)  # one per line: on the same line when there is one
        separator = "\n" if "\n" in problems else " "
        raise CommandError(f"configuration error:{separator}{problems}", EXIT_CONFIG) from exc


def _cmd_check(args: argparse.Namespace) -> int:
    configure_logging("warning", "console")
    config = _config_for(args.config, "--config FILE")
    cloud = openstack_cloud(config, request_timeout=CHECK_REQUEST_TIMEOUT)
    return anyio.run(partial(check_config, wait=args.wait), config, cloud, sys.stdout)


def status_url(metrics_listen: str) -> str:
    """Where this host reaches a metrics_listen address."""
    host, _, port = metrics_listen.rpartition(":")
    local = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}  # noqa: S104 - not a bind
    return f"http://{local.get(host, host)}:{port}"


def _cmd_status(args: argparse.Namespace) -> int:
    url = args.url
    if url is None:
        # Only metrics_listen is wanted: the user data files may be another machine's.
        config = _config_for(args.config, "--url URL, --config FILE", read_files=False)
        if config.metrics_listen is None:
            raise CommandError(f"{args.config} sets no metrics_listen; give --url", EXIT_CONFIG)
        url = status_url(config.metrics_listen)
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


def _cmd_sim(args: argparse.Namespace) -> int:
    from osas.sim import CannotListen, CloudsYamlUnwritable, run_sim  # noqa: PLC0415 - a kit

    configure_logging("info", "console")
    if args.clouds_yaml is not None:
        _writable_folder(args.clouds_yaml.parent, args.clouds_yaml.name)
    try:
        run_sim(args.port, args.clouds_yaml, args.build_seconds, delete_seconds=args.delete_seconds)
    except CannotListen as exc:
        raise CommandError(f"{exc}: stop what listens there, or choose --port", EXIT_BIND) from exc
    except CloudsYamlUnwritable as exc:
        raise CommandError(str(exc), EXIT_OUTPUT) from exc
    return 0


def _cmd_certs(args: argparse.Namespace) -> int:
    from osas.demo.certs import CLIENT_NAME, write_local_certs  # noqa: PLC0415 - a kit

    names = tuple(dict.fromkeys(("localhost", "127.0.0.1", *args.name)))
    _writable_folder(args.out, "the certificates")
    try:
        written = write_local_certs(args.out, names, args.days)
    except OSError as exc:
        raise CommandError(
            f"cannot write the certificates in {args.out}: {exc.strerror}", EXIT_OUTPUT
        ) from exc
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


def _cmd_demo(args: argparse.Namespace) -> int:  # noqa: ARG001 - it takes no option
    from osas.demo.session import main as run_demo  # noqa: PLC0415 - a kit

    # The demo narrates on stdout; expected refusals (the quota step) need no log lines.
    configure_logging("error", "console")
    return run_demo()


def _cmd_bench(args: argparse.Namespace) -> int:
    _writable_folder(args.out.parent, args.out.name)
    if args.compare_with is not None and not (args.compare_with / "osas" / "__main__.py").is_file():
        raise CommandError(f"{args.compare_with} is not a checkout of osas", EXIT_CONFIG)
    try:
        from osas.bench.run import FULL, QUICK, run_benchmark  # noqa: PLC0415 - an extra's kit
    except ModuleNotFoundError as exc:
        if exc.name not in _BENCH_EXTRA:
            raise
        raise CommandError(
            f"needs the bench extra, which is not installed ({exc.name} is missing): "
            f"in osas's clone, {BENCH_INSTALL}",
            EXIT_EXTRA,
        ) from exc
    plan = QUICK if args.quick else FULL
    return run_benchmark(
        plan,
        sizes=args.sizes,
        rounds=args.rounds,
        out=args.out,
        compare_with=args.compare_with.resolve() if args.compare_with else None,
        start_up_only=args.start_up_only,
    )


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _cmd_serve,
    "check-config": _cmd_check,
    "sim": _cmd_sim,
    "status": _cmd_status,
    "certs": _cmd_certs,
    "demo": _cmd_demo,
    "bench": _cmd_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except CommandError as exc:
        sys.stderr.write(f"osas {args.command}: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"osas {args.command}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`osas status | head -1`): nothing more to say, to anyone.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
