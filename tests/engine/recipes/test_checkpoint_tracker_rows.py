"""kill -9 around checkpoint writes, then resume: the tracker holds every step's rows exactly once.

A checkpoint of step N becomes visible (the rename of `.tmp_step_N` to `step_N`) only once the rows of
steps <= N are committed in SQLite: otherwise a run killed just after the rename resumes at N + 1 and
step N's rows are gone for good. Resume drops the rows past the checkpoint (all of them when there is
none yet), so no step appears twice.

The SFT recipe (a 2-layer, 64-dim Llama) runs as the launcher runs it, in its own process group, with a
checkpoint every 2 steps; the test watches the checkpoints folder and the tracker and SIGKILLs the group
at a chosen moment (`MOMENTS`): as soon as a save's `.tmp_step_N` appears, when its `model/` folder
appears, just after `step_N` appears (the moment the defect lost rows), or once the tracker holds rows
of a step past the newest checkpoint. "published, tracker busy": the test holds the tracker's write lock
from the start of the save, as another run writing a burst of rows does, so the step's rows cannot be
committed before the kill unless the save waits for them.
The moment a step's rows of the checkpoint are committed is checked in-process too, by intercepting
the publish (`engine.checkpoint.recipe_state._publish`) and reading the tracker there.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.engine.recipes._sft_helpers import REPO, new_run, recipe_env, run_recipe, tiny_config, write_config

RECIPE = [sys.executable, "-m", "engine.recipes.sft", "--config"]
DEADLINE_S = 300.0  # generous: a launch on a loaded 2-core machine takes tens of seconds
HOLD_AFTER_STATE_S = 2.0  # how long the busy tracker stays locked once the save has written its last file
HOLD_MAX_S = 10.0  # and at most this long in all
SAVE_EVERY = 2
# Where the kill lands (see the module docstring).
MOMENTS = (
    "save started",
    "model written",
    "published",
    "published, tracker busy",
    "rows past the checkpoint",
)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _rows_by_metric(home: Path, run_id: str) -> dict[tuple[str, int], list[int]]:
    """`{(metric, rank): [step, ...]}` of every committed metric row of the run, in step order."""
    from engine.tracking import open_db

    found: dict[tuple[str, int], list[int]] = {}
    with open_db(home) as db:
        for name, rank, step in db.execute(
            "SELECT name, rank, step FROM metrics WHERE run_id = ? ORDER BY name, rank, step", (run_id,)
        ):
            found.setdefault((name, rank), []).append(step)
    return found


def _published(root: Path) -> set[int]:
    """Steps of the `step_<N>` folders under `root` (a run's checkpoints folder)."""
    found = (re.fullmatch(r"step_(\d+)", p.name) for p in root.glob("step_*")) if root.is_dir() else ()
    return {int(m.group(1)) for m in found if m}


def _lock_tracker(home: Path) -> sqlite3.Connection:
    """A connection holding the tracker's write lock (BEGIN IMMEDIATE) until it rolls back."""
    db = sqlite3.connect(home / "tunebench.db", timeout=60, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    return db


def _last_committed_step(home: Path, run_id: str) -> int:
    with sqlite3.connect(home / "tunebench.db", timeout=60) as db:
        (step,) = db.execute(
            "SELECT MAX(step) FROM metrics WHERE run_id = ? AND name = 'loss'", (run_id,)
        ).fetchone()
    return step or 0


def _kill_at(proc: subprocess.Popen, root: Path, moment: str, home: Path, run_id: str) -> str | None:
    """Watch `root` (the run's checkpoints folder) and the tracker until `moment` (one of `MOMENTS`)
    comes, then SIGKILL the run's process group. A save moment missed between two looks ends at the
    save's publish. Returns what was seen at the kill, or None when the run ended first."""
    before = _published(root)
    deadline = time.monotonic() + DEADLINE_S
    lock: sqlite3.Connection | None = None
    locked_at = state_seen = None
    looked_at_rows = 0.0
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return None
            published = _published(root)
            if moment == "rows past the checkpoint":
                if time.monotonic() - looked_at_rows > 0.02:
                    looked_at_rows = time.monotonic()
                    last, newest = _last_committed_step(home, run_id), max(published, default=0)
                    if last > newest:
                        seen = f"rows of step {last} committed, newest checkpoint step {newest}"
                        break
            elif new := published - before:
                seen = f"step_{min(new)} published"
                break
            else:
                tmp = next(iter(root.glob(".tmp_step_*")), None) if root.is_dir() else None
                if tmp is not None:
                    if moment == "save started":
                        seen = f"{tmp.name} started"
                        break
                    if moment == "model written" and (tmp / "model").is_dir():
                        seen = f"{tmp.name}/model written"
                        break
                    if moment == "published, tracker busy" and locked_at is None:
                        lock, locked_at = _lock_tracker(home), time.monotonic()
                    if lock is not None and state_seen is None and (tmp / "recipe_state.pt").is_file():
                        state_seen = time.monotonic()
            if lock is not None and (
                (state_seen is not None and time.monotonic() - state_seen > HOLD_AFTER_STATE_S)
                or time.monotonic() - locked_at > HOLD_MAX_S
            ):  # the save waits for the tracker (as it must): let the rows in, kill when published
                lock.rollback()
                lock.close()
                lock = None
            time.sleep(0.001)
        else:
            raise AssertionError(f"the run did not reach '{moment}' within {DEADLINE_S:.0f} s")
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of the whole run: no handler, no flush
        return seen
    finally:
        if lock is not None:
            lock.rollback()
            lock.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


def _launch(cfg_path: Path, env: dict, log: Path, *, resume: bool) -> subprocess.Popen:
    with log.open("a") as err:
        return subprocess.Popen(
            RECIPE + [str(cfg_path)] + (["resume=true"] if resume else []),
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True,
            start_new_session=True,  # its own process group, as the launcher starts it
        )  # fmt: skip


def _kill_resume_and_check(assets: Path, tmp_path: Path, home: Path, moments: list[str], steps: int) -> None:
    """Run `steps` steps (a checkpoint every `SAVE_EVERY`), SIGKILLed once at each of `moments` and
    resumed after each kill, then to the end; every per-step metric must have a row for each of steps
    1..steps, exactly once."""
    cfg = tiny_config(assets, tmp_path / "run", save_every_n_steps=SAVE_EVERY, max_steps_per_epoch=steps)
    cfg_path = write_config(cfg, tmp_path / "cfg.yaml")
    run_id = new_run(home)
    env = recipe_env(home, run_id)
    root = tmp_path / "run" / "checkpoints"
    log = tmp_path / "stderr.log"
    kills = []
    for i, moment in enumerate(moments):
        proc = _launch(cfg_path, env, log, resume=i > 0)
        seen = _kill_at(proc, root, moment, home, run_id)
        if seen is None:  # the run ended before this moment came
            assert proc.returncode == 0, log.read_text()[-3000:]
            break
        kills.append(f"{moment}: {seen}")
    print(f"{len(kills)} kills: {kills}")
    done = subprocess.run(RECIPE + [str(cfg_path), "resume=true"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=DEADLINE_S)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert steps in _published(root)
    rows = _rows_by_metric(home, run_id)
    per_step = {"loss", "lr", "tokens_per_sec", "tokens_total", "epoch", "mem_peak_gb", "rss_gb"}
    assert per_step <= {name for name, _ in rows}, sorted(rows)
    wrong = {key: got for key, got in rows.items() if got != list(range(1, steps + 1))}
    assert not wrong, f"kills: {kills}; metrics whose steps are not 1..{steps} once each: {wrong}"


def test_kill_9_around_checkpoints_keeps_every_steps_rows_once(shared_assets, tmp_path, tunebench_home):
    # Steps 1-4, a checkpoint at 2 and 4: killed before the first checkpoint (rows of step 1 written),
    # just after step_2 is published while the tracker is busy, and with step 3's rows past step_2;
    # resumed after each kill, the last resume runs to the end.
    moments = ["rows past the checkpoint", "published, tracker busy", "rows past the checkpoint"]
    _kill_resume_and_check(shared_assets, tmp_path, tunebench_home, moments, steps=4)


@pytest.mark.slow
def test_kill_9_at_many_random_moments_keeps_every_steps_rows_once(shared_assets, tmp_path, tunebench_home):
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    moments = [rng.choice(MOMENTS) for _ in range(16)]
    print(f"seed {seed}: {moments}")
    # 24 steps, 12 checkpoints: the kills at a publish move the run on by 2 steps, the others by 0 or 1,
    # so all 16 kills land before the end (unless 12 of them are publishes).
    _kill_resume_and_check(shared_assets, tmp_path, tunebench_home, moments, steps=24)


def test_checkpoint_is_published_only_after_its_steps_rows_are_committed(
    shared_assets, tmp_path, tunebench_home, monkeypatch
):
    from engine.checkpoint import recipe_state
    from engine.tracking import MetricLogger

    run_id = new_run(tunebench_home)
    monkeypatch.setenv("TUNEBENCH_RUN_ID", run_id)
    # Rows leave the buffer only at a step change or a flush (no timer), so only the save can commit them.
    from_env = MetricLogger.from_env.__func__
    monkeypatch.setattr(
        MetricLogger, "from_env", classmethod(lambda cls, **kw: from_env(cls, max_delay_s=0, **kw))
    )
    publish = recipe_state._publish
    committed_at_publish: dict[int, list[int]] = {}

    def watched(tmp: Path, final: Path) -> None:
        step = int(final.name.split("_")[1])
        committed_at_publish[step] = sorted(_rows_by_metric(tunebench_home, run_id).get(("loss", 0), []))
        publish(tmp, final)

    monkeypatch.setattr(recipe_state, "_publish", watched)
    run_recipe(tiny_config(shared_assets, tmp_path / "run", save_every_n_steps=1, max_steps_per_epoch=3))
    assert committed_at_publish == {n: list(range(1, n + 1)) for n in (1, 2, 3)}
