"""`validate`: every problem of a config at once, without building any heavy object.

What is checked:
- interpolation (missing targets, circular references) and `allowed_components`;
- for every mapping with `_component_`: the allow-list, that the path imports (did-you-mean over the
  module's attributes), and its arguments against the callable's signature: unknown keys
  (did-you-mean over the parameter names, unless it takes `**kwargs`), missing required arguments,
  and types from simple annotations (int, float, bool, str, list[...], dict[...], Optional, Union,
  Literal). A nested `_component_` value counts as "some object" and is not type-checked here
  (its own node is checked on its own). Required arguments that recipes pass at the call site
  (`CALL_SITE_ARGS`: params, optimizer, model, tokenizer, module, num_training_steps, plus a
  recipe's own) are not reported missing.
- with `recipe=NAME`: when `engine.recipes.NAME` declares `CONFIG_KEYS: dict[str, str]`, unknown
  top-level keys (did-you-mean). `allowed_components` is always accepted. When it declares
  `CONFIG_TYPES: dict[str, KeyRule]`, each top-level key's value (type, bounds, allowed words, required
  keys, the keys and values of a plain mapping such as `validation:`), so `batch_size: two` or
  `optimizer_in_bwd: "no"` is reported here rather than failing (or silently meaning True) in the run.
  When it defines `config_problems(cfg) -> list[ConfigProblem]`, the problems between keys that it
  finds without building anything (e.g. optimizer_in_bwd with gradient accumulation).
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import os
import pkgutil
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config._components import config_prefixes, import_component
from engine.config._errors import ConfigError, ConfigProblem, did_you_mean, dotted
from engine.config._find import recipe_from_text
from engine.config._interpolate import UNRESOLVED, Resolver
from engine.config._overrides import Override, apply_override, parse_override
from engine.config._yaml import load_yaml

# Arguments recipes pass positionally at the call site, e.g. `instantiate(cfg["optimizer"], params)`.
CALL_SITE_ARGS = frozenset({"params", "optimizer", "model", "tokenizer", "module", "num_training_steps"})
ALWAYS_ALLOWED_KEYS = frozenset({"allowed_components"})
_RECIPE_RE = re.compile(r"^[A-Za-z_]\w*$")


def problem_from_error(exc: ConfigError) -> ConfigProblem:
    """Split a ConfigError's `field: message — hint` line into a ConfigProblem."""
    text = str(exc)
    field = exc.field
    if field and text.startswith(field + ": "):
        rest = text[len(field) + 2 :]
    elif ": " in text:
        field, rest = text.split(": ", 1)
    else:
        rest = text
    message, _, hint = rest.rpartition(" — ")
    if not message:
        message, hint = rest, "fix it"
    return ConfigProblem(field or "<config>", message, hint)


# ---- types -------------------------------------------------------------------------------------------


_SEQUENCES = (collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _is_simple(ann: Any) -> bool:
    """True for the annotations a YAML value can satisfy: scalars, lists, mappings, Literal, Union."""
    base = typing.get_origin(ann) or ann
    if base in (typing.Union, types.UnionType):
        return any(_is_simple(a) for a in typing.get_args(ann))
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


def _type_name(ann: Any) -> str:
    """A YAML writer's name for an annotation: `int or null`, `a list of str`, `one of 'a', 'b'`."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Union or origin is types.UnionType:
        shown = [a for a in args if a is not type(None)]
        simple = [a for a in shown if _is_simple(a)]
        names = " or ".join(_type_name(a) for a in (simple or shown))  # `float | Tensor` reads "float"
        return names + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if ann is None or ann is type(None):
        return "null"
    if (origin or ann) in (list, tuple, set, frozenset):
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)} ({', '.join(_type_name(a) for a in args)})"
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if (origin or ann) in _MAPPINGS:
        return "a mapping"
    if (origin or ann) in _SEQUENCES:
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "")


def _is_component(value: Any) -> bool:
    return isinstance(value, dict) and "_component_" in value


def _accepts(value: Any, ann: Any) -> bool | None:
    """True/False when the simple annotation `ann` accepts/rejects `value`; None when it cannot tell.

    A YAML value is always a plain type, so in a Union the simple members decide when there is one
    besides None (`float | Tensor` rejects "fast"); `Path | None` with a string cannot tell.
    """
    if ann is inspect.Parameter.empty or ann is Any or value is UNRESOLVED or _is_component(value):
        return None
    origin = typing.get_origin(ann)
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(ann)
        results = [_accepts(value, a) for a in members]
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
            return len(value) == len(args) and all(_accepts(v, a) is not False for v, a in zip(value, args))
        if len(args) >= 1 and any(_accepts(v, args[0]) is False for v in value):
            return False
        return True
    if base in _SEQUENCES:
        if isinstance(value, str):
            return True  # a str is a sequence; the callable decides whether that is meant
        return isinstance(value, list) and not (args and any(_accepts(v, args[0]) is False for v in value))
    if base in _MAPPINGS:
        if not isinstance(value, dict):
            return False
        if len(args) == 2:  # dict[str, float]: every key and value
            return not any(
                _accepts(k, args[0]) is False or _accepts(v, args[1]) is False for k, v in value.items()
            )
        return True
    return None


def _hints(target: Any) -> dict[str, Any]:
    fn = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        return {}


# ---- components --------------------------------------------------------------------------------------


def _check_component(
    node: dict, path: tuple, prefixes: list[str], call_site: frozenset[str], out: list[ConfigProblem]
) -> None:
    field = dotted(path + ("_component_",))
    name = node["_component_"]
    if name is UNRESOLVED:
        return
    try:
        target = import_component(name, field=field, extra=prefixes)
    except ConfigError as exc:
        out.append(problem_from_error(exc))
        return
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {
        n: p for n, p in params.items() if p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    hints = _hints(target)
    for key, value in node.items():
        if key == "_component_":
            continue
        here = dotted(path + (key,))
        if key not in named:
            if not takes_kwargs:
                out.append(
                    ConfigProblem(
                        here,
                        f"unknown argument {key!r} for {name}{did_you_mean(str(key), named)}",
                        f"remove it or use one of: {', '.join(named) or '(none)'}",
                    )
                )
            continue
        param = named[key]
        ann = hints.get(key, param.annotation)
        if isinstance(ann, str):
            continue
        if value is None and param.default is None:
            continue
        if _accepts(value, ann) is False:
            out.append(
                ConfigProblem(
                    here,
                    f"{name} expects {_type_name(ann)}, got {type(value).__name__} {value!r}",
                    f"change it to {_type_name(ann)}",
                )
            )
    for pname, param in named.items():
        if param.default is inspect.Parameter.empty and pname not in node and pname not in call_site:
            out.append(
                ConfigProblem(
                    dotted(path + (pname,)),
                    f"missing required argument {pname!r} of {name}",
                    f"add `{pname}: VALUE` under {dotted(path)}",
                )
            )


def _walk(
    node: Any, path: tuple, prefixes: list[str], call_site: frozenset[str], out: list[ConfigProblem]
) -> None:
    if isinstance(node, dict):
        if "_component_" in node:
            _check_component(node, path, prefixes, call_site, out)
        for key, value in node.items():
            if key != "_component_":
                _walk(value, path + (key,), prefixes, call_site, out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, path + (i,), prefixes, call_site, out)


# ---- recipes -----------------------------------------------------------------------------------------


def _recipe_names() -> list[str]:
    try:
        pkg = importlib.import_module("engine.recipes")
    except Exception:
        return []
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def _recipe_module(recipe: str, out: list[ConfigProblem]) -> Any:
    names = _recipe_names()
    if _RECIPE_RE.match(recipe):
        modname = f"engine.recipes.{recipe}"
        try:
            return importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                out.append(
                    ConfigProblem("recipe", f"{modname} failed to import ({exc})", "install what it needs")
                )
                return None
        except Exception as exc:
            out.append(ConfigProblem("recipe", f"{modname} failed to import ({exc})", "fix that module"))
            return None
    out.append(
        ConfigProblem(
            "recipe",
            f"no recipe named {recipe!r}{did_you_mean(recipe, names)}",
            f"use one of: {', '.join(names) or '(none installed)'}",
        )
    )
    return None


def _check_top_keys(cfg: dict, keys: dict[str, str], out: list[ConfigProblem]) -> None:
    allowed = set(keys) | ALWAYS_ALLOWED_KEYS
    for key in cfg:
        if key not in allowed:
            out.append(
                ConfigProblem(
                    str(key),
                    f"unknown top-level key for this recipe{did_you_mean(str(key), allowed)}",
                    "remove it or fix the spelling (`tunebench cat` a built-in config for the known keys)",
                )
            )


@dataclass(frozen=True)
class KeyRule:
    """What one top-level config key of a recipe accepts (recipes list them in `CONFIG_TYPES`).

    Args:
        type: an annotation as in a builder signature (`int`, `float | None`, `bool`, `dict | list`).
        minimum / maximum: the allowed range of a number (inclusive), or None; `above` / `below`: the
            number must exceed / stay under it.
        pattern: a regex (full match, case-insensitive) a string value must match; `expect` words it.
        component: a `_component_` mapping (or, with `list` in `type`, a list of them).
        required: the key must be present (and not null).
        keys: for a plain mapping, the rules of its keys; other keys are reported unknown.
        values: for a mapping of names to things (`rewards:`), the rule every value follows.
    """

    type: Any
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None
    pattern: str | None = None
    expect: str = ""
    component: bool = False
    required: bool = False
    keys: dict[str, KeyRule] | None = field(default=None, hash=False)
    values: KeyRule | None = None

    def wanted(self) -> str:
        """`an integer >= 1 or null`: what to write instead, in a YAML writer's words."""
        if self.expect:
            return self.expect
        members = _members(self.type)
        nullable = type(None) in members
        members = [m for m in members if m is not type(None)]
        if self.component:
            words = ["a mapping with _component_"] + (["a list of them"] if list in members else [])
        else:
            words = [_PLAIN_WORDS.get(_type_name(m), _type_name(m)) for m in members]
        low = (
            f" >= {_num(self.minimum)}" if self.minimum is not None
            else f" > {_num(self.above)}" if self.above is not None else ""
        )  # fmt: skip
        high = (
            f" <= {_num(self.maximum)}" if self.maximum is not None
            else f" < {_num(self.below)}" if self.below is not None else ""
        )  # fmt: skip
        bound = low + (" and" if low and high else "") + high
        return " or ".join([words[0] + bound, *words[1:]] + (["null"] if nullable else []))


# How `wanted` words a type for someone writing YAML.
_PLAIN_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                "dict": "a mapping", "a mapping": "a mapping", "list": "a list"}  # fmt: skip


def _members(ann: Any) -> list:
    origin = typing.get_origin(ann)
    if origin is typing.Union or origin is types.UnionType:
        return list(typing.get_args(ann))
    return [ann]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _rule_problem(value: Any, rule: KeyRule) -> str | None:
    """Why `value` breaks `rule` (`got str 'two'`), or None when it fits."""
    got = f"got {type(value).__name__} {value!r}" if value is not None else "got null"
    if value is None:
        if rule.required:
            return "missing"
        return None if _accepts(None, rule.type) is not False else got
    if value is UNRESOLVED:
        return None
    if _accepts(value, rule.type) is False:
        return got
    if rule.component:
        items = value if isinstance(value, list) else [value]
        if not items or not all(_is_component(v) for v in items):
            return got
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if rule.minimum is not None and value < rule.minimum:
            return got
        if rule.above is not None and value <= rule.above:
            return got
        if rule.maximum is not None and value > rule.maximum:
            return got
        if rule.below is not None and value >= rule.below:
            return got
    if rule.pattern is not None and isinstance(value, str) and not re.fullmatch(rule.pattern, value, re.I):
        return got
    return None


def _check_key_types(
    cfg: dict, rules: dict[str, KeyRule], out: list[ConfigProblem], prefix: tuple = ()
) -> None:
    for key, rule in rules.items():
        if not isinstance(rule, KeyRule):
            continue
        here = dotted(prefix + (key,))
        if key not in cfg:
            if rule.required:
                out.append(ConfigProblem(here, "missing", f"add `{key}:` with {rule.wanted()}"))
            continue
        value = cfg[key]
        why = _rule_problem(value, rule)
        if why == "missing":
            out.append(ConfigProblem(here, "missing (null)", f"set it to {rule.wanted()}"))
        elif why is not None:
            out.append(
                ConfigProblem(here, f"expects {rule.wanted()}, {why}", f"change it to {rule.wanted()}")
            )
        elif rule.keys is not None and isinstance(value, dict):
            for sub in value:
                if sub not in rule.keys:
                    out.append(
                        ConfigProblem(
                            dotted(prefix + (key, sub)),
                            f"unknown key under {here}{did_you_mean(str(sub), rule.keys)}",
                            f"remove it or use one of: {', '.join(rule.keys)}",
                        )
                    )
            _check_key_types(value, rule.keys, out, prefix + (key,))
        if rule.values is not None and isinstance(value, dict) and why is None:
            _check_key_types(value, {sub: rule.values for sub in value}, out, prefix + (key,))


# ---- entry points ------------------------------------------------------------------------------------


def validate(cfg: dict, recipe: str | None = None) -> list[ConfigProblem]:
    """Every problem in `cfg` (as written or already resolved), in a stable order; [] when valid.

    Imports components and recipe modules but builds nothing. Never raises ConfigError.
    """
    out: list[ConfigProblem] = []
    if not isinstance(cfg, dict):
        return [
            ConfigProblem(
                "<config>", f"the config is a {type(cfg).__name__}", "write a mapping of key: value"
            )
        ]
    errors: list[ConfigError] = []
    try:
        resolved = Resolver(cfg, errors=errors).resolve()
    except RecursionError:
        return [ConfigProblem("<config>", "nested or chained too deeply to resolve", "flatten the config")]
    out.extend(problem_from_error(e) for e in errors)
    try:
        prefixes = config_prefixes(resolved)
    except ConfigError as exc:
        out.append(problem_from_error(exc))
        prefixes = []
    call_site = CALL_SITE_ARGS
    if recipe is not None:
        module = _recipe_module(recipe, out)
        if module is not None:
            call_site = call_site | frozenset(getattr(module, "CALL_SITE_ARGS", ()))
            keys = getattr(module, "CONFIG_KEYS", None)
            if isinstance(keys, dict):
                _check_top_keys(resolved, keys, out)
            rules = getattr(module, "CONFIG_TYPES", None)
            if isinstance(rules, dict):
                _check_key_types(resolved, rules, out)
            between = getattr(module, "config_problems", None)
            if callable(between):
                out.extend(between(resolved))
    _walk(resolved, (), prefixes, call_site, out)
    seen: set[ConfigProblem] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def validate_file(
    path: str | os.PathLike, overrides: Iterable[str | Override] = (), recipe: str | None = None
) -> tuple[list[ConfigProblem], str | None]:
    """Validate a config file with overrides: `(problems, recipe)`.

    A malformed file is one problem (with line and column); every bad override is its own problem.
    `recipe` defaults to the one named on the file's launch line (None when it names none).
    """
    try:
        cfg = load_yaml(path)
    except ConfigError as exc:
        return [problem_from_error(exc)], recipe
    if recipe is None:
        recipe = recipe_from_text(Path(path).read_text(encoding="utf-8"))
    problems: list[ConfigProblem] = []
    for ov in overrides:
        try:
            apply_override(cfg, ov if isinstance(ov, Override) else parse_override(ov))
        except ConfigError as exc:
            problems.append(problem_from_error(exc))
    return problems + validate(cfg, recipe=recipe), recipe
