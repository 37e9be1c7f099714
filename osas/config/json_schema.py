"""The configuration file as a JSON schema (draft-07), generated from ``schema``'s models, and
its defaults: what the Helm chart's ``values.schema.json`` checks under ``config``, so that the
chart refuses the values osas would refuse. Rules across keys stay osas's own (and the chart's
templates'): a JSON schema cannot compare two values.

Self-contained (no ``$ref``: the chart nests it under ``config``), without pydantic's titles and
class docstrings; durations as osas reads them (``30s``, ``5m``, seconds)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from osas.config.schema import BootstrapTokenConfig, OsasConfig

_DRAFT = "http://json-schema.org/draft-07/schema#"


def config_json_schema() -> dict[str, Any]:
    """The schema of osas's configuration file."""
    raw = OsasConfig.model_json_schema(schema_generator=_FileSchema)
    definitions = raw.pop("$defs", {})
    for definition in definitions.values():
        # A class's docstring is for osas's readers, not the file's.
        definition.pop("description", None)
    schema = _inline(raw, definitions)
    schema.pop("description", None)
    return {"$schema": _DRAFT, **schema}


def config_defaults() -> dict[str, Any]:
    """Every default of the file, nested as the file nests keys, durations in seconds; and a
    node group's ``bootstrap_token`` block's, which the chart's checks compare."""
    return {**_defaults_of(OsasConfig), "bootstrap_token": _defaults_of(BootstrapTokenConfig)}


class _FileSchema(GenerateJsonSchema):
    def encode_default(self, dft: Any) -> Any:
        if isinstance(dft, timedelta):
            return _duration_text(dft)
        return super().encode_default(dft)


def _duration_text(value: timedelta) -> str:
    """A duration as the file writes it: 90s -> 1m30s, 3600s -> 1h, 0 -> 0s."""
    seconds = value.total_seconds()
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{hours:g}h" if hours else "", f"{minutes:g}m" if minutes else ""]
    parts.append(f"{seconds:g}s" if seconds or not any(parts) else "")
    return "".join(parts)


def _inline(node: Any, definitions: dict[str, Any]) -> Any:
    """``node`` with every ``$ref`` replaced by its definition, pydantic's noise removed, and a
    mapping's key pattern as ``propertyNames`` (``patternProperties`` lets other keys by)."""
    if isinstance(node, list):
        return [_inline(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    reference = node.get("$ref")
    if isinstance(reference, str):
        target = definitions[reference.removeprefix("#/$defs/")]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (key == "format" and value == "path"):
            continue
        if key == "default" and not isinstance(value, str | int | float | bool):
            continue  # objects, lists and nulls say nothing a reader needs
        if key == "patternProperties" and isinstance(value, dict) and len(value) == 1:
            ((pattern, item),) = value.items()
            names = out.setdefault("propertyNames", {})
            names["pattern"] = pattern
            out["additionalProperties"] = _inline(item, definitions)
            continue
        if key == "propertyNames" and "propertyNames" in out:
            out[key] = {**_inline(value, definitions), **out[key]}
            continue
        out[key] = (
            _inline(value, definitions) if key != "properties" else _properties(value, definitions)
        )
    return out


def _properties(properties: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    # Keys here are the file's words, never schema keywords: "title" may be a key.
    return {name: _inline(schema, definitions) for name, schema in properties.items()}


def _defaults_of(model: type[BaseModel]) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.is_required():
            continue
        value = field.get_default(call_default_factory=True)
        defaults[field.alias or name] = _plain(value)
    return defaults


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {
            field.alias or name: _plain(getattr(value, name))
            for name, field in type(value).model_fields.items()
        }
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value
