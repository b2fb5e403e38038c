"""`MetricLogger`: how a recipe writes metrics, progress, events and eval scores to the tracker.

The training thread only appends rows to an in-memory buffer. When a later step starts (or the buffer
holds `_CHUNK_ROWS` rows) the buffer is handed to a writer thread, which writes what is queued in
`BEGIN IMMEDIATE` transactions, so a step's rows reach the database about as soon as the step is done
and the SQLite write never stalls training. The buffer is also handed over when it is older than
`max_delay_s` (the writer thread checks), and `flush()` hands it over and waits until everything is
written: `event()`, `eval_result()`, `close()` and interpreter exit (atexit) all flush.

Under load (many processes logging as fast as they can into one database):
- each transaction is bounded, at most `_TX_ROWS` rows and `_TX_S` seconds of holding the write lock,
  after which the writer commits and, with more queued, leaves the lock free for a few ms; it waits
  for the lock itself (short randomised polls, polling faster the longer it has waited) rather than
  in SQLite's busy handler, so every writer gets the lock in turn and commits every fraction of a
  second, and none waits out a busy timeout ("database is locked");
- the queue is bounded: `log()` waits (back-pressure, nothing is dropped) while `max_queued_rows`
  rows wait for the writer, so memory stays bounded and `close()` has at most that much left to write.
  The total time `log()` waited is recorded as a `tracker` event at close.

SIGTERM (when the process has no SIGTERM handler of its own): the handler only sets a flag and
restores the default action (a second SIGTERM kills at once). The training thread sees the flag at its
next logger call (a safe point: it holds no lock) and flushes every logger there; if it does not call
within `_SIGTERM_GRACE_S` (a long step), a writer thread does it. Either way the process then ends by
SIGTERM as it would have without the tracker.

Without `TUNEBENCH_RUN_ID` (a recipe started by hand) nothing is written: rank 0 prints one compact
line per step to stdout instead (and also with a run id, so `runs/<id>/stdout.log` shows progress).

Length: over 500 lines because the writer's bounded transactions, back-pressure and signal-safe flush
are one concurrency design that reads best in one file.
"""

from __future__ import annotations

import atexit
import collections
import math
import os
import random
import signal
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from engine.tracking.db import connect
from engine.tracking.tracker_errors import TrackerError

_CHECKPOINT_EVERY_S = 30.0
_RETRY_S = 0.5
_FLUSH_TIMEOUT_S = 300.0
_TX_ROWS = 20_000  # most rows in one transaction
_TX_S = 0.05  # most seconds one transaction holds the write lock (checked between chunks)
_CHUNK_ROWS = 2_000  # rows per executemany; also the buffer size that is handed over mid-step
_MAX_QUEUED_ROWS = 20_000  # default back-pressure bound (~1-3 s of writing under heavy contention)
_BUSY_WARN_S = 30.0  # a write lock held this long by someone else is reported (and still waited for)
_SIGTERM_GRACE_S = 1.0
_LIVE: weakref.WeakSet[MetricLogger] = weakref.WeakSet()
_SIGTERM_HOOKED = False
_TERM_PENDING = False  # set by the SIGTERM handler; nothing else happens in the handler
_TERM_LOCK = threading.Lock()


class _Batch:
    """Rows handed from the training thread to the writer thread; `seq` numbers hand-overs."""

    __slots__ = ("metrics", "events", "evals", "progress", "seq")

    def __init__(self, metrics: list, events: list, evals: list, progress: tuple | None, seq: int) -> None:
        self.metrics, self.events, self.evals, self.progress, self.seq = metrics, events, evals, progress, seq

    def rows(self) -> int:
        return len(self.metrics) + len(self.events) + len(self.evals)


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
        max_queued_rows: back-pressure bound; `log()` waits while this many rows wait for the writer.

    Raises `engine.tracking.tracker_errors.TrackerError` when the database cannot be opened, and from
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
        max_queued_rows: int = _MAX_QUEUED_ROWS,
    ) -> None:
        self.run_id = run_id
        self.rank = rank
        self.echo = (rank == 0) if echo is None else echo
        self.max_delay_s = max_delay_s
        self.max_queued_rows = max(1, int(max_queued_rows))
        self._stream = stream
        self._lock = threading.RLock()  # guards the buffer (training thread vs. the writer thread)
        self._metrics: list[tuple] = []  # (run_id, step, name, value, time, rank)
        self._events: list[tuple] = []
        self._evals: list[tuple] = []
        self._progress: tuple[int, int | None] | None = None
        self._total: int | None = None
        self._step: int | None = None  # step of the rows in the buffer
        self._line: dict[str, float] = {}
        self._oldest: float | None = None
        self._closed = False
        self._frozen = False  # the SIGTERM flush took the buffer: later rows are not logged
        self._pid = os.getpid()  # a forked child (DataLoader worker) must never touch this connection
        self._error: BaseException | None = None
        # The queue: batches in hand-over order; `_cv` guards it and the counters below.
        self._cv = threading.Condition(threading.Lock())
        self._queue: collections.deque[_Batch] = collections.deque()
        self._queued_rows = 0
        self._handed = 0  # seq of the last batch handed over
        self._done = 0  # seq of the last batch fully committed
        self._stop = False
        self._waited_s = 0.0  # back-pressure: total time log() waited for room
        # writer-thread figures (see `stats()`)
        self._tx_count = 0
        self._committed_rows = 0
        self._longest_tx_s = 0.0
        self._longest_gap_s = 0.0
        self._last_commit: float | None = None  # set while rows stay queued after a commit
        self._queued_at = 0.0  # when the queue last became non-empty
        self._db: sqlite3.Connection | None = connect(home) if run_id is not None else None
        self._thread: threading.Thread | None = None
        if self._db is not None:
            self._db.execute("PRAGMA busy_timeout=0")  # the writer waits for the lock itself (_begin)
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
        _safe_point()
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
        NaN and +/-inf are kept as such. Waits while `max_queued_rows` rows wait for the writer."""
        _safe_point()
        self._wait_for_room()
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
            if len(self._metrics) >= _CHUNK_ROWS:  # a huge step: hand it over in parts
                self._handoff()

    def event(self, step: int, kind: str, text: str, *, rank: int | None = None) -> None:
        """Something to notice (`checkpoint`, `nan`, `oom`, `eval`, ...); flushed at once."""
        _safe_point()
        r = self.rank if rank is None else int(rank)
        with self._lock:
            self._check_open()
            self._events.append((self.run_id, int(step), kind, text, time.time(), r))
            self._touch()
        if self._db is None and self.echo:
            self._print(f"[{kind}] step {step}: {text}")
        self.flush()

    def eval_result(
        self, step: int, task: str, metric: str, value: float, checkpoint: str | None = None
    ) -> None:
        """One evaluation score (stored in `eval_results`; `tunebench show` lists them); flushed at once."""
        _safe_point()
        with self._lock:
            self._check_open()
            self._evals.append((self.run_id, int(step), task, metric, float(value), checkpoint, time.time()))
            self._touch()
        if self._db is None and self.echo:
            self._print(f"[eval] step {step}: {task} {metric} = {value:.4g}")
        self.flush()

    def flush(self) -> None:
        """Hand over everything buffered and wait until it is committed: on return every row logged
        before the call is in SQLite, visible to any other connection and kept through a kill -9 (a
        barrier, waiting for a write lock held elsewhere as long as it takes, up to 300 s). A recipe's
        checkpoint is published only after it (`engine.checkpoint.recipe_state`). Prints the pending
        step line. Raises `TrackerError` when the rows could not be written in time."""
        _safe_point()
        self._flush(_FLUSH_TIMEOUT_S)

    def close(self) -> None:
        """Flush, stop the writer thread and release the database; later calls are ignored (also in a
        forked child, which must not use the parent's SQLite connection)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._closed:
                return
            if self._waited_s > 0.0 and self._db is not None:
                self._events.append(
                    (self.run_id, self._step or 0, "tracker",
                     f"logging outpaced the database: log() waited {self._waited_s:.1f} s in all for the "
                     f"writer (back-pressure at {self.max_queued_rows} queued rows; nothing was dropped)",
                     time.time(), self.rank)
                )  # fmt: skip
            self._closed = True
        try:
            self._flush(_FLUSH_TIMEOUT_S)
        finally:
            self._shutdown()

    def stats(self) -> dict[str, float]:
        """How the writer fared: `transactions`, `committed_rows`, `longest_tx_s` (longest hold of the
        write lock, BEGIN to COMMIT), `longest_gap_s` (longest time rows were queued without a commit:
        waiting for the lock included) and `waited_s` (total back-pressure wait in `log()`)."""
        return {
            "transactions": self._tx_count,
            "committed_rows": self._committed_rows,
            "longest_tx_s": self._longest_tx_s,
            "longest_gap_s": self._longest_gap_s,
            "waited_s": self._waited_s,
        }

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- training-thread side ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed and not self._frozen:
            raise RuntimeError("MetricLogger is closed")

    def _roll(self, step: int) -> None:
        """A new step starts: hand the previous one to the writer thread."""
        self._check_open()
        if self._step is not None and step != self._step:
            self._print_line()
            self._handoff()
        self._step = int(step)

    def _handoff(self) -> None:
        """Move the buffer to the queue (caller holds `_lock`); rows after a SIGTERM flush are dropped."""
        if self._frozen or not (self._metrics or self._events or self._evals or self._progress):
            self._metrics, self._events, self._evals = [], [], []
            return
        with self._cv:
            self._handed += 1
            batch = _Batch(self._metrics, self._events, self._evals, self._progress, self._handed)
            self._metrics, self._events, self._evals, self._progress = [], [], [], None
            self._oldest = None
            if self._thread is not None:
                if not self._queue:
                    self._queued_at = time.monotonic()
                self._queue.append(batch)
                self._queued_rows += batch.rows()
                self._cv.notify_all()
            else:
                self._done = self._handed

    def _touch(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()

    def _wait_for_room(self) -> None:
        if self._thread is None or self._queued_rows < self.max_queued_rows:
            return
        t0 = time.monotonic()
        with self._cv:
            while self._queued_rows >= self.max_queued_rows and self._thread.is_alive() and not self._stop:
                self._cv.wait(0.25)
        self._waited_s += time.monotonic() - t0

    def _flush(self, timeout_s: float) -> None:
        if os.getpid() != self._pid:  # in a forked child: the parent owns the rows and the database
            return
        with self._lock:
            self._print_line()
            self._handoff()
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout_s
        with self._cv:
            target = self._handed
            while self._done < target and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(min(left, 0.25))
            done = self._done >= target
        if not done:
            raise TrackerError(
                f"metrics of run {self.run_id} could not be written ({self._error}): check the disk and "
                "that nothing holds a write lock on tunebench.db"
            )

    def _shutdown(self) -> None:
        if self._thread is not None:
            with self._cv:
                self._stop = True
                self._cv.notify_all()
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=10)
        if self._db is not None and (self._thread is None or not self._thread.is_alive()):
            self._db.close()
            self._db = None
        _LIVE.discard(self)

    def _flush_for_sigterm(self) -> None:
        """The SIGTERM flush: take the buffer (later rows are not logged) and write everything queued."""
        if os.getpid() != self._pid:
            return
        if not self._lock.acquire(timeout=5.0):  # the training thread holds it only briefly
            return
        try:
            self._print_line()
            self._handoff()
            self._frozen = self._closed = True
        finally:
            self._lock.release()
        if self._thread is threading.current_thread():
            self._drain()  # this writer thread is the one running the flush
        else:
            try:
                self._flush(10.0)
            except TrackerError as exc:
                print(f"tunebench: could not flush metrics on SIGTERM ({exc})", file=sys.stderr)

    # -- writer thread -----------------------------------------------------------------------------
    def _writer(self) -> None:
        last_checkpoint = time.monotonic()
        tick = min(max(self.max_delay_s / 2, 0.01), 0.25) if self.max_delay_s > 0 else 0.25
        term_seen: float | None = None
        while True:
            with self._cv:
                if not self._queue and not self._stop:
                    self._cv.wait(tick)
                stop, empty = self._stop, not self._queue
            if _TERM_PENDING:
                term_seen = term_seen or time.monotonic()
                if time.monotonic() - term_seen > _SIGTERM_GRACE_S:  # the training thread did not call
                    _terminate(wait=False)  # returns at once when another thread is doing it
            if empty:
                if stop:
                    return
                self._hand_over_stale()
                continue
            self._write_one_tx()
            if time.monotonic() - last_checkpoint > _CHECKPOINT_EVERY_S and self._db is not None:
                last_checkpoint = time.monotonic()
                try:
                    self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    pass

    def _drain(self) -> None:
        while self._queue:
            self._write_one_tx()

    def _hand_over_stale(self) -> None:
        oldest = self._oldest
        if self.max_delay_s <= 0 or oldest is None or time.monotonic() - oldest < self.max_delay_s:
            return
        if self._lock.acquire(timeout=0.05):  # never wait on a training thread that is mid-log
            try:
                self._print_line()  # a slow step's line shows now, not when the next step starts
                self._handoff()
            finally:
                self._lock.release()

    def _take(self, limit: int) -> _Batch | None:
        """The front of the queue, at most `limit` rows of it (a bigger batch is split)."""
        with self._cv:
            if not self._queue:
                return None
            front = self._queue[0]
            if front.rows() <= limit:
                return self._queue.popleft()
            part = _Batch(front.metrics[:limit], [], [], None, 0)  # seq 0: not the whole batch yet
            del front.metrics[:limit]
            return part

    def _write_one_tx(self) -> None:
        """One transaction of at most `_TX_ROWS` rows / `_TX_S` s; on an error the rows go back."""
        db = self._db
        assert db is not None
        taken: list[_Batch] = []
        rows = 0
        waiting_since = self._queued_at if self._last_commit is None else self._last_commit
        try:
            self._begin(db)
            t0 = time.monotonic()
            while rows < _TX_ROWS and time.monotonic() - t0 < _TX_S:
                part = self._take(min(_CHUNK_ROWS, _TX_ROWS - rows))
                if part is None:
                    break
                taken.append(part)
                rows += part.rows()
                self._insert(db, part)
            db.execute("COMMIT")
            end = time.monotonic()
        except sqlite3.Error as exc:  # keep the rows; retry (training goes on meanwhile)
            if db.in_transaction:
                db.execute("ROLLBACK")
            self._put_back(taken)
            self._error = exc
            print(f"tunebench: writing metrics failed ({exc}); retrying", file=sys.stderr)
            time.sleep(_RETRY_S)
            return
        self._error = None
        with self._cv:
            self._queued_rows -= rows
            for part in taken:
                if part.seq:
                    self._done = part.seq
            self._cv.notify_all()
            backlog = bool(self._queue)
        self._tx_count += 1
        self._committed_rows += rows
        self._longest_tx_s = max(self._longest_tx_s, end - t0)
        self._longest_gap_s = max(self._longest_gap_s, end - waiting_since)
        self._last_commit = end if backlog else None  # with nothing queued, the next wait starts later
        if backlog:  # leave the lock free a moment so the other writers waiting for it get a turn
            time.sleep(random.uniform(0.002, 0.006))

    def _put_back(self, taken: list[_Batch]) -> None:
        with self._cv:
            for part in reversed(taken):
                if part.seq == 0 and self._queue:  # a split-off part: back into its batch
                    self._queue[0].metrics[:0] = part.metrics
                else:
                    self._queue.appendleft(part)

    def _begin(self, db: sqlite3.Connection) -> None:
        """`BEGIN IMMEDIATE`, waiting for the write lock with short random polls that get faster the
        longer it has waited (so a writer that just committed rarely wins it back first)."""
        t0 = time.monotonic()
        warned = False
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_BUSY) != sqlite3.SQLITE_BUSY:
                    raise
            waited = time.monotonic() - t0
            if waited > _BUSY_WARN_S and not warned:
                warned = True
                print(
                    f"tunebench: the tracker database has been write-locked by another process for "
                    f"{waited:.0f} s; still waiting (metrics are kept)",
                    file=sys.stderr,
                )
            hi = 0.003 if waited < 0.1 else 0.001
            time.sleep(random.uniform(hi / 4, hi))

    def _insert(self, db: sqlite3.Connection, b: _Batch) -> None:
        if b.metrics:
            db.executemany(
                "INSERT INTO metrics (run_id, step, name, value, time, rank) VALUES (?, ?, ?, ?, ?, ?)",
                b.metrics,
            )
        if b.events:
            db.executemany(
                "INSERT INTO events (run_id, step, kind, text, time, rank) VALUES (?, ?, ?, ?, ?, ?)",
                b.events,
            )
        if b.evals:
            db.executemany(
                "INSERT INTO eval_results (run_id, step, task, metric, value, checkpoint, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                b.evals,
            )
        if b.progress is not None:
            step, total = b.progress
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
    if _TERM_PENDING:
        _terminate()
    for logger in list(_LIVE):
        try:
            logger.close()
        except Exception as exc:  # at exit: report, never raise
            print(f"tunebench: could not flush metrics at exit ({exc})", file=sys.stderr)


def _on_sigterm(signum: int, frame: object) -> None:
    """Only a flag (the interrupted code may hold any lock); a second SIGTERM kills at once."""
    global _TERM_PENDING
    _TERM_PENDING = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _safe_point() -> None:
    """Called on entry to the logger's methods, where the calling thread holds none of its locks."""
    if _TERM_PENDING:
        _terminate()


def _terminate(*, wait: bool = True) -> None:
    """Flush every live logger, then end the process by SIGTERM. The first thread here does it and
    never returns; another one waits for the end (`wait`) or returns at once (a writer thread, which
    must go on writing for the one doing it)."""
    if not _TERM_LOCK.acquire(blocking=False):
        if not wait:
            return
        while True:
            time.sleep(1.0)
    for logger in list(_LIVE):
        logger._flush_for_sigterm()
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGTERM)  # the handler restored the default action
    time.sleep(2.0)
    os._exit(128 + signal.SIGTERM)  # someone installed a handler meanwhile: end anyway


def _install_exit_hooks() -> None:
    """atexit flush always; the SIGTERM flag only if nobody handles SIGTERM yet (a recipe that installs
    its own handler later replaces it and exits normally, which runs atexit)."""
    global _SIGTERM_HOOKED
    if _SIGTERM_HOOKED:
        return
    _SIGTERM_HOOKED = True
    atexit.register(_close_all)
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
