"""`tunebench sweep RECIPE --config FILE KEY=V1,V2 [KEY2=A,B ...] [--zip] [--name NAME]`: a grid (or,
with `--zip`, a list) of runs over config keys, all checked first, then queued (`workbench.sweeps`)."""

from __future__ import annotations

import argparse

from workbench.cli_args import add_config_option, add_recipe_command, parse_mixed

_HELP = "queue a grid or list of runs over config keys (KEY=V1,V2 ...), tagged with the sweep"
_DESCRIPTION = (
    "Every combination of the values (a grid; --zip pairs them by position instead) becomes "
    "a run named NAME-<i>, tagged sweep:NAME, in the run queue. Every run's config is checked first: "
    "one bad value is one line and nothing is queued. Rank the runs with `tunebench compare --sweep NAME`."
)


def register(sub: argparse._SubParsersAction) -> None:
    add_recipe_command(sub, "sweep", _options, run, help=_HELP, description=_DESCRIPTION)


def _options(p: argparse.ArgumentParser) -> None:
    add_config_option(p)
    p.add_argument("--name", help="the sweep's name (default sweep-<n>); runs are NAME-1, NAME-2, ...")
    p.add_argument(
        "--zip", action="store_true", help="a list, not a grid: run i takes the i-th value of every key"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override every run gets (repeatable)",
    )
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per run (default 1)")
    p.add_argument("--tag", action="append", default=[], help="another tag for every run (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="check and print the runs; register nothing")
    p.add_argument("--module", help=argparse.SUPPRESS)  # torchrun -m target (tests)


def run(args: argparse.Namespace) -> int:
    from workbench import sweeps as sweep
    from workbench.errors import UserError

    args = parse_mixed(args, _options, prog="tunebench sweep")
    if not args.config:
        raise UserError("--config FILE is required: tunebench sweep RECIPE --config FILE KEY=V1,V2 ...")
    runs = sweep.combinations(args.overrides, zip_values=args.zip)
    if args.dry_run:
        from engine.config import ConfigError
        from engine.tracking.paths import run_dir
        from workbench import launcher

        for i, ovs in enumerate(runs, start=1):
            try:
                launcher.compose_config(
                    args.recipe, config_path=args.config, overrides=[*args.set, *ovs],
                    output_dir=run_dir(f"dry-run-{i}"), module=args.module, nproc=args.nproc,
                )  # fmt: skip
            except (ConfigError, UserError) as exc:
                raise UserError(f"run {i} ({' '.join(ovs)}): {exc}") from None
            print(f"{i}: {' '.join(ovs)}")
        print(f"{len(runs)} run(s), all valid; nothing registered (--dry-run)")
        return 0
    made = sweep.create_sweep(
        args.recipe, runs, config_path=args.config, overrides=args.set, name=args.name, nproc=args.nproc,
        module=args.module, tags=args.tag,
    )  # fmt: skip
    name = sweep.sweep_of(made[0])
    for rec in made:
        print(f"{rec.name} ({rec.id}) place {rec.queue_pos}: {rec.notes}")
    print(
        f"sweep {name}: {len(made)} run(s) queued; `tunebench queue` shows the queue, "
        f"`tunebench compare --sweep {name}` ranks the runs"
    )
    return 0
