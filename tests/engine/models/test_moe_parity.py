"""Qwen3-MoE and Mixtral equal transformers on the same random weights: fp32 logits and the
load-balancing loss (max abs <= 1e-5), gradients of a training step, and a checkpoint round trip
through `save_pretrained(like=...)` gives the same files, keys, dtypes and index."""

from __future__ import annotations

import json

import pytest
import torch

from engine.checkpoint import save_pretrained
from engine.models import from_pretrained
from engine.modules import moe as moe_module
from engine.modules.moe import grouped_mm, grouped_mm_works, loop_mm, moe_aux_loss

from .hf_reference import hf_model

pytest.importorskip("transformers")

FAMILIES = ["qwen3_moe", "mixtral"]
ATOL = 1e-5


def _tokens(seed=1, shape=(2, 12), vocab=128):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_logits_and_aux_loss_match_transformers(family, norm_topk_prob, tmp_path):
    if family == "mixtral" and not norm_topk_prob:
        pytest.skip("Mixtral always renormalises its top-k weights")
    overrides = {"norm_topk_prob": norm_topk_prob} if family == "qwen3_moe" else {}
    reference = hf_model(family, **overrides)
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src")
    tokens = _tokens()
    with torch.no_grad():
        expected = reference(tokens, output_router_logits=True)
        got = ours(tokens)
    torch.testing.assert_close(got, expected.logits, atol=ATOL, rtol=0)
    balance, z = moe_aux_loss(ours)
    torch.testing.assert_close(balance, expected.aux_loss.float(), atol=ATOL, rtol=0)
    logits = torch.stack(expected.router_logits).float()  # [L,T,E]
    z_ref = torch.logsumexp(logits, dim=-1).pow(2).mean()
    torch.testing.assert_close(z, z_ref, atol=ATOL, rtol=0)


PATHS = ["grouped_op", "loop"]


def _force_path(path, monkeypatch):
    """`grouped_op`: torch's grouped GEMM in forward and backward (skip where it does not run);
    `loop`: the per-expert loop fallback."""
    if path == "loop":
        monkeypatch.setattr(moe_module, "_use_op", lambda x, w: False)
    elif not grouped_mm_works("cpu", torch.float32):
        pytest.skip("torch's grouped GEMM does not run on this CPU build")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("requires_grad", [True, False])
def test_grouped_mm_and_its_gradients_equal_the_autograd_loop(path, requires_grad, monkeypatch):
    """Our grouped GEMM (own backward: dx = dy W, dW_e = dy_e^T x_e) equals autograd through one
    matmul per expert, empty experts included; fp32, atol 1e-5 / rtol 1e-5 (bit-equal here)."""
    _force_path(path, monkeypatch)
    g = torch.Generator().manual_seed(0)
    for counts in ([16, 0, 32, 5], [0, 0, 53, 0], [40, 1, 12, 20]):
        x = torch.randn(sum(counts), 24, generator=g, requires_grad=True)
        w = torch.randn(4, 40, 24, generator=g, requires_grad=requires_grad)  # False: a frozen LoRA base
        dy = torch.randn(sum(counts), 40, generator=g)
        got = grouped_mm(x, w, counts)
        got.backward(dy)
        got_dx, got_dw = x.grad, w.grad
        x.grad = w.grad = None
        want = loop_mm(x, w, counts)
        want.backward(dy)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_dx, x.grad, atol=1e-5, rtol=1e-5)
        if requires_grad:
            torch.testing.assert_close(got_dw, w.grad, atol=1e-5, rtol=1e-5)
            assert torch.count_nonzero(got_dw[[i for i, c in enumerate(counts) if c == 0]]) == 0
        else:
            assert got_dw is None and w.grad is None
    x = torch.randn(8, 24, generator=g, requires_grad=True)
    grouped_mm(
        x, torch.randn(2, 16, 24, generator=g), [3, 5]
    ).sum().backward()  # an expanded (stride-0) gradient
    assert x.grad is not None


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_training_loss_and_gradients_match_transformers(family, path, tmp_path, monkeypatch):
    _force_path(path, monkeypatch)
    reference = hf_model(family).train()
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src").train()
    tokens = _tokens(3)
    out = reference(tokens, labels=tokens, output_router_logits=True)
    out.loss.backward()
    logits = ours(tokens)
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )
    balance, _ = moe_aux_loss(ours)
    loss = ce + reference.config.router_aux_loss_coef * balance
    loss.backward()
    torch.testing.assert_close(loss, out.loss, atol=ATOL, rtol=0)
    ref_grads = dict(reference.named_parameters())
    layer = ours.layers[1].mlp
    prefix = "model.layers.1.mlp"  # transformers 5 holds both families under .mlp in memory
    router_ref = ref_grads[f"{prefix}.gate.weight"].grad
    torch.testing.assert_close(layer.router.weight.grad, router_ref, atol=ATOL, rtol=0)
    gate_up = ref_grads[f"{prefix}.experts.gate_up_proj"].grad  # [E, 2H, D]
    hidden = layer.experts.gate_proj.shape[1]
    torch.testing.assert_close(layer.experts.gate_proj.grad, gate_up[:, :hidden], atol=ATOL, rtol=0)
    torch.testing.assert_close(layer.experts.up_proj.grad, gate_up[:, hidden:], atol=ATOL, rtol=0)
    torch.testing.assert_close(
        layer.experts.down_proj.grad, ref_grads[f"{prefix}.experts.down_proj"].grad, atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_roundtrip_same_files_keys_dtypes(family, tmp_path):
    import transformers
    from safetensors import safe_open

    reference = hf_model(family)
    src = tmp_path / "src"
    reference.save_pretrained(src, max_shard_size="40KB")  # several shards + an index
    ours = from_pretrained(src)
    out = save_pretrained(ours, tmp_path / "out", like=src)
    src_files = sorted(p.name for p in src.iterdir())
    assert sorted(p.name for p in out.iterdir()) == src_files
    assert len([n for n in src_files if n.endswith(".safetensors")]) > 1
    src_index = json.loads((src / "model.safetensors.index.json").read_text())
    out_index = json.loads((out / "model.safetensors.index.json").read_text())
    assert out_index["weight_map"] == src_index["weight_map"]
    assert any(".experts.3." in k for k in out_index["weight_map"])  # per-expert keys on disk
    for shard in {*src_index["weight_map"].values()}:
        with safe_open(src / shard, "pt") as a, safe_open(out / shard, "pt") as b:
            assert sorted(a.keys()) == sorted(b.keys())
            for key in a.keys():
                assert a.get_tensor(key).dtype == b.get_tensor(key).dtype
                assert torch.equal(a.get_tensor(key), b.get_tensor(key)), key
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = _tokens(2)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, reference(tokens).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_without_like_is_loadable_by_transformers(family, tmp_path):
    import transformers

    reference = hf_model(family)
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src")
    ours.hf_config = None  # derive config.json from the model alone
    out = save_pretrained(ours, tmp_path / "plain")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == type(reference).__name__
    tokens = _tokens(4)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, reference(tokens).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_with_kv_cache_equals_transformers(family, tmp_path):
    """`tunebench generate`'s engine (KV caches, batched, left-padded) on an MoE: transformers' tokens."""
    from engine.generation import generate

    reference = hf_model(family)
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src")
    prompts = [[5, 6, 7, 8, 9], [3, 4], [100, 101, 1]]
    out = generate(ours, prompts, max_new_tokens=8)
    for prompt, completion in zip(prompts, out.completions):
        expected = reference.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :]
        assert completion == expected.tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_aux_loss_leaves_padding_out_as_transformers_does(family, tmp_path):
    """A right-padded batch with its attention mask: our load-balancing loss equals transformers'
    `load_balancing_loss_func` given the same mask, both on our routers' own probabilities (<= 1e-6)
    and on the transformers model's router logits (<= 1e-5); unmasked, the padding would count."""
    import importlib

    reference = hf_model(family)
    reference.save_pretrained(tmp_path / "src")
    ours = from_pretrained(tmp_path / "src")
    tokens = _tokens(5, shape=(3, 12))
    lengths = [12, 7, 3]
    mask = torch.arange(12)[None, :] < torch.tensor(lengths)[:, None]  # [3,12]
    tokens = tokens.masked_fill(~mask, 0)  # pad id 0 after each row's end
    func = importlib.import_module(f"transformers.models.{family}.modeling_{family}").load_balancing_loss_func
    config = reference.config
    n_experts = config.num_experts if family == "qwen3_moe" else config.num_local_experts
    with torch.no_grad():
        expected = reference(tokens, attention_mask=mask.long(), output_router_logits=True)
        ours(tokens)
    balance, _ = moe_aux_loss(ours, mask=mask)
    # transformers' function on our routers' probabilities (softmax(log p) = p): the same routing
    from engine.modules.moe import moe_layers

    gate_logits = tuple(m.stats.probs.log() for m in moe_layers(ours))
    hf_on_ours = func(gate_logits, n_experts, config.num_experts_per_tok, mask.long())
    torch.testing.assert_close(balance, hf_on_ours.float(), atol=1e-6, rtol=0)
    # ... and on transformers' own forward (padding attends differently there; it is masked out)
    torch.testing.assert_close(balance, expected.aux_loss.float(), atol=ATOL, rtol=0)
    unmasked, _ = moe_aux_loss(ours)
    assert abs(unmasked.item() - balance.item()) > 1e-3  # the mask matters on this batch
    # the z-loss leaves padding out too: the mean over real tokens of logsumexp(logits)^2
    _, z = moe_aux_loss(ours, mask=mask)
    z_ref = torch.stack([torch.logsumexp(lg.float(), -1).pow(2)[mask.reshape(-1)].mean()
                         for lg in expected.router_logits]).mean()  # fmt: skip
    torch.testing.assert_close(z, z_ref, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="mask has 12 entries"):
        moe_aux_loss(ours, mask=mask[:1])
