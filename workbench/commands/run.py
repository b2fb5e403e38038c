"""`tunebench run RECIPE --config FILE [--nproc N] [key=value ...]`: register, launch, follow
(`--queue`: register and put it in the run queue, `workbench.run_queue`).

Several nodes: the same command on each with `--nnodes N --node-rank R --rdzv-endpoint HOST:PORT
--output-dir SHARED` (`workbench.multinode_launch`); `--slurm` writes an sbatch script and submits it
(`workbench.slurm`).
"""

from __future__ import annotations

import argparse

from workbench.cli_args import (
    add_allow_option,
    add_config_option,
    add_recipe_command,
    apply_allow,
    parse_mixed,
)

_HELP = "run a recipe headless: register, launch with torchrun, show progress, exit with its code"
_DESCRIPTION = (
    "Validate the config, register a run, launch it detached (it survives this terminal) and "
    "show a progress bar until it ends; exits with the run's exit code. Ctrl-C asks whether to stop "
    "the run or detach."
)


def register(sub: argparse._SubParsersAction) -> None:
    add_recipe_command(sub, "run", _options, run, help=_HELP, description=_DESCRIPTION)


def _options(p: argparse.ArgumentParser) -> None:
    add_config_option(p)
    add_allow_option(p)
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) on this node (default 1)")
    p.add_argument("--name", help="a name for the run (default <recipe>-<n>)")
    p.add_argument("--tag", action="append", default=[], help="a tag (repeatable)")
    p.add_argument(
        "--detach", action="store_true", help="return once launched; follow with `show RUN --follow`"
    )
    p.add_argument(
        "--queue",
        action="store_true",
        help="put the run in the run queue: it starts when no run uses this machine's device (tunebench queue)",
    )
    p.add_argument(
        "--module", help=argparse.SUPPRESS
    )  # torchrun -m target instead of engine.recipes.<recipe>
    p.add_argument("--nnodes", type=int, default=1, help="nodes of a multi-node run (default 1)")
    p.add_argument(
        "--node-rank", type=int, default=0, help="this node's rank, 0 .. nnodes-1 (0 holds the run's row)"
    )
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of node rank 0, where the nodes meet (multi-node)")
    p.add_argument(
        "--output-dir",
        help="run folder instead of runs/<id>; multi-node: one every node mounts at the same path",
    )
    p.add_argument(
        "--slurm",
        action="store_true",
        help="write an sbatch script for --nnodes x --nproc GPUs and submit it",
    )
    p.add_argument("--partition", help="SLURM partition (with --slurm)")
    p.add_argument("--time", help="SLURM time limit, e.g. 24:00:00 or 2-00:00 (with --slurm)")
    p.add_argument("--account", help="SLURM account to charge (with --slurm)")
    p.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        help="another #SBATCH option, as --sbatch-arg=--qos=high (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    from engine.tracking.db import require_writable
    from workbench import launcher
    from workbench.cli_progress import announce_and_follow
    from workbench.errors import UserError

    args = parse_mixed(args, _options, prog="tunebench run")
    apply_allow(args.allow_component)  # the user's widening: recorded with the run
    if not args.config:
        raise UserError("--config FILE is required: tunebench run RECIPE --config FILE [key=value ...]")
    slurm_only = [f for f, v in (("--partition", args.partition), ("--time", args.time),
                                 ("--account", args.account), ("--sbatch-arg", args.sbatch_arg)) if v]  # fmt: skip
    if slurm_only and not args.slurm:
        raise UserError(f"{slurm_only[0]}: only with --slurm")
    if args.slurm:
        return _run_slurm(args)
    if args.queue and (args.nnodes > 1 or args.node_rank or args.rdzv_endpoint):
        raise UserError(
            "--queue: the run queue starts one-node runs; drop --nnodes/--node-rank/--rdzv-endpoint"
        )
    if args.node_rank:  # another node of a multi-node run: no row here, torchrun in the foreground
        from workbench.multinode_launch import run_node

        return run_node(
            args.recipe, config_path=args.config, overrides=args.overrides, nproc=args.nproc,
            nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
            output_dir=args.output_dir, module=args.module,
        )  # fmt: skip
    require_writable()  # a read-only tracker is its one line before the run's folder is made
    rec = launcher.create_run(
        args.recipe,
        config_path=args.config,
        overrides=args.overrides,
        nproc=args.nproc,
        name=args.name,
        module=args.module,
        tags=args.tag,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        output_dir=args.output_dir,
    )
    if args.queue:
        return _queue(rec)
    return announce_and_follow(launcher.launch(rec.id), "launched", detach=args.detach)


def _queue(rec) -> int:
    """Put a freshly registered run at the end of the run queue; prints its place."""
    from workbench import run_queue

    (rec,) = run_queue.queue_runs([rec.id])
    print(
        f"run {rec.name} ({rec.id}) queued at place {rec.queue_pos}; `tunebench queue` lists the queue, "
        f"`tunebench show {rec.name} --follow` follows the run once it starts",
        flush=True,
    )
    return 0


def _run_slurm(args: argparse.Namespace) -> int:
    """Register the run, write its sbatch script and submit it (or print it when sbatch is absent)."""
    from engine.tracking.db import require_writable
    from workbench import launcher, slurm
    from workbench.errors import UserError

    if args.node_rank or args.rdzv_endpoint:
        raise UserError("--slurm: SLURM places the nodes; drop --node-rank and --rdzv-endpoint")
    res = slurm.SlurmResources(
        nnodes=args.nnodes, gpus_per_node=args.nproc, partition=args.partition, time=args.time,
        account=args.account, sbatch_args=tuple(args.sbatch_arg),
    )  # fmt: skip
    require_writable()
    rec = launcher.create_run(
        args.recipe, config_path=args.config, overrides=args.overrides, nproc=args.nproc, name=args.name,
        module=args.module, tags=args.tag, nnodes=args.nnodes, output_dir=args.output_dir, slurm=True,
    )  # fmt: skip
    submitted = slurm.submit(rec, res)
    if submitted is not None:
        print(
            f"run {submitted.name} ({submitted.id}) submitted as SLURM job {submitted.slurm_job_id}; "
            f"log: {submitted.output_dir}/slurm-{submitted.slurm_job_id}.log",
            flush=True,
        )
    return 0
