"""Which YAML values a Python annotation accepts, and how to name an annotation to someone writing YAML.
Shared by `validate` (builder signatures) and `schema` (recipe keys)."""

from __future__ import annotations

import collections.abc
import inspect
import sys
import types
import typing
from typing import Any

from engine.config._interpolate import UNRESOLVED

_SEQUENCES = (collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def is_simple(ann: Any) -> bool:
    """True for the annotations a YAML value can satisfy: scalars, lists, mappings, Literal, Union."""
    base = typing.get_origin(ann) or ann
    if base in (typing.Union, types.UnionType):
        return any(is_simple(a) for a in typing.get_args(ann))
    return base in (
        bool,
        int,
        float,
        str,
        list,
        tuple,
        set,
        frozenset,
        typing.Literal,
        *_SEQUENCES,
        *_MAPPINGS,
    )


def type_name(ann: Any) -> str:
    """A YAML writer's name for an annotation: `int or null`, `a list of str`, `one of 'a', 'b'`."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Union or origin is types.UnionType:
        shown = [a for a in args if a is not type(None)]
        simple = [a for a in shown if is_simple(a)]
        names = " or ".join(type_name(a) for a in (simple or shown))  # `float | Tensor` reads "float"
        return names + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if ann is None or ann is type(None):
        return "null"
    if (origin or ann) in (list, tuple, set, frozenset):
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)} ({', '.join(type_name(a) for a in args)})"
        return f"a list of {type_name(args[0])}" if args else "a list"
    if (origin or ann) in _MAPPINGS:
        return "a mapping"
    if (origin or ann) in _SEQUENCES:
        return f"a list of {type_name(args[0])}" if args else "a list"
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "")


def is_component(value: Any) -> bool:
    return isinstance(value, dict) and "_component_" in value


def accepts(value: Any, ann: Any) -> bool | None:
    """True/False when the simple annotation `ann` accepts/rejects `value`; None when it cannot tell.

    A YAML value is always a plain type, so in a Union the simple members decide when there is one
    besides None (`float | Tensor` rejects "fast"); `Path | None` with a string cannot tell.
    """
    if ann is inspect.Parameter.empty or ann is Any or value is UNRESOLVED or is_component(value):
        return None
    origin = typing.get_origin(ann)
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(ann)
        results = [accepts(value, a) for a in members]
        if any(r is True for r in results):
            return True
        if any(r is False and a is not type(None) for a, r in zip(members, results)):
            return False
        return None if any(r is None for r in results) else False
    if origin is typing.Literal:
        return any(type(value) is type(opt) and value == opt for opt in typing.get_args(ann))
    if ann is None or ann is type(None):
        return value is None
    base = origin or ann
    args = typing.get_args(ann)
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base is str:
        return isinstance(value, str)
    if base in (list, tuple, set, frozenset):
        if not isinstance(value, list):
            return False
        if base is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            # fixed-length tuple: one value per position
            return len(value) == len(args) and all(accepts(v, a) is not False for v, a in zip(value, args))
        if len(args) >= 1 and any(accepts(v, args[0]) is False for v in value):
            return False
        return True
    if base in _SEQUENCES:
        if isinstance(value, str):
            return True  # a str is a sequence; the callable decides whether that is meant
        return isinstance(value, list) and not (args and any(accepts(v, args[0]) is False for v in value))
    if base in _MAPPINGS:
        if not isinstance(value, dict):
            return False
        if len(args) == 2:  # dict[str, float]: every key and value
            return not any(
                accepts(k, args[0]) is False or accepts(v, args[1]) is False for k, v in value.items()
            )
        return True
    return None


def hints(target: Any) -> dict[str, Any]:
    """The parameter annotations of a callable (a class: its `__init__`), as objects.

    `typing.get_type_hints` reads `__annotations__`; builders made at import time (e.g. the model
    families' `lora_<family>`) carry theirs only in `__signature__`, as strings (`'int'`), so those are
    evaluated too, in the callable's module and the builtins. One that cannot be evaluated is left out.
    """
    fn = target.__init__ if inspect.isclass(target) else target
    try:
        out = dict(typing.get_type_hints(fn))
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        out = {}
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return out
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    namespace = dict(vars(module)) if module is not None else {}
    for name, param in params.items():
        if name in out or not isinstance(param.annotation, str):
            continue
        try:
            out[name] = eval(param.annotation, namespace)  # noqa: S307 - an annotation string of our own code
        except Exception:
            continue
    return out
