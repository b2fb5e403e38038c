"""Meta's original format: what `save_meta` writes computes, under an independent re-implementation
of Meta's reference forward (complex-number RoPE on interleaved pairs), the same logits as
transformers; `load_meta` reads it back; `like=` reproduces the layout; bad files give one line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from engine.checkpoint import CheckpointError
from engine.checkpoint.meta_format import load_meta, save_meta
from engine.models import from_pretrained
from engine.modules.rotary import Llama3RopeScaling, default_inv_freq, llama3_inv_freq
from tests.engine.models.hf_reference import hf_model


class NotAWeight:
    """Any non-tensor object: weights_only loading must refuse it."""


COLUMN = ("wq", "wk", "wv", "w1", "w3", "output")
ROW = ("wo", "w2")


def _merge(model_dir):
    shards = [torch.load(p, weights_only=True) for p in sorted(model_dir.glob("consolidated.*.pth"))]
    params = json.loads((model_dir / "params.json").read_text())
    state = {}
    for key in shards[0]:
        parts = [s[key] for s in shards]
        leaf = key.split(".")[-2]
        if key == "tok_embeddings.weight":
            state[key] = torch.cat(parts, dim=1)  # Llama-2 style ParallelEmbedding split
        elif leaf in COLUMN:
            state[key] = torch.cat(parts, dim=0)
        elif leaf in ROW:
            state[key] = torch.cat(parts, dim=1)
        else:
            state[key] = parts[0]
    return state, params


def meta_reference_logits(state, params, tokens):
    """Meta's reference Llama forward, written from the paper/format description."""
    dim, n_heads = params["dim"], params["n_heads"]
    n_kv, eps = params.get("n_kv_heads", n_heads), params["norm_eps"]
    hd = dim // n_heads
    b, s = tokens.shape
    if params.get("use_scaled_rope"):
        inv = llama3_inv_freq(hd, params["rope_theta"], Llama3RopeScaling(factor=params["rope_scaling_factor"],
                              original_max_position_embeddings=params["rope_original_max_position_embeddings"]))  # fmt: skip
    else:
        inv = default_inv_freq(hd, params["rope_theta"])
    angles = torch.outer(torch.arange(s).float(), inv)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]  # [1,S,1,hd/2]

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x):  # x: [B,S,H,hd], rotate consecutive pairs as complex numbers
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], hd // 2, 2))
        return torch.view_as_real(xc * freqs_cis).flatten(3)

    h = state["tok_embeddings.weight"][tokens]
    causal = torch.full((s, s), float("-inf")).triu(1)
    for i in range(params["n_layers"]):
        p = f"layers.{i}."
        x = rms(h, state[p + "attention_norm.weight"])
        q = rope((x @ state[p + "attention.wq.weight"].T).view(b, s, n_heads, hd))
        k = rope((x @ state[p + "attention.wk.weight"].T).view(b, s, n_kv, hd))
        v = (x @ state[p + "attention.wv.weight"].T).view(b, s, n_kv, hd)
        k, v = (t.repeat_interleave(n_heads // n_kv, dim=2) for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + causal, dim=-1) @ v
        h = h + att.transpose(1, 2).reshape(b, s, dim) @ state[p + "attention.wo.weight"].T
        x = rms(h, state[p + "ffn_norm.weight"])
        ff = F.silu(x @ state[p + "feed_forward.w1.weight"].T) * (x @ state[p + "feed_forward.w3.weight"].T)
        h = h + ff @ state[p + "feed_forward.w2.weight"].T
    return rms(h, state["norm.weight"]) @ state["output.weight"].T


@pytest.mark.parametrize("family", ["llama2", "llama3"])
def test_meta_layout_matches_meta_reference_and_roundtrips(family, tmp_path):
    reference = hf_model(family)
    reference.save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    meta_dir = save_meta(ours, tmp_path / "meta", num_shards=2)
    assert sorted(p.name for p in meta_dir.iterdir()) == [
        "consolidated.00.pth",
        "consolidated.01.pth",
        "params.json",
    ]

    tokens = torch.randint(0, 128, (2, 11))
    with torch.no_grad():
        expected = reference(tokens).logits
        state, params = _merge(meta_dir)
        torch.testing.assert_close(
            meta_reference_logits(state, params, tokens), expected, atol=1e-5, rtol=1e-5
        )
        loaded = load_meta(meta_dir)
        torch.testing.assert_close(loaded(tokens), expected, atol=1e-5, rtol=1e-5)

    again = save_meta(loaded, tmp_path / "again", like=meta_dir)
    assert (again / "params.json").read_text() == (meta_dir / "params.json").read_text()
    for name in ("consolidated.00.pth", "consolidated.01.pth"):
        a = torch.load(meta_dir / name, weights_only=True)
        b = torch.load(again / name, weights_only=True)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=0, rtol=0)


def test_meta_errors_are_one_line(tmp_path):
    ours = from_pretrained(_hf_dir(tmp_path))
    meta_dir = save_meta(ours, tmp_path / "meta", num_shards=2)
    (meta_dir / "consolidated.01.pth").unlink()
    with pytest.raises(CheckpointError, match="shard is missing"):
        load_meta(meta_dir)

    torch.save({"tok_embeddings.weight": NotAWeight()}, meta_dir / "consolidated.00.pth")
    with pytest.raises(CheckpointError, match="consolidated.00.pth: cannot be read"):
        load_meta(meta_dir)
    (meta_dir / "params.json").unlink()
    with pytest.raises(CheckpointError, match="params.json: missing"):
        load_meta(meta_dir)


def test_meta_refuses_qwen(tmp_path):
    hf_model("qwen3").save_pretrained(tmp_path / "q")
    with pytest.raises(CheckpointError, match="Llama models only"):
        save_meta(from_pretrained(tmp_path / "q"), tmp_path / "out")


def _hf_dir(tmp_path):
    hf_model("llama2").save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"
