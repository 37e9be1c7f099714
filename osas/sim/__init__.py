"""A simulated OpenStack on 127.0.0.1 that unmodified openstacksdk works against.

Keystone v3, Nova v2.1 (with microversions), Glance v2 and Neutron v2.0 over one ``FakeNova``,
the same model the tests' in-memory ``FakeCloud`` uses, plus a control API under ``/_sim`` for
processes that cannot reach the object. See ``osas.sim.server``.
"""

from osas.sim.server import (
    APP_CREDENTIAL_ID,
    APP_CREDENTIAL_SECRET,
    CLOUD_NAME,
    DEFAULT_PASSWORD,
    DEFAULT_PROJECT,
    DEFAULT_USER,
    CannotListen,
    CloudsYamlUnwritable,
    SimulatedOpenStack,
    run_sim,
)

__all__ = [
    "APP_CREDENTIAL_ID",
    "APP_CREDENTIAL_SECRET",
    "CLOUD_NAME",
    "DEFAULT_PASSWORD",
    "DEFAULT_PROJECT",
    "DEFAULT_USER",
    "CannotListen",
    "CloudsYamlUnwritable",
    "SimulatedOpenStack",
    "run_sim",
]
