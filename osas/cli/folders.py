"""Where the commands that write files (sim, certs, bench) check they can, before the work."""

from __future__ import annotations

import os
from pathlib import Path

from osas.cli.exit_codes import EXIT_OUTPUT, CommandError


def writable_folder(folder: Path, what: str) -> None:
    """Refuse at once, not after the work, when ``folder`` cannot take the output."""
    existing = next((f for f in (folder, *folder.parents) if f.exists()), folder)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        reason = "not a folder" if not existing.is_dir() else "not writable"
        raise CommandError(f"cannot write {what} in {folder}: {existing} is {reason}", EXIT_OUTPUT)
