"""The user's side of the component allow-list: prefixes a person grants, never a config file.

A config may come from anywhere (a download, a colleague, a model card), so it cannot widen the list of
what `_component_` may name. Only the person running tunebench can, in three places, each remembered
with where it came from (`Grant.source`):
- `tunebench run/validate ... --allow-component PREFIX` (repeatable): `grant_components(prefixes,
  source="--allow-component")` in that process;
- the environment variable `TUNEBENCH_ALLOW=prefix,prefix` (the launcher sets it for a run's processes
  to the prefixes the run was registered with, so a queued or resumed run keeps exactly those);
- `allowed_components: [prefix, ...]` in `TUNEBENCH_HOME/settings.yaml`: a standing grant of this home.
Code may also grant in-process (`grant_components`: the asynchronous GRPO actors receive the trainer's).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.config._errors import ConfigError

ENV_VAR = "TUNEBENCH_ALLOW"
SETTINGS_NAME = "settings.yaml"
SETTINGS_KEY = "allowed_components"
_PREFIX_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class Grant:
    """One user-granted prefix: `prefix` (a dotted module or object path) and `source` (where it was given)."""

    prefix: str
    source: str


_granted: list[Grant] = []


def _norm(prefix: str) -> str:
    return str(prefix).strip().rstrip(".")


def check_prefix(prefix: str, *, where: str) -> str:
    """`prefix` normalised (spaces and a trailing dot dropped). Raises ConfigError naming `where` when it
    is not a dotted name (`mypkg.rewards`)."""
    p = _norm(prefix)
    if not _PREFIX_RE.match(p) or any(seg.startswith("__") for seg in p.split(".")):
        raise ConfigError(
            f"{prefix!r} is not a dotted module prefix",
            hint="give a package or module name such as mypkg.rewards",
            field=where,
        )
    return p


def grant_components(prefixes: Iterable[str], *, source: str = "code") -> None:
    """Allow `_component_` paths under `prefixes` for the rest of this process, recorded as from `source`.

    Raises ConfigError (naming `source`) for a prefix that is not a dotted name."""
    for raw in prefixes:
        p = check_prefix(raw, where=source)
        if all(g.prefix != p for g in _granted):
            _granted.append(Grant(p, source))


def reset_grants() -> None:
    """Forget the in-process grants (tests use this)."""
    _granted.clear()


def settings_path() -> Path:
    """`TUNEBENCH_HOME/settings.yaml` (the home as `engine.tracking.paths.tunebench_home` finds it)."""
    return Path(os.environ.get("TUNEBENCH_HOME") or "~/.tunebench").expanduser() / SETTINGS_NAME


def _env_grants() -> list[Grant]:
    raw = [p for p in os.environ.get(ENV_VAR, "").split(",") if _norm(p)]
    return [Grant(check_prefix(p, where=ENV_VAR), ENV_VAR) for p in raw]


def _settings_grants() -> list[Grant]:
    path = settings_path()
    if not path.is_file():
        return []
    from engine.config._yaml import load_yaml

    data = load_yaml(path)
    value = data.get(SETTINGS_KEY) if isinstance(data, dict) else None
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    where = f"{path}: {SETTINGS_KEY}"
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError("must be a list of module prefixes", hint="write e.g. `allowed_components: [mypkg]`",
                          field=where)  # fmt: skip
    return [Grant(check_prefix(v, where=where), str(path)) for v in value if _norm(v)]


def user_grants() -> list[Grant]:
    """Every prefix the user granted, first source first, each prefix once: in-process grants, then
    `TUNEBENCH_ALLOW`, then `TUNEBENCH_HOME/settings.yaml`. Raises ConfigError (one line naming the
    variable or file) when one of them holds something that is not a dotted prefix."""
    out: dict[str, Grant] = {}
    for g in [*_granted, *_env_grants(), *_settings_grants()]:
        out.setdefault(g.prefix, g)
    return list(out.values())


def user_prefixes() -> list[str]:
    """The prefixes of `user_grants()`."""
    return [g.prefix for g in user_grants()]


def describe_grants(grants: Iterable[Grant]) -> str:
    """`mypkg (from --allow-component); other (from /home/me/.tunebench/settings.yaml)`: what a run's
    tracker event records (`parse_granted` reads the prefixes back)."""
    return "; ".join(f"{g.prefix} (from {g.source})" for g in grants)


def parse_granted(text: str) -> list[str]:
    """The prefixes of a `describe_grants` line (anything that is not a dotted prefix is skipped)."""
    out = []
    for part in text.split("; "):
        word = part.split(" ", 1)[0].strip()
        if _PREFIX_RE.match(word):
            out.append(word)
    return out
