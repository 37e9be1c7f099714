"""Regenerate the Python code for proto/osas/protocol/*.proto into osas/protocol/.

Usage, from anywhere, with the project's virtualenv:
    .venv/bin/python proto/generate.py          # rewrite them; exit 1 if any had changed
    .venv/bin/python proto/generate.py --check  # exit 1 if they are out of date
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ("osas/protocol/k8s.proto", "osas/protocol/externalgrpc.proto")
GENERATED_DIR = "osas/protocol"
GENERATED_GLOBS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py", "*_pb2_grpc.pyi")


def generate(out: Path) -> None:
    """Run protoc (bundled with grpcio-tools) with all output plugins into `out`."""
    plugin = Path(sys.executable).parent / "protoc-gen-mypy_grpc"
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy_grpc={plugin}",
        f"-I{ROOT / 'proto'}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        "--mypy_grpc_opt=quiet",
        f"--mypy_grpc_out={out}",
        *(str(ROOT / "proto" / name) for name in PROTOS),
    ]
    if protoc.main(args) != 0:
        sys.exit(f"protoc failed: {' '.join(args)}")


def generated_files(base: Path) -> set[str]:
    """Generated files under `base`, as paths relative to it."""
    found = (p for pattern in GENERATED_GLOBS for p in (base / GENERATED_DIR).glob(pattern))
    return {p.relative_to(base).as_posix() for p in found}


def stale_files() -> list[str]:
    """Files whose committed content differs from a fresh generation (or that are extra)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        names = generated_files(fresh) | generated_files(ROOT)
        return sorted(
            name
            for name in names
            if not (fresh / name).is_file()
            or not (ROOT / name).is_file()
            or (fresh / name).read_bytes() != (ROOT / name).read_bytes()
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only report files that are out of date"
    )
    if parser.parse_args(argv).check:
        stale = stale_files()
        for name in stale:
            sys.stderr.write(f"out of date: {name}\n")
        return 1 if stale else 0
    stale = stale_files()
    generate(ROOT)
    for name in stale:
        sys.stderr.write(f"regenerated (was out of date, commit it): {name}\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
