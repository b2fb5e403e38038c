"""Command lines that mix options and `key=value` overrides in any order.

argparse cannot interleave a `nargs="*"` positional with options (`run sft --config F lr=1 --nproc 2`):
the subcommand keeps everything after its first positional as `rest` (REMAINDER) and `parse_mixed`
re-reads it with `parse_intermixed_args`, so options may come before or after the overrides.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

AddOptions = Callable[[argparse.ArgumentParser], None]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (`tunebench run: argument --nproc: invalid int
    value: 'abc' — see tunebench run --help`) and exit 2, instead of the usage block and the error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} — see `{self.prog} --help`\n")


def add_documented_command(
    sub: argparse._SubParsersAction, name: str, help: str, doc: str | None
) -> argparse.ArgumentParser:
    """A subcommand whose `--help` description is its module docstring `doc` minus the usage line (the
    second paragraph; none under `python -OO`, which strips docstrings)."""
    return sub.add_parser(name, help=help, description=doc.split("\n\n")[1] if doc else None)


def add_recipe_command(
    sub: argparse._SubParsersAction,
    name: str,
    options: AddOptions,
    func: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """A `tunebench NAME RECIPE [options] [key=value ...]` subcommand (`run`, `sweep`): the recipe
    positional, then `options` and overrides in any order (`rest`; `func` re-reads it with
    `parse_mixed(args, options, ...)`)."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("recipe", help="recipe name: sft, dpo, kd, grpo, ... (engine.recipes.<recipe>)")
    add_rest(p)
    options(p)
    p.set_defaults(func=func)
    return p


def add_config_option(p: argparse.ArgumentParser) -> None:
    """`--config`, required by the command itself (not argparse: it may follow the overrides)."""
    p.add_argument("--config", help="a YAML file or a built-in config name (tunebench ls); required")


def add_rest(p: argparse.ArgumentParser) -> None:
    """The catch-all positional holding options and overrides that follow the first positional."""
    p.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="key=value", help="config overrides (a.b=1, ~key, ...)"
    )


def parse_mixed(args: argparse.Namespace, add_options: AddOptions, *, prog: str) -> argparse.Namespace:
    """`args` with the options found in `args.rest` applied and the leftovers as `args.overrides`."""
    inner = OneLineParser(prog=prog, add_help=False)
    add_options(inner)
    inner.add_argument("overrides", nargs="*")
    dests = [a.dest for a in inner._actions if a.dest != "overrides"]
    inner.set_defaults(**{d: getattr(args, d) for d in dests if hasattr(args, d)})
    ns = inner.parse_intermixed_args(args.rest)
    for key, value in vars(ns).items():
        setattr(args, key, value)
    return args


def add_allow_option(p: argparse.ArgumentParser) -> None:
    """`--allow-component PREFIX` (repeatable): the user's widening of the component allow-list."""
    p.add_argument(
        "--allow-component",
        action="append",
        default=[],
        metavar="PREFIX",
        help="let `_component_` name paths under PREFIX (repeatable; a run records it). A config cannot "
        "allow anything itself; see docs/ARCHITECTURE.md, Trust model",
    )


def apply_allow(prefixes: list[str]) -> None:
    """Grant `--allow-component` prefixes to this process (and the runs it registers).

    Raises `engine.config.ConfigError` (one line) for a prefix that is not a dotted name."""
    from engine.config import grant_components

    grant_components(prefixes or [], source="--allow-component")
