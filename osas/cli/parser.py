"""The ``osas`` command line: every command, its options and its help. Parsing only; what a
command does is in its own module (``osas.cli.serve``, ``osas.cli.status``...)."""

from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path

from osas import __version__
from osas.cli import arguments
from osas.cli.exit_codes import BENCH_INSTALL, all_exit_codes, exit_codes_of
from osas.config import CONFIG_ENV

_RAW = argparse.RawDescriptionHelpFormatter
_WIDTH = 92

# The simulator is a kit `osas serve` never imports (.importlinter), so its credentials are
# written out here; tests/test_cli_help.py holds them to osas.sim's and its /_sim/ index.
_SIM_DESCRIPTION = """\
A simulated OpenStack (Keystone, Nova, Glance, Neutron, Cinder) on 127.0.0.1, for a local try
of osas or the openstack CLI; it runs until Ctrl-C or SIGTERM.

credentials it accepts (project k8s, domain Default; --clouds-yaml writes the password):
  user osas, password secret-password
  application credential id app-cred-id, secret app-cred-secret

control API: plain HTTP and JSON, no token, under the URL it prints; GET /_sim/ lists it:
  /_sim/servers     GET lists, POST seeds servers behind osas's back; DELETE /_sim/servers/ID
  /_sim/faults      GET, POST: failures to inject (errors, stalls, lost answers, paging)
  /_sim/quota       GET, POST: Nova's, Neutron's and Cinder's quotas
  /_sim/nova        GET, POST: build_seconds, delete_seconds, clock_offset, server action
                    timings (start_seconds, stop_seconds, shelve_seconds...), the
                    warm guest's warm_prepare_seconds, serial_console
  /_sim/identity    GET, POST: token lifetime and refusals; POST /_sim/identity/revoke
  /_sim/activate    POST: finish builds now (all), or a server's build or action ({"id": ...})
  /_sim/calls       GET: requests counted by operation; POST /_sim/calls/reset
each region but the first (--region) has its own under /regions/NAME/_sim/; a second cloud
with a Keystone of its own is a second osas sim (--cloud-name, another port).
"""


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
) -> argparse.ArgumentParser:
    # The epilog is laid out already, so argparse leaves all text as given: prose is wrapped
    # here, a description with lines of its own (sim's) is kept.
    if "\n" not in description:
        description = textwrap.fill(description, _WIDTH)
    return commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=exit_codes_of(name),
        formatter_class=_RAW,
    )


def _config_option(command: argparse.ArgumentParser, what: str = "YAML configuration file") -> None:
    command.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(CONFIG_ENV),
        help=f"{what} (default: ${CONFIG_ENV})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="osas",
        description="OpenStack provider for the Kubernetes Cluster Autoscaler (externalgrpc).",
        epilog=all_exit_codes(),
        formatter_class=_RAW,
    )
    parser.add_argument("--version", action="version", version=f"osas {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    _add_check_config(commands)
    _add_sim(commands)
    _add_certs(commands)
    _add_status(commands)
    _add_demo(commands)
    _add_bench(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = _command(
        commands,
        "serve",
        "run the provider",
        "Runs the provider from the configuration file (docs/configuration.md): the gRPC "
        "server the Cluster Autoscaler calls (listen), gRPC health (health_listen) and, when "
        "set, metrics and /status (metrics_listen). It logs one JSON line per event on stderr, "
        "reloads the file on SIGHUP and stops cleanly on SIGTERM or Ctrl-C.",
    )
    _config_option(serve)
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning"],
        help="the least severe events written to stderr (default: %(default)s)",
    )
    serve.add_argument(
        "--log-format",
        default="json",
        choices=["json", "console"],
        help="one JSON object per line, or lines for people (default: %(default)s)",
    )


def _add_check_config(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = _command(
        commands,
        "check-config",
        "validate the configuration and its TLS files, and resolve its names in the cloud",
        "Validates the configuration file, its TLS files and user data as osas serve would, "
        "then looks up every name it uses (image, flavor, networks, security groups, key pair, "
        "server group) in the cloud and prints a line for each. It reads only: nothing is "
        "created or changed (a group's join token is minted in a dry run, which the "
        "Kubernetes API judges and stores nowhere).",
    )
    _config_option(check)
    check.add_argument(
        "--wait",
        type=arguments.seconds,
        default=0.0,
        metavar="SECONDS",
        help="while the cloud cannot be used (starting, clouds.yaml not yet written), try "
        "again every second for up to SECONDS before reporting it (default: 0, no retry)",
    )


def _add_sim(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = _command(commands, "sim", "serve a simulated OpenStack on 127.0.0.1", _SIM_DESCRIPTION)
    sim.add_argument(
        "--port",
        type=arguments.port,
        default=0,
        help="the port of Keystone and every service (default: %(default)s, a free port)",
    )
    sim.add_argument(
        "--clouds-yaml",
        type=Path,
        help="write a clouds.yaml with an 'osas-sim' entry here (default: none written)",
    )
    sim.add_argument(
        "--cloud-name",
        type=arguments.name,
        default="osas-sim",
        help="the clouds.yaml entry written: another name for a second simulated cloud, with "
        "its own Keystone (default: %(default)s)",
    )
    sim.add_argument(
        "--region",
        dest="regions",
        action="append",
        type=arguments.name,
        metavar="NAME",
        help="a region of the cloud, each with its own Nova behind the one Keystone; give it "
        "again for more (default: RegionOne alone; the first is the clouds.yaml entry's)",
    )
    sim.add_argument(
        "--build-seconds",
        type=arguments.seconds,
        default=3.0,
        help="how long servers stay in BUILD (default: %(default)s)",
    )
    sim.add_argument(
        "--delete-seconds",
        type=arguments.seconds,
        default=0.0,
        help="how long a deleted server stays ACTIVE with task_state 'deleting' (real Nova: "
        "0.5-2; default: %(default)s)",
    )


def _add_certs(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = _command(
        commands,
        "certs",
        "certificates for a local try: a CA, osas's server certificate, CA's client one",
        "A private CA, a server certificate for osas and a client certificate for the Cluster "
        "Autoscaler, for a local try (production: cert-manager, docs/install.md).",
    )
    certs.add_argument("--out", type=Path, required=True, help="the folder to write them to")
    certs.add_argument(
        "--name",
        action="append",
        default=[],
        help="another DNS name or IP address the server certificate covers (repeatable); "
        "localhost and 127.0.0.1 always are",
    )
    certs.add_argument(
        "--days",
        type=arguments.count,
        default=30,
        help="how long they are valid (default: %(default)s)",
    )
    certs.add_argument(
        "--force",
        action="store_true",
        help="replace certificates already in --out (without it, osas certs keeps them and "
        "stops: a running osas or CA may use them)",
    )


def _add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = _command(
        commands,
        "status",
        "what a running osas is doing, read from /status on its metrics_listen",
        "What a running osas is doing, read over HTTP from /status on its metrics port: "
        "leader or standby, node groups, servers, failures, queue (docs/operations.md). Give "
        "--url, or --config: of that file only metrics_listen is read (OSAS_METRICS_LISTEN "
        "overrides it, as for serve), so a file osas refuses still serves, after a rejected "
        "reload too.",
    )
    status.add_argument(
        "--url", type=arguments.http_url, help="the metrics port, e.g. http://127.0.0.1:9090"
    )
    _config_option(status, "or the configuration, to find metrics_listen in")
    status.add_argument("--json", action="store_true", help="print the /status document")
    status.add_argument(
        "--wait",
        type=arguments.seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for osas to answer and be ready, for scripts (default: 0, "
        "ask once)",
    )


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _command(
        commands,
        "demo",
        "a Cluster Autoscaler session against a simulated cloud",
        "Starts a simulated OpenStack and osas with fresh mTLS certificates on 127.0.0.1, and "
        "plays a short Cluster Autoscaler session against them, narrated: a scale-up, a quota "
        "failure reported and cleaned up, a scale-down. No options.",
    )


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = _command(
        commands,
        "bench",
        "osas against the bare gRPC limit at 1k-50k servers (needs the bench extra)",
        "Runs the simulated OpenStack, osas and a bare gRPC server side by side on 127.0.0.1, "
        "replays the Cluster Autoscaler's calls against both, measures CA's loop by the "
        "server's CPU at 1k, 5k and 10k nodes, and writes a report (some 30 minutes on 2 "
        f"cores). Needs the bench extra: in osas's clone, {BENCH_INSTALL}.",
    )
    bench.add_argument("--quick", action="store_true", help="1k and 5k servers, 2 rounds")
    bench.add_argument(
        "--sizes",
        type=arguments.sizes,
        metavar="N,N,...",
        help="server counts to measure at (default: 1000,10000,50000)",
    )
    bench.add_argument(
        "--rounds",
        type=arguments.count,
        metavar="N",
        help="rounds per size (default: 5, --quick 2)",
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("BENCHMARKS.md"),
        help="the report to write (default: %(default)s, in the working directory; the "
        "repository's own is docs/BENCHMARKS.md, which nox -s bench writes)",
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
    bench.add_argument(
        "--sizes-only",
        action="store_true",
        help="measure only the rows per number of servers (--sizes), and rewrite only those "
        "sizes' sections of --out and their rows among the targets",
    )
    bench.add_argument(
        "--ca-loop-only",
        action="store_true",
        help="measure only CA's loop by the server's CPU (--sizes: its node counts, default "
        "1000,5000,10000, --quick 1000,5000; --rounds: its rounds, default 2), keep it as "
        "--label's run and rewrite only that section of --out",
    )
    bench.add_argument(
        "--places-only",
        action="store_true",
        help="measure only CA's loop for a healthy place's groups beside a place that is "
        "unreachable or holds many servers, and memory per place (--sizes: the servers of "
        "that place, default 50000, --quick 10000; --rounds: its cycles, default 10, --quick "
        "6), and rewrite only that section of --out",
    )
    bench.add_argument(
        "--warm-only",
        action="store_true",
        help="measure only IncreaseSize to the start of each node, and to its server ACTIVE "
        "and joined, for a node group with a warm pool beside one without (--rounds: its "
        "rounds, default 3, --quick 2), and rewrite only that section of --out",
    )
    bench.add_argument(
        "--label",
        type=arguments.label,
        default="latest",
        help="the name CA's loop run is kept under, beside the runs kept before "
        "(default: %(default)s)",
    )
