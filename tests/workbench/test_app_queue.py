"""Pilot tests of the run queue and sweeps in the workbench: the Runs screen's queue keys (queue, reorder,
cancel, pause/resume), the queue going on after the app quits, a sweep from the Recipe screen, and
Compare opened on a sweep with its runs ranked. Runs are real lsq runs
(tests/workbench/recipes_for_tests/lsq_recipe.py) started by the detached scheduler."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from engine.tracking.db import open_db
from engine.tracking.readers import get_run
from tests.workbench.pilot_wait import wait_for
from workbench import launcher, run_queue
from workbench.app import make_app

RECIPES = Path(__file__).resolve().parent / "recipes_for_tests"
SIZE = (120, 36)
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def lsq_home(tunebench_home, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(RECIPES), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("TUNEBENCH_QUEUE_POLL_S", "0.1")
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "24")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lsq.yaml").write_text("# tunebench run lsq --config lsq.yaml\nsteps: 3\nlr: 0.05\n")
    (tmp_path / "slow.yaml").write_text("steps: 20\nlr: 0.05\nstep_delay_s: 0.1\n")
    yield tmp_path
    _stop_queue_and_runs()


def _stop_queue_and_runs() -> None:
    """Pause the queue, end its scheduler (by its recorded pid) and stop every active run of this home."""
    import psutil

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


def _run(name):
    with open_db() as db:
        return get_run(name, db=db)


def _order():
    return [r.name for r in run_queue.view().waiting]


def _cursor_on(table, name):
    rid = _run(name).id
    table.move_cursor(row=table.visible_ids.index(rid))


async def test_runs_screen_queues_reorders_cancels_pauses_and_the_queue_outlives_the_app(lsq_home):
    from workbench.screens.help import HelpScreen, screen_keys
    from workbench.widgets.runs_table import RunsTable

    run_queue.pause()
    for name, cfg in (("a", "lsq.yaml"), ("b", "lsq.yaml"), ("c", "slow.yaml"), ("e", "lsq.yaml")):
        launcher.create_run("lsq", config_path=cfg, module="lsq_recipe", name=name)
    run_queue.queue_runs([_run(n).id for n in "abc"])
    app = make_app(interval=0.2, recipe_module="lsq_recipe")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.rows_by_id) == 4, what="the runs")
        status = app.screen.query_one("#runs-status")
        await wait_for(
            pilot, lambda: "queue: 3 waiting (paused: P resumes)" in str(status.render()), what="status"
        )
        assert str(table.get_cell(_run("c").id, "status")) == "queued #3"

        # Help lists the queue keys.
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        keys = dict(screen_keys(app.screen.under))
        assert {"u", "shift+up", "shift+down", "P", "w"} <= set(keys) and "cancel" in keys["x"]
        await pilot.press("escape")

        # Reorder: c up twice (to the front), then a down once.
        _cursor_on(table, "c")
        await pilot.press("shift+up", "shift+up")
        await wait_for(pilot, lambda: _order() == ["c", "a", "b"], what="c first")
        _cursor_on(table, "a")
        await pilot.press("shift+down")
        await wait_for(pilot, lambda: _order() == ["c", "b", "a"], what="a last")
        await wait_for(
            pilot, lambda: str(table.get_cell(_run("a").id, "status")) == "queued #3", what="the table"
        )

        # Queue a registered run with u; cancel two waiting runs at once (marks, x, confirm).
        _cursor_on(table, "e")
        await pilot.press("u")
        await wait_for(pilot, lambda: _order() == ["c", "b", "a", "e"], what="e queued")
        for name in ("b", "a"):
            _cursor_on(table, name)
            await pilot.press("space")
        await pilot.press("x")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="the confirmation")
        assert "Cancel b, a?" in str(app.screen.query_one("Label").render()) or "Cancel a, b?" in str(
            app.screen.query_one("Label").render()
        )
        await pilot.press("y")
        await wait_for(pilot, lambda: _order() == ["c", "e"], what="a and b cancelled")
        assert [_run(n).status for n in "ab"] == ["cancelled", "cancelled"]

        # P resumes the queue: the scheduler (started from the app) starts c; e waits behind it.
        await pilot.press("P")
        await wait_for(pilot, lambda: _run("c").status == "running", timeout=180, what="c to start")
        assert _run("e").status == "queued" and _run("e").started_at is None
    # The app has quit while c runs and e waits: the detached scheduler goes on.
    quit_at = time.time()
    assert _run("e").started_at is None
    deadline = time.monotonic() + 240
    while _run("e").status in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.1)
    c, e = _run("c"), _run("e")
    assert (c.status, e.status) == ("completed", "completed")
    assert e.started_at > quit_at and e.started_at >= c.ended_at  # started after the app quit, after c


async def test_recipe_screen_queues_a_sweep_and_a_bad_value_queues_nothing(lsq_home):
    from workbench.screens.recipe import RecipeScreen
    from workbench.sweeps import sweep_runs

    run_queue.pause()
    app = make_app(interval=0.2, recipe_module="lsq_recipe")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        screen = await wait_for(
            pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen, what="recipe"
        )
        app.set_focus(screen.query_one("#config-path"))
        for ch in "lsq.yaml":
            await pilot.press(ch if ch != "." else "full_stop")
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.base.get("steps") == 3, what="config loaded")
        screen.query_one("#run-name").value = "lrs"

        await pilot.press("f7")
        await wait_for(pilot, lambda: app.screen.query("#text"), what="the sweep prompt")
        app.screen.query_one("#text").value = "lr=0.01,[oops x seed=1,2"
        await pilot.press("enter")
        problems = screen.query_one("#problems")
        await wait_for(
            pilot, lambda: "nothing was queued" in str(problems.render()), what="the one-line problem"
        )
        text = str(problems.render())
        assert "sweep lrs, run 3 (lr=[oops seed=1)" in text and len(text.strip().splitlines()) == 1
        with open_db() as db:
            assert sweep_runs("lrs", db=db) == []

        await pilot.press("f7")
        await wait_for(pilot, lambda: app.screen.query("#text"), what="the sweep prompt")
        app.screen.query_one("#text").value = "lr=0.01,0.02 x seed=1,2"
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: type(app.screen).__name__ == "RunsScreen", what="back on the Runs screen"
        )
    with open_db() as db:
        runs = sweep_runs("lrs", db=db)
    got = [
        (yaml.safe_load(r.config_text)["lr"], yaml.safe_load(r.config_text)["seed"], r.queue_pos)
        for r in runs
    ]
    assert got == [(0.01, 1, 1), (0.01, 2, 2), (0.02, 1, 3), (0.02, 2, 4)]
    assert {r.name for r in runs} == {"lrs-1", "lrs-2", "lrs-3", "lrs-4"}


async def test_w_opens_compare_on_the_sweep_ranked_by_val_loss(lsq_home):
    from textual.widgets import DataTable

    from engine.tracking import MetricLogger
    from engine.tracking.run_rows import update_run
    from workbench.screens.compare_screen import CompareScreen
    from workbench.sweeps import create_sweep
    from workbench.widgets.runs_table import RunsTable

    run_queue.pause()
    made = create_sweep(
        "lsq", [["lr=0.01"], ["lr=0.02"], ["lr=0.03"]], config_path="lsq.yaml", module="lsq_recipe", name="s"
    )
    for run, val in zip(made, (0.7, 0.3, 0.5)):
        with MetricLogger(run_id=run.id, echo=False) as log:
            log.log(1, {"loss": 1.0})
            log.log(2, {"loss": 0.9, "val_loss": val})
        with open_db() as db:
            update_run(run.id, db=db, status="completed", queue_pos=None, started_at=1.0, ended_at=2.0)
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.rows_by_id) == 3, what="the runs")
        _cursor_on(table, "s-1")
        await pilot.press("w")
        screen = await wait_for(
            pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen, what="compare"
        )
        summary = screen.query_one("#summary", DataTable)
        await wait_for(pilot, lambda: summary.row_count == 3, what="the ranked summary")
        rows = [[str(c) for c in summary.get_row_at(i)] for i in range(3)]
        assert [(r[0], r[1], r[2]) for r in rows] == [
            ("1", "0.3", "s-2"),
            ("2", "0.5", "s-3"),
            ("3", "0.7", "s-1"),
        ]
        assert "val_loss (lower is better)" in [str(c.label) for c in summary.columns.values()]
