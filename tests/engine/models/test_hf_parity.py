"""Native decoders equal transformers on the same weights (fp32 logits, max abs <= 1e-5), and
`save_pretrained` writes folders transformers loads to the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from engine.checkpoint import save_pretrained
from engine.models import from_pretrained

from .hf_reference import hf_model

pytest.importorskip("transformers")

FAMILIES = ["llama2", "llama3", "qwen2", "qwen3", "mistral"]
ATOL = 1e-5


def _tokens(seed=1, shape=(2, 12), vocab=128):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g)


@pytest.mark.parametrize("family", FAMILIES)
def test_load_hf_logits_match(family, tmp_path):
    reference = hf_model(family)
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src")
    tokens = _tokens()
    with torch.no_grad():
        expected = reference(tokens).logits
        got = ours(tokens)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_roundtrip_through_transformers(family, tmp_path):
    import transformers
    from safetensors import safe_open

    reference = hf_model(family)
    src = tmp_path / "src"
    reference.save_pretrained(src, max_shard_size="20KB")  # several shards + an index
    ours = from_pretrained(src)
    out = save_pretrained(ours, tmp_path / "out", like=src)

    src_files = sorted(p.name for p in src.iterdir())
    assert sorted(p.name for p in out.iterdir()) == src_files
    assert len([n for n in src_files if n.endswith(".safetensors")]) > 1
    src_index = json.loads((src / "model.safetensors.index.json").read_text())
    out_index = json.loads((out / "model.safetensors.index.json").read_text())
    assert out_index["weight_map"] == src_index["weight_map"]
    for shard in {*src_index["weight_map"].values()}:
        with safe_open(src / shard, "pt") as a, safe_open(out / shard, "pt") as b:
            assert sorted(a.keys()) == sorted(b.keys())
            for key in a.keys():
                assert a.get_tensor(key).dtype == b.get_tensor(key).dtype

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = _tokens(2)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, reference(tokens).logits, atol=ATOL, rtol=0)


def test_save_without_like_writes_a_transformers_config(tmp_path):
    import transformers

    reference = hf_model("qwen3")
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src")
    out = save_pretrained(ours, tmp_path / "plain", dtype=torch.bfloat16)
    written = json.loads((out / "config.json").read_text())
    source = json.loads((tmp_path / "src" / "config.json").read_text())
    assert written["torch_dtype"] == "bfloat16"
    assert {k: v for k, v in written.items() if k not in ("torch_dtype", "dtype")} == {
        k: v for k, v in source.items() if k not in ("torch_dtype", "dtype")
    }
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = _tokens(3)
    with torch.no_grad():
        # bf16 storage: compare against our own model rounded the same way.
        ours_bf16 = from_pretrained(out, dtype=torch.float32)
        torch.testing.assert_close(reloaded(tokens).logits, ours_bf16(tokens), atol=ATOL, rtol=0)


def test_from_pretrained_casts_dtype(tmp_path):
    hf_model("llama3").save_pretrained(tmp_path / "src")
    model = from_pretrained(tmp_path / "src", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(p.is_meta for p in model.parameters())
    assert model(_tokens()).dtype == torch.bfloat16


def test_lora_model_exports_merged_weights_transformers_loads(tmp_path):
    import transformers

    from engine.checkpoint import load_hf_weights
    from engine.models.qwen2 import lora_qwen2
    from engine.modules.peft import get_adapter_params

    reference = hf_model("qwen2")
    reference.save_pretrained(tmp_path / "src")
    # A LoRA model built elsewhere (as a recipe's `_component_` would be) on meta, then filled.

    with torch.device("meta"):
        model = lora_qwen2(
            vocab_size=128, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=96,
            max_seq_len=128, rope_base=reference.config.rope_parameters["rope_theta"],
            lora_rank=4, apply_lora_to_mlp=True, apply_lora_to_output=True,
            lora_attn_modules=("q_proj", "k_proj", "v_proj", "output_proj"),
        )  # fmt: skip
    load_hf_weights(model, tmp_path / "src")
    tokens = _tokens(4)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens).logits, atol=ATOL, rtol=0)
        for p in get_adapter_params(model).values():
            p.add_(torch.randn_like(p) * 0.05)
        adapted = model(tokens)
    save_pretrained(model, tmp_path / "merged", like=tmp_path / "src")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "merged", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, adapted, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_bf16_error_is_no_worse_than_transformers(family, tmp_path):
    """In bf16 exact equality is not expected (op order); our error against the fp32 reference
    must be within 1.5x transformers' own bf16 error (+ half a bf16 ulp at the logits' scale)."""
    reference = hf_model(family)
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src", dtype=torch.bfloat16)
    tokens = _tokens(5)
    with torch.no_grad():
        exact = reference(tokens).logits
        theirs_err = (reference.to(torch.bfloat16)(tokens).logits.float() - exact).abs().max()
        ours_err = (ours(tokens).float() - exact).abs().max()
    assert ours_err <= 1.5 * theirs_err + 4e-3, (ours_err, theirs_err)
