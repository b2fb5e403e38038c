"""`tunebench validate CONFIG [key=value ...] [--recipe NAME]`: report every problem of a config.

Prints one `field: what is wrong — what to do` line per problem and exits 2 when there are any;
prints one OK line and exits 0 when the config is valid. The recipe (for its top-level keys) comes
from `--recipe` or the config's launch line (`# tunebench run sft --config ...`).
"""

from __future__ import annotations

import argparse

from workbench.cli_args import add_documented_command
from workbench.errors import UserError

_HELP = "check a config (and overrides) and report every problem at once"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_documented_command(subparsers, "validate", _HELP, __doc__)
    p.add_argument(
        "--recipe", default=None, help="recipe whose top-level keys apply (default: the launch line)"
    )
    p.add_argument("config", metavar="CONFIG", help="a YAML file or a built-in name (see `tunebench ls`)")
    # REMAINDER so that overrides and --recipe may come in any order after CONFIG (see _split_recipe).
    p.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        metavar="key=value",
        help="overrides: key=value, a.b=value, ~key",
    )
    p.set_defaults(func=run)


def _split_recipe(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """Take `--recipe NAME` / `--recipe=NAME` out of the overrides; any other `--flag` is an error."""
    recipe, overrides = args.recipe, []
    it = iter(args.overrides)
    for arg in it:
        if arg == "--recipe" or arg.startswith("--recipe="):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, "")
            if not value:
                raise UserError("--recipe: no name after it — write --recipe sft (or dpo, kd, grpo, ...)")
            recipe = value
        elif arg.startswith("--"):
            raise UserError(
                f"{arg}: unknown option — write tunebench validate CONFIG [key=value ...] [--recipe NAME]"
            )
        else:
            overrides.append(arg)
    return recipe, overrides


def _is_empty(path) -> bool:
    """The file parses to no keys at all (empty or only comments); unreadable/malformed: False
    (`validate_file` reports those)."""
    from engine.config import ConfigError
    from engine.config._yaml import load_yaml

    try:
        return load_yaml(path) == {}
    except ConfigError:
        return False


def run(args: argparse.Namespace) -> int:
    from engine.config import find_config
    from engine.config._validate import validate_file

    recipe, overrides = _split_recipe(args)
    path = find_config(args.config)
    if _is_empty(path):
        from workbench.launcher import empty_config_message

        print(empty_config_message(str(path)))
        return 2
    problems, recipe = validate_file(path, overrides, recipe=recipe)
    for problem in problems:
        print(problem)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        print(f"{len(problems)} {noun} in {path}")
        return 2
    print(f"OK: {path} is valid" + (f" for recipe {recipe}" if recipe else ""))
    return 0
