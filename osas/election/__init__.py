"""Leader election: one osas writes per cluster, the holder of a Kubernetes Lease.

``port`` is what the rest of osas uses (no Kubernetes client behind it); ``lease`` is the
adapter on lightkube, imported by the composition root alone.
"""

from osas.election.port import (
    ElectionSettings,
    ElectionSetupError,
    Leadership,
    NoElection,
    PreviousHolder,
    default_identity,
    lease_name_for,
    resolve_endpoint,
)

__all__ = [
    "ElectionSettings",
    "ElectionSetupError",
    "Leadership",
    "NoElection",
    "PreviousHolder",
    "default_identity",
    "lease_name_for",
    "resolve_endpoint",
]
