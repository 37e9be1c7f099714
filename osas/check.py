"""``osas check-config``: the configuration validated, and every name it uses resolved in the
cloud, before anything is deployed."""

from __future__ import annotations

from typing import TextIO

from osas.cloud.errors import CloudError
from osas.cloud.port import Cloud, Reference
from osas.config import OsasConfig


async def check_cloud(config: OsasConfig, cloud: Cloud, out: TextIO) -> int:
    """Print one row per resource each node group names; 0 when all are found, else 1."""
    try:
        described = await cloud.verify()
        rows: list[tuple[str, Reference]] = []
        for spec in config.cluster_spec().node_groups:
            rows += [(spec.group_id, ref) for ref in await cloud.resolve(spec)]
    except CloudError as exc:
        out.write(f"osas check-config: the cloud cannot be used: {exc}\n")
        return 1
    finally:
        await cloud.close()
    out.write(f"cloud: {described}\n\n")
    header = ("NODE GROUP", "KIND", "NAME", "RESULT")
    table = [header] + [
        (group, ref.kind, ref.name, f"ok ({ref.resource_id})" if ref.found else "NOT FOUND")
        for group, ref in rows
    ]
    widths = [max(len(row[column]) for row in table) for column in range(len(header))]
    for row in table:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        out.write("\n")
    missing = [ref for _, ref in rows if not ref.found]
    out.write(f"\n{len(missing)} problem(s)\n" if missing else "\nall resources found\n")
    return 1 if missing else 0
