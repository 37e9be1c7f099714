"""``osas status``: the ``/status`` document of the metrics port as one screen of text."""

from __future__ import annotations

from typing import Any

from osas.domain.problems import Problem

PROBLEMS = tuple(problem.value for problem in Problem)

_COLUMNS = (
    ("GROUP", 14),
    ("MIN", 4),
    ("TARGET", 7),
    ("MAX", 5),
    ("RUNNING", 9),
    ("CREATING", 9),
    ("DELETING", 9),
    ("ERROR", 6),
    ("QUEUED", 7),
    ("IN-DOUBT", 9),
    ("FAILED", 7),
)


def _row(cells: list[str]) -> str:
    return "".join(
        cell.ljust(width) if index == 0 else cell.rjust(width)
        for index, (cell, (_, width)) in enumerate(zip(cells, _COLUMNS, strict=True))
    ).rstrip()


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:  # noqa: PLR2004 - seconds read better up to two minutes
        return f"{seconds:.0f}s ago"
    return f"{seconds / 60:.0f}m ago"


def _writer_lines(status: dict[str, Any]) -> list[str]:
    """Who writes (the leader lease), whether scale-ups are held, and Nova's clock."""
    lines = []
    election = status.get("leader_election") or {}
    if election.get("enabled"):
        role = "leader" if election.get("leading") else "standby"
        lines.append(
            f"{role}: lease {election.get('lease')}, held by {election.get('holder') or 'no one'}"
            f" (this osas: {election.get('identity')})"
        )
    held = status.get("scale_ups_held_seconds")
    if held:
        lines.append(
            f"scale-ups held for {held:.0f}s more: creates of an earlier osas may still reach "
            "Nova (MAX shows the max size CA is told)"
        )
    offset = status["syncs"].get("nova_clock_offset_seconds")
    if offset is not None and abs(offset) > 5:  # noqa: PLR2004 - the threshold osas logs at
        lines.append(f"Nova's clock is {offset:+.0f}s off osas's (changes-since uses Nova's)")
    return lines


def _quota_line(groups: list[dict[str, Any]]) -> str:
    """How many more servers of each group the project's quota holds, and what bounds it."""
    parts = []
    for group in groups:
        room = group.get("quota_headroom")
        if room is None or room.get("servers") is None:
            continue
        bounded = {k: v for k, v in room.items() if k != "servers" and v is not None}
        limit = min(bounded, key=lambda key: bounded[key]) if bounded else "?"
        parts.append(f"{group['id']} {room['servers']} more ({limit})")
    if not parts:
        return "quota headroom: not read, or no limit (MAX is max_size)"
    return "quota headroom: " + ", ".join(parts) + " (MAX is bounded by it)"


def _group_problem_lines(status: dict[str, Any]) -> list[str]:
    """Node groups in a problem (``osas.domain.problems.JoinWatch``), one line each."""
    return [
        f"node group {found['group']}: {found['advice']} "
        f"({found['servers']} in the last {found['window_seconds'] / 3600:g}h)"
        for found in status.get("group_problems", [])
    ]


def render_status(status: dict[str, Any]) -> str:
    """``/status`` as one screen of text."""
    ready = "ready" if status["ready"] else f"NOT READY: {status['not_ready_reason']}"
    syncs = status["syncs"]
    lines = [
        f"osas {status['version']}: {ready}",
        f"last sync {_age(status['inventory_age_seconds'])}; "
        f"{syncs['full']} full, {syncs['incremental']} incremental, "
        f"{syncs['failures']} failed"
        + (f" (last error: {syncs['last_error']})" if syncs["last_error"] else ""),
        *_writer_lines(status),
        "",
        _row([name for name, _ in _COLUMNS]),
    ]
    failures: list[str] = []
    for group in status["groups"]:
        servers, creates = group["servers"], group["creates"]
        target = group["target_size"]
        lines.append(
            _row(
                [
                    group["id"],
                    str(group["min_size"]),
                    "-" if target is None else str(target),
                    str(group.get("reported_max_size", group["max_size"])),
                    str(servers["running"]),
                    str(servers["creating"]),
                    str(servers["deleting"]),
                    str(servers["error"]),
                    str(creates["queued"] + creates["sending"]),
                    str(creates["in_doubt"]),
                    str(creates["failed"]),
                ]
            )
        )
        failures += [
            f"  {group['id']}: {f['count']} x {f['code']} (class {f['class']}): {f['message']}"
            for f in group["failures"]
        ]
    lines.append(_quota_line(status["groups"]))
    lines.append("")
    lines.append("failures CA sees:" if failures else "failures CA sees: none")
    lines += failures
    queue = status["queue"]
    lines.append(
        f"queue: {queue['creates'] + queue['deletes']} of {queue['capacity']} "
        f"({queue['creates']} creates, {queue['deletes']} deletes); "
        f"workers busy: {queue['workers_busy']} of {queue['workers']}"
    )
    problems = status["problems"]
    lines.append(
        "servers needing a person: " + ", ".join(f"{name} {problems[name]}" for name in PROBLEMS)
    )
    lines += _group_problem_lines(status)
    lines.append(f"certificate reloads refused: {status['rejected_certificate_reloads']}")
    return "\n".join(lines) + "\n"
