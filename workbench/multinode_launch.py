"""Multi-node launches: `tunebench run ... --nnodes N --node-rank R --rdzv-endpoint HOST:PORT`.

The same command runs on every node, with its own `--node-rank`:

- node rank 0 (HOST, the rendezvous endpoint's host) registers the run in its tracker and launches
  it through the supervisor like any run (`workbench.launcher`), with torchrun's static rendezvous
  on the TCPStore at HOST:PORT (`workbench.supervisor.torchrun_command`). Its global rank 0 logs the
  run's metrics; every rank's memory reaches that one row through the process group
  (`engine.training.multinode.per_rank_memory`).
- any other node rank runs torchrun in the foreground (`run_node`): no tracker row and no tracker
  writes on that host (its ranks start without `TUNEBENCH_RUN_ID`); its output goes to the terminal
  and the command exits with its ranks' code.

`--output-dir DIR` is required: every rank writes its checkpoint shard there, so it must be a folder
every node mounts at the same path (it may hold other files: the run records what it creates there,
`workbench.run_manifest`, and deleting the run removes only that); the recipe refuses one that rank 0 does not see every node write
to (`engine.training.multinode.check_shared_output_dir`). Node rank 0 writes the run's `config.yaml`,
logs and checkpoints there (instead of `runs/<id>/`); the tracker database stays on node 0's local
disk (SQLite is never put on a network filesystem).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from workbench import component_grants
from workbench.errors import UserError

_ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
NODE_CONFIG_DIR = ".node_configs"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); `UserError` naming `--rdzv-endpoint` otherwise."""
    m = _ENDPOINT.match(endpoint or "")
    if not m or not 0 < int(m.group("port")) < 65536:
        raise UserError(
            f"--rdzv-endpoint {endpoint!r}: give HOST:PORT of node rank 0, e.g. node0.cluster:29500"
        )
    return m.group("host"), int(m.group("port"))


def check_launch(
    *, nnodes: int, node_rank: int, rdzv_endpoint: str | None, output_dir: str | os.PathLike | None
) -> None:
    """Refuse inconsistent multi-node options in one line (before anything is registered)."""
    if nnodes < 1:
        raise UserError(f"--nnodes {nnodes}: use 1 or more nodes")
    if nnodes == 1:
        if node_rank:
            raise UserError(f"--node-rank {node_rank}: only with --nnodes 2 or more")
        if rdzv_endpoint:
            raise UserError("--rdzv-endpoint: only with --nnodes 2 or more (one node uses a private one)")
        return
    if not 0 <= node_rank < nnodes:
        raise UserError(f"--node-rank {node_rank}: use 0 .. {nnodes - 1} for --nnodes {nnodes}")
    if not rdzv_endpoint:
        raise UserError(
            f"--nnodes {nnodes}: give --rdzv-endpoint HOST:PORT (HOST: the machine of --node-rank 0)"
        )
    parse_endpoint(rdzv_endpoint)
    if output_dir is None:
        raise UserError(
            f"--nnodes {nnodes}: give --output-dir DIR, a folder every node mounts at the same path "
            "(every rank writes its checkpoint shard there)"
        )


def shared_run_dir(output_dir: str | os.PathLike) -> Path:
    """The absolute run folder for `--output-dir`. It may hold other files (they are left alone, and
    so is the folder's mode: `workbench.run_manifest`), but none of the names a run writes there
    (`run_manifest.RUN_NAMES`): one that already holds a run is refused, and so is one holding, say,
    the user's own `eval/`, which the run would write into. `UserError` naming the entry otherwise."""
    from workbench.run_manifest import RUN_NAMES

    out = Path(output_dir).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--output-dir {out}: it is a file; give a folder")
    for held in RUN_NAMES:
        if not (out / held).exists() and not (out / held).is_symlink():
            continue
        if held in ("config.yaml", "checkpoints"):
            raise UserError(
                f"--output-dir {out} already holds a run ({held}): choose a new folder, or resume that "
                "run with `tunebench resume`"
            )
        raise UserError(
            f"--output-dir {out} already holds {held}, a name the run writes there: choose a new folder, "
            f"or move {held} out of it"
        )
    return out


def run_node(
    recipe: str,
    *,
    config_path: str,
    overrides: Iterable[str],
    nproc: int,
    nnodes: int,
    node_rank: int,
    rdzv_endpoint: str,
    output_dir: str | os.PathLike,
    module: str | None = None,
) -> int:
    """Run node `node_rank` (> 0) of a multi-node run in the foreground; returns its ranks' exit code.

    The config is validated here as on node 0 (same file and overrides: give the same command), with
    `output_dir` set to the shared folder. Nothing is registered: the run's row is node 0's.
    """
    import sys

    from engine.config import ConfigError, apply_overrides, dump_config, find_config, load_yaml
    from engine.config import validate as validate_config
    from workbench.launcher import _check_nproc
    from workbench.supervisor import recorded_exit_code, torchrun_command

    check_launch(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, output_dir=output_dir)
    if node_rank == 0:
        raise UserError("--node-rank 0 registers the run: launch it with workbench.launcher.create_run")
    source = str(find_config(config_path))
    cfg = apply_overrides(load_yaml(source), list(overrides))
    out = Path(output_dir).expanduser().resolve()
    cfg["output_dir"] = str(out)
    if module is None:
        problems = validate_config(cfg, recipe=recipe)
        if problems:
            raise ConfigError(f"{source}: {problems[0]}", field=source)
        _check_nproc(recipe, nproc * nnodes, cfg)
    # This node's copy of the config, in a private temp folder (the shared folder may not be shared).
    tmp = Path(tempfile.mkdtemp(prefix=f"tunebench-node{node_rank}-"))
    config = tmp / "config.yaml"
    config.write_text(
        dump_config(cfg, header=f"node {node_rank} of a {nnodes}-node {recipe} run: written by tunebench")
    )
    exit_dir = tmp / "exit_codes"
    env = {k: v for k, v in os.environ.items() if k != "TUNEBENCH_RUN_ID"}  # no tracker writes here
    env.update(TUNEBENCH_EXIT_DIR=str(exit_dir), PYTHONUNBUFFERED="1")
    env = component_grants.current_env(env)  # this node's --allow-component reaches its ranks
    cmd = torchrun_command(
        nproc=nproc, module=module or f"engine.recipes.{recipe}", config=config, extra=[],
        nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
    )  # fmt: skip
    print(
        f"node {node_rank} of {nnodes}: joining the rendezvous at {rdzv_endpoint}",
        file=sys.stderr,
        flush=True,
    )
    child = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    try:
        rc = child.wait()
    except KeyboardInterrupt:  # Ctrl-C reached torchrun too (same process group): let it end its ranks
        child.send_signal(signal.SIGTERM)
        child.wait()
        return 130
    code = recorded_exit_code(exit_dir, "", rc)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return code
