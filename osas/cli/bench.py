"""``osas bench``: the benchmark's entry, refusing at once what would fail after the work."""

from __future__ import annotations

import argparse

from osas.cli.exit_codes import BENCH_INSTALL, EXIT_CONFIG, EXIT_EXTRA, CommandError
from osas.cli.folders import writable_folder

# The modules of the optional extra `bench` (pyproject.toml) that osas bench imports.
_BENCH_EXTRA = frozenset({"trustme", "pyinstrument"})


def run(args: argparse.Namespace) -> int:
    writable_folder(args.out.parent, args.out.name)
    if args.sizes_only and not args.out.is_file():
        # Refused now, not after the half hour of measuring: it rewrites sections of a report.
        raise CommandError(
            f"--sizes-only rewrites the sections of an existing report, and {args.out} is none; "
            "give --out docs/BENCHMARKS.md (the repository's) or run without --sizes-only",
            EXIT_CONFIG,
        )
    if args.compare_with is not None and not (args.compare_with / "osas" / "__main__.py").is_file():
        raise CommandError(f"{args.compare_with} is not a checkout of osas", EXIT_CONFIG)
    try:
        from osas.bench.run import FULL, QUICK, run_benchmark  # noqa: PLC0415 - an extra's kit
    except ModuleNotFoundError as exc:
        if exc.name not in _BENCH_EXTRA:
            raise
        raise CommandError(
            f"needs the bench extra, which is not installed ({exc.name} is missing): "
            f"in osas's clone, {BENCH_INSTALL}",
            EXIT_EXTRA,
        ) from exc
    plan = QUICK if args.quick else FULL
    return run_benchmark(
        plan,
        sizes=args.sizes,
        rounds=args.rounds,
        out=args.out,
        compare_with=args.compare_with.resolve() if args.compare_with else None,
        start_up_only=args.start_up_only,
        sizes_only=args.sizes_only,
        ca_loop_only=args.ca_loop_only,
        places_only=args.places_only,
        warm_only=args.warm_only,
        ca_loop_label=args.label,
    )
