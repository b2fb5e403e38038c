"""PEFT-layout adapters and merged models, checked against transformers + peft on the same weights."""

import json

import pytest
import torch

from engine.checkpoint import load_hf_weights
from engine.checkpoint.checkpoint_errors import CheckpointError
from engine.checkpoint.peft import load_adapters, save_adapters, save_merged_model
from engine.models.llama3 import lora_llama3

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

SIZES = dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128,
             max_seq_len=128, rope_base=10000.0, norm_eps=1e-6)  # fmt: skip


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Llama saved by transformers itself."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    model.save_pretrained(path)
    return path


def _lora_model(hf_dir, **lora):
    with torch.device("meta"):
        model = lora_llama3(**SIZES, **lora)
    load_hf_weights(model, hf_dir)
    torch.manual_seed(1)
    with torch.no_grad():  # trained-looking adapters: B != 0
        for name, p in model.named_parameters():
            if "lora_b" in name or "magnitude" in name:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


TOKENS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "lora",
    [
        dict(lora_attn_modules=("q_proj", "v_proj"), lora_rank=4, lora_alpha=8.0),
        dict(
            lora_attn_modules=("q_proj", "k_proj", "v_proj", "output_proj"),
            apply_lora_to_mlp=True,
            apply_lora_to_output=True,
            lora_rank=8,
            lora_alpha=16.0,
        ),
        dict(lora_attn_modules=("q_proj", "v_proj"), lora_rank=4, lora_alpha=8.0, use_dora=True),
        dict(
            lora_attn_modules=("q_proj", "v_proj"),
            apply_lora_to_mlp=True,
            lora_rank=16,
            lora_alpha=8.0,
            use_rslora=True,
        ),  # fmt: skip
    ],
    ids=["qv", "all", "dora", "rslora"],
)
def test_peft_loads_our_adapters_with_equal_logits(hf_dir, tmp_path, lora):
    model = _lora_model(hf_dir, **lora)
    out = save_adapters(model, tmp_path / "adapter", base_model_dir=hf_dir)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == lora["lora_rank"] and config["peft_type"] == "LORA"
    assert config["use_rslora"] is lora.get("use_rslora", False)

    base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    reference = peft.PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        expected = reference(TOKENS).logits
        got = model(TOKENS)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_merged_model_equals_unmerged_in_transformers(hf_dir, tmp_path):
    lora = dict(lora_attn_modules=("q_proj", "k_proj", "v_proj", "output_proj"), apply_lora_to_mlp=True,
                apply_lora_to_output=True, lora_rank=8, lora_alpha=16.0)  # fmt: skip
    model = _lora_model(hf_dir, **lora)
    merged_dir = save_merged_model(model, tmp_path / "merged", like=hf_dir)
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(TOKENS).logits, model(TOKENS), atol=1e-5, rtol=1e-5)


def test_load_adapters_round_trip_and_mismatch(hf_dir, tmp_path):
    model = _lora_model(hf_dir, lora_rank=4, lora_alpha=8.0)
    out = save_adapters(model, tmp_path / "adapter")
    fresh = _lora_model(hf_dir, lora_rank=4, lora_alpha=8.0)
    with torch.no_grad():
        for name, p in fresh.named_parameters():
            if "lora_" in name:
                p.zero_()
    load_adapters(fresh, out)
    with torch.no_grad():
        torch.testing.assert_close(fresh(TOKENS), model(TOKENS), atol=0, rtol=0)
    other = _lora_model(hf_dir, lora_rank=2, lora_alpha=8.0)
    with pytest.raises(CheckpointError, match="lora_rank"):
        load_adapters(other, out)
    with pytest.raises(CheckpointError, match="not a PEFT adapter folder"):
        load_adapters(other, tmp_path)


def test_peft_rslora_adapters_load_in_ours_with_equal_logits(hf_dir, tmp_path):
    """The other direction: adapters PEFT trains with `use_rslora=True` (scale alpha / sqrt(r)) load
    into our decoder (`load_eval_model` reads `use_rslora`) with PEFT's logits; without rsLoRA the
    same weights give other logits (the scale is 4x at r=16), so the flag is really read."""
    from engine.eval.model_loading import load_eval_model

    base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    config = peft.LoraConfig(r=16, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"])
    theirs = peft.get_peft_model(base, config)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    theirs.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    saved["base_model_name_or_path"] = str(hf_dir)
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(saved))
    ours = load_eval_model(tmp_path / "adapter")
    with torch.no_grad():
        expected = theirs.eval()(TOKENS).logits
        torch.testing.assert_close(ours(TOKENS), expected, atol=1e-5, rtol=1e-5)
        saved["use_rslora"] = False
        (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(saved))
        plain = load_eval_model(tmp_path / "adapter")
        assert (plain(TOKENS) - expected).abs().max() > 1e-3
