"""``osas certs``: a CA and the two certificates of a local try, and where each goes."""

from __future__ import annotations

import argparse
import sys

from osas.cli.exit_codes import EXIT_OUTPUT, CommandError
from osas.cli.folders import writable_folder


def run(args: argparse.Namespace) -> int:
    from osas.demo.certs import CLIENT_NAME, write_local_certs  # noqa: PLC0415 - a kit

    names = tuple(dict.fromkeys(("localhost", "127.0.0.1", *args.name)))
    writable_folder(args.out, "the certificates")
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
