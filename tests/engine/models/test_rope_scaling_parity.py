"""Every RoPE schedule (linear, dynamic NTK, YaRN, LongRoPE, Llama 3) equals transformers' own
`*ForCausalLM` on tiny random Llama and Qwen3 configs: fp32 logits within 1e-5 (max abs), on both
sides of the length where a schedule changes (dynamic NTK: `max_position_embeddings`; LongRoPE:
`original_max_position_embeddings`); both config spellings (`rope_parameters`, which the installed
transformers writes, and the transformers-4 `rope_scaling` + top-level `rope_theta`) load; greedy
generation with our KV cache gives transformers' `generate` tokens for dynamic NTK and LongRoPE.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.checkpoint import save_pretrained
from engine.generation import generate
from engine.models import from_pretrained

from .hf_reference import hf_model

pytest.importorskip("transformers")

ATOL = 1e-5
MAX_POS = 64  # max_position_embeddings of the tiny configs
ORIGINAL = 32  # original_max_position_embeddings where a schedule has one


def _factors(n: int, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (1.0 + 3.0 * torch.rand(n, generator=g)).tolist()


def _rope(kind: str, head_dim: int) -> dict:
    """A `rope_parameters` block of `kind` for a head of `head_dim`."""
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    if kind == "dynamic":
        return {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    if kind == "yarn":
        return {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        }
    if kind == "yarn_no_truncate":  # gpt-oss style: fractional ramp bounds, explicit betas
        return {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
                "truncate": False, "original_max_position_embeddings": ORIGINAL}  # fmt: skip
    if kind == "yarn_mscale":  # DeepSeek style: the attention factor from mscale / mscale_all_dim
        return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                "original_max_position_embeddings": ORIGINAL}  # fmt: skip
    if kind == "yarn_attention_factor":
        return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "attention_factor": 1.3,
                "original_max_position_embeddings": ORIGINAL}  # fmt: skip
    if kind == "longrope":
        return {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": _factors(head_dim // 2, 1),
                "long_factor": _factors(head_dim // 2, 2), "original_max_position_embeddings": ORIGINAL}  # fmt: skip
    if kind == "llama3":
        return {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL}  # fmt: skip
    raise ValueError(kind)


HEAD_DIM = {"llama3": 16, "qwen3": 24}  # hf_reference: Llama 64 / 4 heads, Qwen3 head_dim 24
KINDS = [
    "linear",
    "dynamic",
    "yarn",
    "yarn_no_truncate",
    "yarn_mscale",
    "yarn_attention_factor",
    "longrope",
    "llama3",
]
# Lengths on each side of where the schedule changes (dynamic: MAX_POS; the others: ORIGINAL).
LENGTHS = {"dynamic": (40, 100)}
DEFAULT_LENGTHS = (20, 50)


def _reference(family: str, kind: str):
    return hf_model(family, max_position_embeddings=MAX_POS, rope_parameters=_rope(kind, HEAD_DIM[family]))


def _tokens(length: int, seed: int = 1, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers_on_both_sides(family, kind, tmp_path):
    reference = _reference(family, kind)
    reference.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    for length in LENGTHS.get(kind, DEFAULT_LENGTHS):
        tokens = _tokens(length)
        with torch.no_grad():
            # transformers' dynamic schedule keeps state between calls (it only grows, and resets
            # below max_position_embeddings); lengths run upward here, so each call sees a fresh state.
            expected = reference(tokens).logits
            got = ours(tokens)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=f"{kind} at length {length}")


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_schedules_do_change_at_the_switch(kind, tmp_path):
    """The long side is not the short schedule: the same prefix's logits differ once the forward is long."""
    _reference("llama3", kind).save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    short, long = LENGTHS.get(kind, DEFAULT_LENGTHS)
    tokens = _tokens(long)
    with torch.no_grad():
        prefix = ours(tokens[:, :short])
        within_long = ours(tokens)[:, :short]
    assert (prefix - within_long).abs().max() > 1e-3


def test_legacy_rope_scaling_spelling_loads_the_same(tmp_path):
    """transformers 4 wrote `rope_scaling` (with `type`) and a top-level `rope_theta`; both readers agree."""
    import transformers

    reference = _reference("qwen3", "yarn")
    reference.save_pretrained(tmp_path / "new")
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    assert "rope_parameters" in config and "rope_scaling" not in config  # what this transformers writes
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")
    config["rope_scaling"] = params
    reference.save_pretrained(tmp_path / "old")
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))

    legacy_reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "old", dtype=torch.float32
    )
    ours_new, ours_old = from_pretrained(tmp_path / "new"), from_pretrained(tmp_path / "old")
    tokens = _tokens(50)
    with torch.no_grad():
        expected = reference(tokens).logits
        torch.testing.assert_close(legacy_reference.eval()(tokens).logits, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours_old(tokens), expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours_new(tokens), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn_mscale", "longrope"])
def test_save_pretrained_keeps_the_schedule(kind, tmp_path):
    """A config written from the native model alone (no `like=`) gives transformers the same logits."""
    import transformers

    reference = _reference("llama3", kind)
    reference.save_pretrained(tmp_path / "src")
    out = save_pretrained(from_pretrained(tmp_path / "src"), tmp_path / "out")
    written = json.loads((out / "config.json").read_text())
    assert written["max_position_embeddings"] == MAX_POS
    assert written["rope_parameters"]["rope_type"] == _rope(kind, 16)["rope_type"]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    for length in LENGTHS.get(kind, DEFAULT_LENGTHS):
        tokens = _tokens(length, seed=3)
        with torch.no_grad():
            torch.testing.assert_close(reloaded(tokens).logits, reference(tokens).logits, atol=ATOL, rtol=0)


def _reference_generate(reference, prompt, steps, **kwargs) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the log-probabilities of each chosen token `[steps]`."""
    out = reference.generate(prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, **kwargs)  # fmt: skip
    tokens = out.sequences[0, prompt.shape[1] :]
    logits = torch.stack([step[0] for step in out.logits])  # [steps, V]
    return tokens.tolist(), torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]


def test_dynamic_generation_matches_transformers_generate(tmp_path):
    """A prompt below max_position_embeddings, generated past it: transformers' cached `generate` rotates
    each new token with the base of its own length and keeps the cached keys; so does our KV cache
    (tokens equal, chosen-token log-probabilities within 1e-5)."""
    reference = _reference("llama3", "dynamic")
    reference.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    prompt = _tokens(MAX_POS - 8, seed=5, batch=1)
    tokens, logprobs = _reference_generate(reference, prompt, 24)
    got = generate(ours, [prompt[0].tolist()], max_new_tokens=24, return_logprobs=True)
    assert got.tokens[0].tolist() == tokens
    torch.testing.assert_close(got.logprobs[0], logprobs, atol=ATOL, rtol=0)


def test_longrope_generation_reencodes_at_the_switch(tmp_path):
    """Past original_max_position_embeddings every key must use the long factors: our cached generation
    re-encodes once there and equals transformers' uncached `generate` (a full recompute each step):
    tokens equal, chosen-token log-probabilities within 1e-5, and so does our own uncached path."""
    reference = _reference("llama3", "longrope")
    reference.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    prompt = _tokens(ORIGINAL - 6, seed=6, batch=1)
    tokens, logprobs = _reference_generate(reference, prompt, 20, use_cache=False)
    for use_cache in (True, False):
        got = generate(
            ours, [prompt[0].tolist()], max_new_tokens=20, use_cache=use_cache, return_logprobs=True
        )
        assert got.tokens[0].tolist() == tokens
        torch.testing.assert_close(got.logprobs[0], logprobs, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "block, message",
    [
        ({"rope_type": "su2"}, "rope_type 'su2' is not supported"),
        ({"rope_type": "linear"}, "rope_parameters.factor is missing"),
        (
            {"rope_type": "yarn", "factor": 4.0, "truncate": "no"},
            "rope_parameters.truncate must be true or false",
        ),
        (
            {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
            "short_factor has 1 entries",
        ),
    ],
)
def test_bad_rope_block_is_one_line(block, message, tmp_path):
    from engine.checkpoint.checkpoint_errors import CheckpointError

    _reference("llama3", "linear").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 10000.0, **block}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as info:
        from_pretrained(tmp_path)
    assert "\n" not in str(info.value) and "config.json" in str(info.value)


def test_every_family_builder_takes_a_schedule_from_a_config():
    from engine.config import instantiate, validate

    node = {
        "_component_": "engine.models.qwen3.lora_qwen3_tiny",
        "rope_scaling": {"_component_": "engine.modules.rope_scaling.YarnRopeScaling", "factor": 4.0,
                         "original_max_position_embeddings": 64},
    }  # fmt: skip
    assert validate({"model": node}) == []
    assert instantiate(node).rope.scaling.attention_scale == pytest.approx(0.1 * math.log(4.0) + 1)
    node["rope_scaling"]["factr"] = 2.0
    (problem,) = validate({"model": node})
    assert problem.field == "model.rope_scaling.factr" and "factor" in problem.message
