"""``osas sim``: the simulated OpenStack, served until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse

from osas.cli.exit_codes import EXIT_BIND, EXIT_OUTPUT, CommandError
from osas.cli.folders import writable_folder
from osas.process import configure_logging


def run(args: argparse.Namespace) -> int:
    from osas.sim import CannotListen, CloudsYamlUnwritable, run_sim  # noqa: PLC0415 - a kit

    configure_logging("info", "console")
    if args.clouds_yaml is not None:
        writable_folder(args.clouds_yaml.parent, args.clouds_yaml.name)
    try:
        run_sim(
            args.port,
            args.clouds_yaml,
            args.build_seconds,
            delete_seconds=args.delete_seconds,
            regions=tuple(args.regions or ()),
            cloud_name=args.cloud_name,
        )
    except CannotListen as exc:
        raise CommandError(f"{exc}: stop what listens there, or choose --port", EXIT_BIND) from exc
    except CloudsYamlUnwritable as exc:
        raise CommandError(str(exc), EXIT_OUTPUT) from exc
    return 0
