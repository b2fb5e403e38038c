"""The run queue's scheduler: `python -m workbench.scheduler [--fork]`, one detached process per home.

Started on demand by `workbench.run_queue.ensure_scheduler` (when a run is queued or the queue is
resumed) with `--fork`: the first process forks, prints the child's pid and exits, so the scheduler is
re-parented to init and lives in a session of its own, like a run's supervisor (quitting the workbench
or the SSH session does not stop it). Then it:

1. claims the queue (`engine.tracking.queue_rows.claim_scheduler`: one live scheduler at a time, known by
   pid + start time; a second one exits at once);
2. every `TUNEBENCH_QUEUE_POLL_S` seconds (default 2): marks lost runs failed (`reconcile_lost`), and
   when no run uses this host's device (`busy_runs`: running or starting, SLURM runs aside) takes the
   first waiting run out of the queue (`take_next`) and launches it (`workbench.launcher.launch`: its
   own detached supervisor);
3. exits when there is nothing to start: the queue is empty or paused (`release_scheduler` checks and
   lets go in one transaction, so a run queued at that moment finds either this scheduler or none and
   starts a new one).

Runs inherit this process's environment (as a supervisor inherits its caller's): the environment of the
command that started the scheduler. SIGTERM/SIGINT only set a flag; the loop lets go and exits.
Its messages go to `TUNEBENCH_HOME/scheduler.log`.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from engine.tracking.db import open_db
from engine.tracking.queue_rows import busy_runs, claim_scheduler, release_scheduler, take_next
from engine.tracking.run_rows import add_event

POLL_ENV = "TUNEBENCH_QUEUE_POLL_S"
LOG_NAME = "scheduler.log"


def poll_interval() -> float:
    """Seconds between looks at the queue: `TUNEBENCH_QUEUE_POLL_S`, default 2."""
    try:
        return max(0.05, float(os.environ.get(POLL_ENV, "2")))
    except ValueError:
        return 2.0


def _say(text: str) -> None:
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} scheduler {os.getpid()}: {text}", file=sys.stderr, flush=True
    )


def schedule(poll_s: float | None = None) -> int:
    """Drive the queue until it has nothing to start (or a SIGTERM); returns 0."""
    from workbench.launcher import _alive, _create_time, launch, reconcile_lost

    poll = poll_interval() if poll_s is None else poll_s
    me = os.getpid()
    with open_db() as db:
        if not claim_scheduler(me, _create_time(me), db=db, alive=_alive):
            return 0  # another scheduler drives the queue
    asked = {"stop": False}

    def on_signal(signum: int, frame: object) -> None:
        asked["stop"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    host = socket.gethostname()
    _say("driving the queue")
    try:
        while not asked["stop"]:
            reconcile_lost()
            with open_db() as db:
                nxt = None if busy_runs(db=db, host=host) else take_next(db=db)
                if nxt is None and release_scheduler(me, db=db):
                    _say("nothing to start (queue empty or paused): exiting")
                    return 0
            if nxt is not None:
                _start(nxt, launch)
                continue  # the next look sees it starting, so nothing else starts beside it
            deadline = time.monotonic() + poll
            while not asked["stop"] and time.monotonic() < deadline:
                time.sleep(min(0.05, poll))
        _say("asked to stop: exiting (runs already started keep going)")
        return 0
    finally:
        with open_db() as db:
            release_scheduler(me, db=db, force=True)


def _start(run, launch) -> None:
    """Launch one run taken from the queue; a launch that fails is recorded on the run by `launch`."""
    with open_db() as db:
        add_event(run.id, run.step, "queue", "started by the run queue", db=db)
    try:
        launch(run.id)
    except Exception as exc:  # the run is marked failed by launch; the queue goes on with the next
        _say(f"run {run.name} ({run.id}) did not start: {exc}")
        return
    _say(f"started run {run.name} ({run.id})")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--fork":
        from workbench.supervisor import detach

        detach()
        args = args[1:]
    if args:
        print("usage: python -m workbench.scheduler [--fork]", file=sys.stderr)
        return 2
    return schedule()


if __name__ == "__main__":
    sys.exit(main())
