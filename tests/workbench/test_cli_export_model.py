"""`tunebench export-model`: a run's latest checkpoint becomes a GGUF that the importer reads; every bad
input is one line on stderr, exit 2, and no file is left behind."""

from __future__ import annotations

import pytest

from engine.checkpoint.gguf import load_gguf
from engine.tracking.db import open_db
from engine.tracking.run_rows import create_run
from workbench.cli import main

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from tests.engine.checkpoint.test_gguf import _tiny_llama, _tiny_tokenizer
    from tests.engine.checkpoint.test_gguf_export import _save_folder

    tok = _tiny_tokenizer()
    return _save_folder(
        _tiny_llama(tok.get_vocab_size(), tied=True), tok, tmp_path_factory.mktemp("m") / "tiny"
    )


def _one_line_exit_2(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tunebench: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_run_latest_checkpoint_exports(tunebench_home, model_folder, tmp_path, capsys):
    import shutil

    with open_db() as db:
        run = create_run(db=db, recipe="sft", config_text="lr: 0.1\n", name="tiny-run")
    for step in (1, 2):
        ckpt = tunebench_home / "runs" / run.id / "checkpoints" / f"step_{step}"
        shutil.copytree(model_folder, ckpt / "model")
        (ckpt / "recipe_state.pt").write_bytes(b"")
    out = tmp_path / "tiny.gguf"
    assert main(["export-model", "tiny-run", "--gguf", "q8_0", "-o", str(out)]) == 0
    assert "step_2" in capsys.readouterr().out
    ckpt = load_gguf(out)
    assert ckpt.tensor_types["model.layers.0.self_attn.q_proj.weight"] == "Q8_0"
    err = _one_line_exit_2(["export-model", "tiny-run", "--gguf", "q8_0", "-o", str(out)], capsys)
    assert "--force" in err
    assert main(["export-model", "tiny-run", "--gguf", "f16", "-o", str(out), "--force"]) == 0
    assert load_gguf(out).tensor_types["model.layers.0.self_attn.q_proj.weight"] == "F16"


def test_bad_inputs_one_line_exit_2(tunebench_home, model_folder, tmp_path, capsys):
    out = tmp_path / "x.gguf"
    err = _one_line_exit_2(["export-model", "no-such-run", "--gguf", "f16", "-o", str(out)], capsys)
    assert "no-such-run" in err
    (tmp_path / "empty").mkdir()
    err = _one_line_exit_2(["export-model", str(tmp_path / "empty"), "--gguf", "f16", "-o", str(out)], capsys)
    assert "no model weights" in err
    err = _one_line_exit_2(["export-model", str(model_folder), "--gguf", "q4_k", "-o", str(out)], capsys)
    assert "--gguf 'q4_k'" in err and "q8_0" in err
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "config.json").write_text(
        '{"architectures": ["GemmaForCausalLM"], "model_type": "gemma"}'
    )
    err = _one_line_exit_2(["export-model", str(tmp_path / "gemma"), "--gguf", "f16", "-o", str(out)], capsys)
    assert "gemma" in err and "qwen3_moe" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "gemma"]  # nothing written
