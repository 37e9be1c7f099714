"""GetOptions: the Cluster Autoscaler's defaults, echoed, with a group's overrides applied."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import timedelta

from osas.domain.errors import NotSupported
from osas.domain.specs import OptionOverrides


@dataclass(frozen=True, slots=True)
class AutoscalingOptions:
    """Every option the protocol carries; CA uses an answer verbatim, zeros included."""

    scale_down_utilization_threshold: float
    scale_down_gpu_utilization_threshold: float
    scale_down_unneeded_time: timedelta
    scale_down_unready_time: timedelta
    max_node_provision_time: timedelta
    zero_or_max_node_scaling: bool
    ignore_daemonsets_utilization: bool


def group_options(defaults: AutoscalingOptions, overrides: OptionOverrides) -> AutoscalingOptions:
    """The group's options, or NotSupported so that CA keeps its own defaults.

    Answering at all costs CA >= 1.35 its per-group MaxNodeStartupTime (the protocol has no field
    for it, so it becomes 0), hence only groups with overrides answer.
    """
    if overrides.is_empty():
        raise NotSupported("node group has no option overrides; CA keeps its defaults")
    changes = {
        f.name: getattr(overrides, f.name)
        for f in fields(overrides)
        if getattr(overrides, f.name) is not None
    }
    return replace(defaults, **changes)
