"""``osas status``: the ``/status`` document of the metrics port as one screen of text."""

from __future__ import annotations

from typing import Any

from osas.domain.problems import Problem

PROBLEMS = tuple(problem.value for problem in Problem)
# Servers needing a person listed one by one on the screen (``--json`` has more).
PROBLEM_SERVERS_ON_SCREEN = 10

# From RUNNING to FAILED the columns add up to TARGET, at every moment: listed servers by
# state, then creates in hand from accepted to sent (Nova answered, no listing shows the server
# yet) or in doubt, and failed until CA removes them. DELETING is outside the target.
_COLUMNS = (
    ("GROUP", 14),
    ("MIN", 4),
    ("TARGET", 7),
    ("MAX", 5),
    ("RUNNING", 9),
    ("BUILDING", 9),
    ("ERROR", 6),
    ("QUEUED", 7),
    ("SENT", 5),
    ("IN-DOUBT", 9),
    ("FAILED", 7),
    ("DELETING", 9),
)


def _row(cells: list[str]) -> str:
    return "".join(
        cell.ljust(width) if index == 0 else cell.rjust(width)
        for index, (cell, (_, width)) in enumerate(zip(cells, _COLUMNS, strict=True))
    ).rstrip()


def _span(seconds: float) -> str:
    if seconds < 120:  # noqa: PLR2004 - seconds read better up to two minutes
        return f"{seconds:.0f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{_span(seconds)} ago"


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
    offset = status["syncs"].get("nova_clock_offset_seconds")
    if offset is not None and abs(offset) > 5:  # noqa: PLR2004 - the threshold osas logs at
        lines.append(f"Nova's clock is {offset:+.0f}s off osas's (changes-since uses Nova's)")
    return lines


def _sync_lines(status: dict[str, Any]) -> list[str]:
    """The syncs with OpenStack, and while they fail, since when and why: one set of lines,
    or one per place where the node groups live in several, each saying its groups."""
    places = status.get("places") or []
    if len(places) <= 1:
        return _place_sync_lines(status, status, "")
    lines = []
    for place in places:
        where = f"{place['cloud']}, region {place['region'] or '(default)'}"
        prefix = f"{where} ({', '.join(place['groups'])}): "
        lines += _place_sync_lines(place, status, prefix)
    return lines


def _place_sync_lines(place: dict[str, Any], status: dict[str, Any], prefix: str) -> list[str]:
    """A place's syncs, how far they fail, and how long its scale-ups are still held."""
    syncs, age = place["syncs"], place["inventory_age_seconds"]
    lines = [
        (
            f"{prefix}last sync {_age(age)}; {syncs['full']} full, "
            f"{syncs['incremental']} incremental, {syncs['failures']} failed"
        )
    ]
    failing = syncs.get("failing_for_seconds")
    if failing is not None:
        line = (
            f"{prefix}OpenStack FAILING for {_span(failing)} "
            f"({syncs['consecutive_failures']} in a row)"
        )
        error = syncs["last_error"]
        # Before the first sync, the reason osas is not ready says it already.
        said = error and error in (status.get("not_ready_reason") or "")
        lines.append(line + ("; last error: above" if said else f"; last error: {error}"))
    held = place.get("scale_ups_held_seconds")
    if held is not None:
        until = f"for {held:.0f}s more" if held > 0 else "until a listing of it shows them"
        lines.append(
            f"{prefix}scale-ups held {until}: creates of an earlier osas may still reach Nova "
            "(MAX shows the max size CA is told)"
        )
    return lines


def _reload_lines(status: dict[str, Any]) -> list[str]:
    """A rejected reload of the configuration file: when, why, and what is in force; keys
    the file changes that wait for a restart."""
    lines = []
    restart = status.get("restart_needed_for") or []
    if restart:
        lines.append(
            f"RESTART NEEDED: the configuration file changes {', '.join(restart)}, which a "
            "reload does not apply; the values osas started with stay in force until a restart"
        )
    reload = status.get("config_reload")
    if reload is None or reload["result"] != "rejected":
        return lines
    reasons = str(reload["reason"]).splitlines() or [""]
    return [
        *lines,
        (
            f"configuration reload REJECTED {_age(reload['seconds_ago'])} ({reload['at']}); "
            "the configuration loaded before stays in force:"
        ),
        *(f"  {reason}" for reason in reasons),
    ]


def _problem_lines(status: dict[str, Any], shown: int) -> list[str]:
    """Servers needing a person: counts, then the first ``shown`` of them one by one."""
    problems = status["problems"]
    lines = [
        "servers needing a person: " + ", ".join(f"{name} {problems[name]}" for name in PROBLEMS)
    ]
    listed = status.get("problem_servers") or []
    for server in listed[:shown]:
        age = server["age_seconds"]
        lines.append(
            f"  {server['problem']} {server['group']}/{server['name'] or '?'} "
            f"(id {server['id']}, {'age unknown' if age is None else _span(age) + ' old'}, "
            f"for {_span(server['for_seconds'])}): {server['reason']}"
        )
    more = len(listed) - len(listed[:shown]) + status.get("problem_servers_not_shown", 0)
    if more:
        lines.append(f"  and {more} more")
    return lines


def _quota_line(groups: list[dict[str, Any]]) -> str:
    """How many more servers of each group the project's quota holds, and what bounds it; or
    that the quota has not been read (yet, or it cannot be), or sets no limit."""
    bounded, unlimited, unread = [], [], []
    for group in groups:
        room = group.get("quota_headroom")
        if room is None:
            unread.append(group["id"])
        elif room.get("servers") is None:
            unlimited.append(group["id"])
        else:
            limit = room.get("limited_by") or "?"
            bounded.append(f"{group['id']} {room['servers']} more ({limit})")
    if not bounded and not unlimited:
        return (
            "quota headroom: not read (not yet, or it cannot be: see the log; "
            "reconcile.quota_interval 0s never reads it); MAX is max_size"
        )
    parts = bounded + [f"{group_id} no limit" for group_id in unlimited]
    parts += [f"{group_id} not read" for group_id in unread]
    bound = "MAX is bounded by it" if bounded else "MAX is max_size"
    return "quota headroom: " + ", ".join(parts) + f" ({bound})"


def _warm_pool_lines(groups: list[dict[str, Any]]) -> list[str]:
    """Each group's warm pool, one line each: the state its servers wait in, how many are ready
    of those wanted, how many are on their way, and why it is not filling when it is short;
    warm servers left of a pool no longer configured."""
    lines = []
    for group in groups:
        pool = group.get("warm_pool") or {}
        servers = pool.get("servers", 0)
        if pool.get("state") is None:
            if servers:
                lines.append(
                    f"warm pool {group['id']}: none configured; {servers} warm server(s) of it "
                    "left, which osas deletes"
                )
            continue
        head = f"warm pool {group['id']} ({pool['state']})"
        if "wanted" not in pool:
            census = pool.get("by_status") or {}
            found = ", ".join(f"{name} {count}" for name, count in sorted(census.items()))
            lines.append(
                f"{head}: {servers} server(s){f' ({found})' if found else ''}; not judged yet "
                "(osas keeps pools once it has synced, and only while it may write)"
            )
            continue
        line = (
            f"{head}: ready {pool['ready']} of {pool['wanted']}, "
            f"preparing {pool['preparing']}, refilling {pool['refilling']}"
        )
        why_not = pool.get("why_not")
        lines.append(line + (f"; not filling: {why_not}" if why_not else ""))
    return lines


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
    config = status.get("config_file")
    lines = [
        f"cluster {status.get('cluster_name', '?')}" + (f" (config {config})" if config else ""),
        f"osas {status['version']}: {ready}",
        *_sync_lines(status),
        *_reload_lines(status),
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
                    str(servers["error"]),
                    str(creates["queued"]),
                    str(creates["sending"] + creates["created"]),
                    str(creates["in_doubt"]),
                    str(creates["failed"]),
                    str(servers["deleting"]),
                ]
            )
        )
        failures += [
            f"  {group['id']}: {f['count']} x {f['code']} (class {f['class']}): {f['message']}"
            for f in group["failures"]
        ]
    lines.append(_quota_line(status["groups"]))
    lines += _warm_pool_lines(status["groups"])
    lines.append("")
    lines.append("failures CA sees:" if failures else "failures CA sees: none")
    lines += failures
    queue = status["queue"]
    lines.append(
        f"queue: {queue['creates'] + queue['deletes']} of {queue['capacity']} "
        f"({queue['creates']} creates, {queue['deletes']} deletes); "
        f"workers busy: {queue['workers_busy']} of {queue['workers']}"
    )
    lines += _problem_lines(status, PROBLEM_SERVERS_ON_SCREEN)
    lines += _group_problem_lines(status)
    lines.append(f"certificate reloads refused: {status['rejected_certificate_reloads']}")
    return "\n".join(lines) + "\n"
