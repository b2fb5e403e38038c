"""`tunebench run RECIPE --config FILE [--nproc N] [key=value ...]`: register, launch, follow."""

from __future__ import annotations

import argparse
import sys

from workbench.cli_args import add_rest, parse_mixed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a recipe headless: register, launch with torchrun, show progress, exit with its code",
        description="Validate the config, register a run, launch it detached (it survives this terminal) and "
        "show a progress bar until it ends; exits with the run's exit code. Ctrl-C asks whether to stop "
        "the run or detach.",
    )
    p.add_argument("recipe", help="recipe name: sft, dpo, kd, grpo, ... (engine.recipes.<recipe>)")
    add_rest(p)
    _options(p)
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a YAML file or a built-in config name (tunebench ls); required")
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) on this node (default 1)")
    p.add_argument("--name", help="a name for the run (default <recipe>-<n>)")
    p.add_argument("--tag", action="append", default=[], help="a tag (repeatable)")
    p.add_argument(
        "--detach", action="store_true", help="return once launched; follow with `show RUN --follow`"
    )
    p.add_argument(
        "--module", help=argparse.SUPPRESS
    )  # torchrun -m target instead of engine.recipes.<recipe>


def run(args: argparse.Namespace) -> int:
    from workbench import launcher
    from workbench.errors import UserError
    from workbench.run_progress import follow

    args = parse_mixed(args, _options, prog="tunebench run")
    if not args.config:
        raise UserError("--config FILE is required: tunebench run RECIPE --config FILE [key=value ...]")
    rec = launcher.create_run(
        args.recipe,
        config_path=args.config,
        overrides=args.overrides,
        nproc=args.nproc,
        name=args.name,
        module=args.module,
        tags=args.tag,
    )
    rec = launcher.launch(rec.id)
    print(f"run {rec.name} ({rec.id}) launched; log: {rec.output_dir}/stdout.log", flush=True)
    if args.detach:
        return 0
    return follow(rec.id, stream=sys.stderr)
