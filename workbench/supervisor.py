"""The detached process that owns one launch of a run: `python -m workbench.supervisor RUN_ID [-- ARGS]`.

Started by `workbench.launcher.launch` with `--fork`: the first process forks, prints the child's pid
and exits, so the supervisor is re-parented to init (no zombie in a long-lived workbench) and runs in
a session of its own (closing the UI or the SSH session does not stop it). It then:

1. starts `torchrun --standalone --nproc_per_node N -m <module> --config runs/<id>/config.yaml [ARGS]`
   in a new process group, stdout+stderr appended to `runs/<id>/stdout.log`;
2. records pid, pgid, `running` and the start time;
3. waits; a SIGTERM to the supervisor itself counts as a stop request and is passed to the ranks
   (the handler only sets a flag; the wait loop passes it on); in a shared `--output-dir` it records
   the new top-level entries as the run's every few seconds and at the end (`workbench.run_manifest`);
4. records the end: `exit_code` (the failing worker's code, read from torchrun's failure report),
   `ended_at`, status `stopped` (a stop was requested), `completed` (0) or `failed` with the tail of
   the log as `error`; finally kills stragglers left in the group.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.tracking.db import open_db
from engine.tracking.paths import tunebench_home
from engine.tracking.readers import get_run
from engine.tracking.run_rows import add_event, update_run
from workbench import run_manifest

LOG_NAME = "stdout.log"
EXIT_DIR_NAME = ".exit_codes"
_EXITCODE_RE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_ELASTIC_LOG_RE = re.compile(r"^[EWI]\d{4} \d")  # torch.distributed.elastic's own log lines
_NOISE_RE = re.compile(r"^(step \d+(/\d+)? \||== tunebench: )")  # MetricLogger's step lines, our header
TAIL_LINES = 20
WAIT_TICK_S = 0.5  # how soon a stop seen by the SIGTERM handler reaches the ranks
RECORD_EVERY_S = 5.0  # how often a shared run folder's new entries are recorded (run_manifest)
_TRACEBACK = "Traceback (most recent call last):"


def torchrun_command(
    *,
    nproc: int,
    module: str,
    config: Path,
    extra: list[str],
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    """The torchrun command line (as `python -m torch.distributed.run`, so the venv's torch is used).

    One node: `--standalone`, a private rendezvous on a free port (concurrent runs never collide).
    Several: torchrun's static rendezvous on the c10d TCPStore at `rdzv_endpoint` (node rank 0's host),
    where the node rank fixes the ranks a node gets (node R: `R*nproc .. R*nproc+nproc-1`), so global
    rank 0, which logs the run's metrics, is on the host that holds the tracker row. (The dynamic c10d
    rendezvous orders nodes by host name, which could put rank 0 on a node without the row.)
    """
    if nnodes > 1:
        rendezvous = [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={rdzv_endpoint}",
            "--max-restarts=0",
        ]
    else:
        rendezvous = ["--standalone"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        "--config",
        str(config),
        *extra,
    ]


def read_tail(path: Path, max_bytes: int = 65536) -> str:
    """The last `max_bytes` of a log file as text ("" when absent)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def worker_exit_code(log_tail: str, returncode: int) -> int:
    """The exit code to report: torchrun exits 1 whatever its worker returned, but its failure report
    names the first failing worker's `exitcode`; use that when present."""
    if returncode == 0:
        return 0
    root = log_tail.rfind("Root Cause")
    if root >= 0:
        m = _EXITCODE_RE.search(log_tail, root)
        if m:
            return int(m.group(1))
    return returncode


def recorded_exit_code(exit_dir: Path, log_tail: str, returncode: int) -> int:
    """The run's exit code: 0 when torchrun succeeded; else the lowest rank's non-zero code that the
    ranks recorded themselves (`engine.training.shutdown` writes `exit_dir/rank<N>`); else, for a rank
    that died without recording (a signal, a crash before shutdown), what torchrun's report says."""
    if returncode == 0:
        return 0
    codes = []
    for path in exit_dir.glob("rank*"):
        try:
            codes.append((int(path.name[4:]), int(path.read_text().strip())))
        except (OSError, ValueError):  # a name or content not written by shutdown()
            continue
    failing = [code for _, code in sorted(codes) if code != 0]
    return failing[0] if failing else worker_exit_code(log_tail, returncode)


def failure_text(log_tail: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of what the recipe printed: torchrun's own traceback and failure report
    and elastic log lines are cut, so the reason (e.g. `loss is nan at step 12`) is what remains."""
    text = log_tail
    idx = text.rfind(_TRACEBACK)
    while idx >= 0:
        if "torch/distributed/run.py" in text[idx : idx + 3000]:
            text = text[:idx]
            break
        idx = text.rfind(_TRACEBACK, 0, idx)
    kept = [
        ln
        for ln in text.splitlines()
        if ln.strip() and not _ELASTIC_LOG_RE.match(ln) and not _NOISE_RE.match(ln)
    ]
    return "\n".join(kept[-lines:])


def failure_summary(log_tail: str, code: int) -> str:
    """What a failed run's record says went wrong. Exit code 2 is a bad input, which the recipe reports
    in one last line: only that line is kept (not the import warnings printed before it); any other
    code keeps `failure_text`'s last lines, so a crash's traceback is visible."""
    text = failure_text(log_tail)
    if code == 2 and text:
        return text.splitlines()[-1]
    return text or f"exit code {code}"


def supervise(run_id: str, extra: list[str]) -> int:
    """Run one launch of `run_id` to its end and record it; returns 0 (the run's code is in the db)."""
    with open_db() as db:
        run = get_run(run_id, db=db)
        out = Path(run.output_dir)
        log_path = out / LOG_NAME
        cmd = torchrun_command(
            nproc=run.nproc, module=run.module, config=out / "config.yaml", extra=extra,
            nnodes=run.nnodes, rdzv_endpoint=run.rdzv_endpoint,
        )  # fmt: skip
        env = dict(os.environ)
        exit_dir = out / EXIT_DIR_NAME  # each rank records its own code there (torchrun exits 1)
        with contextlib.suppress(OSError):  # a shared folder: these are the run's (unrecorded: left)
            run_manifest.record(out, LOG_NAME, EXIT_DIR_NAME)
            run_manifest.settle(out)  # what else is there now is not the run's (it waited, or resumes)
        shutil.rmtree(exit_dir, ignore_errors=True)  # a resume relaunches into the same folder
        env.update(
            TUNEBENCH_HOME=str(tunebench_home()),
            TUNEBENCH_RUN_ID=run.id,
            TUNEBENCH_EXIT_DIR=str(exit_dir),
            PYTHONUNBUFFERED="1",
        )
        child: subprocess.Popen | None = None
        stop_seen = False

        def on_term(signum: int, frame: object) -> None:  # `kill <supervisor>` = a stop request
            nonlocal stop_seen
            stop_seen = True  # only a flag: the wait loop below passes it on to the ranks

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with open(log_path, "ab", buffering=0) as log:
            log.write(f"== tunebench: {' '.join(cmd)}\n".encode())
            try:
                child = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                update_run(
                    run.id,
                    db=db,
                    status="failed",
                    exit_code=127,
                    ended_at=time.time(),
                    error=f"could not start torchrun: {exc}",
                )
                return 0
            now = time.time()
            update_run(run.id, db=db, status="running", pid=child.pid, pgid=child.pid, started_at=now)
            where = (
                f" on each of {run.nnodes} nodes (rendezvous {run.rdzv_endpoint})" if run.nnodes > 1 else ""
            )
            add_event(run.id, run.step, "start", f"{run.nproc} process(es){where}, pid {child.pid}", db=db)
            if get_run(run.id, db=db).stop_requested:  # a stop that came before the pid was known
                _signal_group(child.pid, signal.SIGTERM)  # (no rank yet: torchrun passes it on)
            rc = _wait_recording(child, out, run.id, lambda: stop_seen, db=db)
            _signal_group(child.pid, signal.SIGKILL)
            from workbench.launcher import _kill, run_workers

            for proc in run_workers(run.id):  # workers orphaned by a crashed torchrun (own sessions)
                _kill(proc)
        tail = read_tail(log_path)
        code = recorded_exit_code(exit_dir, tail, rc)
        final = get_run(run.id, db=db)
        if final.stop_requested or stop_seen:
            status, error = "stopped", None
        elif code == 0:
            status, error = "completed", None
        else:
            status, error = "failed", failure_summary(tail, code)
        update_run(run.id, db=db, status=status, exit_code=code, ended_at=time.time(), error=error)
        add_event(run.id, final.step, "end", f"{status} (exit code {code})", db=db)
    return 0


def _wait_recording(
    child: subprocess.Popen, out: Path, run_id: str, stop_seen, *, db, every_s: float = RECORD_EVERY_S
) -> int:
    """Wait for torchrun to end; returns its code. Meanwhile, a stop seen by the SIGTERM handler
    (`stop_seen()` turns true) is passed to the ranks once, and every `every_s` seconds, and at the
    end, the new top-level entries of a shared run folder are recorded as the run's
    (`workbench.run_manifest.record_new`; nothing happens for a run's own `runs/<id>/`)."""
    from workbench.launcher import signal_ranks

    passed = False
    next_record = 0.0
    while True:
        if stop_seen() and not passed:
            passed = True
            signal_ranks(get_run(run_id, db=db), signal.SIGTERM)
        if time.monotonic() >= next_record:
            _record_new(out)
            next_record = time.monotonic() + every_s
        try:
            rc = child.wait(timeout=WAIT_TICK_S)
            break
        except subprocess.TimeoutExpired:
            continue
    _record_new(out)
    return rc


def _record_new(out: Path) -> None:
    # a full or unreachable shared disk: the run goes on (a delete then leaves what was not recorded)
    with contextlib.suppress(OSError):
        run_manifest.record_new(out)


def detach() -> None:
    """Fork into a new session that outlives the caller's terminal: the parent prints the child's pid
    (the launcher reads it) and exits; the child continues with stdin/stdout on /dev/null."""
    pid = os.fork()
    if pid > 0:
        print(pid, flush=True)
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fork = bool(args) and args[0] == "--fork"
    if fork:
        args = args[1:]
    if not args:
        print("usage: python -m workbench.supervisor [--fork] RUN_ID [-- ARGS...]", file=sys.stderr)
        return 2
    run_id, rest = args[0], args[1:]
    extra = rest[1:] if rest[:1] == ["--"] else rest
    if fork:
        detach()
    return supervise(run_id, extra)


if __name__ == "__main__":
    sys.exit(main())
