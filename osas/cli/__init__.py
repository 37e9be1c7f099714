"""The ``osas`` command: ``main`` runs it. The parser is ``osas.cli.parser``, each command's
work its own module (``serve``, ``check_config``, ``status``, ``sim``, ``certs``, ``demo``,
``bench``), their exit codes ``osas.cli.exit_codes``."""

from osas.cli.entry import main

__all__ = ["main"]
