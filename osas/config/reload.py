"""What a reload may change under a running process, and what it leaves for a restart."""

from __future__ import annotations

from osas.config.schema import OsasConfig

# The node groups and what CA reads of them. The rest (listen addresses, TLS paths — their
# files rotate anyway —, OpenStack, intervals, queue, cluster name, provider id form) would
# be unsafe or meaningless to change under a running process.
RELOADABLE = frozenset({"node_groups", "gpu_label", "gpu_types", "pricing"})


def restart_only_changes(current: OsasConfig, new: OsasConfig) -> list[str]:
    """The top-level keys ``new`` changes that a reload cannot apply: listen addresses, TLS
    paths, OpenStack, intervals..."""
    names = [name for name in type(current).model_fields if name not in RELOADABLE]
    return [name for name in names if getattr(current, name) != getattr(new, name)]


def reloaded(current: OsasConfig, new: OsasConfig) -> OsasConfig:
    """The configuration in force after ``new`` is applied: its reloadable keys, the rest
    as it was."""
    return current.model_copy(update={name: getattr(new, name) for name in RELOADABLE})
