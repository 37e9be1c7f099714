"""The configuration: its schema (``schema``), how it is read (``loading``), the value classes
it becomes (``convert``), the places its node groups live in (``places``), what a reload may
change (``reload``) and the start-up summary (``summary``)."""

from osas.config.loading import CONFIG_ENV, ConfigError, load_config
from osas.config.places import Place, PlaceKey, places_of
from osas.config.reload import RELOADABLE, reloaded, restart_only_changes
from osas.config.schema import NodeGroupConfig, OsasConfig
from osas.config.summary import startup_summary

__all__ = [
    "CONFIG_ENV",
    "RELOADABLE",
    "ConfigError",
    "NodeGroupConfig",
    "OsasConfig",
    "Place",
    "PlaceKey",
    "load_config",
    "places_of",
    "reloaded",
    "restart_only_changes",
    "startup_summary",
]
