"""Build objects from `_component_` nodes.

    optimizer:
      _component_: torch.optim.AdamW
      lr: 3e-4
    instantiate(cfg["optimizer"], model.parameters())       # AdamW(params, lr=0.0003)
    instantiate(cfg["optimizer"], model.parameters(), lr=1e-3)  # call-site kwargs win over the YAML

Nested nodes with `_component_` are built first (depth first); mappings without one are passed as
plain dicts with their inner components built; lists likewise. `instantiate(None)` returns None so
optional components can be switched off with `key: null`.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from engine.config._components import import_component
from engine.config._errors import ConfigError
from engine.config._interpolate import has_reference


def _build(value: Any, path: str) -> Any:
    if isinstance(value, dict):
        if "_component_" in value:
            return _call(value, path, (), {})
        return {k: _build(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_build(v, f"{path}.{i}") for i, v in enumerate(value)]
    if has_reference(value):
        raise ConfigError(
            f"unresolved interpolation {value!r}",
            hint="load the config with load_config, which resolves it",
            field=path,
        )
    return value


def _call(node: dict, path: str, args: tuple, kwargs: dict) -> Any:
    name = node["_component_"]
    target = import_component(name, field=f"{path}._component_")
    built = {k: _build(v, f"{path}.{k}") for k, v in node.items() if k != "_component_" and k not in kwargs}
    built.update(kwargs)
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        sig = None
    # The top node's config key is the caller's (`instantiate(cfg["model"])`): it is named by its component.
    top = path == name
    label, node_words = ("", f"the node with _component_: {name}") if top else (path, path)
    if sig is not None:
        try:
            sig.bind(*args, **built)
        except TypeError as exc:
            missing = re.search(r"missing a required argument: '(\w+)'", str(exc))
            if missing:
                key = missing.group(1)
                raise ConfigError(
                    f"missing required argument {key!r} of {name}",
                    hint=f"add `{key}: VALUE` under {node_words}",
                    field=f"{path}.{key}",
                ) from None
            raise ConfigError(
                f"{name} cannot take these arguments ({exc})",
                hint="remove or rename the offending key under"
                f" {node_words}, or check that {name} is the right kind of component here",
                field=path,
                label=label,
            ) from None
    try:
        return target(*args, **built)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{name}(...) refused its arguments: {exc}",
            hint="fix " + (f"that value in {node_words}" if top else f"the values under {path}"),
            field=path,
            label=label,
        ) from exc


def instantiate(node: Any, *args: Any, **kwargs: Any) -> Any:
    """Build the object described by `node` (a mapping with `_component_`).

    `args` are passed positionally before the YAML arguments; `kwargs` override YAML keys of the same
    name. Returns None for a None node. Raises ConfigError when the node has no `_component_`, the
    component is not allowed or not importable, a required argument is missing (named), or the
    callable rejects its arguments with TypeError/ValueError.
    """
    if node is None:
        return None
    if not isinstance(node, dict):
        raise ConfigError(
            f"expected a mapping with _component_, got {type(node).__name__} {node!r}",
            hint="pass the config node of the component",
            label="instantiate",
        )
    if "_component_" not in node:
        keys = ", ".join(map(str, node)) or "none"
        raise ConfigError(
            f"the mapping has no _component_ key (keys: {keys})",
            hint="add `_component_: dotted.path`",
            label="instantiate",
            field="_component_",
        )
    name = node["_component_"]
    return _call(node, name if isinstance(name, str) else "<component>", args, kwargs)
