"""Which `_component_` paths may be imported, and importing them.

A component path is allowed when
- it is on the allow-list (`engine.config._allowlist`: exact third-party names such as
  `torch.optim.AdamW`, and the project's own component modules such as `engine.models`), or
- the user granted a prefix covering it (`engine.config._grants`: `--allow-component`, `TUNEBENCH_ALLOW`,
  `TUNEBENCH_HOME/settings.yaml`). A config cannot grant anything: a config that still has an
  `allowed_components:` key is refused (`config_widening_error`).
Never allowed: dunder segments (`torch.nn.Linear.__class__`); private segments (`_x`) unless a user
grant covers them. The name check runs before anything is imported, so a refused path never executes
code. After importing, every module the path reaches by attribute and the defining module of the class
or function it lands on must be allowed too (`torch.os.system` under a `torch` grant, or a function an
engine module imported from elsewhere, is refused although its first segments are allowed), unless the
path is named exactly (on the list, or by a user grant of that very name).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
import re
import types
from collections.abc import Iterable
from typing import Any

from engine.config._allowlist import ENGINE_MODULES, NAMED, in_engine_modules, listed, under
from engine.config._errors import ConfigError, did_you_mean
from engine.config._grants import ENV_VAR, grant_components, reset_grants, settings_path, user_prefixes

# What may be named with no grant: the exact names, and the project's component modules.
BUILTIN_PREFIXES = ("engine.models", "engine.modules", "engine.data")
_DOTTED_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
CONFIG_KEY = "allowed_components"


class ComponentRefused(ConfigError):
    """A `_component_` (or a config key) that the allow-list refuses: the security refusal, one line."""


def how_to_allow(prefix: str) -> str:
    """The words that say where a user (never a config) widens the allow-list with `prefix`."""
    return (
        f"if you trust it, allow it yourself (tunebench run/validate --allow-component {prefix}, "
        f"{ENV_VAR}={prefix}, or allowed_components in {settings_path()})"
    )


def allow_components(prefixes: Iterable[str], *, source: str = "code") -> None:
    """Allow `_component_` paths under `prefixes` for the rest of this process (a user-side grant;
    the CLI's `--allow-component` calls this with its own `source`)."""
    grant_components(prefixes, source=source)


def reset_allowed_components() -> None:
    """Forget the prefixes granted in this process (tests use this)."""
    reset_grants()


def config_widening_error(cfg: Any) -> ComponentRefused | None:
    """The refusal of a config that tries to widen its own allow-list (`allowed_components:`), or None."""
    if not isinstance(cfg, dict) or CONFIG_KEY not in cfg:
        return None
    return ComponentRefused(
        "a config cannot widen its own allow-list (it may come from anyone)",
        hint="remove the key; " + how_to_allow("PREFIX"),
        field=CONFIG_KEY,
    )


def _user_covers(name: str, user: list[str]) -> bool:
    return any(under(name, p) for p in user)


def _refusal(name: str, user: list[str]) -> str | None:
    """None when the dotted `name` is allowed, else why it is not."""
    parts = name.split(".")
    if any(seg.startswith("__") for seg in parts):
        return "reaches a dunder attribute"
    if _user_covers(name, user):
        return None
    if any(seg.startswith("_") for seg in parts):
        return "is private (a segment starts with '_')"
    if listed(name):
        return None
    if under(name, "engine.config"):
        return "is the config system itself (a config may not widen its own allow-list)"
    return "is not on the allow-list of components"


def check_allowed(name: str, *, field: str | None = None) -> None:
    """Raise ComponentRefused (a ConfigError) unless the component path `name` is allowed (see the
    module docstring); imports nothing. `field` names the config field (default: the path itself)."""
    field = field or str(name)
    if not isinstance(name, str) or not _DOTTED_RE.match(name):
        raise ConfigError(
            f"{name!r} is not a dotted import path",
            hint="write e.g. `_component_: torch.optim.AdamW`",
            field=field,
        )
    why = _refusal(name, user_prefixes())
    if why is not None:
        close = _close_listed(name)
        if close:
            hint = "fix the path"
        else:
            hint = 'use a listed component (docs/ARCHITECTURE.md, "Trust model")' + (
                "" if why == "reaches a dunder attribute" else "; " + how_to_allow(name)
            )
        raise ComponentRefused(f"component {name} {why}{close}", hint=hint, field=field)


def _close_listed(name: str) -> str:
    """` (did you mean 'torch.optim.AdamW'?)` for a near miss of a listed name or engine module, else ""."""
    parts = name.split(".")
    if parts[0] == "engine":
        if any(under(name, m) for m in ENGINE_MODULES):
            return ""  # in a listed module but excluded or private: no other spelling is meant
        for n in (3, 2):
            close = difflib.get_close_matches(".".join(parts[:n]), ENGINE_MODULES, n=1, cutoff=0.75)
            if close and len(parts) > n:
                return f" (did you mean '{close[0]}.{'.'.join(parts[n:])}'?)"
        return ""
    close = difflib.get_close_matches(name, NAMED, n=1, cutoff=0.8)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _module_ok(modname: str, user: list[str]) -> bool:
    return in_engine_modules(modname) or _user_covers(modname, user)


def _check_reached(name: str, obj: Any, *, field: str) -> None:
    """Refuse a path that passes the name check but lands elsewhere (`engine.models.llama3.torch.save`)."""
    user = user_prefixes()
    if (
        name in NAMED or name in user
    ):  # named exactly, by the list or by the user: that object, wherever defined
        return
    if isinstance(obj, types.ModuleType):
        target, ok = obj.__name__, _module_ok(obj.__name__, user)
    elif inspect.isclass(obj) or inspect.isroutine(obj):  # instances (a functools.partial) are the owner's
        module = getattr(obj, "__module__", None)
        if not isinstance(module, str):
            return
        target = f"{module}.{getattr(obj, '__qualname__', '')}".rstrip(".")
        ok = _module_ok(module, user) or _user_covers(target, user)
    else:
        return
    if not ok:
        raise ComponentRefused(
            f"component {name} leads to {target}, which is not on the allow-list of components",
            hint='name a listed component (docs/ARCHITECTURE.md, "Trust model"); ' + how_to_allow(target),
            field=field,
        )


def _module_names(package: str) -> list[str]:
    try:
        pkg = importlib.import_module(package)
    except Exception:
        return []
    return [m.name for m in pkgutil.iter_modules(getattr(pkg, "__path__", []) or [])]


def import_component(name: str, *, field: str | None = None) -> Any:
    """Check the allow-list, then import `name` (`pkg.module.Attr[.attr...]`) and return the object.

    `field` names the config field in messages (default: the path itself).
    Raises ComponentRefused when refused, ConfigError naming `field` when the path cannot be imported
    (with a did-you-mean over the module's attributes or the package's modules).
    """
    field = field or str(name)
    check_allowed(name, field=field)
    parts = name.split(".")
    module = None
    for cut in range(len(parts), 0, -1):
        modname = ".".join(parts[:cut])
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and not (modname == exc.name or modname.startswith(exc.name + ".")):
                raise ConfigError(
                    f"importing {modname} failed: missing module {exc.name}", hint="install it", field=field
                ) from None
            continue
        except Exception as exc:
            raise ConfigError(
                f"importing {modname} failed ({type(exc).__name__}: {exc})",
                hint="fix that module",
                field=field,
            ) from None
        obj: Any = (
            module  # imported by the name the path spells (checked above); what getattr reaches is checked
        )
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
            _check_reached(name, obj, field=field)
        return obj
    hint = did_you_mean(parts[0], [m.name for m in pkgutil.iter_modules()])
    raise ConfigError(
        f"unknown component {name}: no module {parts[0]!r}{hint}", hint="fix the path", field=field
    )
