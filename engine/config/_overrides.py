"""Command-line overrides: `key=value`, `a.b.c=value`, `list.0.key=value`, `+new=value`, `~key`.

Values are YAML (the config loader's rules): `lr=1e-4` is a float, `flag=true` a bool, `x=null`
None, `mods=[q_proj,v_proj]` a list, `opt={lr: 1}` a mapping; `key=` is the empty string.

- `key=value` sets a key, creating missing parent mappings.
- `+key=value` adds a key that must not exist yet (for people used to Hydra).
- `~key` / `~a.b` / `~list.1` deletes a key or list item.
- Swapping a component: when the target is a mapping with `_component_` and the value is a dotted
  path (`optimizer=torch.optim.SGD`), only `_component_` changes. The arguments the new callable
  accepts (by its signature; all of them when it takes `**kwargs` or has no readable signature)
  are kept, the others are dropped. The new path goes through the allow-list first.
  To replace the whole node instead, give a mapping: `optimizer={_component_: torch.optim.SGD, lr: 0.1}`.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from engine.config._components import import_component
from engine.config._errors import ConfigError, did_you_mean, dotted
from engine.config._interpolate import has_reference
from engine.config._yaml import parse_yaml

_SEGMENT_RE = re.compile(r"^(?:[A-Za-z_][\w\-]*|\d+)$")
_DOTTED_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


@dataclass(frozen=True)
class Override:
    """One parsed override: `op` is "set", "add" or "delete"; `path` holds keys and list indices."""

    op: Literal["set", "add", "delete"]
    path: tuple
    value: Any
    text: str


def _parse_path(text: str, original: str) -> tuple:
    parts = text.split(".")
    if not text or not all(_SEGMENT_RE.match(p) for p in parts):
        raise ConfigError(
            f"{text!r} is not a key path",
            hint="write key=value, a.b.c=value, list.0.key=value or ~key",
            label=f"override {original!r}",
            field=original,
        )
    return tuple(int(p) if p.isdigit() else p for p in parts)


def parse_override(text: str) -> Override:
    """Parse one override string. Raises ConfigError naming the override when malformed."""
    if not isinstance(text, str):
        raise ConfigError("overrides are strings like key=value", label=f"override {text!r}", field=str(text))
    raw = text.strip()
    if raw.startswith("~"):
        if "=" in raw:
            raise ConfigError(
                "a deletion takes no value",
                hint=f"write ~{raw[1:].split('=')[0]}",
                label=f"override {text!r}",
                field=text,
            )
        return Override("delete", _parse_path(raw[1:], text), None, text)
    if "=" not in raw:
        raise ConfigError(
            "no '=' in it",
            hint="write key=value (or ~key to delete a key)",
            label=f"override {text!r}",
            field=text,
        )
    key, value_text = raw.split("=", 1)
    op: Literal["set", "add"] = "set"
    if key.startswith("+"):
        op, key = "add", key[1:]
    path = _parse_path(key.strip(), text)
    value = "" if value_text.strip() == "" else parse_yaml(value_text, source=f"override {text!r}")
    return Override(op, path, value, text)


def parse_overrides(texts: Iterable[str]) -> list[Override]:
    """Parse override strings in order. Raises ConfigError naming the first malformed one."""
    if isinstance(texts, str):
        texts = [texts]
    return [t if isinstance(t, Override) else parse_override(t) for t in texts]


def _kept_args(node: dict, target: Any) -> dict:
    """The arguments of `node` that the callable `target` accepts (all when it takes **kwargs)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return {k: v for k, v in node.items() if k != "_component_"}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {k: v for k, v in node.items() if k != "_component_"}
    names = {n for n, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return {k: v for k, v in node.items() if k != "_component_" and k in names}


def _no_index_into_mapping(node: Any, key: Any, ov: Override, where: tuple) -> None:
    """Refuse `dataset.0.source=x` when `dataset` is a mapping: it would add a key `0`, not index a list."""
    if isinstance(node, dict) and isinstance(key, int) and key not in node and str(key) not in node:
        keys = ", ".join(map(str, node)) or "none"
        raise ConfigError(
            f"{dotted(where) if where else 'the config'} is a mapping, not a list, so it has no item {key}",
            hint=f"use one of its keys ({keys})",
            label=f"override {ov.text!r}",
            field=ov.text,
        )


def _walk_to_parent(cfg: dict, ov: Override, *, create: bool) -> Any:
    node: Any = cfg
    for i, key in enumerate(ov.path[:-1]):
        here = dotted(ov.path[: i + 1])
        if isinstance(node, dict):
            if key not in node and str(key) in node:
                key = str(key)
            _no_index_into_mapping(node, key, ov, ov.path[:i])
            if key not in node:
                if not create:
                    raise ConfigError(
                        f"no key {here} in the config{did_you_mean(str(key), map(str, node))}",
                        hint="check the spelling",
                        label=f"override {ov.text!r}",
                        field=ov.text,
                    )
                node[key] = {}
            node = node[key]
        elif isinstance(node, list):
            if not isinstance(key, int) or key >= len(node):
                raise ConfigError(
                    f"{dotted(ov.path[:i])} is a list of {len(node)} items",
                    hint=f"use an index from 0 to {len(node) - 1}",
                    label=f"override {ov.text!r}",
                    field=ov.text,
                )
            node = node[key]
        else:
            raise ConfigError(
                f"{dotted(ov.path[:i])} is a {type(node).__name__}, not a mapping or list",
                hint=f"override {dotted(ov.path[:i])} itself",
                label=f"override {ov.text!r}",
                field=ov.text,
            )
    if not isinstance(node, (dict, list)):
        raise ConfigError(
            f"{dotted(ov.path[:-1])} is a {type(node).__name__}, not a mapping or list",
            hint=f"override {dotted(ov.path[:-1])} itself",
            label=f"override {ov.text!r}",
            field=ov.text,
        )
    return node


def apply_override(cfg: dict, ov: Override) -> None:
    """Apply one parsed override to `cfg` in place. Raises ConfigError naming the override."""
    parent = _walk_to_parent(cfg, ov, create=ov.op != "delete")
    key = ov.path[-1]
    if isinstance(parent, list):
        if not isinstance(key, int) or key >= len(parent):
            raise ConfigError(
                f"{dotted(ov.path[:-1])} is a list of {len(parent)} items",
                hint=f"use an index from 0 to {len(parent) - 1}",
                label=f"override {ov.text!r}",
                field=ov.text,
            )
        if ov.op == "delete":
            del parent[key]
        elif ov.op == "add":
            raise ConfigError(
                f"list item {dotted(ov.path)} exists",
                hint="drop the '+'",
                label=f"override {ov.text!r}",
                field=ov.text,
            )
        else:
            parent[key] = _new_value(cfg, parent[key], ov)
        return
    if key not in parent and str(key) in parent:
        key = str(key)
    _no_index_into_mapping(parent, key, ov, ov.path[:-1])
    exists = key in parent
    if ov.op == "delete":
        if not exists:
            raise ConfigError(
                f"no key {dotted(ov.path)} to delete{did_you_mean(str(key), map(str, parent))}",
                hint="check the spelling",
                label=f"override {ov.text!r}",
                field=ov.text,
            )
        del parent[key]
    elif ov.op == "add" and exists:
        raise ConfigError(
            f"{dotted(ov.path)} already exists",
            hint=f"write {ov.text[1:]} (without '+') to change it",
            label=f"override {ov.text!r}",
            field=ov.text,
        )
    else:
        parent[key] = _new_value(cfg, parent.get(key), ov)


def _new_value(cfg: dict, old: Any, ov: Override) -> Any:
    if not (isinstance(old, dict) and "_component_" in old and isinstance(ov.value, str)):
        return copy.deepcopy(ov.value)
    if has_reference(ov.value):
        return ov.value  # `model=${base_model}`: the reference replaces the whole node
    if not _DOTTED_PATH_RE.match(ov.value):
        raise ConfigError(
            f"{dotted(ov.path)} is a component",
            hint="give a dotted path like torch.optim.SGD or a mapping {_component_: ..., arg: ...}",
            label=f"override {ov.text!r}",
            field=ov.text,
        )
    target = import_component(ov.value, field=f"override {ov.text!r}")
    return {"_component_": ov.value, **_kept_args(old, target)}


def apply_overrides(cfg: dict, overrides: Iterable[str | Override]) -> dict:
    """A copy of `cfg` with `overrides` applied in order (strings are parsed first).

    Raises ConfigError naming the override when it is malformed or does not fit the config.
    """
    out = copy.deepcopy(cfg)
    for ov in parse_overrides(overrides):
        apply_override(out, ov)
    return out
