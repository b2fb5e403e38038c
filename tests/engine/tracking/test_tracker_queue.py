"""The run queue in the tracker: places, cancel, move, pause, take-next, one scheduler at a time, and the
schema 3 -> 4 migration."""

import pytest

from engine.tracking import db as dbmod
from engine.tracking import queue_rows as tq
from engine.tracking.db import open_db
from engine.tracking.readers import get_run
from engine.tracking.run_rows import create_run, update_run
from engine.tracking.tracker_errors import TrackerError


def _runs(db, *names):
    return [create_run(db=db, recipe="sft", config_text="a: 1\n", name=n) for n in names]


def _order(db):
    return [(r.name, r.queue_pos) for r in tq.waiting_runs(db=db)]


def test_enqueue_cancel_move_and_take_next_in_order(tunebench_home):
    with open_db() as db:
        a, b, c, d = _runs(db, "a", "b", "c", "d")
        rows = tq.enqueue([a.id, b.id, c.id], db=db)
        assert [(r.name, r.queue_pos) for r in rows] == [("a", 1), ("b", 2), ("c", 3)]
        tq.enqueue([d.id], db=db)
        assert _order(db) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]

        assert tq.cancel(b.id, db=db).status == "cancelled"
        assert _order(db) == [("a", 1), ("c", 2), ("d", 3)]  # renumbered, order kept
        cancelled = get_run(b.id, db=db)
        assert (cancelled.queue_pos, cancelled.started_at) == (None, None)
        with pytest.raises(TrackerError, match="not waiting in the queue"):
            tq.cancel(b.id, db=db)

        assert tq.move(d.id, 1, db=db) == 1
        assert _order(db) == [("d", 1), ("a", 2), ("c", 3)]
        assert tq.move(d.id, 99, db=db) == 3  # clipped to the end
        assert _order(db) == [("a", 1), ("c", 2), ("d", 3)]

        taken = tq.take_next(db=db)
        assert (taken.name, taken.queue_pos, taken.status) == ("a", None, "queued")
        assert _order(db) == [("c", 1), ("d", 2)]
        with pytest.raises(TrackerError, match="not waiting"):
            tq.cancel(a.id, db=db)  # taken by the scheduler: a cancel no longer races the launch

        tq.enqueue([b.id], db=db)  # a cancelled run that never started can be queued again
        assert _order(db) == [("c", 1), ("d", 2), ("b", 3)]
        assert get_run(b.id, db=db).status == "queued"


def test_only_never_started_runs_can_wait(tunebench_home):
    with open_db() as db:
        done, live, fresh = _runs(db, "done", "live", "fresh")
        update_run(done.id, db=db, status="completed", started_at=1.0, ended_at=2.0)
        update_run(live.id, db=db, supervisor_pid=12345)  # launched, starting
        with pytest.raises(TrackerError, match="run done is completed: only a run that never started"):
            tq.enqueue([fresh.id, done.id], db=db)
        assert _order(db) == []  # all or none
        with pytest.raises(TrackerError, match="run live is queued: only a run that never started"):
            tq.enqueue([live.id], db=db)
        tq.enqueue([fresh.id], db=db)
        with pytest.raises(TrackerError, match="already in the queue"):
            tq.enqueue([fresh.id], db=db)


def test_pause_holds_take_next(tunebench_home):
    with open_db() as db:
        (a,) = _runs(db, "a")
        tq.enqueue([a.id], db=db)
        tq.set_paused(True, db=db)
        assert tq.queue_state(db=db).paused
        assert tq.take_next(db=db) is None
        assert _order(db) == [("a", 1)]
        tq.set_paused(False, db=db)
        assert tq.take_next(db=db).id == a.id
        assert tq.take_next(db=db) is None  # empty


def test_busy_runs_are_this_host_s_running_or_starting_runs(tunebench_home):
    with open_db() as db:
        running, starting, waiting, slurm, other = _runs(
            db, "running", "starting", "waiting", "slurm", "other"
        )
        update_run(running.id, db=db, status="running")
        update_run(starting.id, db=db, supervisor_pid=4242)
        tq.enqueue([waiting.id], db=db)
        update_run(slurm.id, db=db, status="running", slurm_job_id="77")
        update_run(other.id, db=db, status="running", host="another-host")
        busy = {r.name for r in tq.busy_runs(db=db, host=running.host)}
    assert busy == {"running", "starting"}


def test_one_scheduler_at_a_time_and_release_only_when_idle(tunebench_home):
    alive = {111: True, 222: True}
    is_alive = lambda pid, started: alive.get(pid, False)  # noqa: E731
    with open_db() as db:
        assert tq.claim_scheduler(111, 5.0, db=db, alive=is_alive)
        assert not tq.claim_scheduler(222, 6.0, db=db, alive=is_alive)  # 111 is alive
        assert tq.queue_state(db=db).scheduler_pid == 111
        alive[111] = False  # it died without letting go (kill -9)
        assert tq.claim_scheduler(222, 6.0, db=db, alive=is_alive)
        assert (tq.queue_state(db=db).scheduler_pid, tq.queue_state(db=db).scheduler_started) == (222, 6.0)

        (a,) = _runs(db, "a")
        tq.enqueue([a.id], db=db)
        assert not tq.release_scheduler(222, db=db)  # a run waits: keep going
        assert tq.queue_state(db=db).scheduler_pid == 222
        tq.set_paused(True, db=db)
        assert tq.release_scheduler(222, db=db)  # paused: nothing to start
        assert tq.queue_state(db=db).scheduler_pid is None
        assert tq.claim_scheduler(111, 7.0, db=db, alive=is_alive)
        assert tq.release_scheduler(222, db=db, force=True)  # not the holder: changes nothing
        assert tq.queue_state(db=db).scheduler_pid == 111


def test_version_3_database_gets_the_queue(tunebench_home):
    with open_db() as db:
        create_run(db=db, recipe="sft", config_text="", name="kept3")
        db.execute("ALTER TABLE runs DROP COLUMN queue_pos")  # as in version 3
        db.execute("DROP TABLE queue_state")
        db.execute("UPDATE schema_version SET version = 3")
    with open_db() as db:
        assert db.execute("SELECT version FROM schema_version").fetchone()[0] == dbmod.SCHEMA_VERSION == 4
        assert db.execute("SELECT name, queue_pos FROM runs").fetchall() == [("kept3", None)]
        assert tq.queue_state(db=db) == tq.QueueState(False, None, None)
        tq.set_paused(True, db=db)
        assert tq.queue_state(db=db).paused
