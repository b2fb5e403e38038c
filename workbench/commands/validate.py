"""`tunebench validate CONFIG [key=value ...] [--recipe NAME] [--allow-component PREFIX]`: report every
problem of a config.

Prints one `field: what is wrong — what to do` line per problem and exits 2 when there are any;
prints one OK line and exits 0 when the config is valid. The recipe (for its top-level keys) comes
from `--recipe` or the config's launch line (`# tunebench run sft --config ...`). A component the
allow-list refuses, or an `allowed_components:` key, is the one line printed instead (exit 2):
`--allow-component PREFIX` is where the user allows more (docs/ARCHITECTURE.md, "Trust model").
"""

from __future__ import annotations

import argparse

from workbench.cli_args import add_allow_option, add_documented_command, apply_allow
from workbench.errors import UserError

_HELP = "check a config (and overrides) and report every problem at once"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_documented_command(subparsers, "validate", _HELP, __doc__)
    p.add_argument(
        "--recipe", default=None, help="recipe whose top-level keys apply (default: the launch line)"
    )
    add_allow_option(p)
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
    """Take `--recipe NAME` / `--recipe=NAME` (and `--allow-component PREFIX`, into
    `args.allow_component`) out of the overrides; any other `--flag` is an error."""
    recipe, overrides = args.recipe, []
    it = iter(args.overrides)
    for arg in it:
        if arg == "--allow-component" or arg.startswith("--allow-component="):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, "")
            if not value:
                raise UserError(
                    "--allow-component: no prefix after it — write --allow-component mypkg.rewards"
                )
            args.allow_component.append(value)
        elif arg == "--recipe" or arg.startswith("--recipe="):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, "")
            if not value:
                raise UserError("--recipe: no name after it — write --recipe sft (or dpo, kd, grpo, ...)")
            recipe = value
        elif arg.startswith("--"):
            raise UserError(
                f"{arg}: unknown option — write tunebench validate CONFIG [key=value ...] [--recipe NAME]"
                " [--allow-component PREFIX]"
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


def _refuse_untrusted(path, overrides: list[str]) -> None:
    """Raise the config's security refusal (a component off the allow-list, `allowed_components:`) as
    the command's one line; a malformed file or override is left to `validate_file`, which lists it."""
    from engine.config import ComponentRefused, ConfigError, apply_overrides, load_yaml, refuse_untrusted

    try:
        cfg = load_yaml(path)
    except ConfigError:
        return
    for ov in overrides:
        try:
            cfg = apply_overrides(cfg, [ov])
        except ComponentRefused:
            raise
        except ConfigError:
            continue
    refuse_untrusted(cfg)


def run(args: argparse.Namespace) -> int:
    from engine.config import find_config
    from engine.config._validate import validate_file

    recipe, overrides = _split_recipe(args)
    apply_allow(args.allow_component)
    path = find_config(args.config)
    if _is_empty(path):
        from workbench.launcher import empty_config_message

        print(empty_config_message(str(path)))
        return 2
    _refuse_untrusted(path, overrides)
    problems, recipe = validate_file(path, overrides, recipe=recipe)
    for problem in problems:
        print(problem)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        print(f"{len(problems)} {noun} in {path}")
        return 2
    print(f"OK: {path} is valid" + (f" for recipe {recipe}" if recipe else ""))
    return 0
