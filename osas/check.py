"""``osas check-config``: the configuration validated, its TLS files checked as a handshake would
use them, and every name it uses resolved in the cloud, before anything is deployed.

It checks everything it can and reports every problem, then exits with the code of the first
check that failed, in this order: TLS files (4), user data (1), join tokens (1), the
cloud (3), names not found in it (1). An invalid configuration (2) stops it before any of
them. ``osas serve`` uses the same codes."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TextIO

import anyio

from osas.app import join_tokens_for
from osas.cloud.errors import CloudError
from osas.cloud.port import VERIFY_WAITS_FOR, Cloud, Reference
from osas.config import ConfigError, OsasConfig, Place
from osas.domain.quota import QuotaBook
from osas.domain.servers import Flavor
from osas.domain.specs import NodeGroupSpec
from osas.election.port import JoinTokenError
from osas.engine.userdata import (
    TOKEN_OF_ITS_SIZE,
    SecretFiles,
    UserDataError,
    build_user_data,
    mints_unused_tokens,
    read_template,
    template_variables,
    token_in_user_data,
    unfilled_hint,
    unfilled_placeholders,
)
from osas.service.tls import CertificateError, inspect_files

EXIT_OK = 0
EXIT_FAILED = 1  # check-config: names not found in the cloud, user data that cannot be built
EXIT_CONFIG = 2
EXIT_CLOUD = 3
EXIT_TLS = 4
# Each request check-config sends to OpenStack waits at most this long, and is sent once: a
# Keystone that accepts connections and never answers costs two of them (discovery, token).
CHECK_REQUEST_TIMEOUT = 5.0
# While the cloud's check has no answer, a line after this long, then this often.
CHECK_FIRST_PROGRESS = 3.0
CHECK_PROGRESS_EVERY = 5.0


class Report:
    """check-config's output as it comes, and its problems, kept for the one line on stderr
    that ends a failed check (``summary``)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.problems: list[str] = []

    def write(self, text: str) -> None:
        self._out.write(text)

    def progress(self, text: str) -> None:
        """A line of what is going on, shown at once (stdout may be a pipe)."""
        self._out.write(text)
        self._out.flush()

    def problem(self, section: str, text: str) -> None:
        """One problem: a ``PROBLEM`` line in the output, and kept for the summary."""
        self._out.write(f"{section}: PROBLEM: {text}\n")
        self.problems.append(f"{section}: {text}")

    def summary(self) -> str:
        count = len(self.problems)
        first = self.problems[0] if self.problems else "see the output above"
        return (
            f"{count} problem(s) (each above, marked PROBLEM or NOT FOUND); the first: "
            f"{first}; fix it and run osas check-config again"
        )


def check_tls(config: OsasConfig, out: Report) -> int:
    """The TLS files: readable, key matching the certificate, valid now (a warning within a
    week of the end), covering ``tls.server_names``, a client CA that is a certificate."""
    tls = config.server_settings().tls
    if tls is None:
        out.write("tls: off (insecure: true)\n\n")
        return EXIT_OK
    now = datetime.now(UTC)
    try:
        identity = inspect_files(tls, now)
    except CertificateError as exc:
        out.problem("tls", str(exc))
        out.write("\n")
        return EXIT_TLS
    names = ", ".join(identity.names()) or "no names"
    out.write(f"tls: ok: {tls.cert_file} names {names}, valid until {identity.not_after:%Y-%m-%d}")
    if tls.server_names:
        out.write(f", covers tls.server_names ({', '.join(tls.server_names)})\n")
    else:
        out.write("\ntls: note: set tls.server_names to the host of CA's address to check it\n")
    warning = identity.expiry_warning(now)
    if warning:
        out.write(f"tls: WARNING: {warning}\n")
    out.write("\n")
    return EXIT_OK


async def reach_cloud(cloud: Cloud, wait: float) -> str:
    """The cloud's description once it answers. With ``wait`` > 0, a cloud that cannot be used
    yet (its API still starting, its clouds.yaml not written yet) is tried again every second
    until ``wait`` seconds have passed; then the last failure stands."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return await cloud.verify()
        except CloudError:
            if time.monotonic() >= deadline:
                raise
        await anyio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


async def check_cloud(
    config: OsasConfig,
    cloud: Cloud,
    out: Report,
    *,
    wait: float = 0.0,
    place: Place | None = None,
) -> int:
    """Print one row per resource each node group names; 0 when all are found, 1 when some are
    not, 3 when the cloud cannot be used at all. With ``place``, the groups that live there,
    under a line saying which place it is."""
    groups = config.cluster_spec().node_groups
    section = "cloud"
    if place is not None:
        groups = tuple(spec for spec in groups if spec.group_id in place.group_ids)
        section = f"cloud {place.cloud} region {place.region or '(default)'}"
        names = ", ".join(place.group_ids) or "none; the top-level openstack block's"
        out.write(f"place: {place} (node groups: {names})\n")
    try:
        described = await _reach_saying_so(cloud, out, wait)
        rows: list[tuple[str, Reference]] = []
        for spec in groups:
            rows += [(spec.group_id, ref) for ref in await cloud.resolve(spec)]
        headroom = await _headroom_rows(cloud, groups)
    except CloudError as exc:
        out.problem(section, f"the cloud cannot be used: {exc}")
        return EXIT_CLOUD
    finally:
        await cloud.close()
    out.write(f"{section}: {described}\n\n")
    table = [("NODE GROUP", "KIND", "NAME", "RESULT")] + [
        (group, ref.kind, ref.name, f"ok ({ref.resource_id})" if ref.found else "NOT FOUND")
        for group, ref in rows
    ]
    _write_table(table, out)
    out.write("\n")
    if isinstance(headroom, str):
        out.write(f"quota: cannot be read ({headroom}); max sizes are not bounded by it\n")
    else:
        rows_of_quota, unread = headroom
        out.write("quota: what the project can still hold, as CA will be told\n")
        _write_table([("NODE GROUP", "MAX SIZE", "HEADROOM", "LIMITED BY"), *rows_of_quota], out)
        for resource, reason in unread.items():
            out.write(f"quota: {resource} cannot be read ({reason}); it bounds nothing\n")
    missing = [(group, ref) for group, ref in rows if not ref.found]
    out.problems.extend(
        f"{section}: node group {group!r}: {ref.kind} {ref.name!r} not found"
        for group, ref in missing
    )
    out.write(f"\n{len(missing)} problem(s)\n" if missing else "\nall resources found\n")
    return EXIT_FAILED if missing else EXIT_OK


async def _reach_saying_so(cloud: Cloud, out: Report, wait: float) -> str:
    """``reach_cloud``, with a line now and then while no answer comes."""
    failure: CloudError | None = None
    described = ""
    async with anyio.create_task_group() as waiting:
        waiting.start_soon(_say_while_waiting, cloud, out)
        try:
            described = await reach_cloud(cloud, wait)
        except CloudError as exc:
            failure = exc  # raised as itself below, not inside the task group's exception group
        waiting.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return described


async def _say_while_waiting(cloud: Cloud, out: Report) -> None:
    """A line while OpenStack has not answered the cloud's check: a cloud that accepts
    connections and never answers would otherwise leave the screen blank until the timeouts."""
    began = time.monotonic()
    await anyio.sleep(CHECK_FIRST_PROGRESS)
    while True:
        retrying = cloud.retrying()
        out.progress(
            f"cloud: waiting {time.monotonic() - began:.0f}s for OpenStack's answer to "
            f"{VERIFY_WAITS_FOR}: "
            + (retrying or f"no answer yet; each request waits up to {CHECK_REQUEST_TIMEOUT:g}s")
            + "\n"
        )
        await anyio.sleep(CHECK_PROGRESS_EVERY)


async def _headroom_rows(
    cloud: Cloud, groups: tuple[NodeGroupSpec, ...]
) -> tuple[list[tuple[str, ...]], Mapping[str, str]] | str:
    """Each group's headroom in the project's quota now, and what of it could not be read;
    or why the quota cannot be read at all."""
    server_groups = sorted({spec.server_group for spec in groups if spec.server_group})
    volumes = any(spec.boot_volume is not None for spec in groups)
    try:
        quota = await cloud.get_quota(server_groups, volumes=volumes)
    except CloudError as exc:
        return str(exc)
    flavors: dict[str, Flavor | None] = {}
    for spec in groups:
        flavors[spec.group_id] = await cloud.get_flavor(spec.flavor)
    book = QuotaBook()
    book.read(quota, {})
    rows: list[tuple[str, ...]] = []
    for spec in groups:
        room = book.headroom(spec, groups, flavors)
        count = "no limit" if room.count is None else str(room.count)
        rows.append((spec.group_id, str(spec.max_size), count, room.limiting() or "-"))
    return rows, quota.unread


def _write_table(table: Sequence[tuple[str, ...]], out: Report) -> None:
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    for row in table:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        out.write("\n")


def check_user_data(config: OsasConfig, out: Report) -> int:
    """Each group's user data built as for a create (files read, variables filled in, the size
    checked), and every ``${name}`` it would leave as written; the content is never printed."""
    files = SecretFiles()
    problems = 0
    for spec in config.cluster_spec().node_groups:
        group = spec.group_id
        name = f"{config.cluster_name}-{group}-check"
        try:
            token = TOKEN_OF_ITS_SIZE if token_in_user_data(spec) else None
            text = build_user_data(
                spec,
                cluster_name=config.cluster_name,
                name=name,
                files=files,
                bootstrap_token=token,
            )
            read = read_template(spec, files)  # as read for the build: not read twice
        except UserDataError as exc:
            out.problem("user data", str(exc))
            problems += 1
            continue
        if text is None or read is None:
            continue
        template, source = read
        if mints_unused_tokens(spec, template):
            out.problem(
                "user data",
                f"node group {group!r}: {source} never says ${{bootstrap_token}}, yet "
                "bootstrap_token mints a token for each create",
            )
            problems += 1
            continue
        unfilled = unfilled_placeholders(template, template_variables(spec))
        for placeholder in unfilled:
            out.problem(
                "user data",
                f"node group {group!r}: {source} line {placeholder.line}: "
                f"${{{placeholder.name}}} names no variable; osas leaves it as written",
            )
        if unfilled:
            out.write(f"user data:   fix: {unfilled_hint(spec, unfilled)}\n")
            problems += 1
            continue
        out.write(f"user data: ok: node group {group!r}, {len(text.encode())} bytes\n")
    out.write("\n")
    return EXIT_FAILED if problems else EXIT_OK


async def check_join_tokens(config: OsasConfig, out: Report) -> int:
    """For the groups with ``bootstrap_token``: a token minted as a create would, judged by
    the API server in full (RBAC, admission policies) and stored nowhere (a dry run)."""
    specs = [
        (spec.group_id, spec.bootstrap_token.ttl)
        for spec in config.cluster_spec().node_groups
        if spec.bootstrap_token is not None
    ]
    try:
        tokens = join_tokens_for(config, None)
    except ConfigError as exc:
        out.problem("join tokens", str(exc))
        out.write("\n")
        return EXIT_FAILED
    if tokens is None:  # no group mints: nothing to rehearse
        return EXIT_OK
    problems = 0
    try:
        for group, ttl in specs:
            try:
                name = await tokens.rehearse(group_id=group, ttl=ttl)
            except JoinTokenError as exc:
                out.problem("join tokens", f"node group {group!r}: {exc}")
                problems += 1
                continue
            out.write(
                f"join tokens: ok: node group {group!r}: a Secret like {name} would be "
                f"admitted (dry run), valid {ttl:.0f}s\n"
            )
    finally:
        await tokens.aclose()
    out.write("\n")
    return EXIT_FAILED if problems else EXIT_OK


async def check_config(
    config: OsasConfig,
    clouds: Sequence[tuple[Place, Cloud]],
    out: Report,
    *,
    wait: float = 0.0,
) -> int:
    """Every check, every problem reported; the exit code of the first that failed. ``clouds``:
    a cloud adapter for each place the node groups live in (``places_of``), each checked with
    the groups that live there. ``wait``: see :func:`reach_cloud`."""
    codes = [
        check_tls(config, out),
        check_user_data(config, out),
        await check_join_tokens(config, out),
    ]
    several = len(clouds) > 1
    for place, cloud in clouds:
        code = await check_cloud(config, cloud, out, wait=wait, place=place if several else None)
        codes.append(code)
        if several:
            out.write("\n")
    return next((code for code in codes if code != EXIT_OK), EXIT_OK)
