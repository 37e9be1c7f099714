"""The benchmark, a kit like ``osas.sim`` and ``osas.demo`` that the core never imports.

``osas bench`` (or ``nox -s bench``) runs, as separate processes on 127.0.0.1: the simulated
OpenStack seeded with 1k / 10k / 50k servers (``osas.bench.cloud``), ``osas serve`` against it,
and a bare grpc.aio server answering the same bytes over the same mTLS (``osas.bench.bare``);
it replays the Cluster Autoscaler's loop against both and writes ``docs/BENCHMARKS.md``.
"""
