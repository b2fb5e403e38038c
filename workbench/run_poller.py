"""Incremental reads of one run for the Live screen: the worker's own cursors (metric and event ids
seen, log offset, eval rows shown) behind a lock, so a poll thread never touches screen state and two
polls never fetch the same rows."""

from __future__ import annotations

import threading
from collections import defaultdict

from workbench import services
from workbench.ui_messages import RunDataArrived


class RunPoller:
    """`poll()` returns what is new in run `run_id` since the last call as a `RunDataArrived`
    (None while another poll is running); `reset()` starts over (after a resume truncated metrics).
    Raises whatever the tracker read raises (the caller posts it)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._lock = threading.Lock()
        self._after_metric = self._after_event = self._log_offset = 0
        self._eval_count = -1  # eval rows shown so far (-1: not read yet)

    def reset(self) -> None:
        with self._lock:
            self._after_metric = self._log_offset = 0
            self._eval_count = -1

    def poll(self) -> RunDataArrived | None:
        # One poll at a time: a slow read (busy disk) must not let two threads fetch the same rows.
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._poll_once()
        finally:
            self._lock.release()

    def _poll_once(self) -> RunDataArrived:
        run, metrics, events = services.poll_run(
            self.run_id, after_metric=self._after_metric, after_event=self._after_event
        )
        log_text, offset = services.read_log(self.run_id, run.get("output_dir"), self._log_offset)
        evals = services.eval_rows(self.run_id)
        grouped: dict[str, dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
        for m in metrics:
            grouped[m.name][m.rank].append((m.step, m.value))
        if metrics:
            self._after_metric = max(m.id for m in metrics)
        if events:
            self._after_event = max(e.id for e in events)
        self._log_offset = offset
        if len(evals) == self._eval_count:
            evals = None  # unchanged: no redraw
        else:
            self._eval_count = len(evals)
        return RunDataArrived(
            self.run_id,
            run,
            {k: dict(v) for k, v in grouped.items()},
            [{"kind": e.kind, "text": e.text, "step": e.step} for e in events],
            log_text,
            [(m.step, m.time) for m in metrics if m.name == "loss" and m.rank == 0],
            evals,
        )
