"""Phi-3 / Phi-4 (`Phi3ForCausalLM`) against transformers on the same random tiny weights: fp32 logits
within 1e-5 (max abs) with the default RoPE and a sliding window, with LongRoPE on both sides of
`original_max_position_embeddings`, with partial rotary; gradients within 1e-5; a folder saved from the
native model reloads in transformers with the same files, keys (fused `qkv_proj` / `gate_up_proj`) and
logits; greedy LongRoPE generation equals transformers' Phi-3 `generate`; LoRA / QLoRA train, and PEFT
loads our adapters (one on the fused `qkv_proj`) to the same logits (1e-5)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.checkpoint import save_pretrained
from engine.generation import generate
from engine.models import from_pretrained

from .hf_reference import hf_model

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
ORIGINAL, MAX_POS = 32, 64


def _tokens(length=20, seed=1, batch=2):
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def _factors(n, seed):
    return (1.0 + 3.0 * torch.rand(n, generator=torch.Generator().manual_seed(seed))).tolist()


def _longrope(partial: float = 1.0, seed: int = 0):
    """A Phi-3.5-style reference: LongRoPE over a 32-token original context, 64 in all."""
    half = int(16 * partial) // 2  # head_dim 16 (64 / 4 heads)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": _factors(half, 1),
            "long_factor": _factors(half, 2), "partial_rotary_factor": partial}  # fmt: skip
    return hf_model("phi3", seed=seed, max_position_embeddings=MAX_POS, original_max_position_embeddings=ORIGINAL,
                    sliding_window=None, rope_parameters=rope)  # fmt: skip


VARIANTS = {
    "window": lambda: hf_model("phi3"),
    "longrope": lambda: _longrope(),
    "longrope_partial": lambda: _longrope(partial=0.5),
    "partial": lambda: hf_model(
        "phi3", rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}
    ),  # fmt: skip
    "phi4": lambda: hf_model("phi4"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(variant, tmp_path):
    reference = VARIANTS[variant]()
    reference.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert ours.layers[0].attn.qkv_proj is not None and ours.layers[0].attn.q_proj is None
    for length in (20, 50):  # both sides of LongRoPE's switch (32); longer than the window (6)
        tokens = _tokens(length)
        with torch.no_grad():
            torch.testing.assert_close(
                ours(tokens), reference(tokens).logits, atol=ATOL, rtol=0, msg=str(length)
            )


def test_phi4_14b_preset_is_transformers_phi4():
    """Our preset's config.json builds transformers' Phi3ForCausalLM with the same parameters, by name and shape."""
    from engine.checkpoint.hf_keys import native_to_hf
    from engine.models.hf_config import hf_config_from_model
    from engine.models.phi3 import phi4_14b

    with torch.device("meta"):
        ours = phi4_14b()
        config = hf_config_from_model(ours)
        theirs = transformers.AutoModelForCausalLM.from_config(transformers.Phi3Config(**config))
    assert config["architectures"] == ["Phi3ForCausalLM"] and config["vocab_size"] == 100_352
    expected = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert {native_to_hf(k): tuple(v.shape) for k, v in ours.state_dict().items()} == expected


@pytest.mark.parametrize("variant", ["window", "longrope_partial"])
def test_save_pretrained_roundtrip_through_transformers(variant, tmp_path):
    from safetensors import safe_open

    reference = VARIANTS[variant]()
    src = tmp_path / "src"
    reference.save_pretrained(src, max_shard_size="20KB")  # several shards + an index
    ours = from_pretrained(src)
    out = save_pretrained(ours, tmp_path / "out", like=src)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in src.iterdir())
    src_index = json.loads((src / "model.safetensors.index.json").read_text())
    assert (
        json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
        == src_index["weight_map"]
    )
    assert "model.layers.0.self_attn.qkv_proj.weight" in src_index["weight_map"]
    assert "model.layers.0.mlp.gate_up_proj.weight" in src_index["weight_map"]
    for shard in {*src_index["weight_map"].values()}:
        with safe_open(src / shard, "pt") as a, safe_open(out / shard, "pt") as b:
            assert sorted(a.keys()) == sorted(b.keys())
            for key in a.keys():
                assert torch.equal(a.get_tensor(key), b.get_tensor(key)), key
    # Also a config written from the native model alone (no `like=`): transformers reads the same model.
    plain = save_pretrained(ours, tmp_path / "plain")
    for folder in (out, plain):
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        for length in (20, 50):
            tokens = _tokens(length, seed=2)
            with torch.no_grad():
                torch.testing.assert_close(
                    reloaded(tokens).logits, reference(tokens).logits, atol=ATOL, rtol=0
                )


@pytest.mark.parametrize("variant", ["window", "longrope_partial"])
def test_gradients_match_transformers(variant, tmp_path):
    from engine.checkpoint.hf_keys import native_to_hf

    reference = VARIANTS[variant]().train()
    reference.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path).train()
    tokens = _tokens(40, seed=3)
    out = reference(tokens, labels=tokens)
    out.loss.backward()
    logits = ours(tokens)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )
    loss.backward()
    torch.testing.assert_close(loss, out.loss, atol=ATOL, rtol=0)
    theirs = dict(reference.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[native_to_hf(name)].grad, atol=ATOL, rtol=0, msg=name)


def test_longrope_generation_matches_transformers_phi3_generate(tmp_path):
    """transformers' Phi-3 drops its cache once the sequence passes original_max_position_embeddings and
    re-encodes with the long factors; our generation does the same: tokens and chosen-token
    log-probabilities (1e-5) equal."""
    reference = _longrope()
    reference.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    prompt = _tokens(ORIGINAL - 5, seed=4, batch=1)
    out = reference.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)  # fmt: skip
    tokens = out.sequences[0, prompt.shape[1] :]
    logprobs = torch.log_softmax(torch.stack([s[0] for s in out.logits]), -1).gather(-1, tokens[:, None])[
        :, 0
    ]
    got = generate(ours, [prompt[0].tolist()], max_new_tokens=16, return_logprobs=True)
    assert got.tokens[0].tolist() == tokens.tolist()
    torch.testing.assert_close(got.logprobs[0], logprobs, atol=ATOL, rtol=0)


def _lora_phi3(src, **lora):
    from engine.checkpoint import load_hf_weights
    from engine.models.phi3 import lora_phi3

    config = json.loads((src / "config.json").read_text())
    with torch.device("meta"):
        model = lora_phi3(vocab_size=128, num_layers=2, num_heads=4, num_kv_heads=config["num_key_value_heads"],
                          embed_dim=64, intermediate_dim=96, max_seq_len=128, sliding_window=config["sliding_window"],
                          **lora)  # fmt: skip
    return load_hf_weights(model, src)


@pytest.mark.parametrize("quantize_base", [False, True], ids=["lora", "qlora"])
def test_lora_and_qlora_train_on_a_tiny_task(quantize_base, tmp_path):
    from engine.modules.peft import LoRALinear, get_adapter_params, set_trainable_params

    hf_model("phi3").save_pretrained(tmp_path)
    model = _lora_phi3(
        tmp_path, lora_rank=8, lora_alpha=16.0, apply_lora_to_mlp=True, quantize_base=quantize_base
    )
    attn, mlp = model.layers[0].attn, model.layers[0].mlp
    assert isinstance(attn.qkv_proj, LoRALinear) and isinstance(mlp.gate_up_proj, LoRALinear)
    assert attn.qkv_proj.quantize_base == quantize_base
    adapters = get_adapter_params(model)
    set_trainable_params(model, adapters)
    optimizer = torch.optim.AdamW(adapters.values(), lr=3e-2)
    tokens = _tokens(16, seed=5, batch=2)  # memorise two rows
    losses = []
    for _ in range(12):
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 128), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses  # from ln(128) = 4.85 to ~2.6 in 12 steps (seeded)


@pytest.mark.parametrize(
    "lora",
    [
        dict(lora_attn_modules=("qkv_proj",)),
        dict(lora_attn_modules=("qkv_proj", "output_proj"), apply_lora_to_mlp=True),
    ],
    ids=["qkv", "all"],
)
def test_peft_loads_our_adapters_on_the_fused_projections(lora, tmp_path):
    peft = pytest.importorskip("peft")
    from engine.checkpoint.peft import load_adapters, save_adapters
    from engine.modules.peft import get_adapter_params

    src = tmp_path / "src"
    hf_model("phi3").save_pretrained(src)
    model = _lora_phi3(src, lora_rank=4, lora_alpha=8.0, **lora).eval()
    with torch.no_grad():  # trained-looking adapters: B != 0
        for p in get_adapter_params(model).values():
            p.add_(torch.randn_like(p) * 0.05)
    out = save_adapters(model, tmp_path / "adapter", base_model_dir=src)
    config = json.loads((out / "adapter_config.json").read_text())
    expected_targets = {"qkv_proj"} | (
        {"o_proj", "gate_up_proj", "down_proj"} if "output_proj" in lora["lora_attn_modules"] else set()
    )
    assert set(config["target_modules"]) == expected_targets
    base = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    reference = peft.PeftModel.from_pretrained(base, out).eval()
    tokens = _tokens(20, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens).logits, atol=ATOL, rtol=0)
    reloaded = _lora_phi3(src, lora_rank=4, lora_alpha=8.0, **lora).eval()
    load_adapters(reloaded, out)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens), model(tokens), atol=0, rtol=0)


def test_wrong_lora_target_names_the_fused_projection():
    from engine.config import ConfigError, instantiate

    with pytest.raises(ConfigError, match="one fused qkv_proj"):
        instantiate(
            {"_component_": "engine.models.phi3.lora_phi3_tiny", "lora_attn_modules": ["q_proj", "v_proj"]}
        )
