"""SLURM: `tunebench run RECIPE --config FILE --slurm --nnodes N --nproc G --output-dir SHARED [...]`.

`submit` writes `SHARED/sbatch.sh` (from the run's config and the resources: nodes, GPUs per node,
partition, time, account, extra `#SBATCH` lines) and submits it with `sbatch --parsable`; the run's
tracker row (on the submitting host) records the job id. Without `sbatch` on PATH nothing is
registered: the script is printed and written, with a line saying how to submit it.

The job: one task per node (`srun --ntasks-per-node=1`) runs the script again in `--node` mode, which
starts torchrun for that node: static rendezvous on the first node of the allocation, node rank
`$SLURM_NODEID` (so global rank 0 is on the first node), port 29500 + job id mod 1000 (two jobs that
share a first node do not collide). The ranks run without `TUNEBENCH_RUN_ID` (the tracker's SQLite
file stays on the submitting host, never on a network filesystem): the row's state follows the job
through `squeue` / `sacct` (`reconcile`), and per-step figures are rank 0's step lines in
`SHARED/slurm-<job>.log`. Checkpoints go to SHARED, which every node must see (the recipe checks).
SHARED may hold other files: what the run creates there is recorded (`workbench.run_manifest`: the
job script records it at the job's start and exit, `reconcile` when it sees the job end).

Every user value is quoted for what reads it: `#SBATCH` lines are parsed by sbatch itself
(`sbatch_quote`), the others by bash (`shlex.quote`); a value with a newline or another control
character is refused in one line naming its option (`check_script_value`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.tracking.records import RunRecord
from workbench.errors import UserError

SCRIPT_NAME = "sbatch.sh"
BASE_PORT = 29500
_TIME_FORMATS = ("MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS")

# SLURM job states (squeue %T / sacct State) -> the tracker's run status.
SLURM_STATUS = {
    "PENDING": "queued", "CONFIGURING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued",
    "REQUEUE_FED": "queued", "RESV_DEL_HOLD": "queued", "SPECIAL_EXIT": "queued",
    "RUNNING": "running", "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running",
    "SUSPENDED": "running", "STOPPED": "running", "RESIZING": "running",
    "COMPLETED": "completed",
    "CANCELLED": "stopped",
    "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed",
    "OUT_OF_MEMORY": "failed", "DEADLINE": "failed", "PREEMPTED": "failed", "REVOKED": "failed",
}  # fmt: skip
_WHY = {
    "TIMEOUT": "reached its --time limit", "NODE_FAIL": "lost a node", "BOOT_FAIL": "a node failed to boot",
    "OUT_OF_MEMORY": "ran out of host memory", "DEADLINE": "passed its deadline", "PREEMPTED": "was preempted",
    "FAILED": "exited non-zero", "REVOKED": "was revoked",
}  # fmt: skip


@dataclass(frozen=True)
class SlurmResources:
    """What the job asks SLURM for. `gpus_per_node` is also torchrun's processes per node."""

    nnodes: int = 1
    gpus_per_node: int = 1
    partition: str | None = None
    time: str | None = None  # SLURM's --time: MM, HH:MM:SS, D-HH:MM, ...
    account: str | None = None
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)  # extra `#SBATCH` options, e.g. --qos=high

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise UserError(f"--nnodes {self.nnodes}: use 1 or more nodes")
        if self.gpus_per_node < 1:
            raise UserError(f"--nproc {self.gpus_per_node}: use 1 or more GPUs per node")
        for option, value in (
            ("--partition", self.partition),
            ("--time", self.time),
            ("--account", self.account),
        ):
            if value is not None:
                check_directive_value(option, value)
        if self.time is not None and not _valid_time(self.time):
            raise UserError(f"--time {self.time!r}: use SLURM's format, one of {', '.join(_TIME_FORMATS)}")
        for arg in self.sbatch_args:
            check_directive_value("--sbatch-arg", arg)
            if not _SBATCH_ARG.fullmatch(arg):
                raise UserError(f"--sbatch-arg {arg!r}: give one long sbatch option such as --qos=high")


# -- what the job script can hold ---------------------------------------------------------------------
# sbatch reads `#SBATCH` lines itself (Slurm's src/sbatch/opt.c, `_get_argument`), not through bash: an
# argument ends at unquoted white space; '...' and "..." group (older releases: only "..."); a backslash
# makes the next character literal, inside quotes too; an unquoted `#` starts a comment (older releases:
# any `#`); a newline ends the line and the first line that is not a comment ends the `#SBATCH` block.
# So a value is written bare when it is plain, else in double quotes with \ " ' # escaped, which every
# release reads back exactly; what no line can hold (control characters) is refused.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_SBATCH_ARG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9-]*(=.*)?", re.DOTALL)


def check_script_value(option: str, value: str) -> None:
    """Refuse (`UserError` naming `option`) a value with a newline or another control character: in
    the job script it would end its line (and, in an `#SBATCH` line, end sbatch's reading of them)."""
    bad = _CONTROL.search(value)
    if bad:
        raise UserError(
            f"{option} {value!r}: remove the control character {bad.group()!r} (a newline would end its "
            "line of the SLURM job script)"
        )


def check_directive_value(option: str, value: str) -> None:
    """`check_script_value`, and refuse what sbatch reads specially anywhere in an `#SBATCH` line:
    the words `hetjob` / `packjob` (job separators)."""
    check_script_value(option, value)
    word = re.search(r"hetjob|packjob", value, re.IGNORECASE)
    if word:
        raise UserError(
            f"{option} {value!r}: sbatch reads {word.group()!r} in an #SBATCH line as a job separator; "
            "give a value without it"
        )


def check_script_path(option: str, path: str) -> None:
    """`check_directive_value` for the shared folder (it is in `#SBATCH --output=`), and refuse a
    backslash there: in an output file name it turns off SLURM's `%j` replacement."""
    check_directive_value(option, path)
    if "\\" in path:
        raise UserError(
            f"{option} {path!r}: SLURM reads a backslash in --output specially; choose a path without one"
        )


def sbatch_quote(value: str) -> str:
    """`value` as one `#SBATCH` argument (or the value part of one) that sbatch reads back exactly:
    bare when plain, else double-quoted with backslash, quotes and `#` escaped. The caller refused
    control characters (`check_directive_value`)."""
    if _PLAIN.fullmatch(value):
        return value
    return '"' + re.sub(r"""([\\"'#])""", r"\\\1", value) + '"'


def _directive(option: str, value: str) -> str:
    return f"#SBATCH {option}={sbatch_quote(value)}"


def _extra_directive(arg: str) -> str:
    name, eq, value = arg.partition("=")
    return f"#SBATCH {name}={sbatch_quote(value)}" if eq else f"#SBATCH {name}"


def _valid_time(text: str) -> bool:
    days, _, clock = text.rpartition("-")
    if days and not days.isdigit():
        return False
    parts = clock.split(":")
    return 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)


def sbatch_script(run: RunRecord, res: SlurmResources, *, python: str, pythonpath: str | None = None) -> str:
    """The job script for `run` (its `output_dir` holds `config.yaml`; the script lives there too).

    Every user value is quoted for what reads it: `sbatch_quote` in `#SBATCH` lines (sbatch parses
    those), `shlex.quote` in shell lines. `UserError` for a value no line can hold (a control
    character; `check_script_path` for the folder), which `create_run` / `SlurmResources` refuse first.
    """
    out = run.output_dir
    check_script_path("--output-dir", out)
    for option, value in (("--module", run.module), ("python", python), ("PYTHONPATH", pythonpath or "")):
        check_script_value(option, value)
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# tunebench run {run.recipe}: SLURM job for run {run.name} ({run.id}), written by tunebench.",
        f"# Submit: sbatch {q(out + '/' + SCRIPT_NAME)}   (tunebench run --slurm does, when sbatch is present)",
        _directive("--job-name", f"tunebench-{run.name}"),
        _directive("--nodes", str(res.nnodes)),
        "#SBATCH --ntasks-per-node=1",
        _directive("--gpus-per-node", str(res.gpus_per_node)),
    ]
    if res.partition:
        lines.append(_directive("--partition", res.partition))
    if res.time:
        lines.append(_directive("--time", res.time))
    if res.account:
        lines.append(_directive("--account", res.account))
    lines += [_extra_directive(arg) for arg in res.sbatch_args]
    lines += [
        _directive("--output", out.replace("%", "%%") + "/slurm-%j.log"),  # %% is a literal % there
        "set -euo pipefail",
        "export PYTHONUNBUFFERED=1",
    ]
    if pythonpath:
        lines.append(f'export PYTHONPATH={q(pythonpath)}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    torchrun = " ".join([
        q(python), "-m", "torch.distributed.run",
        f"--nnodes={res.nnodes}", '--node-rank="$SLURM_NODEID"', "--rdzv-backend=static",
        '--rdzv-endpoint="$TUNEBENCH_RDZV_HOST:$TUNEBENCH_RDZV_PORT"', "--max-restarts=0",
        f"--nproc_per_node={res.gpus_per_node}", "-m", q(run.module), "--config", q(out + "/config.yaml"),
    ])  # fmt: skip
    lines += [
        'if [[ "${1:-}" == "--node" ]]; then  # one task per node (srun below): this node\'s torchrun',
        f"  exec {torchrun}",
        "fi",
        "# what the run creates in the shared folder is recorded as its own (workbench.run_manifest)",
        f"tunebench_record() {{ {q(python)} -m workbench.run_manifest record-new {q(out)} || true; }}",
        "trap tunebench_record EXIT",
        "tunebench_record",
        # the first node of the allocation (no `| head -n 1`: under pipefail its SIGPIPE can end the job)
        'TUNEBENCH_NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "TUNEBENCH_RDZV_HOST=${TUNEBENCH_NODES%%$'\\n'*}",
        f"TUNEBENCH_RDZV_PORT=$(({BASE_PORT} + SLURM_JOB_ID % 1000))",
        "export TUNEBENCH_RDZV_HOST TUNEBENCH_RDZV_PORT",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash {q(out + '/' + SCRIPT_NAME)} --node",
    ]
    return "\n".join(lines) + "\n"


def _source_root() -> str | None:
    """The folder holding the `engine` package when tunebench runs from a source tree (else None)."""
    import engine

    root = Path(engine.__file__).resolve().parent.parent
    return str(root) if (root / "pyproject.toml").is_file() else None


def submit(run: RunRecord, res: SlurmResources, *, stream=None) -> RunRecord | None:
    """Write the script into the run folder and submit it; returns the row with its job id, or None
    (and the row deleted, the script printed) when `sbatch` is not on PATH. `UserError` when sbatch
    refuses the job (its message)."""
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run
    from engine.tracking.run_rows import add_event, delete_run, update_run
    from workbench import run_manifest

    stream = stream or sys.stdout
    try:
        text = sbatch_script(run, res, python=sys.executable, pythonpath=_source_root())
    except UserError:
        with open_db() as db:
            delete_run(run.id, db=db)
        raise
    path = Path(run.output_dir) / SCRIPT_NAME
    run_manifest.record(path.parent, SCRIPT_NAME)
    tmp = path.with_name(f".{SCRIPT_NAME}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        with open_db() as db:
            delete_run(run.id, db=db)
        stream.write(text)
        stream.flush()
        print(
            f"tunebench: sbatch is not on PATH, so nothing was submitted or registered: the script above is "
            f"{path}; on a SLURM login node run `sbatch {path}`",
            file=sys.stderr,
        )
        return None
    from workbench.component_grants import current_env  # the job inherits it: --allow-component reaches it

    proc = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True, timeout=120,
                          env=current_env(dict(os.environ)))  # fmt: skip
    job = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job:
        with open_db() as db:
            delete_run(run.id, db=db)
        why = (proc.stderr.strip().splitlines() or ["no job id printed"])[-1]
        raise UserError(f"sbatch refused the job ({why}): fix the resources, or submit {path} by hand")
    with open_db() as db:
        update_run(run.id, db=db, slurm_job_id=job)
        add_event(
            run.id,
            0,
            "start",
            f"submitted to SLURM as job {job} ({res.nnodes} x {res.gpus_per_node} GPUs)",
            db=db,
        )
        return get_run(run.id, db=db)


def job_state(job_id: str) -> tuple[str, int | None] | str:
    """(SLURM state, exit code or None) of a job from `squeue` (queued or running) or `sacct` (ended);
    a line saying why when neither command is on PATH or neither knows the job."""
    squeue, sacct = shutil.which("squeue"), shutil.which("sacct")
    if squeue is None and sacct is None:
        return (
            f"squeue and sacct are not on PATH: the state of SLURM job {job_id} cannot be read here "
            "(look from the cluster's login node)"
        )
    if squeue is not None:
        proc = subprocess.run(
            [squeue, "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60
        )
        state = proc.stdout.strip().split()[:1]
        if proc.returncode == 0 and state:
            return state[0].upper(), None
    if sacct is not None:
        proc = subprocess.run(
            [sacct, "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in proc.stdout.splitlines():
            state, _, code = line.strip().partition("|")
            if state:
                exit_code = code.split(":")[0]
                return state.split()[0].upper(), int(exit_code) if exit_code.isdigit() else None
    return (
        f"SLURM job {job_id} is not known to squeue or sacct (purged from the accounting, or another cluster)"
    )


def reconcile(run: RunRecord) -> str | None:
    """Bring an active SLURM run's status in line with its job; returns a line when it cannot be read."""
    from engine.tracking.db import open_db
    from engine.tracking.records import ACTIVE_STATUSES
    from engine.tracking.run_rows import add_event, update_run

    if run.slurm_job_id is None or run.status not in ACTIVE_STATUSES:
        return None
    found = job_state(run.slurm_job_id)
    if isinstance(found, str):
        return found
    state, code = found
    status = SLURM_STATUS.get(state)
    if status is None:
        return f"SLURM job {run.slurm_job_id} is in state {state}, which tunebench does not know: left {run.status}"
    if status == run.status:
        return None
    fields: dict[str, object] = {"status": status}
    if status == "running" and run.started_at is None:
        fields["started_at"] = time.time()
    if status not in ACTIVE_STATUSES:
        fields.update(
            ended_at=time.time(), exit_code=code if code is not None else (0 if status == "completed" else 1)
        )
        if status == "failed":
            fields["error"] = (
                f"SLURM job {run.slurm_job_id} {_WHY.get(state, 'failed')} ({state}); see {run.output_dir}/slurm-{run.slurm_job_id}.log"
            )
    if status not in ACTIVE_STATUSES:  # what the job left in the shared folder is the run's
        from workbench import run_manifest

        try:
            run_manifest.record_new(run.output_dir)
        except OSError:  # the folder is not reachable from here: a delete then leaves those entries
            pass
    with open_db() as db:
        update_run(run.id, db=db, **fields)
        add_event(
            run.id,
            run.step,
            "end" if status not in ACTIVE_STATUSES else "start",
            f"SLURM job {run.slurm_job_id}: {state}",
            db=db,
        )
    return None


def reconcile_all() -> list[str]:
    """`reconcile` every active SLURM run of this tracker; returns the lines of those not readable."""
    from engine.tracking.db import open_db
    from engine.tracking.readers import active_runs

    with open_db() as db:
        runs = [r for r in active_runs(db=db) if r.slurm_job_id]
    return [line for r in runs if (line := reconcile(r))]


def cancel(run: RunRecord) -> None:
    """`scancel` the run's job (SIGTERM first, so the ranks checkpoint); `UserError` without scancel."""
    scancel = shutil.which("scancel")
    if scancel is None:
        raise UserError(
            f"scancel is not on PATH: cancel SLURM job {run.slurm_job_id} from the cluster's login node"
        )
    subprocess.run([scancel, "--signal=TERM", "--full", run.slurm_job_id], check=False, timeout=60)
