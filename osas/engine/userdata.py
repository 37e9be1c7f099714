"""User data for one new server: an inline template or a template file, with variables whose
values are read from files (a mounted Secret), so that no bootstrap secret ever sits in the
configuration. Files are read when a create is built and read again only once they changed."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from osas.domain.specs import NodeGroupSpec

# Nova caps user data at 65535 bytes once base64-encoded; a larger file can never fit.
USER_DATA_MAX = 65535
BUILTIN_VARIABLES = frozenset({"server_name", "node_group", "cluster_name"})
# Filled in only for a group with ``bootstrap_token``: the token minted for the server.
BOOTSTRAP_TOKEN_VARIABLE = "bootstrap_token"  # noqa: S105 - a variable's name
# A token's shape (kubeadm's ``[a-z0-9]{6}.[a-z0-9]{16}``), for builds that only measure.
TOKEN_OF_ITS_SIZE = "abcdef.0123456789abcdef"  # noqa: S105 - a stand-in of a token's length


class UserDataError(Exception):
    """The user data of a create cannot be built. The message names the group, the file and
    the reason (size, missing, not UTF-8, not JSON), never any of the files' content."""


@dataclass(frozen=True, slots=True)
class _Read:
    stamp: tuple[int, int, int, int]
    text: str


def relative_note(path: str | Path) -> str:
    """Where a relative path is read from, said: the working directory, not the folder of the
    configuration file that names it."""
    if Path(path).is_absolute():
        return ""
    return f" (a relative path: read from the working directory, {Path.cwd()})"


class SecretFiles:
    """Small files read at each use and re-read only when they changed. A Secret update swaps
    the ``..data`` symlink behind the mounted path, so what ``stat`` sees through the path (inode,
    device, size, modification time) changes with it."""

    def __init__(self) -> None:
        self._read: dict[str, _Read] = {}

    def read(self, path: str, what: str) -> str:
        try:
            info = Path(path).stat()
        except FileNotFoundError:
            raise UserDataError(f"{what}: {path} does not exist{relative_note(path)}") from None
        except OSError as exc:
            raise UserDataError(
                f"{what}: {path} cannot be read: {exc.strerror}{relative_note(path)}"
            ) from None
        stamp = (info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns)
        cached = self._read.get(path)
        if cached is not None and cached.stamp == stamp:
            return cached.text
        if info.st_size > USER_DATA_MAX:
            raise UserDataError(
                f"{what}: {path} is {info.st_size} bytes; user data is at most "
                f"{USER_DATA_MAX} bytes once base64-encoded"
            )
        try:
            with Path(path).open("rb") as file:
                raw = file.read(USER_DATA_MAX + 1)
        except OSError as exc:
            raise UserDataError(f"{what}: {path} cannot be read: {exc.strerror}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserDataError(f"{what}: {path} is not UTF-8 text (byte {exc.start})") from None
        self._read[path] = _Read(stamp, text)
        return text


@dataclass(frozen=True, slots=True)
class Unfilled:
    """A ``${name}`` of a template that names no variable: osas leaves it as written."""

    name: str
    line: int

    def __str__(self) -> str:
        return f"${{{self.name}}} (line {self.line})"


def token_in_user_data(spec: NodeGroupSpec) -> bool:
    """Whether the group's minted join token is filled in its user data: not for a group
    with a warm pool, whose servers get theirs in metadata at their claim (``node_metadata``)."""
    return spec.bootstrap_token is not None and spec.warm_pool is None


def template_variables(spec: NodeGroupSpec) -> frozenset[str]:
    """The variables a group's template may name besides osas's own: its ``user_data_vars``,
    and the minted token where the group fills one in."""
    minted = {BOOTSTRAP_TOKEN_VARIABLE} if token_in_user_data(spec) else set()
    return frozenset(spec.user_data_vars).union(minted)


def mints_unused_tokens(spec: NodeGroupSpec, template: str) -> bool:
    """The group mints a join token per create that its template never fills in."""
    return token_in_user_data(spec) and f"${{{BOOTSTRAP_TOKEN_VARIABLE}}}" not in template


def warm_fingerprint(spec: NodeGroupSpec, files: SecretFiles) -> str:
    """What a warm server of the group is prepared from, in a few characters (the warm
    mark's value): its image, flavor, networks and the rest of its create, its user data
    template and variables, its labels, taints and the state it waits in. A server prepared
    from anything else is replaced. Raises UserDataError as ``build_user_data`` does."""
    read = read_template(spec, files)
    variables = {
        variable: files.read(path, f"node group {spec.group_id!r}: user_data_vars.{variable}")
        for variable, path in sorted(spec.user_data_vars.items())
    }
    boot = spec.boot_volume
    described = {
        "flavor": spec.flavor,
        "image": spec.image,
        "networks": list(spec.networks),
        "key_name": spec.key_name,
        "security_groups": list(spec.security_groups),
        "availability_zone": spec.availability_zone,
        "server_group": spec.server_group,
        "boot_volume": None if boot is None else [boot.size_gib, boot.volume_type],
        "metadata": dict(spec.metadata),
        "labels": dict(spec.labels),
        "taints": [[t.key, t.value, t.effect.value] for t in spec.taints],
        "state": None if spec.warm_pool is None else spec.warm_pool.state.value,
        "format": spec.user_data_format,
        "template": None if read is None else read[0],
        "variables": variables,
    }
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    return f"v1-{digest[:32]}"


def unfilled_placeholders(template: str, variables: Iterable[str]) -> tuple[Unfilled, ...]:
    """Every ``${name}`` in ``template`` that neither ``variables`` nor osas fills, with its
    line. Only the braced form counts: ``$name`` is how a shell variable is written, and
    ``$${name}`` is the escape for a braced one."""
    known = BUILTIN_VARIABLES.union(variables)
    return tuple(
        Unfilled(match["braced"], template.count("\n", 0, match.start()) + 1)
        for match in Template.pattern.finditer(template)
        if match["braced"] is not None and match["braced"] not in known
    )


def unfilled_hint(spec: NodeGroupSpec, unfilled: Iterable[Unfilled]) -> str:
    """What to do about ``unfilled``: name the variable, or escape it for the shell."""
    names = sorted({placeholder.name for placeholder in unfilled})
    declared = ", ".join(sorted(spec.user_data_vars)) or "none"
    if BOOTSTRAP_TOKEN_VARIABLE in names and spec.bootstrap_token is None:
        return (
            f"${{{BOOTSTRAP_TOKEN_VARIABLE}}} is filled only for a group with a bootstrap_token "
            "block (a token minted per server): add one, or name the variable in user_data_vars"
        )
    escaped = ", ".join(f"$${{{name}}}" for name in names)
    return (
        f"name it in user_data_vars (this group's: {declared}; osas itself fills "
        f"{', '.join(sorted(BUILTIN_VARIABLES))}), or, if the shell is meant to expand it, "
        f"write {escaped}"
    )


def render_user_data(
    template: str, *, cluster_name: str, group_id: str, name: str, **variables: str
) -> str:
    """``${server_name}``, ``${node_group}``, ``${cluster_name}`` and the given variables filled
    in; anything else that looks like a placeholder is left as written."""
    return Template(template).safe_substitute(
        variables, server_name=name, node_group=group_id, cluster_name=cluster_name
    )


def _in_strings(node: Any, values: dict[str, str]) -> Any:
    """The JSON document with placeholders filled in its string values only."""
    if isinstance(node, str):
        return Template(node).safe_substitute(values)
    if isinstance(node, list):
        return [_in_strings(item, values) for item in node]
    if isinstance(node, dict):
        return {key: _in_strings(item, values) for key, item in node.items()}
    return node


def read_template(spec: NodeGroupSpec, files: SecretFiles) -> tuple[str, str] | None:
    """The group's template and where it comes from (its file, or ``user_data``); None when
    the group has no user data. Raises UserDataError when the file cannot be read."""
    if spec.user_data_file is not None:
        where = f"node group {spec.group_id!r}: user_data_file"
        return files.read(spec.user_data_file, where), spec.user_data_file
    if spec.user_data is not None:
        return spec.user_data, "user_data"
    return None


def build_user_data(
    spec: NodeGroupSpec,
    *,
    cluster_name: str,
    name: str,
    files: SecretFiles,
    bootstrap_token: str | None = None,
) -> str | None:
    """The user data of one server of ``spec``, or None when the group has none;
    ``bootstrap_token`` is the token minted for it, required for a group that has one.

    Raises UserDataError when a file is missing, unreadable or too large, when a ``json``
    template is not JSON, or when the result exceeds what Nova accepts."""
    group = spec.group_id
    if token_in_user_data(spec) != (bootstrap_token is not None):
        raise ValueError(f"node group {group!r}: a minted token goes with a bootstrap_token block")
    read = read_template(spec, files)
    if read is None:
        return None
    template, source = read
    values = {
        variable: files.read(path, f"node group {group!r}: user_data_vars.{variable}").rstrip(
            "\r\n"
        )
        for variable, path in spec.user_data_vars.items()
    }
    values.update(server_name=name, node_group=group, cluster_name=cluster_name)
    if bootstrap_token is not None:
        values[BOOTSTRAP_TOKEN_VARIABLE] = bootstrap_token
    if spec.user_data_format == "json":
        try:
            document = json.loads(template)
        except json.JSONDecodeError as exc:
            raise UserDataError(
                f"node group {group!r}: {source} is not JSON: {exc.msg} at line {exc.lineno}, "
                f"column {exc.colno}"
            ) from None
        text = json.dumps(_in_strings(document, values), ensure_ascii=False)
    else:
        text = Template(template).safe_substitute(values)
    encoded = len(base64.b64encode(text.encode()))
    if encoded > USER_DATA_MAX:
        raise UserDataError(
            f"node group {group!r}: the user data from {source} is {encoded} bytes "
            f"base64-encoded once filled in; Nova accepts {USER_DATA_MAX}"
        )
    return text
