"""Reading the configuration: the YAML file (``--config`` or ``OSAS_CONFIG``) overridden by
``OSAS_*`` environment variables (``__`` between nested keys), validated whole before anything
starts, and every problem said in words that name the file, the key and the reason."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError

from osas.config.schema import ENV_PREFIX, KeyClash, OsasConfig
from osas.config.wording import reason
from osas.engine.userdata import SecretFiles, UserDataError

CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
_MERGE_TAG = "tag:yaml.org,2002:merge"

# A key's place in the file: ("node_groups", 1, "min_size").
Location = tuple[int | str, ...]


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, the key and the reason."""


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # noqa: ARG002 - signature set by pydantic-settings
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._data


@dataclass(frozen=True, slots=True)
class _Document:
    """The file's data, the line each key and list item starts on, and the keys a mapping
    gives more than once (with every line each is given on)."""

    data: dict[str, Any]
    lines: dict[Location, int] = field(default_factory=dict)
    repeated: list[tuple[Location, list[yaml.Mark]]] = field(default_factory=list)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def yaml_document(path: Path) -> object:
    """The file read as YAML, whatever it holds (keys given twice included: the last wins);
    a ConfigError saying why it cannot be. For ``osas status``, which wants one key of a file
    osas may have refused."""
    text = _read_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {_yaml_problem(exc)}") from None


def _read_yaml(path: Path) -> _Document:
    loader = yaml.SafeLoader(_read_text(path))
    try:
        node = loader.get_single_node()
        # The layout is read before the data is built: building merges `<<: *defaults` into
        # the mapping's own keys, which would then look given twice.
        document = _Document({})
        if node is not None:
            _lay_out(node, (), document, set())
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {_yaml_problem(exc)}") from None
    finally:
        loader.dispose()
    if data is None:
        return document
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    odd = [key for key in data if not isinstance(key, str)]
    if odd:
        # YAML reads `on:` as True and `1:` as 1; quote such keys to mean the words.
        raise ConfigError(f"{path}: {odd[0]!r}: keys must be strings (quote them)")
    if document.repeated:
        # YAML keeps the last of a key given twice and drops the others without a word: a
        # second `node_groups:` block would silently replace the first.
        raise ConfigError(
            "\n".join(
                f"{path}: {_where(at, data)}: duplicate key at {_places(marks)} (YAML would "
                "keep the last and drop the others unseen); keep one"
                for at, marks in sorted(document.repeated, key=lambda repeat: repeat[1][0].index)
            )
        )
    return _Document(data, document.lines)


def _lay_out(node: yaml.Node, at: Location, document: _Document, seen: set[int]) -> None:
    """Record where each key and list item under ``node`` starts, and every key a mapping
    gives twice. A node reached again through an alias is not walked again."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            document.lines.setdefault((*at, index), item.start_mark.line + 1)
            _lay_out(item, (*at, index), document, seen)
    elif isinstance(node, yaml.MappingNode):
        given: dict[tuple[str, str], list[yaml.Mark]] = {}
        for key, value in node.value:
            if key.tag == _MERGE_TAG:
                # `<<: *defaults`: the keys given beside it override its own, no clash.
                merged = _Document({})
                _lay_out(value, at, merged, seen)
                document.repeated.extend(merged.repeated)
                continue
            if not isinstance(key, yaml.ScalarNode):
                continue
            given.setdefault((key.tag, key.value), []).append(key.start_mark)
            document.lines.setdefault((*at, key.value), key.start_mark.line + 1)
            _lay_out(value, (*at, key.value), document, seen)
        document.repeated.extend(
            ((*at, name), marks) for (_, name), marks in given.items() if len(marks) > 1
        )


def _places(marks: list[yaml.Mark]) -> str:
    """``lines 3 and 9``; ``line 4, column 9 and line 4, column 15`` on one line."""
    lines = [mark.line + 1 for mark in marks]
    if len(set(lines)) == len(lines):
        return f"lines {_listed([str(line) for line in lines])}"
    return _listed([_position(mark) for mark in marks])


def _listed(words: list[str]) -> str:
    """a and b; a, b and c."""
    return f"{', '.join(words[:-1])} and {words[-1]}"


# What kind of mistake each YAML error class means, in words that quote nothing of the file.
_YAML_PROBLEMS: tuple[tuple[type[yaml.YAMLError], str], ...] = (
    (yaml.scanner.ScannerError, "a token cannot be read (an unclosed quote, a tab, a stray ':')"),
    (yaml.parser.ParserError, "the structure does not parse (indentation, a missing ':' or '-')"),
    (yaml.composer.ComposerError, "an alias or document does not fit"),
    (yaml.constructor.ConstructorError, "a value cannot be built (an unknown tag)"),
    (yaml.reader.ReaderError, "a character YAML does not allow"),
)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where the YAML breaks and what kind of mistake it is. Never yaml's own message: it
    quotes the offending line, which may be the one holding a password."""
    kind = next((text for cls, text in _YAML_PROBLEMS if isinstance(exc, cls)), "")
    problem = getattr(exc, "problem_mark", None)
    context = getattr(exc, "context_mark", None)
    where = f" at {_position(problem)}" if problem else ""
    if context and (not problem or context.line != problem.line):
        # An unclosed quote is noticed where the file ends; where it opened is the useful part.
        where += f" (in what starts at {_position(context)})"
    return f"not valid YAML{where}" + (f": {kind}" if kind else "")


def _position(mark: yaml.Mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _where(loc: Location, data: dict[str, Any]) -> str:
    """``node_groups[1](gpu).min_size`` rather than ``node_groups.1.min_size``."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            node = node[item] if isinstance(node, list) and item < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                label += f"({node['id']})"
            parts.append(label)
        else:
            parts.append(f".{item}" if parts else item)
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"


def load_config(path: Path, *, read_files: bool = True) -> OsasConfig:
    """Read and validate the configuration. Problems with single keys are all reported at once
    in ConfigError; checks across keys (duplicate ids, tls vs insecure) follow once the keys
    themselves are valid, and then every file a node group's user data is read from must be
    readable as user data. ``read_files=False`` leaves those files alone: a configuration
    written for another machine (the chart's, rendered) checked here."""
    document = _read_yaml(path)
    data = document.data

    class _FromFile(OsasConfig):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,  # noqa: ARG003
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003
            file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            # Environment first: OSAS_* variables override the file.
            return (env_settings, _YamlSource(settings_cls, data))

    try:
        config = _FromFile()
    except SettingsError as exc:
        raise ConfigError(f"{path}: an {ENV_PREFIX}* variable cannot be parsed: {exc}") from exc
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            why = reason(err)
            clash = err.get("ctx", {}).get("error")
            if isinstance(clash, KeyClash):
                first, loc = (*loc, *clash.first), (*loc, *clash.key)
                why += _clash_lines(loc, first, document) + _env_hint(loc)
            else:
                why += _env_hint(loc) or _line_hint(loc, err["type"], document)
            problems.append(f"{path}: {_where(loc, data)}: {why}")
        raise ConfigError("\n".join(problems)) from exc
    unreadable = _unreadable_user_data(config, data) if read_files else []
    if unreadable:
        raise ConfigError("\n".join(f"{path}: {problem}" for problem in unreadable))
    return config


def _clash_lines(key: Location, first: Location, document: _Document) -> str:
    """`` (line 30; first at node_groups[0](workers).id, line 12)``: with the lines when the
    file, not the environment, gave the keys."""
    where = _where(first, document.data)
    if _env_names(key):
        return f" (first at {where})"
    return f" (line {_line(key, document)}; first at {where}, line {_line(first, document)})"


def _line_hint(at: Location, kind: str, document: _Document) -> str:
    """`` (line 12)``, where the file gives the key; for a key it lacks, where the block that
    lacks it starts."""
    if kind == "missing":
        block = at[:-1]
        return f" (in the block at line {_line(block, document)})" if block else ""
    return f" (line {_line(at, document)})" if at in document.lines else ""


def _line(at: Location, document: _Document) -> int:
    """The line ``at`` starts on, or its closest enclosing key or item's (a key merged in
    from `<<: *defaults` has no line of its own there)."""
    while at and at not in document.lines:
        at = at[:-1]
    return document.lines.get(at, 1)


def _unreadable_user_data(config: OsasConfig, data: dict[str, Any]) -> list[str]:
    """Each file a node group's user data is read from that cannot be (missing, unreadable,
    too large, not UTF-8), said as a create would say it: otherwise osas would start, or
    take a reload, and then fail every create of the group."""
    files = SecretFiles()
    sources: list[tuple[Location, Path]] = []
    for index, group in enumerate(config.node_groups):
        if group.user_data_file is not None:
            sources.append((("node_groups", index, "user_data_file"), group.user_data_file))
        sources += [
            (("node_groups", index, "user_data_vars", name), file)
            for name, file in group.user_data_vars.items()
        ]
    problems = []
    for at, file in sources:
        try:
            files.read(str(file), _where(at, data))
        except UserDataError as exc:
            problems.append(f"{exc}{_env_hint(at)}")
    return problems


def _env_hint(loc: Location) -> str:
    """Say so when the offending key was set from the environment, not the file."""
    names = _env_names(loc)
    return f" (from {', '.join(names)})" if names else ""


def _env_names(loc: Location) -> list[str]:
    """The OSAS_* variables that set the top-level key of ``loc`` or a key under it."""
    if not loc or not isinstance(loc[0], str):
        return []
    prefix = f"{ENV_PREFIX}{loc[0].upper()}"
    return sorted(name for name in os.environ if name == prefix or name.startswith(prefix + "__"))
