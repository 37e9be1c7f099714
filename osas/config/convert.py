"""Between the file's models and the value classes the engine, ledger, cloud, server and
domain use: each default is read from its value class (written there once), and each value
class is built from the model whose fields carry the same names, by one conversion.

A model and its value class name their fields alike (``reconcile.interval`` is
``ReconcileSettings.interval``), so nothing is copied by hand; a test keeps the two lists of
names equal. The one value not read by name is given where it is derived, in ``schema``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

_Value = TypeVar("_Value")


def default_of(cls: type[Any], name: str) -> Any:
    """The default the value class ``cls`` gives ``name``, for the file's schema."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            break
    raise LookupError(f"{cls.__name__}.{name} has no default")


def default_duration(cls: type[Any], name: str) -> timedelta:
    """A default the value class holds in seconds, as the file's duration."""
    return timedelta(seconds=default_of(cls, name))


def as_values(cls: type[_Value], model: BaseModel, **derived: Any) -> _Value:
    """``cls`` built from the model's fields of the same names, each converted to the type
    ``cls`` declares; a field the model does not offer keeps the class's default, unless
    ``derived`` gives it."""
    hints = typing.get_type_hints(cls)
    offered = type(model).model_fields
    values = {
        item.name: _as_value(getattr(model, item.name), hints[item.name])
        for item in dataclasses.fields(cls)  # type: ignore[arg-type]
        if item.init and item.name in offered
    }
    return cls(**values, **derived)


def _as_value(value: Any, hint: Any) -> Any:
    """A validated value as the plain value ``hint`` asks for: a model as its value class,
    lists as tuples, paths as text, durations as seconds where the value class counts them."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
        origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        # A block the file validates straight into its value class (openstack.auth) is one.
        return value if isinstance(value, hint) else as_values(hint, value)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_as_value(element, item) for element in value)
    if origin in (Mapping, dict):
        item = typing.get_args(hint)[1]
        return {key: _as_value(element, item) for key, element in value.items()}
    return _as_scalar(value, hint)


def _as_scalar(value: Any, hint: Any) -> Any:
    if hint is str and isinstance(value, Path):
        return str(value)
    if hint is float and isinstance(value, timedelta):
        return value.total_seconds()
    return value
