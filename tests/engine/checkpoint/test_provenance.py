"""Checkpoint marks: resume unpickles DCP metadata, so only folders this home's runs wrote (in that folder)
are loaded, unless the user sets TUNEBENCH_TRUST_CHECKPOINT=1. The check runs before anything is
unpickled: a booby-trapped `.metadata` never executes without the user's word."""

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from engine.checkpoint.provenance import UntrustedCheckpointError, why_foreign
from engine.checkpoint.recipe_state import CheckpointStateError, load_checkpoint, save_checkpoint


@pytest.fixture
def model_and_opt(tunebench_home, monkeypatch):
    monkeypatch.delenv("TUNEBENCH_TRUST_CHECKPOINT", raising=False)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _save(out: Path, model, opt) -> Path:
    return save_checkpoint(out, 1, model=model, optimizer=opt, recipe_state={"epoch": 0})


class _Touch:
    """Unpickling this creates a file: what a hostile `.metadata` could do (any code, really)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_run_loads_what_it_wrote_and_nothing_copied_or_changed(model_and_opt, tmp_path):
    model, opt = model_and_opt
    ck = _save(tmp_path / "run", model, opt)
    assert (ck / "tunebench_mark.json").is_file() and why_foreign(ck) is None
    assert load_checkpoint(ck, model=model, optimizer=opt)["step"] == 1

    copied = tmp_path / "elsewhere/checkpoints/step_1"
    shutil.copytree(ck, copied)  # the same bytes in another folder: another run's, or a download
    with pytest.raises(UntrustedCheckpointError) as info:
        load_checkpoint(copied, model=model, optimizer=opt)
    msg = str(info.value)
    assert msg.startswith(f"{copied}: not written by a run of this TUNEBENCH_HOME in this folder (its mark")
    assert "--trust-checkpoint" in msg and "TUNEBENCH_TRUST_CHECKPOINT=1" in msg and "\n" not in msg

    (ck / "state/.metadata").write_bytes((ck / "state/.metadata").read_bytes() + b"\0")  # changed since
    assert "does not match" in why_foreign(ck)


def test_a_booby_trapped_metadata_is_not_unpickled_without_the_users_trust(
    model_and_opt, tmp_path, monkeypatch
):
    model, opt = model_and_opt
    ck = _save(tmp_path / "run", model, opt)
    bad = tmp_path / "downloaded/checkpoints/step_1"
    shutil.copytree(ck, bad)
    (bad / "tunebench_mark.json").unlink()
    owned = tmp_path / "owned"
    (bad / "state/.metadata").write_bytes(pickle.dumps(_Touch(owned)))
    with pytest.raises(UntrustedCheckpointError, match=r"it has no tunebench_mark\.json"):
        load_checkpoint(bad, model=model, optimizer=opt)
    assert not owned.exists()
    # With the user's word it is loaded, and the pickle runs: that is the danger the check keeps out.
    monkeypatch.setenv("TUNEBENCH_TRUST_CHECKPOINT", "1")
    with pytest.raises(CheckpointStateError):
        load_checkpoint(bad, model=model, optimizer=opt)
    assert owned.exists()


def test_a_home_without_its_key_trusts_nothing(model_and_opt, tmp_path, tunebench_home):
    model, opt = model_and_opt
    ck = _save(tmp_path / "run", model, opt)
    (tunebench_home / "checkpoint.key").unlink()
    assert "has no checkpoint.key" in why_foreign(ck)
    assert (tunebench_home / "checkpoint.key").exists() is False
    ck2 = _save(tmp_path / "run2", model, opt)  # the next save makes a new key: old marks no longer hold
    assert why_foreign(ck2) is None and "does not match" in why_foreign(ck)
    assert oct((tunebench_home / "checkpoint.key").stat().st_mode & 0o777) == "0o600"
