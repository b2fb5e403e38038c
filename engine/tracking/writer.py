"""`MetricLogger`: how a recipe writes metrics, progress, events and eval scores to the tracker.

Rows are buffered in memory and written in one `BEGIN IMMEDIATE` transaction (`executemany`) when
a later step starts, on `flush()`, when the buffer is older than `max_delay_s` (a daemon thread
checks), at `close()`, at interpreter exit (atexit) and on SIGTERM when the process has no SIGTERM
handler of its own. So a recipe that logs once per optimizer step gets one small transaction per
step, and a reader sees a step at most `max_delay_s` after it was logged.

Without `TUNEBENCH_RUN_ID` (a recipe started by hand) nothing is written: rank 0 prints one compact
line per step to stdout instead.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from engine.tracking.db import connect, write_tx

_CHECKPOINT_EVERY_S = 30.0
_LIVE: weakref.WeakSet[MetricLogger] = weakref.WeakSet()
_SIGTERM_HOOKED = False


class MetricLogger:
    """Buffered writer of one run's metrics.

    Args:
        run_id: the tracker row (None: print only, write nothing).
        rank: this process's rank; rank 0 also owns progress and the printed line.
        home: `TUNEBENCH_HOME` (default: the environment's).
        echo: print one compact line per step (default: rank 0 only).
        max_delay_s: longest time a logged row waits in the buffer (default 0.5 s).
        stream: where the line goes (default stdout).

    Raises `engine.tracking.errors.TrackerError` when the database cannot be opened.
    """

    def __init__(
        self,
        *,
        run_id: str | None,
        rank: int = 0,
        home: Path | None = None,
        echo: bool | None = None,
        max_delay_s: float = 0.5,
        stream: TextIO | None = None,
    ) -> None:
        self.run_id = run_id
        self.rank = rank
        self.echo = (rank == 0) if echo is None else echo
        self.max_delay_s = max_delay_s
        self._stream = stream
        self._lock = threading.RLock()
        self._metrics: list[tuple] = []  # (run_id, step, name, value, time, rank)
        self._events: list[tuple] = []
        self._evals: list[tuple] = []
        self._progress: tuple[int, int | None] | None = None
        self._total: int | None = None
        self._step: int | None = None  # step of the rows in the buffer
        self._line: dict[str, float] = {}
        self._oldest: float | None = None
        self._last_checkpoint = time.monotonic()
        self._closed = False
        self._db: sqlite3.Connection | None = connect(home) if run_id is not None else None
        self._stop_timer = threading.Event()
        self._timer: threading.Thread | None = None
        if self._db is not None and max_delay_s > 0:
            self._timer = threading.Thread(target=self._flush_stale, name="tunebench-metrics", daemon=True)
            self._timer.start()
        _LIVE.add(self)

    @classmethod
    def from_env(cls, *, rank: int | None = None, **kwargs: object) -> MetricLogger:
        """A logger for the run in `TUNEBENCH_RUN_ID` (under `TUNEBENCH_HOME`); `rank` defaults to the
        `RANK` environment variable torchrun sets (0 without it). Installs the atexit/SIGTERM flush."""
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        logger = cls(run_id=os.environ.get("TUNEBENCH_RUN_ID") or None, rank=rank, **kwargs)  # type: ignore[arg-type]
        _install_exit_hooks()
        return logger

    # -- what recipes call -------------------------------------------------------------------------
    def set_progress(self, step: int, total_steps: int | None = None) -> None:
        """Rank 0's optimizer step and the planned total (for progress bars and ETAs)."""
        if self.rank != 0:
            return
        with self._lock:
            self._roll(step)
            if total_steps is not None:
                self._total = int(total_steps)
            self._progress = (int(step), self._total)
            self._touch()

    def log(self, step: int, metrics: Mapping[str, object], *, rank: int | None = None) -> None:
        """Buffer scalars of `step` (floats, ints, 0-d tensors); `rank` defaults to this logger's.
        NaN and +/-inf are kept as such."""
        now = time.time()
        r = self.rank if rank is None else int(rank)
        with self._lock:
            self._roll(step)
            for name, value in metrics.items():
                v = float(value)  # type: ignore[arg-type]
                self._metrics.append((self.run_id, int(step), name, v, now, r))
                if r == self.rank:
                    self._line[name] = v
            self._touch()

    def event(self, step: int, kind: str, text: str, *, rank: int | None = None) -> None:
        """Something to notice (`checkpoint`, `nan`, `oom`, `eval`, ...); flushed at once."""
        r = self.rank if rank is None else int(rank)
        with self._lock:
            self._events.append((self.run_id, int(step), kind, text, time.time(), r))
            self._touch()
        if self._db is None and self.echo:
            self._print(f"[{kind}] step {step}: {text}")
        self.flush()

    def eval_result(
        self, step: int, task: str, metric: str, value: float, checkpoint: str | None = None
    ) -> None:
        """One evaluation score (stored in `eval_results`; `tunebench show` lists them); flushed at once."""
        with self._lock:
            self._evals.append((self.run_id, int(step), task, metric, float(value), checkpoint, time.time()))
            self._touch()
        if self._db is None and self.echo:
            self._print(f"[eval] step {step}: {task} {metric} = {value:.4g}")
        self.flush()

    def flush(self) -> None:
        """Write everything buffered in one transaction (and print the pending step line)."""
        with self._lock:
            self._print_line()
            if self._db is None:
                self._metrics.clear()
                self._events.clear()
                self._evals.clear()
                self._progress = None
                self._oldest = None
                return
            if not (self._metrics or self._events or self._evals or self._progress):
                return
            db = self._db
            with write_tx(db):
                if self._metrics:
                    db.executemany(
                        "INSERT INTO metrics (run_id, step, name, value, time, rank) VALUES (?, ?, ?, ?, ?, ?)",
                        self._metrics,
                    )
                if self._events:
                    db.executemany(
                        "INSERT INTO events (run_id, step, kind, text, time, rank) VALUES (?, ?, ?, ?, ?, ?)",
                        self._events,
                    )
                if self._evals:
                    db.executemany(
                        "INSERT INTO eval_results (run_id, step, task, metric, value, checkpoint, time) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        self._evals,
                    )
                if self._progress is not None:
                    step, total = self._progress
                    db.execute(
                        "UPDATE runs SET step = ?, total_steps = COALESCE(?, total_steps) WHERE id = ?",
                        (step, total, self.run_id),
                    )
            self._metrics.clear()
            self._events.clear()
            self._evals.clear()
            self._progress = None
            self._oldest = None
            if time.monotonic() - self._last_checkpoint > _CHECKPOINT_EVERY_S:
                self._last_checkpoint = time.monotonic()
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def close(self) -> None:
        """Flush and release the database; later calls are ignored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop_timer.set()
            try:
                self.flush()
            finally:
                if self._db is not None:
                    self._db.close()
                    self._db = None
        _LIVE.discard(self)

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------
    def _roll(self, step: int) -> None:
        """A new step starts: flush the previous one."""
        if self._closed:
            raise RuntimeError("MetricLogger is closed")
        if self._step is not None and step != self._step:
            self.flush()
        self._step = int(step)

    def _touch(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()

    def _flush_stale(self) -> None:
        tick = max(self.max_delay_s / 2, 0.01)
        while not self._stop_timer.wait(tick):
            oldest = self._oldest
            if oldest is not None and time.monotonic() - oldest >= self.max_delay_s:
                try:
                    self.flush()
                except sqlite3.Error as exc:  # keep training; the next flush retries with the same rows
                    print(f"tunebench: metrics flush failed ({exc}); retrying", file=sys.stderr)

    def _print_line(self) -> None:
        if not (self.echo and self._line and self._step is not None):
            self._line.clear()
            return
        total = f"/{self._total}" if self._total else ""
        parts = [f"step {self._step}{total}"]
        for name, v in self._line.items():
            parts.append(f"{name} {_fmt(v)}")
        self._line.clear()
        self._print(" | ".join(parts))

    def _print(self, text: str) -> None:
        stream = self._stream or sys.stdout
        print(text, file=stream, flush=True)


def _fmt(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.5g}"


def _close_all() -> None:
    for logger in list(_LIVE):
        try:
            logger.close()
        except Exception as exc:  # at exit: report, never raise
            print(f"tunebench: could not flush metrics at exit ({exc})", file=sys.stderr)


def _on_sigterm(signum: int, frame: object) -> None:
    _close_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_exit_hooks() -> None:
    """atexit flush always; a SIGTERM flush only if nobody handles SIGTERM yet (a recipe that installs
    its own handler later replaces it and exits normally, which runs atexit)."""
    global _SIGTERM_HOOKED
    if _SIGTERM_HOOKED:
        return
    _SIGTERM_HOOKED = True
    atexit.register(_close_all)
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
