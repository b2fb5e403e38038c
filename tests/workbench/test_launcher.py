"""The launcher with real subprocesses: torchrun runs the least-squares test recipe
(tests/workbench/recipes_for_tests/lsq_recipe.py) under a detached supervisor."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from engine.tracking import open_db, readers
from workbench import launcher
from workbench.cli import main
from workbench.errors import UserError

RECIPES = Path(__file__).resolve().parent / "recipes_for_tests"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def lsq(tunebench_home, monkeypatch, tmp_path):
    """Makes `lsq_recipe` importable by torchrun's workers; returns a function writing a config."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(RECIPES), os.environ.get("PYTHONPATH", "")]))

    def config(**kw) -> Path:
        path = tmp_path / f"lsq_{len(list(tmp_path.glob('lsq_*.yaml')))}.yaml"
        path.write_text("".join(f"{k}: {v}\n" for k, v in {"steps": 30, "lr": 0.05, **kw}.items()))
        return path

    return config


def _start(cfg: Path, **kw):
    rec = launcher.create_run("lsq", config_path=cfg, module="lsq_recipe", **kw)
    return launcher.launch(rec.id)


def _losses(run_id):
    with open_db() as db:
        return readers.metric_series(run_id, "loss", db=db)


def _wait_step(run_id, step, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open_db() as db:
            run = readers.get_run(run_id, db=db)
        if run.step >= step:
            return run
        assert run.status in ("queued", "running"), run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not reach step {step}")


def test_exit_codes_statuses_and_error_tail(lsq):
    ok = _start(lsq(checkpoint_every=10), name="ok")
    nan = _start(lsq(lr=5.0, steps=200), name="diverges")
    bad = _start(lsq(steps="many"), name="badcfg")
    ok, nan, bad = (launcher.wait(r.id, timeout=240) for r in (ok, nan, bad))

    assert (ok.status, ok.exit_code, ok.error) == ("completed", 0, None)
    assert ok.pid and ok.pgid == ok.pid and ok.ended_at >= ok.started_at
    steps = [s for s, _ in _losses(ok.id)]
    assert steps == list(range(1, 31))  # every step exactly once
    losses = [v for _, v in _losses(ok.id)]
    assert sum(losses[-5:]) < 0.1 * sum(losses[:5])  # it really trains
    assert (Path(ok.output_dir) / "checkpoints" / "step_30" / "recipe_state.pt").is_file()
    assert f"output_dir: {ok.output_dir}" in (Path(ok.output_dir) / "config.yaml").read_text()
    assert "step 30/30 | loss" in (Path(ok.output_dir) / "stdout.log").read_text()

    assert (nan.status, nan.exit_code) == ("failed", 1)
    assert nan.error.splitlines()[-1].startswith("loss is nan at step ")
    assert "torch/distributed/run.py" not in nan.error
    with open_db() as db:
        assert "nan" in [e.kind for e in readers.events_since(nan.id, db=db)]

    assert (bad.status, bad.exit_code) == ("failed", 2)
    assert "steps: must be a positive integer" in bad.error
    # the code came from the rank itself (torchrun exits 1), not from torchrun's report
    assert (Path(bad.output_dir) / ".exit_codes" / "rank0").read_text() == "2\n"
    assert (Path(nan.output_dir) / ".exit_codes" / "rank0").read_text() == "1\n"


def test_exit_code_is_the_lowest_failing_rank_s_own_then_torchrun_s_report(tmp_path):
    from workbench.supervisor import recorded_exit_code

    report = "Root Cause (first observed failure):\n[0]:\n  exitcode  : -9 (pid: 12)\n"
    assert recorded_exit_code(tmp_path, report, 0) == 0
    assert recorded_exit_code(tmp_path, report, 1) == -9  # nothing recorded: a rank was killed
    (tmp_path / "rank1").write_text("2\n")
    (tmp_path / "rank3").write_text("1\n")
    (tmp_path / "rank0").write_text("0\n")
    (tmp_path / "rank2").write_text("garbage")
    assert recorded_exit_code(tmp_path, report, 1) == 2


@pytest.mark.slow
def test_stop_then_resume_equals_an_uninterrupted_run(lsq):
    cfg = lsq(steps=60, checkpoint_every=1000, step_delay_s=0.05)
    ref = _start(cfg, name="reference")
    run = _start(cfg, name="interrupted")
    _wait_step(run.id, 15)
    stopped = launcher.stop(run.id, grace_s=30)
    assert stopped.status == "stopped" and stopped.stop_requested
    n = launcher.latest_checkpoint_step(stopped.output_dir)
    assert n is not None and 15 <= n < 60  # the recipe checkpointed on SIGTERM
    with pytest.raises(UserError, match="not running"):
        launcher.stop(run.id)

    resumed = launcher.resume(run.id)
    with pytest.raises(UserError, match="stop it first"):
        launcher.resume(run.id)
    done = launcher.wait(resumed.id, timeout=240)
    ref = launcher.wait(ref.id, timeout=240)
    assert (done.status, done.exit_code, done.kind, done.resumes) == ("completed", 0, "resume", 1)
    got, want = _losses(run.id), _losses(ref.id)
    assert [s for s, _ in got] == list(range(1, 61))
    # reference: the same config run without interruption (same data order and RNG after resume)
    torch.testing.assert_close(
        torch.tensor([v for _, v in got]), torch.tensor([v for _, v in want]), rtol=1e-6, atol=0
    )
    with open_db() as db:
        kinds = [e.kind for e in readers.events_since(run.id, db=db)]
    assert kinds.count("resume") == 1 and "stop" in kinds


def test_kill9_of_everything_is_found_lost_then_resumes_with_each_step_once(lsq, capsys):
    run = _start(lsq(steps=80, checkpoint_every=10, step_delay_s=0.05), name="victim")
    running = _wait_step(run.id, 25)
    workers = launcher.run_workers(run.id)
    assert len(workers) == 2  # torchrun + one worker
    os.kill(running.supervisor_pid, signal.SIGKILL)
    for proc in workers:
        proc.kill()
    # any tunebench command first reconciles: `tunebench runs --json` reports the run failed
    deadline = time.monotonic() + 30
    status = "running"
    while status == "running" and time.monotonic() < deadline:
        capsys.readouterr()
        assert main(["runs", "--json"]) == 0
        status = json.loads(capsys.readouterr().out)[0]["status"]
        time.sleep(0.2)
    assert status == "failed"
    with open_db() as db:
        dead = readers.get_run(run.id, db=db)
        logged = [s for s, _ in readers.metric_series(run.id, "loss", db=db)]
    assert dead.status == "failed" and dead.error.startswith("process lost")
    n = launcher.latest_checkpoint_step(dead.output_dir)
    assert n is not None and n % 10 == 0 and max(logged) >= n

    done = launcher.wait(launcher.resume(run.id).id, timeout=240)
    assert (done.status, done.exit_code) == ("completed", 0)
    assert [s for s, _ in _losses(run.id)] == list(
        range(1, 81)
    )  # rows past step n were dropped, then re-logged


def test_clone_export_and_refusals(lsq, tmp_path):
    rec = launcher.create_run("lsq", config_path=lsq(steps=5), module="lsq_recipe", name="base", tags=["a"])
    child = launcher.clone(rec.id, ["lr=0.01", "~steps", "steps=7"], name="child")
    assert (child.parent_id, child.kind, child.status, child.module) == (
        rec.id,
        "clone",
        "queued",
        "lsq_recipe",
    )
    assert "lr: 0.01" in child.config_text and "steps: 7" in child.config_text
    assert child.output_dir != rec.output_dir and child.tag_list == ["a"]
    out = launcher.export(child.id, tmp_path / "child.yaml")
    text = out.read_text()
    assert text.startswith("# tunebench run lsq --config child.yaml") and "\noutput_dir:" not in text
    with pytest.raises(UserError, match="no checkpoint"):
        launcher.resume(rec.id)
    with pytest.raises(UserError, match="does not exist"):
        launcher.export(rec.id, tmp_path / "nope" / "x.yaml")
    from engine.config import ConfigError

    before = sorted(p.name for p in (launcher.run_dir("x").parent).iterdir())
    with pytest.raises(ConfigError):
        launcher.create_run("lsq", config_path=tmp_path / "missing.yaml", module="lsq_recipe")
    with pytest.raises(ConfigError):
        launcher.create_run("lsq", config_text="a: [1, 2\n", module="lsq_recipe")
    with pytest.raises(ConfigError, match="taken"):
        launcher.create_run("lsq", config_path=lsq(), module="lsq_recipe", name="base")
    assert sorted(p.name for p in (launcher.run_dir("x").parent).iterdir()) == before  # nothing half-written


@pytest.mark.distributed
def test_two_ranks_log_per_rank_memory_and_both_stop_on_sigterm(lsq):
    run = _start(lsq(steps=400, checkpoint_every=1000, step_delay_s=0.05), nproc=2, name="two")
    _wait_step(run.id, 5)
    assert len(launcher.run_workers(run.id)) == 3  # torchrun + 2 workers
    with pytest.raises(UserError, match="already running"):
        launcher.launch(run.id)
    done = launcher.stop(run.id, grace_s=60)
    assert (done.status, done.exit_code, done.nproc) == ("stopped", 0, 2)  # ranks checkpointed, exited 0
    assert launcher.run_workers(run.id) == []
    with open_db() as db:
        ranks = {r for _, _, r in db.execute(
            "SELECT step, value, rank FROM metrics WHERE run_id = ? AND name = 'mem_peak_gb'", (run.id,)
        )}  # fmt: skip
        loss_ranks = {
            r
            for (r,) in db.execute(
                "SELECT DISTINCT rank FROM metrics WHERE run_id = ? AND name = 'loss'", (run.id,)
            )
        }
    assert ranks == {0, 1} and loss_ranks == {0}
    n = launcher.latest_checkpoint_step(done.output_dir)
    assert n is not None and 5 <= n < 400


def test_reconcile_ignores_reused_pids_and_other_hosts(tunebench_home):
    import subprocess as sp
    import sys

    from engine.tracking.run_rows import create_run as register
    from engine.tracking.run_rows import update_run

    # a process started after the run "started": its pid/pgid is a reused id, not the run's
    other = sp.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        with open_db() as db:
            here = register(db=db, recipe="lsq", config_text="", name="rebooted")
            update_run(here.id, db=db, status="running", started_at=time.time() - 3600, pid=other.pid,
                       pgid=other.pid, supervisor_pid=other.pid, supervisor_started=time.time() - 3600)  # fmt: skip
            away = register(db=db, recipe="lsq", config_text="", name="elsewhere")
            update_run(away.id, db=db, status="running", host="another-host", supervisor_pid=1, pgid=1)
        assert launcher.reconcile_lost() == [here.id]
        with open_db() as db:
            assert readers.get_run("elsewhere", db=db).status == "running"  # not ours to judge
    finally:
        other.kill()
        other.wait()


def test_sigterm_to_the_supervisor_is_a_stop(lsq):
    """`kill <supervisor>`: its handler only sets a flag; the wait loop passes the stop to the ranks,
    which checkpoint and exit 0, and the run is recorded `stopped`."""
    run = _start(lsq(steps=400, checkpoint_every=1000, step_delay_s=0.05), name="term-supervisor")
    running = _wait_step(run.id, 3)
    os.kill(running.supervisor_pid, signal.SIGTERM)
    done = launcher.wait(run.id, timeout=120)
    assert (done.status, done.exit_code) == ("stopped", 0)
    n = launcher.latest_checkpoint_step(done.output_dir)
    assert n is not None and 3 <= n < 400
