"""A recipe's config, declared once: `Field` per top-level key, `Schema` per recipe.

    CONFIG_SCHEMA = Schema(
        {
            "batch_size": Field(int, 1, "samples per micro-batch on each rank", minimum=1),
            "tensor_parallel_dim": Field(int, 1, "tensor-parallel degree", minimum=1),
            "loss": Field(dict | None, None, "the loss component", component=True, controls=("linear_ce",)),
        },
        checks=(optimizer_in_backward_problems,),
        nproc_check=check_parallel_degrees,  # (cfg, nproc) -> problems: the mesh degrees fit nproc
    )

Everything else reads that declaration (see docs/ARCHITECTURE.md, "Where a config key lives"):
- `engine.config.validate(cfg, recipe=NAME)` and `tunebench validate`: `Schema.problems` (unknown keys
  with did-you-mean, each value's type and bounds, the checks between keys);
- the recipe: `Schema.check(cfg)` in its entry point, `Schema.fill(cfg)` for the defaults it trains with;
- the launcher: `Schema.nproc_problem` (`max_nproc`, and `nproc_check`: the parallel degrees fit);
- the workbench's Recipe screen: `Schema.offers(control)` / `absent_controls()` (which memory and
  parallel controls apply, and why not) and `max_nproc`.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config._errors import ConfigError, ConfigProblem, did_you_mean, dotted
from engine.config._interpolate import UNRESOLVED
from engine.config._types import accepts, is_component, type_name

REQUIRED = object()  # a Field default: the key must be given (and not null)
ALWAYS_ALLOWED_KEYS = frozenset({"allowed_components"})  # refused by validate itself, not as unknown
# The workbench controls a Field may name in `controls` (engine/ never imports the workbench; the names
# are the contract): `nproc` is the launcher's process count, the others set config keys.
CONTROL_NAMES = frozenset(
    {"nproc", "lora_rank", "optimizer", "activation_checkpointing", "optimizer_in_bwd", "linear_ce",
     "compile", "packing"}
)  # fmt: skip


@dataclass(frozen=True)
class Field:
    """One config key: what it accepts, what it means when absent, what it does, who shows it.

    Args:
        type: an annotation as in a builder signature (`int`, `float | None`, `bool`, `dict | list`).
        default: the value the recipe uses when the key is absent; `REQUIRED` when it must be given.
        doc: one line: what the key does (the Recipe screen and `tunebench validate` show it).
        minimum / maximum: the allowed range of a number (inclusive), or None; `above` / `below`: the
            number must exceed / stay under it.
        pattern: a regex (full match, case-insensitive) a string value must match; `expect` words it.
        component: a `_component_` mapping (or, with `list` in `type`, a list of them).
        keys: for a plain mapping (a nested block: `validation`, `fsdp`), the Fields of its keys;
            other keys are reported unknown (did-you-mean), and `Schema.fill` fills the absent ones
            with their defaults, so a recipe reads `cfg["fsdp"]["cpu_offload"]` without a default of
            its own. A block whose default is a mapping reads null as that default (all sub-defaults).
        values: for a mapping of names to things (`rewards:`), the Field every value follows.
        controls: the workbench controls (`CONTROL_NAMES`) that set this key for this recipe.
    """

    type: Any
    default: Any = None
    doc: str = ""
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None
    pattern: str | None = None
    expect: str = ""
    component: bool = False
    keys: dict[str, Field] | None = field(default=None, hash=False)
    values: Field | None = None
    controls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.controls) - CONTROL_NAMES
        if unknown:
            raise ValueError(
                f"Field controls {sorted(unknown)} are not workbench controls {sorted(CONTROL_NAMES)}"
            )

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def but(self, **changes: Any) -> Field:
        """This field with some attributes changed (a recipe's own doc or default for a shared key)."""
        return dataclasses.replace(self, **changes)

    def filled(self, value: Any) -> Any:
        """`value` with a block's absent keys set to their defaults (recursively); other values as
        they are. Null for a block whose default is a mapping is that mapping, filled."""
        if self.keys is None:
            return value
        if value is None and isinstance(self.default, dict):
            value = self.default
        if not isinstance(value, dict):
            return value
        out = dict(value)
        for sub, rule in self.keys.items():
            if sub not in out and not rule.required:
                out[sub] = copy.deepcopy(rule.default)
            if sub in out:
                out[sub] = rule.filled(out[sub])
        return out

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
            words = [_PLAIN_WORDS.get(type_name(m), type_name(m)) for m in members]
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

    def why_not(self, value: Any) -> str | None:
        """Why `value` breaks this field (`got str 'two'`; `missing` for a required null), or None."""
        got = f"got {type(value).__name__} {value!r}" if value is not None else "got null"
        if value is None:
            if self.required:
                return "missing"
            return None if accepts(None, self.type) is not False else got
        if value is UNRESOLVED:
            return None
        if accepts(value, self.type) is False:
            return got
        if self.component:
            items = value if isinstance(value, list) else [value]
            if not items or not all(is_component(v) for v in items):
                return got
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                return got
            if self.above is not None and value <= self.above:
                return got
            if self.maximum is not None and value > self.maximum:
                return got
            if self.below is not None and value >= self.below:
                return got
        if (
            self.pattern is not None
            and isinstance(value, str)
            and not re.fullmatch(self.pattern, value, re.I)
        ):
            return got
        return None


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


def field_problems(cfg: Mapping, fields: Mapping[str, Field], prefix: tuple = ()) -> list[ConfigProblem]:
    """The problems of each declared key of `cfg` (missing required keys, type, bounds, nested keys)."""
    out: list[ConfigProblem] = []
    for key, rule in fields.items():
        here = dotted(prefix + (key,))
        if key not in cfg:
            if rule.required:
                out.append(ConfigProblem(here, "missing", f"add `{key}:` with {rule.wanted()}"))
            continue
        value = cfg[key]
        why = rule.why_not(value)
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
            out.extend(field_problems(value, rule.keys, prefix + (key,)))
        if rule.values is not None and isinstance(value, dict) and why is None:
            out.extend(field_problems(value, {sub: rule.values for sub in value}, prefix + (key,)))
    return out


Check = Callable[[dict], list[ConfigProblem]]


@dataclass(frozen=True)
class Schema:
    """A recipe's whole config: its Fields, the checks between them, and what that means for processes.

    Args:
        fields: top-level key -> Field (`allowed_components` is not reported unknown: `validate` refuses it on its own).
        checks: functions `cfg -> [ConfigProblem]` for problems between keys, found without building
            anything (optimizer-in-backward with gradient accumulation, ...); they run only when every
            field is fine, on the config with defaults filled in (`fill`).
        max_nproc: the most processes the recipe runs on (None: any); `nproc_note` says why.
        nproc_check: `(cfg, nproc) -> [ConfigProblem]`, what the keys need of the process count (the
            parallel degrees multiply to a divisor of it); the launcher and the recipe ask it.
        absent: workbench controls no field names -> why this recipe does not read them (shown by the
            Recipe screen; a control neither named nor explained reads "not read by this recipe").
        call_site_args: required builder arguments the recipe passes itself (not reported missing).
    """

    fields: dict[str, Field]
    checks: tuple[Check, ...] = ()
    max_nproc: int | None = None
    nproc_note: str = ""
    nproc_check: Callable[[dict, int], list[ConfigProblem]] | None = None
    absent: dict[str, str] = field(default_factory=dict)
    call_site_args: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        named = {c for f in self.fields.values() for c in f.controls}
        both = named & set(self.absent)
        if both:
            raise ValueError(f"controls {sorted(both)} are both named by a field and listed as absent")
        if (self.max_nproc == 1) != bool(self.nproc_note):
            raise ValueError("a one-process schema says why in nproc_note (and only that one)")

    # -- reading --------------------------------------------------------------------------------
    def field_at(self, path: str) -> Field | None:
        """The Field of a key, top-level (`batch_size`) or in a block (`validation.fraction`); None
        for a key the schema does not declare (a component's own arguments included)."""
        fields: Mapping[str, Field] | None = self.fields
        found = None
        for part in path.split("."):
            if fields is None or part not in fields:
                return None
            found = fields[part]
            fields = found.keys
        return found

    def doc(self, key: str) -> str:
        """The one-line description of a key, top-level or dotted into a block ("" for an unknown one)."""
        f = self.field_at(key)
        return f.doc if f is not None else ""

    def fill(self, cfg: Mapping) -> dict:
        """A copy of `cfg` with every absent optional key set to its default, and the absent keys of
        the blocks given (or defaulted) filled the same way: what the recipe trains with."""
        out = dict(cfg)
        for key, f in self.fields.items():
            if key not in out and not f.required:
                out[key] = copy.deepcopy(f.default)  # a list default is the run's own
            if key in out:
                out[key] = f.filled(out[key])
        return out

    # -- checking -------------------------------------------------------------------------------
    def problems(self, cfg: Mapping) -> list[ConfigProblem]:
        """Unknown top-level keys (did-you-mean), each key's value, then the checks between keys."""
        allowed = set(self.fields) | ALWAYS_ALLOWED_KEYS
        out = [
            ConfigProblem(
                str(key),
                f"unknown top-level key for this recipe{did_you_mean(str(key), allowed)}",
                "remove it or fix the spelling (`tunebench cat` a built-in config for the known keys)",
            )
            for key in cfg
            if key not in allowed
        ]
        out.extend(field_problems(cfg, self.fields))
        if not out:  # the checks between keys get values the fields accepted, defaults filled in
            filled = self.fill(cfg)
            for check in self.checks:
                out.extend(check(filled))
        return out

    def check(self, cfg: Mapping) -> dict:
        """`fill(cfg)` when the schema finds no problem. Raises ConfigError: the first problem, and how
        many more `tunebench validate` lists."""
        problems = self.problems(cfg)
        if problems:
            raise ConfigError.from_problems(problems)
        return self.fill(cfg)

    def nproc_problem(self, nproc: int, cfg: Mapping, *, recipe: str = "this") -> str | None:
        """Why `nproc` processes cannot run `cfg` (over `max_nproc`, or what `nproc_check` finds), in
        the words that follow `--nproc N: `; None when they can."""
        if self.max_nproc is not None and nproc > self.max_nproc:
            return f"the {recipe} recipe runs on at most {self.max_nproc} process(es); use --nproc {self.max_nproc}"
        problems = self.nproc_check(self.fill(cfg), nproc) if self.nproc_check is not None else []
        return str(problems[0]) if problems else None

    def world_size_error(self, world_size: int, cfg: Mapping) -> ConfigError | None:
        """The same facts inside a started recipe (torchrun run by hand): more ranks than `max_nproc`,
        or what `nproc_check` finds for `world_size`. None when the world size fits."""
        if self.max_nproc is not None and world_size > self.max_nproc:
            return ConfigError(self.nproc_note, field="nproc_per_node", hint=f"use {self.max_nproc}")
        problems = self.nproc_check(self.fill(cfg), world_size) if self.nproc_check is not None else []
        return ConfigError.from_problem(problems[0]) if problems else None

    # -- the workbench's controls -------------------------------------------------------------
    def offers(self, control: str) -> bool:
        """True when the Recipe screen shows `control` for this recipe (a field names it; `nproc` when
        the recipe runs on more than one process)."""
        if control == "nproc":
            return self.max_nproc != 1
        return any(control in f.controls for f in self.fields.values())

    def absent_controls(self) -> dict[str, str]:
        """Every workbench control this recipe does not offer -> why."""
        out = {}
        for name in sorted(CONTROL_NAMES):
            if not self.offers(name):
                out[name] = (
                    self.nproc_note if name == "nproc" else self.absent.get(name, "not read by this recipe")
                )
        return out
