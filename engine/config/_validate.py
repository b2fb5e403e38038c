"""`validate`: every problem of a config at once, without building any heavy object.

What is checked:
- interpolation (missing targets, circular references); an `allowed_components:` key is refused (a
  config cannot widen its own allow-list; `engine.config._grants` says where the user does);
- for every mapping with `_component_`: the allow-list, that the path imports (did-you-mean over the
  module's attributes), and its arguments against the callable's signature: unknown keys
  (did-you-mean over the parameter names, unless it takes `**kwargs`), missing required arguments,
  and types from simple annotations (int, float, bool, str, list[...], dict[...], Optional, Union,
  Literal), and the bounds of arguments that mean the same everywhere (`lr` >= 0, `lora_rank` and
  model sizes positive: `engine.config.argument_bounds`). A nested `_component_` value counts as
  "some object" and is not type-checked here (its own node is checked on its own). Required
  arguments that recipes pass at the call site (`CALL_SITE_ARGS`: params, optimizer, model,
  tokenizer, module, num_training_steps, plus a recipe's own) are not reported missing.
- with `recipe=NAME`: the `CONFIG_SCHEMA` (an `engine.config.recipe_schema.Schema`) of `engine.recipes.NAME`:
  unknown top-level keys (did-you-mean; `allowed_components` gets its own refusal instead), each key's value
  (type, bounds, allowed words, required keys, the keys and values of a plain mapping such as
  `validation:`), so `batch_size: two` or `optimizer_in_bwd: "no"` is reported here rather than failing
  (or silently meaning True) in the run, and the schema's checks between keys (optimizer_in_bwd with
  gradient accumulation, ...). A module without a schema is checked for components only.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.config._components import ComponentRefused, config_widening_error, import_component
from engine.config._errors import ConfigError, ConfigProblem, did_you_mean, dotted
from engine.config._find import recipe_from_text
from engine.config._interpolate import UNRESOLVED, Resolver
from engine.config._overrides import Override, apply_override, parse_override
from engine.config._types import accepts, hints, type_name
from engine.config._yaml import load_yaml
from engine.config.argument_bounds import bound_problem
from engine.config.recipe_schema import Schema

# Arguments recipes pass positionally at the call site, e.g. `instantiate(cfg["optimizer"], params)`.
CALL_SITE_ARGS = frozenset({"params", "optimizer", "model", "tokenizer", "module", "num_training_steps"})
_RECIPE_RE = re.compile(r"^[A-Za-z_]\w*$")


# ---- components --------------------------------------------------------------------------------------


def _check_component(node: dict, path: tuple, call_site: frozenset[str], out: list[ConfigProblem]) -> None:
    field = dotted(path + ("_component_",))
    name = node["_component_"]
    if name is UNRESOLVED:
        return
    try:
        target = import_component(name, field=field)
    except ConfigError as exc:
        out.append(exc.problem)
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
    annotations = hints(target)
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
        ann = annotations.get(key, param.annotation)
        if isinstance(ann, str):
            continue
        if value is None and param.default is None:
            continue
        if accepts(value, ann) is False:
            out.append(
                ConfigProblem(
                    here,
                    f"{name} expects {type_name(ann)}, got {type(value).__name__} {value!r}",
                    f"change it to {type_name(ann)}",
                )
            )
        elif (bound := bound_problem(here, key, value)) is not None:  # lr: -1, lora_rank: 0
            out.append(bound)
    for pname, param in named.items():
        if param.default is inspect.Parameter.empty and pname not in node and pname not in call_site:
            out.append(
                ConfigProblem(
                    dotted(path + (pname,)),
                    f"missing required argument {pname!r} of {name}",
                    f"add `{pname}: VALUE` under {dotted(path)}",
                )
            )


def _walk(node: Any, path: tuple, call_site: frozenset[str], out: list[ConfigProblem]) -> None:
    if isinstance(node, dict):
        if "_component_" in node:
            _check_component(node, path, call_site, out)
        for key, value in node.items():
            if key != "_component_":
                _walk(value, path + (key,), call_site, out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, path + (i,), call_site, out)


def _component_names(node: Any, path: tuple):
    """`(field, name)` of every `_component_` string in `node`, depth first."""
    if isinstance(node, dict):
        name = node.get("_component_")
        if isinstance(name, str):
            yield dotted(path + ("_component_",)), name
        for key, value in node.items():
            if key != "_component_":
                yield from _component_names(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _component_names(value, path + (i,))


def refuse_untrusted(cfg: Any) -> None:
    """Raise the first security refusal of `cfg` (written or resolved), as one line: an
    `allowed_components:` key, or a `_component_` the allow-list refuses (named). Other problems are
    `validate`'s; nothing outside the allow-list is imported.

    Raises:
        ComponentRefused: the key, or the field and component refused.
    """
    if not isinstance(cfg, dict):
        return
    try:
        resolved = Resolver(cfg, errors=[]).resolve()
    except RecursionError:
        return
    widening = config_widening_error(resolved)
    if widening is not None:
        raise widening
    for field, name in _component_names(resolved, ()):
        try:
            import_component(name, field=field)
        except ComponentRefused:
            raise
        except ConfigError:
            continue  # an unknown or broken component: validate reports it


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
    out.extend(e.problem for e in errors)
    widening = config_widening_error(resolved)
    if widening is not None:
        out.append(widening.problem)
    call_site = CALL_SITE_ARGS
    if recipe is not None:
        module = _recipe_module(recipe, out)
        schema = getattr(module, "CONFIG_SCHEMA", None) if module is not None else None
        if isinstance(schema, Schema):
            call_site = call_site | schema.call_site_args
            out.extend(schema.problems(resolved))
    _walk(resolved, (), call_site, out)
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
        return [exc.problem], recipe
    if recipe is None:
        recipe = recipe_from_text(Path(path).read_text(encoding="utf-8"))
    problems: list[ConfigProblem] = []
    for ov in overrides:
        try:
            apply_override(cfg, ov if isinstance(ov, Override) else parse_override(ov))
        except ConfigError as exc:
            problems.append(exc.problem)
    return problems + validate(cfg, recipe=recipe), recipe
