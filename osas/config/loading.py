"""Reading the configuration: the YAML file (``--config`` or ``OSAS_CONFIG``) overridden by
``OSAS_*`` environment variables (``__`` between nested keys), validated whole before anything
starts, and every problem said in words that name the file, the key and the reason."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError

from osas.config.schema import ENV_PREFIX, OsasConfig

CONFIG_ENV = f"{ENV_PREFIX}CONFIG"


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


def yaml_document(path: Path) -> object:
    """The file read as YAML, whatever it holds; a ConfigError saying why it cannot be."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {_yaml_problem(exc)}") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    data = yaml_document(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    odd = [key for key in data if not isinstance(key, str)]
    if odd:
        # YAML reads `on:` as True and `1:` as 1; quote such keys to mean the words.
        raise ConfigError(f"{path}: {odd[0]!r}: keys must be strings (quote them)")
    return data


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


def _where(loc: tuple[int | str, ...], data: dict[str, Any]) -> str:
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


def load_config(path: Path) -> OsasConfig:
    """Read and validate the configuration. Problems with single keys are all reported at once
    in ConfigError; checks across keys (duplicate ids, tls vs insecure) follow once the keys
    themselves are valid."""
    data = _read_yaml(path)

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
        return _FromFile()
    except SettingsError as exc:
        raise ConfigError(f"{path}: an {ENV_PREFIX}* variable cannot be parsed: {exc}") from exc
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            reason = err["msg"].removeprefix("Value error, ")
            problems.append(f"{path}: {_where(loc, data)}: {reason}{_env_hint(loc)}")
        raise ConfigError("\n".join(problems)) from exc


def _env_hint(loc: tuple[int | str, ...]) -> str:
    """Say so when the offending key was set from the environment, not the file."""
    if not loc or not isinstance(loc[0], str):
        return ""
    prefix = f"{ENV_PREFIX}{loc[0].upper()}"
    names = sorted(name for name in os.environ if name == prefix or name.startswith(prefix + "__"))
    return f" (from {', '.join(names)})" if names else ""
