"""Which `_component_` paths may be imported, and importing them.

A component path is allowed when it equals or starts with (at a dot boundary) one of:
- the built-in prefixes `engine`, `torch`, `torchao`;
- the prefixes in the config's top-level `allowed_components: [prefix, ...]`;
- the prefixes in the environment variable `TUNEBENCH_ALLOW` (comma-separated);
- prefixes registered in this process with `allow_components` (`load_config` registers the
  loaded config's `allowed_components`, so `instantiate(cfg["model"])` honours them).

Refused unless a user-given prefix names them explicitly:
- callables that load or run code from outside the config (`torch.load`, `torch.hub`, ...) and
  `engine.config` itself (a config must not widen its own allow-list);
- dunder segments anywhere, and private segments (`_x`) under `torch`/`torchao`;
- paths that pass the prefix check but reach another module (`torch.os.system`: every module on the
  way, and the defining module of a stdlib class or function, must be allowed too).
The prefix check runs before anything is imported, so a refused path never executes code.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import sys
import types
from collections.abc import Iterable
from typing import Any

from engine.config._errors import ConfigError, did_you_mean

BUILTIN_PREFIXES = ("engine", "torch", "torchao")
# Under the built-in prefixes but able to run arbitrary code or fetch from the network.
DENIED_PREFIXES = (
    "torch.load",
    "torch.hub",
    "torch.jit.load",
    "torch.package",
    "torch.utils.cpp_extension",
    "torch.ops.load_library",
    "torch.classes.load_library",
    "torch.serialization",
    "torch.distributed.rpc",
    "engine.config",  # would let a config widen its own allow-list
)
_DOTTED_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_registered: list[str] = []


def _norm(prefix: str) -> str:
    return prefix.strip().rstrip(".")


def _matches(name: str, prefix: str) -> bool:
    p = _norm(prefix)
    return bool(p) and (name == p or name.startswith(p + "."))


def env_prefixes() -> list[str]:
    """Prefixes from `TUNEBENCH_ALLOW` (comma-separated; blanks ignored)."""
    return [_norm(p) for p in os.environ.get("TUNEBENCH_ALLOW", "").split(",") if _norm(p)]


def config_prefixes(cfg: Any) -> list[str]:
    """The config's `allowed_components` as a list of prefixes.

    Raises ConfigError when it is not a string or a list of strings.
    """
    if not isinstance(cfg, dict) or cfg.get("allowed_components") is None:
        return []
    value = cfg["allowed_components"]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and _norm(v) for v in value):
        raise ConfigError(
            "must be a list of module prefixes",
            hint="write e.g. `allowed_components: [mypkg.models]`",
            field="allowed_components",
        )
    return [_norm(v) for v in value]


def allow_components(prefixes: Iterable[str]) -> None:
    """Allow `_component_` paths under `prefixes` for the rest of this process."""
    for p in prefixes:
        if _norm(p) and _norm(p) not in _registered:
            _registered.append(_norm(p))


def reset_allowed_components() -> None:
    """Forget the prefixes registered with `allow_components` (tests use this)."""
    _registered.clear()


def _user_prefixes(extra: Iterable[str]) -> list[str]:
    return [*(_norm(p) for p in extra), *env_prefixes(), *_registered]


def _refusal(name: str, user: list[str]) -> str | None:
    """None when the dotted `name` is allowed, else why it is not."""
    if any(_matches(name, p) for p in user):
        return None
    parts = name.split(".")
    if any(seg.startswith("__") for seg in parts):
        return "reaches a dunder attribute"
    if any(_matches(name, p) for p in DENIED_PREFIXES):
        if _matches(name, "engine.config"):
            return "is the config system itself (a config may not widen its own allow-list)"
        return "can run code from outside the config"
    if parts[0] in ("torch", "torchao") and any(seg.startswith("_") for seg in parts):
        return "is private to torch (a segment starts with '_')"
    if any(_matches(name, p) for p in BUILTIN_PREFIXES):
        return None
    return "is not under an allowed prefix"


def _refuse(field: str, subject: str, why: str, allow: str, user: list[str]) -> ConfigError:
    return ConfigError(
        f"{subject} {why} (allowed: {', '.join(p + '.' for p in BUILTIN_PREFIXES)}"
        f"{''.join(', ' + p + '.' for p in dict.fromkeys(user) if p not in BUILTIN_PREFIXES)})",
        hint=f"to allow it add `allowed_components: [{allow}]` to the config or set TUNEBENCH_ALLOW={allow}",
        field=field,
    )


def check_allowed(name: str, *, field: str | None = None, extra: Iterable[str] = ()) -> None:
    """Raise ConfigError unless the component path `name` is allowed (see the module docstring).

    `field` names the config field in the message (default: the path itself).
    """
    field = field or str(name)
    if not isinstance(name, str) or not _DOTTED_RE.match(name):
        raise ConfigError(
            f"{name!r} is not a dotted import path",
            hint="write e.g. `_component_: torch.optim.AdamW`",
            field=field,
        )
    user = _user_prefixes(extra)
    why = _refusal(name, user)
    if why is not None:
        allow = name.split(".")[0] if why == "is not under an allowed prefix" else name
        raise _refuse(field, f"component {name}", why, allow, user)


def _check_reached(name: str, obj: Any, *, field: str, extra: Iterable[str]) -> None:
    """Refuse a path that passes the prefix check but lands elsewhere (`torch.os.system`)."""
    user = _user_prefixes(extra)
    if isinstance(obj, types.ModuleType):
        target = obj.__name__
    elif inspect.isclass(obj) or inspect.isroutine(obj):  # instances (a functools.partial) are the owner's
        target = getattr(obj, "__module__", None)
        if not isinstance(target, str) or target.split(".")[0] not in sys.stdlib_module_names:
            return
    else:
        return
    why = _refusal(target, user)
    if why is not None:
        raise _refuse(
            field, f"component {name} leads to module {target}, which", why, target.split(".")[0], user
        )


def _module_names(package: str) -> list[str]:
    try:
        pkg = importlib.import_module(package)
    except Exception:
        return []
    return [m.name for m in pkgutil.iter_modules(getattr(pkg, "__path__", []) or [])]


def import_component(name: str, *, field: str | None = None, extra: Iterable[str] = ()) -> Any:
    """Check the allow-list, then import `name` (`pkg.module.Attr[.attr...]`) and return the object.

    `field` names the config field in messages (default: the path itself); `extra` adds prefixes
    (e.g. the config's `allowed_components`) to the allow-list.

    Raises ConfigError naming `field` when refused or when the path cannot be imported, with a
    did-you-mean over the module's attributes or the package's modules.
    """
    field = field or str(name)
    check_allowed(name, field=field, extra=extra)
    parts = name.split(".")
    module = None
    for cut in range(len(parts), 0, -1):
        modname = ".".join(parts[:cut])
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and not (modname == exc.name or modname.startswith(exc.name + ".")):
                raise ConfigError(
                    f"importing {modname} failed: missing module {exc.name}",
                    hint="install it",
                    field=field,
                ) from None
            continue
        except Exception as exc:
            raise ConfigError(
                f"importing {modname} failed ({type(exc).__name__}: {exc})",
                hint="fix that module",
                field=field,
            ) from None
        obj: Any = module
        _check_reached(name, module, field=field, extra=extra)
        for i, attr in enumerate(parts[cut:]):
            if not hasattr(obj, attr):
                owner = ".".join(parts[: cut + i])
                choices = [a for a in dir(obj) if not a.startswith("_")]
                if isinstance(obj, type(module)):
                    choices += _module_names(owner)
                raise ConfigError(
                    f"unknown component {name}: {owner} has no {attr!r}{did_you_mean(attr, choices)}",
                    hint="fix the path",
                    field=field,
                )
            obj = getattr(obj, attr)
            _check_reached(name, obj, field=field, extra=extra)
        return obj
    hint = did_you_mean(parts[0], [m.name for m in pkgutil.iter_modules()])
    raise ConfigError(
        f"unknown component {name}: no module {parts[0]!r}{hint}", hint="fix the path", field=field
    )
