"""Hypothesis strategies for the stages' details models (stages/<name>/details.py), as the report
templates read them: any part with a default or a None may be left out or None, lists may be
empty, and every string may carry what a target's text can (ANSI escapes, line breaks, pipes)."""

from __future__ import annotations

import enum
import types
import typing
from functools import cache
from typing import Any, Literal, Union

from hypothesis import strategies as st
from pydantic import BaseModel, StringConstraints
from pydantic.fields import FieldInfo

# What target text brings into a report: a terminal's colours, a traceback's line breaks, a
# pytest parameter id with a pipe, a carriage return from a progress bar.
NASTY_TEXT = ["\x1b[1mbold\x1b[0m", "first line\nsecond line", "a | b", "progress\r\n", "\x1b]0;title\x07tab\there", "", "x\x00y\u2028z"]

TEXT = st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=12))
FLOATS = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
INTS = st.integers(min_value=0, max_value=10**9)
MAX_ITEMS = 3


def model_data(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    """JSON-like data for `model`: the required fields, and each optional one or not."""
    return _model_data(model)


@cache
def _model_data(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        value = st.deferred(lambda f=field: _field_value(f))
        if field.is_required():
            required[key] = value
        else:
            optional[key] = value
    return st.fixed_dictionaries(required, optional=optional)


def _field_value(field: FieldInfo) -> st.SearchStrategy[Any]:
    if field.annotation is str:
        for meta in field.metadata:
            if getattr(meta, "pattern", None):
                return st.from_regex(meta.pattern, fullmatch=True)
    return value_of(field.annotation)


def value_of(annotation: Any) -> st.SearchStrategy[Any]:
    """A strategy for one annotated value, as JSON holds it."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return st.none()
    if annotation is Any:
        return st.one_of(st.none(), TEXT, INTS)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_data(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return st.sampled_from([member.value for member in annotation])
    simple = {bool: st.booleans(), int: INTS, float: FLOATS, str: TEXT}
    if annotation in simple:
        return simple[annotation]
    if origin is typing.Annotated:
        pattern = next((m.pattern for m in args[1:] if isinstance(m, StringConstraints) and m.pattern), None)
        return st.from_regex(pattern, fullmatch=True) if pattern else value_of(args[0])
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of([value_of(arg) for arg in args])
    if origin is list:
        return st.lists(value_of(args[0]), max_size=MAX_ITEMS)
    if origin is dict:
        return st.dictionaries(value_of(args[0]), value_of(args[1]), max_size=MAX_ITEMS)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(value_of(args[0]), max_size=MAX_ITEMS)
        return st.tuples(*[value_of(arg) for arg in args]).map(list)
    raise TypeError(f"no strategy for {annotation!r}")


def bare(model: type[BaseModel]) -> dict[str, Any]:
    """The least `model` holds: no optional field, None wherever allowed, empty collections."""
    return {field.alias or name: _least(field.annotation) for name, field in model.model_fields.items() if field.is_required()}


def _least(annotation: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return None if type(None) in args else _least(args[0])
    if origin is typing.Annotated:
        return "0" if args[0] is str else _least(args[0])
    if origin is Literal:
        return args[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return bare(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(iter(annotation)).value
    if origin in (list, tuple) and not (origin is tuple and args and args[-1] is not Ellipsis):
        return []
    if origin is tuple:
        return [_least(arg) for arg in args]
    if origin is dict:
        return {}
    return {bool: False, int: 0, float: 0.0, str: ""}.get(annotation)
