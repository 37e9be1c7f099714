"""The floor benchmark: a bare grpc.aio server's CPU per call is read for each setting."""

from __future__ import annotations

from osas.bench.floor import SETTINGS, cpu_per_call


def test_every_setting_serves_and_its_cpu_per_call_is_read():
    for setting in SETTINGS:
        assert cpu_per_call(setting, 300) > 0
