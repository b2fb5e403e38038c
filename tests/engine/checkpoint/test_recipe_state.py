"""Recipe-state checkpoints: exact resume against an uninterrupted run, atomicity, keep-last-K, errors."""

import random

import pytest
import torch

from engine.checkpoint.recipe_state import (
    CheckpointStateError,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)


def _model(seed=0, freeze_first=False):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    if freeze_first:
        model[0].requires_grad_(False)
    return model


def _optim(model):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    return opt, sched


def _step(model, opt, sched):
    # The batch comes from the global RNG, so resuming must restore the RNG to reproduce it.
    x = torch.randn(5, 8)
    loss = model(x).pow(2).mean() + torch.rand(()) * 0
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("freeze_first", [False, True])
def test_resume_equals_uninterrupted_run(tmp_path, freeze_first):
    # Reference: 6 uninterrupted steps.
    torch.manual_seed(123)
    ref = _model(freeze_first=freeze_first)
    ref_opt, ref_sched = _optim(ref)
    torch.manual_seed(7)
    for _ in range(6):
        _step(ref, ref_opt, ref_sched)

    # Interrupted: 3 steps, checkpoint, 2 more steps (lost), then a fresh process state resumes.
    run = _model(freeze_first=freeze_first)
    opt, sched = _optim(run)
    torch.manual_seed(7)
    for _ in range(3):
        _step(run, opt, sched)
    save_checkpoint(
        tmp_path, 3, model=run, optimizer=opt, recipe_state={"epoch": 0, "sched": sched.state_dict()}
    )
    for _ in range(2):
        _step(run, opt, sched)
    torch.manual_seed(999)  # the new process starts elsewhere

    fresh = _model(freeze_first=freeze_first)
    fresh_opt, fresh_sched = _optim(fresh)
    state = load_checkpoint(latest_checkpoint(tmp_path), model=fresh, optimizer=fresh_opt)
    fresh_sched.load_state_dict(state["sched"])
    assert state["step"] == 3 and state["epoch"] == 0
    for _ in range(3):
        _step(fresh, fresh_opt, fresh_sched)

    for (name, a), b in zip(ref.state_dict().items(), fresh.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert fresh_sched.get_last_lr() == ref_sched.get_last_lr()


def test_frozen_parameters_are_not_saved(tmp_path):
    model = _model(freeze_first=True)
    opt, _ = _optim(model)
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, recipe_state={})
    import torch.distributed.checkpoint as dcp

    keys = set(dcp.FileSystemReader(str(path / "state")).read_metadata().state_dict_metadata)
    assert "model.2.weight" in keys and "model.0.weight" not in keys


def test_keep_last_and_crash_mid_save(tmp_path):
    model = _model()
    opt, _ = _optim(model)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model=model, optimizer=opt, recipe_state={}, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]

    # A save killed half-way leaves a temp folder: it is never "latest" and the next save removes it.
    half = tmp_path / "checkpoints" / ".tmp_step_5"
    (half / "state").mkdir(parents=True)
    assert latest_checkpoint(tmp_path).name == "step_4"
    save_checkpoint(tmp_path, 6, model=model, optimizer=opt, recipe_state={}, keep_last=2)
    assert not half.exists()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 6]


def test_same_step_saved_twice_replaces(tmp_path):
    model = _model()
    opt, _ = _optim(model)
    save_checkpoint(tmp_path, 2, model=model, optimizer=opt, recipe_state={"tag": "a"})
    save_checkpoint(tmp_path, 2, model=model, optimizer=opt, recipe_state={"tag": "b"})
    state = load_checkpoint(tmp_path / "checkpoints" / "step_2", model=model, optimizer=opt)
    assert state["tag"] == "b"


def test_write_model_called_inside_the_atomic_folder(tmp_path):
    model = _model()
    opt, _ = _optim(model)

    def write_model(folder):
        folder.mkdir()
        (folder / "weights.txt").write_text("ok")

    path = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, recipe_state={}, write_model=write_model)
    assert (path / "model" / "weights.txt").read_text() == "ok"


def test_incomplete_or_corrupt_checkpoint_is_one_clear_error(tmp_path):
    model = _model()
    opt, _ = _optim(model)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(CheckpointStateError, match="not a complete recipe checkpoint"):
        load_checkpoint(tmp_path / "nothing", model=model, optimizer=opt)
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, recipe_state={})
    (path / "recipe_state.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointStateError) as info:
        load_checkpoint(path, model=model, optimizer=opt)
    assert "\n" not in str(info.value) and "step_1" in str(info.value)


def test_rng_round_trip():
    state = capture_rng_state()
    expected = (random.random(), torch.rand(3))
    random.random(), torch.rand(3)
    restore_rng_state(state)
    got = (random.random(), torch.rand(3))
    assert got[0] == expected[0]
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
