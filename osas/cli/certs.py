"""``osas certs``: a CA and the two certificates of a local try, and where each goes."""

from __future__ import annotations

import argparse
import os
import sys

from osas.cli.exit_codes import EXIT_OUTPUT, CommandError
from osas.cli.folders import writable_folder
from osas.config.schema import ENV_PREFIX, OsasConfig

# The variable that moves serve's listen address, as serve reads it.
_LISTEN_ENV = f"{ENV_PREFIX}LISTEN"


def _port() -> tuple[str, str]:
    """The port osas serve will listen on here (OSAS_LISTEN, as serve reads it, else its
    default), and where that came from."""
    listen = os.environ.get(_LISTEN_ENV, "")
    _, colon, port = listen.rpartition(":")
    if colon and port.isdigit():
        return port, f"from {_LISTEN_ENV}"
    default = str(OsasConfig.model_fields["listen"].default).rpartition(":")[2]
    return default, f"osas serve's default; {_LISTEN_ENV} moves it"


def run(args: argparse.Namespace) -> int:
    from osas.demo.certs import CLIENT_NAME, LOCAL_FILES, write_local_certs  # noqa: PLC0415 - a kit

    names = tuple(dict.fromkeys(("localhost", "127.0.0.1", *args.name)))
    writable_folder(args.out, "the certificates")
    there = [args.out / name for name in LOCAL_FILES if (args.out / name).exists()]
    if there and not args.force:
        more = f" and {len(there) - 1} more" if len(there) > 1 else ""
        raise CommandError(
            f"{there[0]}{more} already exist: osas certs keeps them (a running osas or CA may "
            "use them); give --force to replace them, or another --out",
            EXIT_OUTPUT,
        )
    try:
        written = write_local_certs(args.out, names, args.days)
    except OSError as exc:
        raise CommandError(
            f"cannot write the certificates in {args.out}: {exc.strerror}", EXIT_OUTPUT
        ) from exc
    out = args.out
    port, said = _port()
    sys.stdout.write(
        f"wrote {', '.join(str(p) for p in written)}"
        + (" (replacing the ones there)" if there else "")
        + "\n"
        f"server certificate for {', '.join(names)}; client certificate for {CLIENT_NAME};\n"
        f"valid {args.days} days. For a local try, not for production (docs/install.md).\n\n"
        "osas's configuration:\n"
        "tls:\n"
        f"  cert_file: {out / 'tls.crt'}\n"
        f"  key_file: {out / 'tls.key'}\n"
        f"  client_ca_file: {out / 'ca.crt'}\n"
        f"  server_names: [{', '.join(names)}]\n\n"
        "the Cluster Autoscaler's cloud-config:\n"
        f"address: localhost:{port}   # {said}\n"
        f"cert: {out / 'client.crt'}\n"
        f"key: {out / 'client.key'}\n"
        f"cacert: {out / 'ca.crt'}\n"
    )
    return 0
