"""``osas COMMAND``: the command line parsed, the command run, its refusal said in one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from osas.cli import bench, certs, check_config, demo, serve, sim, status
from osas.cli.exit_codes import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, CommandError
from osas.cli.parser import build_parser

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": serve.run,
    "check-config": check_config.run,
    "sim": sim.run,
    "status": status.run,
    "certs": certs.run,
    "demo": demo.run,
    "bench": bench.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
