"""`${a.b}` interpolation: whole-value references keep their type, partial ones become text.

    lr: 3e-4
    optimizer: {lr: ${lr}}                  # -> 0.0003 (a float, not a string)
    checkpoint_dir: ${output_dir}/ckpt      # -> "runs/7/ckpt"
    first_source: ${dataset.0.source}       # list items by index
    price: $${not_a_reference}              # `$$` escapes: -> "${not_a_reference}"

A reference may point at a mapping or list (the resolved copy is inserted) or at another reference
(resolved first). A reference that leads back to itself is a circular interpolation.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from engine.config._errors import ConfigError, did_you_mean, dotted

# `$${` is an escaped `${`; `${path}` is a reference; path segments are keys or list indices.
_REF_RE = re.compile(r"\$\$\{|\$\{([^${}]*)\}")


def has_reference(value: Any) -> bool:
    """True for a string holding at least one `${...}` reference."""
    return isinstance(value, str) and any(m.group(0) != "$${" for m in _REF_RE.finditer(value))


def parse_ref(text: str, *, where: str) -> tuple:
    """`"a.0.b"` -> `("a", 0, "b")`. Raises ConfigError for an empty or malformed path."""
    parts = text.strip().split(".")
    if not text.strip() or any(not p for p in parts):
        raise ConfigError(
            f"malformed interpolation ${{{text}}}", hint="write ${key} or ${a.b.c}", field=where
        )
    return tuple(int(p) if p.isdigit() else p for p in parts)


def _step(node: Any, key: Any, *, here: tuple, ref: str, where: str) -> Any:
    if isinstance(node, dict):
        if key in node:
            return node[key]
        if str(key) in node:
            return node[str(key)]
        raise ConfigError(
            f"interpolation ${{{ref}}} refers to {dotted(here + (key,))}, which does not exist"
            f"{did_you_mean(str(key), map(str, node))}",
            hint="add that key or fix the reference",
            field=where,
        )
    if isinstance(node, list) and isinstance(key, int):
        if key < len(node):
            return node[key]
        raise ConfigError(
            f"interpolation ${{{ref}}}: {dotted(here)} has {len(node)} items, no index {key}",
            hint="fix the index",
            field=where,
        )
    raise ConfigError(
        f"interpolation ${{{ref}}}: {dotted(here)} is a {type(node).__name__}, it has no key {key!r}",
        hint="fix the reference",
        field=where,
    )


class _Unresolved:
    """Placeholder for a value whose interpolation failed (lenient mode, used by `validate`)."""

    def __repr__(self) -> str:
        return "<unresolved>"

    def __deepcopy__(self, memo):
        return self


UNRESOLVED = _Unresolved()


class Resolver:
    """Resolves every reference in a config tree, memoising by path and detecting cycles.

    With `errors` given (a list), failures are appended there and the value becomes `UNRESOLVED`
    instead of raising.
    """

    def __init__(self, root: dict, errors: list[ConfigError] | None = None) -> None:
        self.root = root
        self.errors = errors
        self._done: dict[tuple, Any] = {}
        self._stack: list[tuple] = []

    def resolve(self) -> dict:
        return self.get(())

    def get(self, path: tuple) -> Any:
        """The fully resolved value at `path` (a tuple of keys and indices)."""
        if path in self._done:
            return self._done[path]
        if path in self._stack:
            cycle = self._stack[self._stack.index(path) :] + [path]
            where = dotted(cycle[0])
            raise ConfigError(
                f"circular interpolation {' -> '.join(dotted(p) for p in cycle)}",
                hint="make one of these a plain value",
                field=where,
            )
        self._stack.append(path)
        try:
            value = self._resolve_node(self._raw(path), path)
        finally:
            self._stack.pop()
        self._done[path] = value
        return value

    def _raw(self, path: tuple) -> Any:
        node: Any = self.root
        for i, key in enumerate(path):
            node = _step(node, key, here=path[:i], ref=dotted(path), where=dotted(path))
            if i < len(path) - 1 and has_reference(node):
                node = self.get(path[: i + 1])
        return node

    def _resolve_node(self, node: Any, path: tuple) -> Any:
        if isinstance(node, dict):
            return {k: self._child(path + (k,)) for k in node}
        if isinstance(node, list):
            return [self._child(path + (i,)) for i in range(len(node))]
        if isinstance(node, str):
            return self._resolve_string(node, path)
        return node

    def _child(self, path: tuple) -> Any:
        if self.errors is None:
            return self.get(path)
        try:
            return self.get(path)
        except ConfigError as exc:
            self.errors.append(exc)
            self._done[path] = UNRESOLVED
            return UNRESOLVED

    def _resolve_string(self, text: str, path: tuple) -> Any:
        where = dotted(path)
        matches = list(_REF_RE.finditer(text))
        if not matches:
            return text
        if len(matches) == 1 and matches[0].span() == (0, len(text)) and matches[0].group(0) != "$${":
            return copy.deepcopy(self._lookup(matches[0].group(1), where))  # whole value: keep its type
        out, pos = [], 0
        for m in matches:
            out.append(text[pos : m.start()])
            if m.group(0) == "$${":
                out.append("${")
            else:
                value = self._lookup(m.group(1), where)
                if isinstance(value, (dict, list)):
                    raise ConfigError(
                        f"${{{m.group(1)}}} is a {type(value).__name__} and cannot be part of a string",
                        hint="refer to one of its scalar fields instead",
                        field=where,
                    )
                if value is UNRESOLVED:
                    return UNRESOLVED
                out.append(
                    "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
                )
            pos = m.end()
        out.append(text[pos:])
        return "".join(out)

    def _lookup(self, ref: str, where: str) -> Any:
        target = parse_ref(ref, where=where)
        node: Any = self.root
        for i, key in enumerate(target):  # walk the raw tree so a missing key gets a precise message
            node = _step(node, key, here=target[:i], ref=ref, where=where)
            if i < len(target) - 1 and has_reference(node):
                node = self.get(target[: i + 1])
        return self.get(target)


def resolve_interpolations(cfg: dict) -> dict:
    """A copy of `cfg` with every `${...}` resolved. Raises ConfigError naming the field."""
    try:
        return Resolver(cfg).resolve()
    except RecursionError:
        raise ConfigError(
            "nested or chained too deeply to resolve",
            label="<config>",
            hint="flatten the config or shorten the chain of references",
        ) from None
