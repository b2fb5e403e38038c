"""Following a run from the terminal: a one-line progress bar until the run ends (shared by the
`run`, `resume`, `clone` and `show --follow` commands), and small formatting helpers."""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

from engine.tracking.db import open_db
from engine.tracking.readers import events_since, get_run, summarize
from engine.tracking.records import ACTIVE_STATUSES, RunRecord, RunSummary

BAR_WIDTH = 24
_NOTABLE = {"checkpoint", "nan", "oom", "eval", "resume", "stop"}


def exit_code_of(run: RunRecord) -> int:
    """The shell exit code for a finished run: its recorded code (signals as 128+N), 0 when stopped
    on request, 1 when it failed without a code."""
    if run.status == "stopped":
        return 0
    code = run.exit_code
    if code is None:
        return 0 if run.status == "completed" else 1
    return 128 - code if code < 0 else code


def human_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def human_number(v: float | None) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:.4g}"


def progress_line(s: RunSummary, *, width: int = BAR_WIDTH) -> str:
    """`[#####.....] 12/100  loss 1.234  5.6k tok/s  ETA 1m23s  running`"""
    run = s.run
    total = run.total_steps
    if total:
        filled = min(width, int(width * run.step / total))
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {run.step}/{total}"
    else:
        bar = f"step {run.step}"
    loss = "-" if s.last_loss is None else f"{s.last_loss:.4g}"
    return f"{bar}  loss {loss}  {human_number(s.tokens_per_sec_median)} tok/s  ETA {human_duration(s.eta_s)}  {run.status}"


def follow(
    run_id: str, *, stream: TextIO | None = None, poll_s: float = 0.5, interactive: bool | None = None
) -> int:
    """Show progress until the run ends; returns `exit_code_of(run)`.

    Ctrl-C asks "stop the run or detach? [s/d]" when stdin is a terminal (`interactive`), and detaches
    otherwise; detaching returns 0 and leaves the run going.
    """
    from workbench import launcher

    out = stream or sys.stderr
    tty = out.isatty()
    if interactive is None:
        interactive = sys.stdin.isatty()
    last_event = 0
    last_print = 0.0
    last_line = ""
    while True:
        try:
            with open_db() as db:
                run = get_run(run_id, db=db)
                for ev in events_since(run.id, db=db, after_id=last_event):
                    last_event = ev.id
                    if ev.kind in _NOTABLE:
                        _emit(out, tty, f"step {ev.step}: {ev.kind}: {ev.text}")
                summary = summarize(run, db=db)
            line = progress_line(summary)
            trained = bool(run.step) or summary.last_loss is not None
            if run.status not in ACTIVE_STATUSES:
                if trained:
                    _emit(out, tty, line, final=True)
                elif tty and last_line:
                    out.write("\r\x1b[2K")  # a failed start: no progress to leave on screen
                ending = f"run {run.name} {run.status} (exit code {run.exit_code})"
                error = (run.error or "").strip() if run.status == "failed" else ""
                if error and "\n" not in error:
                    print(f"{ending}: {error}", file=out)
                elif error:
                    print(f"{ending}:\n{error}", file=out)
                else:
                    print(ending, file=out)
                return exit_code_of(run)
            now = time.monotonic()
            if tty:
                out.write("\r" + line.ljust(len(last_line)))
                out.flush()
            elif trained and line != last_line and now - last_print >= 2.0:  # nothing before step 1
                print(line, file=out, flush=True)
                last_print = now
            last_line = line
            launcher.reconcile_lost()
            time.sleep(poll_s)
        except KeyboardInterrupt:
            choice = "d"
            if interactive:
                try:
                    choice = input("\nstop the run or detach? [s/d] ").strip().lower()[:1] or "d"
                except (EOFError, KeyboardInterrupt):
                    choice = "d"
            if choice == "s":
                print(f"stopping run {run_id} (checkpoint, then exit) ...", file=out)
                launcher.stop(run_id)
                continue
            print(f"\ndetached; the run goes on. Follow it again: tunebench show {run_id} --follow", file=out)
            return 0


def announce_and_follow(rec: RunRecord, how: str, *, detach: bool) -> int:
    """After launching `rec`: print `run NAME (ID) <how>; log: <output_dir>/stdout.log`, then `follow`
    it on stderr to its end (its exit code), or return 0 at once when `detach`."""
    print(f"run {rec.name} ({rec.id}) {how}; log: {rec.output_dir}/stdout.log", flush=True)
    if detach:
        return 0
    return follow(rec.id, stream=sys.stderr)


def _emit(out: TextIO, tty: bool, text: str, *, final: bool = False) -> None:
    if tty:
        out.write("\r\x1b[2K")
    print(text, file=out, flush=True)
