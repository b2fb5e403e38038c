"""One definition of a complete checkpoint, shared by the recipes' resume and the launcher's."""

import torch

from engine.checkpoint.layout import is_complete_checkpoint, latest_checkpoint, latest_checkpoint_step
from engine.checkpoint.recipe_state import save_checkpoint
from workbench import launcher


def test_a_step_folder_without_recipe_state_is_not_a_checkpoint_for_anyone(tmp_path):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, step=3, model=model, optimizer=None, recipe_state={})
    (tmp_path / "checkpoints" / "step_9").mkdir()  # e.g. a copy in progress: no recipe_state.pt
    (tmp_path / "checkpoints" / ".tmp_step_12").mkdir()
    (tmp_path / "checkpoints" / ".tmp_step_12" / "recipe_state.pt").write_bytes(b"")
    assert is_complete_checkpoint(tmp_path / "checkpoints" / "step_3")
    assert not is_complete_checkpoint(tmp_path / "checkpoints" / "step_9")
    assert not is_complete_checkpoint(tmp_path / "checkpoints" / ".tmp_step_12")
    assert latest_checkpoint(tmp_path).name == "step_3"
    assert latest_checkpoint_step(tmp_path) == 3
    assert launcher.latest_checkpoint_step(tmp_path) == 3  # what `tunebench resume` truncates to


def test_no_checkpoints(tmp_path):
    assert latest_checkpoint_step(tmp_path) is None and launcher.latest_checkpoint_step(tmp_path) is None
