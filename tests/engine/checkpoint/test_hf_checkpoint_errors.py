"""Bad Hugging Face folders give one clear CheckpointError line (a ConfigError: exit 2 in the CLI)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.checkpoint import CheckpointError, save_pretrained
from engine.config import ConfigError
from engine.models import from_pretrained
from tests.engine.models.hf_reference import hf_model


@pytest.fixture
def sharded(tmp_path):
    hf_model("qwen2").save_pretrained(tmp_path / "m", max_shard_size="20KB")
    return tmp_path / "m"


@pytest.fixture
def single(tmp_path):
    hf_model("llama3").save_pretrained(tmp_path / "s")
    return tmp_path / "s"


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and isinstance(exc.value, ConfigError)
    return text


def test_truncated_file(single):
    path = single / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(single)
    assert "model.safetensors: truncated" in _one_line(exc)


def test_garbage_file(single):
    (single / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(single)
    assert "not a valid safetensors file" in _one_line(exc)


def test_missing_shard(sharded):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (sharded / victim).unlink()
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(sharded)
    assert f"{victim}: shard listed in model.safetensors.index.json is missing" in _one_line(exc)


def test_unknown_architecture(single):
    config = json.loads((single / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    config["model_type"] = "gpt_neox"
    (single / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(single)
    assert "architecture GPTNeoXForCausalLM is not supported" in _one_line(exc)


def test_shape_mismatch_names_key_and_shapes(single):
    config = json.loads((single / "config.json").read_text())
    config["intermediate_size"] = 100
    (single / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(single)
    text = _one_line(exc)
    assert "model.layers.0.mlp.down_proj.weight has shape (64, 96), the model expects (64, 100)" in text


def test_missing_key(single):
    from safetensors.torch import load_file, save_file

    tensors = load_file(single / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, single / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(single)
    assert "weight model.layers.1.mlp.up_proj.weight is missing" in _one_line(exc)


def test_missing_config(single):
    (single / "config.json").unlink()
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(single)
    assert "config.json: missing" in _one_line(exc)


def test_save_like_a_different_size_refuses_and_writes_nothing(single, tmp_path):
    model = from_pretrained(single)
    other = tmp_path / "other"
    hf_model("llama3", intermediate_size=80).save_pretrained(other)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError) as exc:
        save_pretrained(model, out, like=other)
    assert "down_proj.weight has shape (64, 80) but the model's is (64, 96)" in _one_line(exc)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_save_keeps_source_dtype(tmp_path):
    hf_model("qwen3").to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = from_pretrained(tmp_path / "bf16", dtype=torch.float32)
    save_pretrained(model, tmp_path / "out", like=tmp_path / "bf16")
    from safetensors import safe_open

    with safe_open(tmp_path / "out" / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_unknown_key_is_named(single):
    from safetensors.torch import load_file, save_file

    tensors = load_file(single / "model.safetensors")
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, single / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as exc:
        from_pretrained(single)
    assert "key model.layers.0.mlp.extra_proj.weight has no place in this TransformerDecoder" in _one_line(
        exc
    )
