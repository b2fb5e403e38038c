"""`MetricLogger.flush()` is a barrier: it returns only once every row logged before it is committed in
SQLite (visible to any other connection), however long the write lock is held elsewhere. A checkpoint
is published right after this flush (`engine.checkpoint.recipe_state.save_training_checkpoint`)."""

import sqlite3
import threading

from engine.tracking import MetricLogger, readers
from engine.tracking.db import open_db
from engine.tracking.paths import db_path
from engine.tracking.run_rows import create_run


def test_flush_waits_until_the_rows_are_committed_while_another_writer_holds_the_lock(tunebench_home):
    with open_db() as db:
        run = create_run(db=db, recipe="sft", config_text="{}")
    log = MetricLogger(run_id=run.id, echo=False, max_delay_s=0)  # no timer: only the flush hands rows over
    try:
        log.log(1, {"loss": 2.0})
        log.log(2, {"loss": 1.5, "lr": 0.1})
        busy = sqlite3.connect(db_path(tunebench_home), timeout=60, isolation_level=None)
        busy.execute("BEGIN IMMEDIATE")  # another run writing a long burst
        returned = threading.Event()
        flusher = threading.Thread(target=lambda: (log.flush(), returned.set()), daemon=True)
        flusher.start()
        # While the lock is held the rows cannot be committed, so the flush must still be waiting.
        assert not returned.wait(1.0), "flush() returned while its rows could not be committed"
        busy.rollback()
        busy.close()
        assert returned.wait(120), "flush() did not return after the write lock was released"
        with open_db() as db:  # a fresh connection: what another process sees
            rows = [(m.step, m.name, m.value) for m in readers.metrics_since(run.id, db=db)]
        assert rows == [(1, "loss", 2.0), (2, "loss", 1.5), (2, "lr", 0.1)]
    finally:
        log.close()
