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


_NO_OVERRIDES = NotSupported("node group has no option overrides; CA keeps its defaults")


def options_refusal(overrides: OptionOverrides) -> NotSupported | None:
    """Why a group answers no options (so that CA keeps its own defaults), or None when it
    has overrides to answer with. Decided by the configuration alone: CA asks about four times
    per node per loop, and the answer is the same until a reload.

    Answering at all costs CA >= 1.35 its per-group MaxNodeStartupTime (the protocol has no field
    for it, so it becomes 0), hence only groups with overrides answer.
    """
    return _NO_OVERRIDES if overrides.is_empty() else None


def group_options(defaults: AutoscalingOptions, overrides: OptionOverrides) -> AutoscalingOptions:
    """The group's options, or NotSupported (``options_refusal``)."""
    refusal = options_refusal(overrides)
    if refusal is not None:
        raise refusal
    changes = {
        f.name: getattr(overrides, f.name)
        for f in fields(overrides)
        if getattr(overrides, f.name) is not None
    }
    return replace(defaults, **changes)
