"""The SFT recipe as the launcher runs it: `python -m engine.recipes.sft` / `torchrun`, exit codes,
SIGTERM, kill -9 + resume, FSDP2 on two ranks; step losses read back from the tracker."""

import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.recipes._sft_helpers import (
    REPO,
    losses,
    new_run,
    recipe_env,
    run_recipe,
    tiny_config,
    write_config,
)

RECIPE = [sys.executable, "-m", "engine.recipes.sft", "--config"]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the in-process reference runs like the 1-thread subprocesses
    yield
    torch.set_num_threads(before)


def _run(cmd, env, timeout=300):
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_bad_config_is_one_line_and_exit_2(shared_assets, tmp_path, tunebench_home):
    cfg = write_config(tiny_config(shared_assets, tmp_path / "run"), tmp_path / "cfg.yaml")
    done = _run(RECIPE + [str(cfg), "optimzer_in_bwd=true"], recipe_env(tunebench_home))
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
    assert any("optimzer_in_bwd" in ln and "did you mean 'optimizer_in_bwd'" in ln for ln in lines), (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_nan_loss_fails_with_step_and_keeps_last_good_checkpoint(shared_assets, tmp_path, tunebench_home):
    # A learning rate of 1e30 blows the weights up after the first update.
    cfg = tiny_config(shared_assets, tmp_path / "run", save_every_n_steps=1, max_steps_per_epoch=6)
    cfg["optimizer"] = {"_component_": "torch.optim.SGD", "lr": 1e30}
    done = _run(RECIPE + [str(write_config(cfg, tmp_path / "cfg.yaml"))], recipe_env(tunebench_home))
    assert done.returncode == 1, done.stderr
    import re

    match = re.search(r"loss is (nan|inf) at step (\d+)", done.stderr)
    assert match, done.stderr
    bad = int(match.group(2))
    steps = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert bad >= 2 and steps and steps[-1] == bad - 1


def test_sigterm_checkpoints_and_exits_0(shared_assets, tmp_path, tunebench_home):
    cfg = tiny_config(shared_assets, tmp_path / "run", max_steps_per_epoch=200)
    run_id = new_run(tunebench_home)
    proc = subprocess.Popen(
        RECIPE + [str(write_config(cfg, tmp_path / "cfg.yaml"))], env=recipe_env(tunebench_home, run_id),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_step(tunebench_home, run_id, 2, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    saved = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert len(saved) == 1 and 2 <= saved[0] < 200
    assert [s for s, _ in losses(tunebench_home, run_id)] == list(range(1, saved[0] + 1))


def _wait_for_step(home, run_id, step, proc, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"recipe ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        done = losses(home, run_id)
        if done and done[-1][0] >= step:
            return done[-1][0]
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _final_weights(output_dir, step):
    return load_file(str(output_dir / "checkpoints" / f"step_{step}" / "model" / "model.safetensors"))


def test_kill_9_then_resume_equals_uninterrupted_run(shared_assets, tmp_path, tunebench_home):
    # Dropout on, two epochs: the resumed run must restore RNG, data position, optimizer and LR.
    over = dict(save_every_n_steps=2, max_steps_per_epoch=5, epochs=2, **{"model.attn_dropout": 0.1})
    reference = run_recipe(tiny_config(shared_assets, tmp_path / "ref", **over))
    assert len(reference.loss_history) == 10

    cfg_path = write_config(tiny_config(shared_assets, tmp_path / "run", **over), tmp_path / "cfg.yaml")
    run_id = new_run(tunebench_home)
    env = recipe_env(tunebench_home, run_id)
    proc = subprocess.Popen(RECIPE + [str(cfg_path)], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        killed_at = _wait_for_step(tunebench_home, run_id, random.Random().randint(3, 8), proc)
        proc.kill()  # SIGKILL: no handler, no flush, possibly mid-save
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed_at < 10
    done = _run(RECIPE + [str(cfg_path), "resume=true"], env)
    assert done.returncode == 0, done.stderr

    got, expected = _final_weights(tmp_path / "run", 10), _final_weights(tmp_path / "ref", 10)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)
    rows = losses(tunebench_home, run_id)
    assert [s for s, _ in rows] == list(range(1, 11))  # each step exactly once
    torch.testing.assert_close(
        torch.tensor([v for _, v in rows]), torch.tensor(reference.loss_history), rtol=1e-6, atol=0
    )


@pytest.mark.distributed
def test_fsdp2_two_ranks_equal_one_rank(shared_assets, tmp_path, tunebench_home):
    over = dict(
        max_steps_per_epoch=4, optimizer={"_component_": "torch.optim.SGD", "lr": 0.2, "momentum": 0.9}
    )
    one = run_recipe(tiny_config(shared_assets, tmp_path / "one", batch_size=4, **over))
    cfg_path = write_config(
        tiny_config(shared_assets, tmp_path / "two", batch_size=2, **over), tmp_path / "cfg.yaml"
    )
    run_id = new_run(tunebench_home)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "engine.recipes.sft", "--config", str(cfg_path)]  # fmt: skip
    done = _run(cmd, recipe_env(tunebench_home, run_id))
    assert done.returncode == 0, done.stderr[-3000:]
    two = [v for _, v in losses(tunebench_home, run_id)]
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one.loss_history), rtol=1e-5, atol=0)
    # The sharded run's exported weights are the single-process run's.
    got, expected = _final_weights(tmp_path / "two", 4), _final_weights(tmp_path / "one", 4)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-6, msg=key)


def _tunebench(args, env, timeout=400):
    return _run([sys.executable, "-m", "workbench.cli", *args], env, timeout=timeout)


@pytest.mark.slow  # two launcher round trips (supervisor + torchrun): ~1-2 minutes on this machine
def test_exported_yaml_run_headless_reproduces_the_loss_curve(shared_assets, tmp_path, tunebench_home):
    from engine.tracking import open_db
    from engine.tracking.readers import list_runs

    env = recipe_env(tunebench_home)
    cfg = write_config(
        tiny_config(shared_assets, tmp_path / "unused", max_steps_per_epoch=3), tmp_path / "cfg.yaml"
    )
    first = _tunebench(["run", "sft", "--config", str(cfg), "--name", "first"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    exported = tmp_path / "exported.yaml"
    done = _tunebench(["export", "first", "-o", str(exported)], env)
    assert done.returncode == 0 and exported.is_file(), done.stderr
    second = _tunebench(["run", "sft", "--config", str(exported), "--name", "second"], env)
    assert second.returncode == 0, second.stderr[-3000:]
    with open_db(tunebench_home) as db:
        ids = {r.name: r.id for r in list_runs(db=db)}
    a, b = losses(tunebench_home, ids["first"]), losses(tunebench_home, ids["second"])
    assert [s for s, _ in a] == [1, 2, 3] == [s for s, _ in b]
    torch.testing.assert_close(
        torch.tensor([v for _, v in b]), torch.tensor([v for _, v in a]), rtol=1e-6, atol=0
    )


@pytest.mark.slow
def test_demo_config_trains_the_embedded_model_with_falling_loss(tmp_path, tunebench_home):
    pytest.importorskip("gguf")
    from engine.config import find_config

    run_id = new_run(tunebench_home)
    env = dict(recipe_env(tunebench_home, run_id), OMP_NUM_THREADS="2")
    done = _run(RECIPE + [str(find_config("demo/smollm2_135m_lora")), f"output_dir={tmp_path / 'run'}",
                          "max_steps_per_epoch=30", "save_merged_model=false"], env, timeout=3000)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    values = [v for _, v in losses(tunebench_home, run_id)]
    assert len(values) == 30
    assert sum(values[-5:]) / 5 < sum(values[:5]) / 5 - 0.2, values
    assert (tmp_path / "run" / "checkpoints" / "step_30" / "model" / "adapter_model.safetensors").is_file()
