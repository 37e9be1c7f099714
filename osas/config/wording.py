"""What a refused key means, in the file's words rather than pydantic's: a key osas does not
know says which one was meant, a value of the wrong form says what form it takes, a missing
one says it is required."""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from osas.config.schema import ADDRESS_PATTERN, CLIENT_PATTERN, OsasConfig
from osas.domain.ids import NAME_MAX_LENGTH, NAME_PATTERN

Location = tuple[int | str, ...]

# The forms a pattern stands for, said as a person would write them.
_FORMS = {
    ADDRESS_PATTERN: "HOST:PORT (for example 127.0.0.1:8086, 0.0.0.0:8086 or [::]:8086)",
    NAME_PATTERN: (
        f"a name of lowercase letters, digits and '-', starting and ending with a letter or "
        f"digit, at most {NAME_MAX_LENGTH} characters"
    ),
    CLIENT_PATTERN: "dns:NAME, uri:URI or cn:NAME",
}
# At most this many keys are listed when no known key is close to the one written.
_KEYS_LISTED = 12


def reason(err: ErrorDetails) -> str:
    """Why the value at ``err``'s location is refused."""
    kind, loc = err["type"], tuple(err["loc"])
    if kind == "extra_forbidden":
        return _unknown_key(loc)
    if kind == "missing":
        return "required, and not given"
    if kind == "string_pattern_mismatch":
        pattern = str((err.get("ctx") or {}).get("pattern", ""))
        form = _FORMS.get(pattern)
        if form is not None:
            return f"{err['input']!r} is not {form}"
    return str(err["msg"]).removeprefix("Value error, ")


def _unknown_key(loc: Location) -> str:
    written = str(loc[-1]) if loc else ""
    known = _keys_at(loc[:-1])
    if not known:
        return "not a key osas knows here"
    close = difflib.get_close_matches(written, known, n=1, cutoff=0.6)
    if close:
        return f"not a key osas knows here; did you mean {close[0]}?"
    if len(known) <= _KEYS_LISTED:
        return f"not a key osas knows here (the keys here: {', '.join(known)})"
    return "not a key osas knows here (docs/configuration.md lists them)"


def _keys_at(loc: Location) -> list[str]:
    """The keys the file may give at ``loc`` (a mapping of the configuration), as the file
    writes them; none when ``loc`` is not such a mapping."""
    model = _model_at(loc)
    if model is None:
        return []
    return [field.alias or name for name, field in model.model_fields.items()]


def _model_at(loc: Location) -> type[BaseModel] | None:
    hint: Any = OsasConfig
    for part in loc:
        hint = _inner(hint)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            fields = {field.alias or name: field for name, field in hint.model_fields.items()}
            if not isinstance(part, str) or part not in fields:
                return None
            hint = fields[part].annotation
        elif get_origin(hint) in {list, tuple, Sequence} and isinstance(part, int):
            hint = get_args(hint)[0]
        elif get_origin(hint) is dict:
            hint = get_args(hint)[1]
        else:
            return None
    hint = _inner(hint)
    return hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None


def _inner(hint: Any) -> Any:
    """``hint`` without ``Annotated`` and ``None``: the one model of a union, if it has one."""
    origin = get_origin(hint)
    if origin is Annotated:
        return _inner(get_args(hint)[0])
    if origin in {Union, types.UnionType}:
        members = [_inner(arg) for arg in get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        return models[0] if len(models) == 1 else None
    return hint
