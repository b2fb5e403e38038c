"""The run queue with real processes: the detached scheduler (`workbench.scheduler`) starts queued runs of
the least-squares test recipe (tests/workbench/recipes_for_tests/lsq_recipe.py) one after another, and
`tunebench run --queue` / `tunebench queue ...` drive it from the command line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from engine.tracking.db import open_db
from engine.tracking.readers import get_run
from workbench import launcher, run_queue
from workbench.cli import main

RECIPES = Path(__file__).resolve().parent / "recipes_for_tests"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def lsq(tunebench_home, monkeypatch, tmp_path):
    """The test recipe importable by the runs the scheduler starts, a fast scheduler poll, and a
    function writing an lsq config; afterwards no scheduler or run of this home is left behind."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(RECIPES), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TUNEBENCH_QUEUE_POLL_S", "0.1")

    def config(**kw) -> Path:
        path = tmp_path / f"lsq_{len(list(tmp_path.glob('lsq_*.yaml')))}.yaml"
        path.write_text("".join(f"{k}: {v}\n" for k, v in {"steps": 3, "lr": 0.05, **kw}.items()))
        return path

    yield config
    stop_queue_and_runs()


def stop_queue_and_runs() -> None:
    """Pause the queue, end its scheduler (by its recorded pid) and stop every active run of this home."""
    from engine.tracking.readers import active_runs

    run_queue.pause()
    pid = run_queue.view().scheduler_pid
    if pid is not None:
        try:
            psutil.Process(pid).terminate()  # SIGTERM sets its stop flag; it lets go of the queue
        except psutil.Error:
            pass
    with open_db() as db:
        active = [r.id for r in active_runs(db=db)]
    for rid in active:
        try:
            launcher.stop(rid, grace_s=10, wait_s=10)
        except Exception:  # ended meanwhile
            pass


def wait_until(predicate, what: str, timeout: float = 120.0):
    """Poll `predicate()` until it is truthy (returns its value); fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _run(run_id):
    with open_db() as db:
        return get_run(run_id, db=db)


def _register(cfg, name):
    return launcher.create_run("lsq", config_path=cfg, module="lsq_recipe", name=name)


def test_queued_runs_start_one_after_another_with_cancel_reorder_and_pause(lsq):
    run_queue.pause()
    a, b, c = (_register(lsq(), n) for n in "abc")
    d = _register(lsq(steps=20, step_delay_s=0.1), "d")  # long enough to pause the queue while it runs
    run_queue.queue_runs([a.id, b.id, c.id, d.id])
    view = run_queue.view()
    assert view.paused and view.scheduler_pid is None  # paused: no scheduler was started
    assert [r.name for r in view.waiting] == ["a", "b", "c", "d"]

    assert run_queue.cancel(b.id).status == "cancelled"
    assert run_queue.move(d.id, "top") == 1
    assert run_queue.move(c.id, "up") == 2  # d, c, a
    assert run_queue.move(c.id, "down") == 3  # d, a, c
    assert [r.name for r in run_queue.view().waiting] == ["d", "a", "c"]

    pid = run_queue.resume()
    assert pid is not None and pid != os.getpid()
    assert psutil.Process(pid).ppid() != os.getpid()  # detached: forked away, not our child
    wait_until(lambda: _run(d.id).status == "running", "run d to start")
    assert [_run(r.id).status for r in (a, c)] == ["queued", "queued"]  # one at a time

    run_queue.pause()  # while d runs: d goes on, nothing more starts, the scheduler exits
    wait_until(lambda: _run(d.id).status == "completed", "run d to complete")
    wait_until(lambda: run_queue.view().scheduler_pid is None, "the paused scheduler to exit")
    held = [_run(r.id) for r in (a, c)]
    assert [(r.status, r.queue_pos, r.started_at) for r in held] == [("queued", 1, None), ("queued", 2, None)]
    run_queue.cancel(c.id)

    assert run_queue.resume() is not None
    wait_until(lambda: _run(a.id).status not in ("queued", "running"), "run a to end")
    d, a, b, c = (_run(r.id) for r in (d, a, b, c))
    assert [r.status for r in (d, a)] == ["completed"] * 2
    assert d.ended_at <= a.started_at  # the second started only after the first ended
    for never in (b, c):
        assert (never.status, never.started_at, never.supervisor_pid) == ("cancelled", None, None)
    wait_until(lambda: run_queue.view().scheduler_pid is None, "the scheduler to exit on an empty queue")
    with open_db() as db:
        from engine.tracking.readers import events_since

        assert "started by the run queue" in [e.text for e in events_since(a.id, db=db)]


def test_cli_queue_run_ls_move_cancel_and_stop_of_a_waiting_run(lsq, capsys):
    cfg = lsq()
    assert main(["queue", "pause"]) == 0
    for name in ("one", "two", "three"):
        assert (
            main(["run", "lsq", "--module", "lsq_recipe", "--config", str(cfg), "--queue", "--name", name])
            == 0
        )
    out = capsys.readouterr().out
    assert "run three (" in out and "queued at place 3" in out

    assert main(["queue", "move", "three", "1"]) == 0
    assert main(["queue", "cancel", "one"]) == 0
    capsys.readouterr()
    assert main(["queue", "ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["paused"] is True and listed["scheduler_pid"] is None and listed["running"] == []
    assert [(r["name"], r["queue_pos"]) for r in listed["waiting"]] == [("three", 1), ("two", 2)]
    assert main(["queue"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "queue: 2 waiting, 0 using the device (paused)"
    assert text.index("three") < text.index("two")

    assert main(["stop", "two"]) == 0  # a waiting run: cancelled, nothing to signal
    assert capsys.readouterr().out.strip().endswith(": cancelled (it was waiting in the queue)")
    assert _run("two").status == "cancelled"
    assert main(["runs", "--status", "cancelled", "--json"]) == 0
    assert sorted(r["name"] for r in json.loads(capsys.readouterr().out)) == ["one", "two"]

    for argv, line in (
        (["queue", "cancel", "one"], "run one is not waiting in the queue (it is cancelled)"),
        (["queue", "move", "three", "sideways"], "move 'sideways': give a place (1 = next) or one of up"),
        (["queue", "add", "three"], "run three is already in the queue (place 1)"),
        (
            ["run", "lsq", "--config", str(cfg), "--queue", "--nnodes", "2"],
            "--queue: the run queue starts one-node",
        ),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and line in err, err
