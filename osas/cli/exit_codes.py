"""The exit codes of the ``osas`` commands: one table, shown whole by ``osas --help`` and,
each command's own rows only, by ``osas COMMAND --help`` (docs/cli.md has the same table)."""

from __future__ import annotations

import textwrap

from osas.check import EXIT_CLOUD, EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_TLS

__all__ = [
    "BENCH_INSTALL",
    "COMMANDS",
    "EXIT_BIND",
    "EXIT_BROKEN_PIPE",
    "EXIT_CLOUD",
    "EXIT_CONFIG",
    "EXIT_EXTRA",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_LEASE_LOST",
    "EXIT_OUTPUT",
    "EXIT_TLS",
    "EXIT_USAGE",
    "CommandError",
    "all_exit_codes",
    "exit_codes_of",
]

EXIT_USAGE = 2  # argparse's own code for a command line it refuses
EXIT_BIND = 5
EXIT_OUTPUT = 6
EXIT_EXTRA = 7
EXIT_LEASE_LOST = 8
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

# What exit 7 tells a user to run. osas is not on PyPI (the name "osas" there is another
# project's), so from a clone, as the README installs osas.
BENCH_INSTALL = "pip install -e '.[bench]'"

# In the order `osas --help` lists them.
COMMANDS = ("serve", "check-config", "sim", "certs", "status", "demo", "bench")

# (code, the commands it is theirs, what it means); a code may have a row per meaning.
_MEANINGS: tuple[tuple[int, tuple[str, ...], str], ...] = (
    (EXIT_OK, ("serve", "sim"), "ran and stopped cleanly (SIGTERM, Ctrl-C)"),
    (EXIT_OK, ("check-config",), "everything checked out"),
    (EXIT_OK, ("status",), "ready (a warm standby is ready)"),
    (EXIT_OK, ("certs",), "wrote the certificates"),
    (EXIT_OK, ("demo",), "the session played to its end"),
    (EXIT_OK, ("bench",), "wrote the report"),
    (
        EXIT_FAILED,
        ("check-config",),
        (
            "a name the configuration uses is not found in the cloud, or user data cannot be "
            "built or leaves a ${name} as written"
        ),
    ),
    (EXIT_FAILED, ("status",), "not ready"),
    (EXIT_FAILED, ("demo",), "a step did not reach the state it waits for (it says which)"),
    (
        EXIT_FAILED,
        ("serve",),
        "an unexpected failure (a bug; the log event 'osas failed' holds its traceback)",
    ),
    (
        EXIT_CONFIG,
        ("serve", "check-config", "status"),
        "the command line or the configuration is invalid (what, and why, is printed)",
    ),
    (
        EXIT_CONFIG,
        ("sim", "certs", "demo", "bench"),
        "the command line is invalid (what, and why, is printed)",
    ),
    (
        EXIT_CONFIG,
        ("serve",),
        ("the leader election cannot start (no Kubernetes configuration, an unusable kubeconfig)"),
    ),
    (
        EXIT_CLOUD,
        ("serve", "check-config"),
        (
            "the cloud cannot be used: credentials, endpoint, cloud name, clouds.yaml missing, "
            "compute microversion"
        ),
    ),
    (EXIT_CLOUD, ("status",), "osas did not answer"),
    (
        EXIT_TLS,
        ("serve", "check-config"),
        (
            "the TLS files cannot serve: missing or unreadable, key and certificate do not match, "
            "expired or not yet valid, tls.server_names not covered"
        ),
    ),
    (EXIT_BIND, ("serve", "sim"), "cannot listen (address in use, not an address of this host)"),
    (EXIT_OUTPUT, ("certs", "sim", "bench"), "a file or folder it must write cannot be written"),
    (EXIT_EXTRA, ("bench",), "the optional extra it needs is not installed"),
    (
        EXIT_LEASE_LOST,
        ("serve",),
        (
            "lost the leader lease (another osas took it, or the Kubernetes API was out of reach "
            "for renew_deadline); it stopped writing, and a restart makes it a standby"
        ),
    ),
    (EXIT_INTERRUPTED, COMMANDS, "interrupted (Ctrl-C) before it was done"),
    (EXIT_BROKEN_PIPE, COMMANDS, "the reader of its output went away (osas status | head -1)"),
)

_WIDTH = 96
_FOOTNOTE = """
Every failure ends in one line "osas ...: ..." on stderr that names the cause and what to fix
(serve prints it after its JSON log events, one of which, "startup failed", carries the same
reason); a traceback means a bug.
"""


def _row(code: int, text: str) -> str:
    return textwrap.fill(text, _WIDTH, initial_indent=f"  {code:<3} ", subsequent_indent=" " * 6)


def all_exit_codes() -> str:
    """Every command's exit codes, a line (or a few) per code: ``osas --help``'s epilog."""
    rows = []
    for code in dict.fromkeys(code for code, _, _ in _MEANINGS):
        parts = [
            meaning if commands == COMMANDS else f"{', '.join(commands)}: {meaning}"
            for number, commands, meaning in _MEANINGS
            if number == code
        ]
        rows.append(_row(code, "; ".join(parts)))
    return "exit codes (docs/cli.md):\n" + "\n".join(rows) + "\n" + _FOOTNOTE


def exit_codes_of(command: str) -> str:
    """The exit codes ``command`` ends with: its ``--help``'s epilog."""
    if command not in COMMANDS:
        raise ValueError(f"no command {command!r}")
    rows = [_row(code, meaning) for code, commands, meaning in _MEANINGS if command in commands]
    return (
        f"exit codes of osas {command} (every command's: osas --help, docs/cli.md):\n"
        + "\n".join(rows)
        + "\n"
    )


class CommandError(Exception):
    """What stops a command, said in one line, with the exit code it ends with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
