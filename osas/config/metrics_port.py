"""Where a configuration file puts the metrics port, read leniently for ``osas status``.

Nothing else of the file is checked: after a reload osas refused, the file is the one an
operator needs ``osas status`` for, and all it must hold is ``metrics_listen``.
"""

from __future__ import annotations

import os
from pathlib import Path

from osas.config.loading import ConfigError, yaml_document
from osas.config.schema import _ADDRESS_RE, ENV_PREFIX

METRICS_LISTEN_ENV = f"{ENV_PREFIX}METRICS_LISTEN"


def metrics_listen_in(path: Path) -> str | None:
    """``metrics_listen`` as osas serve would take it from ``path`` (``OSAS_METRICS_LISTEN``
    first), None when unset (the port is off); a ConfigError only when the file cannot be read
    as a YAML mapping or the value is no HOST:PORT."""
    value: object = os.environ.get(METRICS_LISTEN_ENV)
    where = METRICS_LISTEN_ENV
    if value is None:
        value = _top_level(path).get("metrics_listen")
        where = f"{path}: metrics_listen"
    if value is None:
        return None
    if not isinstance(value, str) or not _ADDRESS_RE.match(value):
        raise ConfigError(f"{where}: {value!r} is not HOST:PORT")
    return value


def _top_level(path: Path) -> dict[object, object]:
    # Read as YAML only: a key given twice, or any other mistake osas refuses, still leaves
    # the port readable.
    data = yaml_document(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level is not a mapping of keys")
    return data
