"""``python -m osas`` and the ``osas`` command.

gRPC's C core reads ``GRPC_VERBOSITY`` once, when grpc is imported, and otherwise writes its own
plain-text lines (a failed bind, for one) into the JSON log on stderr. So it is silenced here,
before ``osas.cli`` imports grpc; a value the operator set is kept.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from osas.cli import main as run  # noqa: PLC0415 - grpc must not be imported before this

    return run()


if __name__ == "__main__":
    sys.exit(main())
