"""Which cloud a configuration runs against: OpenStack through openstacksdk, or the simulator's
in-process cloud (``cloud_backend: fake``). Kept out of the app, which never imports the
simulator."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from osas.cloud.metrics import CloudMetrics
from osas.cloud.openstack import OpenStackCloud
from osas.cloud.port import Cloud
from osas.config import OsasConfig
from osas.sim.cloud import FakeCloud
from osas.sim.model import FakeNova

# The in-process cloud behind `cloud_backend: fake` turns BUILD servers ACTIVE after this long.
FAKE_BUILD_SECONDS = 5.0


def build_cloud(config: OsasConfig, registry: CollectorRegistry | None = None) -> Cloud:
    """The cloud; with a registry, OpenStack requests are counted in it (the app's)."""
    if config.cloud_backend == "fake":
        return FakeCloud(FakeNova(build_seconds=FAKE_BUILD_SECONDS))
    metrics = CloudMetrics(registry) if registry is not None else None
    return OpenStackCloud(config.openstack_settings(), metrics=metrics)
