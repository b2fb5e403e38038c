"""`MetricLogger`: how a recipe writes metrics, progress, events and eval scores to the tracker.

The training thread only appends rows to an in-memory buffer. When a later step starts, the buffer
is handed to a writer thread that writes it in one `BEGIN IMMEDIATE` transaction (`executemany`;
batches that queued up meanwhile go in the same transaction), so a step's rows reach the database
about as soon as the step is done, and the SQLite write (and any wait on a busy database or a slow
disk) never stalls training. The buffer is also handed over when it is older than `max_delay_s`
(the writer thread checks), and `flush()` hands it over and waits until everything is written:
`event()`, `eval_result()`, `close()`, interpreter exit (atexit) and SIGTERM (when the process has no
SIGTERM handler of its own) all flush.

Without `TUNEBENCH_RUN_ID` (a recipe started by hand) nothing is written: rank 0 prints one compact
line per step to stdout instead (and also with a run id, so `runs/<id>/stdout.log` shows progress).
"""

from __future__ import annotations

import atexit
import math
import os
import queue
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
from engine.tracking.errors import TrackerError

_CHECKPOINT_EVERY_S = 30.0
_RETRY_S = 0.5
_FLUSH_TIMEOUT_S = 300.0
_LIVE: weakref.WeakSet[MetricLogger] = weakref.WeakSet()
_SIGTERM_HOOKED = False


class _Batch:
    """Rows handed from the training thread to the writer thread."""

    __slots__ = ("metrics", "events", "evals", "progress")

    def __init__(self, metrics: list, events: list, evals: list, progress: tuple | None) -> None:
        self.metrics, self.events, self.evals, self.progress = metrics, events, evals, progress


class MetricLogger:
    """Buffered writer of one run's metrics.

    Args:
        run_id: the tracker row (None: print only, write nothing).
        rank: this process's rank; rank 0 also owns progress and the printed line.
        home: `TUNEBENCH_HOME` (default: the environment's).
        echo: print one compact line per step (default: rank 0 only).
        max_delay_s: longest time a logged row waits in the buffer (default 0.5 s; 0: only step
            changes and `flush()` hand rows over).
        stream: where the line goes (default stdout).

    Raises `engine.tracking.errors.TrackerError` when the database cannot be opened, and from
    `flush()`/`close()` when rows could not be written within 300 s.
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
        self._lock = threading.RLock()  # guards the buffer (training thread vs. the staleness check)
        self._metrics: list[tuple] = []  # (run_id, step, name, value, time, rank)
        self._events: list[tuple] = []
        self._evals: list[tuple] = []
        self._progress: tuple[int, int | None] | None = None
        self._total: int | None = None
        self._step: int | None = None  # step of the rows in the buffer
        self._line: dict[str, float] = {}
        self._oldest: float | None = None
        self._closed = False
        self._pid = os.getpid()  # a forked child (DataLoader worker) must never touch this connection
        self._error: BaseException | None = None
        self._queue: queue.Queue[_Batch | None] = queue.Queue()
        self._db: sqlite3.Connection | None = connect(home) if run_id is not None else None
        self._thread: threading.Thread | None = None
        if self._db is not None:
            self._thread = threading.Thread(target=self._writer, name="tunebench-metrics", daemon=True)
            self._thread.start()
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
        """Hand over everything buffered and wait until it is written (prints the pending step line)."""
        if os.getpid() != self._pid:  # in a forked child: the parent owns the rows and the database
            return
        with self._lock:
            self._print_line()
            self._handoff()
        if self._thread is None:
            return
        deadline = time.monotonic() + _FLUSH_TIMEOUT_S
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            if not self._thread.is_alive():
                break
            time.sleep(0.0005)
        if self._queue.unfinished_tasks:
            raise TrackerError(
                f"metrics of run {self.run_id} could not be written ({self._error}): check the disk and "
                "that nothing holds a write lock on tunebench.db"
            )

    def close(self) -> None:
        """Flush, stop the writer thread and release the database; later calls are ignored (also in a
        forked child, which must not use the parent's SQLite connection)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush()
        finally:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join(timeout=10)
            if self._db is not None:
                self._db.close()
                self._db = None
            _LIVE.discard(self)

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- training-thread side ----------------------------------------------------------------------
    def _roll(self, step: int) -> None:
        """A new step starts: hand the previous one to the writer thread."""
        if self._closed:
            raise RuntimeError("MetricLogger is closed")
        if self._step is not None and step != self._step:
            self._print_line()
            self._handoff()
        self._step = int(step)

    def _handoff(self) -> None:
        if not (self._metrics or self._events or self._evals or self._progress):
            return
        batch = _Batch(self._metrics, self._events, self._evals, self._progress)
        self._metrics, self._events, self._evals, self._progress = [], [], [], None
        self._oldest = None
        if self._thread is not None:
            self._queue.put(batch)

    def _touch(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()

    # -- writer thread -----------------------------------------------------------------------------
    def _writer(self) -> None:
        last_checkpoint = time.monotonic()
        tick = max(self.max_delay_s / 2, 0.01) if self.max_delay_s > 0 else None
        while True:
            try:
                first = self._queue.get(timeout=tick)
            except queue.Empty:
                self._hand_over_stale()
                continue
            batches = [first]
            while True:  # whatever queued up meanwhile goes in the same transaction
                try:
                    batches.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(b is None for b in batches)
            rows = [b for b in batches if b is not None]
            while rows:
                try:
                    self._write(rows)
                    self._error = None
                    break
                except sqlite3.Error as exc:  # keep the rows; retry (training goes on meanwhile)
                    self._error = exc
                    print(f"tunebench: writing metrics failed ({exc}); retrying", file=sys.stderr)
                    time.sleep(_RETRY_S)
            for _ in batches:
                self._queue.task_done()
            if time.monotonic() - last_checkpoint > _CHECKPOINT_EVERY_S and self._db is not None:
                last_checkpoint = time.monotonic()
                try:
                    self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    pass
            if stop:
                return

    def _hand_over_stale(self) -> None:
        oldest = self._oldest
        if oldest is None or time.monotonic() - oldest < self.max_delay_s:
            return
        if self._lock.acquire(timeout=0.05):  # never wait on a training thread that is mid-log
            try:
                self._print_line()  # a slow step's line shows now, not when the next step starts
                self._handoff()
            finally:
                self._lock.release()

    def _write(self, batches: list[_Batch]) -> None:
        db = self._db
        assert db is not None
        metrics = [r for b in batches for r in b.metrics]
        events = [r for b in batches for r in b.events]
        evals = [r for b in batches for r in b.evals]
        progress = next((b.progress for b in reversed(batches) if b.progress is not None), None)
        with write_tx(db):
            if metrics:
                db.executemany(
                    "INSERT INTO metrics (run_id, step, name, value, time, rank) VALUES (?, ?, ?, ?, ?, ?)",
                    metrics,
                )
            if events:
                db.executemany(
                    "INSERT INTO events (run_id, step, kind, text, time, rank) VALUES (?, ?, ?, ?, ?, ?)",
                    events,
                )
            if evals:
                db.executemany(
                    "INSERT INTO eval_results (run_id, step, task, metric, value, checkpoint, time) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    evals,
                )
            if progress is not None:
                step, total = progress
                db.execute(
                    "UPDATE runs SET step = ?, total_steps = COALESCE(?, total_steps) WHERE id = ?",
                    (step, total, self.run_id),
                )

    # -- printing ----------------------------------------------------------------------------------
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
