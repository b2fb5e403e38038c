"""The memory estimate against what torch actually allocates for a small Llama-shaped decoder.

Reference: a hand-written decoder (RMSNorm, GQA attention through SDPA, SwiGLU MLP, tied output) whose
parameter, gradient and AdamW-state bytes are summed from the real tensors, and whose saved-for-backward
activations are measured with `torch.autograd.graph.saved_tensors_hooks` (deduplicated by storage).
"""

from __future__ import annotations

import pytest

from engine.training.memory_estimate import (
    GiB,
    MemoryEstimateError,
    ModelShape,
    TrainingOptions,
    detect_device_memory,
    estimate_memory,
)

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

SHAPE = ModelShape(num_layers=2, dim=64, vocab_size=256, intermediate_dim=160, kv_dim=32)
HEADS, KV_HEADS = 4, 2


class _Block(nn.Module):
    def __init__(self, s: ModelShape):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(s.dim), nn.RMSNorm(s.dim)
        self.q_proj = nn.Linear(s.dim, s.dim, bias=False)
        self.k_proj = nn.Linear(s.dim, s.kv_dim, bias=False)
        self.v_proj = nn.Linear(s.dim, s.kv_dim, bias=False)
        self.o_proj = nn.Linear(s.dim, s.dim, bias=False)
        self.gate = nn.Linear(s.dim, s.intermediate_dim, bias=False)
        self.up = nn.Linear(s.dim, s.intermediate_dim, bias=False)
        self.down = nn.Linear(s.intermediate_dim, s.dim, bias=False)

    def forward(self, x):  # x: [B, S, D]
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q_proj(h).view(b, t, HEADS, -1).transpose(1, 2)  # [B, H, S, hd]
        k = self.k_proj(h).view(b, t, KV_HEADS, -1).transpose(1, 2)  # [B, KVH, S, hd]
        v = self.v_proj(h).view(b, t, KV_HEADS, -1).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, H, S, hd]
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class _Decoder(nn.Module):
    def __init__(self, s: ModelShape):
        super().__init__()
        self.tok = nn.Embedding(s.vocab_size, s.dim)
        self.layers = nn.ModuleList(_Block(s) for _ in range(s.num_layers))
        self.norm = nn.RMSNorm(s.dim)

    def forward(self, tokens):  # tokens: [B, S] -> logits [B, S, V]
        x = self.tok(tokens)
        for layer in self.layers:
            x = layer(x)
        return F.linear(self.norm(x), self.tok.weight)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_parameter_count_matches_torch_model():
    model = _Decoder(SHAPE)
    assert SHAPE.num_params == sum(p.numel() for p in model.parameters())


def test_weights_gradients_and_adamw_state_match_real_tensors():
    # Full fine-tune in fp32 with AdamW: every figure is exact.
    torch.manual_seed(0)
    model = _Decoder(SHAPE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, SHAPE.vocab_size, (2, 16))
    F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten()).backward()
    opt.step()
    est = estimate_memory(SHAPE, TrainingOptions(dtype="fp32", batch_size=2, seq_len=16))
    weights = _bytes(model.parameters())
    grads = _bytes(p.grad for p in model.parameters())
    states = _bytes(v for st in opt.state.values() for k, v in st.items() if k in ("exp_avg", "exp_avg_sq"))
    torch.testing.assert_close(est.weights_bytes, float(weights), rtol=0, atol=0)
    torch.testing.assert_close(est.gradients_bytes, float(grads), rtol=0, atol=0)
    torch.testing.assert_close(est.optimizer_bytes, float(states), rtol=0, atol=0)


def test_lora_trainable_params_match_adapter_tensors():
    rank = 4
    opts = TrainingOptions(method="lora", lora_rank=rank, lora_attn_modules=("q_proj", "v_proj"))
    est = estimate_memory(SHAPE, opts)
    # Reference: A [r, in] and B [out, r] matrices on q and v of each layer.
    adapters = [
        torch.empty(rank, SHAPE.dim).numel() + torch.empty(out, rank).numel()
        for _ in range(SHAPE.num_layers)
        for out in (SHAPE.dim, SHAPE.kv_dim)
    ]
    assert est.trainable_params == sum(adapters)
    assert est.gradients_bytes == sum(adapters) * 2  # bf16 gradients of the adapters only


def test_activation_estimate_close_to_saved_tensors():
    torch.manual_seed(0)
    model = _Decoder(SHAPE)
    batch, seq = 2, 128
    tokens = torch.randint(0, SHAPE.vocab_size, (batch, seq))
    seen: dict[int, int] = {}

    def pack(t):
        if t.requires_grad or t.grad_fn is not None or t.dtype.is_floating_point:
            if not isinstance(t, nn.Parameter):
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    measured = sum(n for ptr, n in seen.items() if ptr not in params)
    # fp32 model: the logits, their fp32 "upcast" (a copy in fp32 here too) and log-softmax output.
    est = estimate_memory(SHAPE, TrainingOptions(dtype="fp32", batch_size=batch, seq_len=seq))
    assert loss.isfinite()
    # The estimate is a planning figure: within 35% of what autograd really keeps.
    torch.testing.assert_close(est.activations_bytes, float(measured), rtol=0.35, atol=0)


def test_memory_options_reduce_the_estimate_in_the_expected_direction():
    shape = ModelShape(num_layers=30, dim=576, vocab_size=49152, intermediate_dim=1536, kv_dim=192)
    base = estimate_memory(shape, TrainingOptions(batch_size=4, seq_len=2048))
    ac = estimate_memory(shape, TrainingOptions(batch_size=4, seq_len=2048, activation_checkpointing=True))
    lce = estimate_memory(shape, TrainingOptions(batch_size=4, seq_len=2048, linear_cross_entropy=True))
    oib = estimate_memory(shape, TrainingOptions(batch_size=4, seq_len=2048, optimizer_in_backward=True))
    low = estimate_memory(shape, TrainingOptions(batch_size=4, seq_len=2048, optimizer="adamw8bit"))
    lora = estimate_memory(shape, TrainingOptions(method="lora"))
    qlora = estimate_memory(shape, TrainingOptions(method="qlora"))
    fsdp = estimate_memory(shape, TrainingOptions(batch_size=4, seq_len=2048, nproc=4))
    both = estimate_memory(
        shape,
        TrainingOptions(batch_size=4, seq_len=2048, activation_checkpointing=True, linear_cross_entropy=True),
    )
    # With a 49k vocabulary the logits dominate: checkpointing alone halves, both cut > 8x.
    assert ac.activations_bytes < base.activations_bytes / 1.5
    assert both.activations_bytes < base.activations_bytes / 8
    assert lce.activations_bytes < base.activations_bytes
    assert oib.gradients_bytes < base.gradients_bytes / 4  # the 28M-value embedding stays
    assert low.optimizer_bytes < base.optimizer_bytes / 1.9
    assert lora.optimizer_bytes < base.optimizer_bytes / 50
    assert qlora.weights_bytes < lora.weights_bytes
    torch.testing.assert_close(fsdp.weights_bytes, base.weights_bytes / 4)
    assert base.fits(1 * GiB) is False and base.fits(None) is None and lora.fits(80 * GiB) is True


def test_model_card_mapping_and_errors():
    card = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152, "intermediate_size": 1536}
    card |= {"num_attention_heads": 9, "num_key_value_heads": 3}
    shape = ModelShape.from_card(card)
    assert shape.kv_dim == 192 and shape.intermediate_dim == 1536
    # SmolLM2-135M has 134,515,008 parameters (tied embeddings).
    assert shape.num_params == 134_515_008
    with pytest.raises(MemoryEstimateError, match="vocab_size"):
        ModelShape.from_card({"dim": 8, "num_layers": 2})
    with pytest.raises(MemoryEstimateError, match="method"):
        TrainingOptions(method="dora")
    with pytest.raises(MemoryEstimateError, match="lora_attn_modules"):
        estimate_memory(shape, TrainingOptions(method="lora", lora_attn_modules=("qq",)))


def test_detect_device_memory_returns_a_size_without_a_gpu(monkeypatch):
    monkeypatch.delenv("TUNEBENCH_DEVICE_MEMORY_GB", raising=False)
    name, size = detect_device_memory()
    assert name.startswith(("cpu", "cuda")) and size and size > 0


def test_device_memory_override_and_its_error(monkeypatch):
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "80")
    assert detect_device_memory() == ("planned device", 80 * GiB)
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "lots")
    with pytest.raises(MemoryEstimateError, match="TUNEBENCH_DEVICE_MEMORY_GB"):
        detect_device_memory()


def test_parameter_count_matches_every_model_card():
    """Reference: each card's parameter count, computed by engine.models from its builder on the meta
    device. Biases (Qwen2 QKV) and q/k norms are not in the estimate: within 0.1%."""
    models = pytest.importorskip("engine.models")
    if not hasattr(models, "model_cards"):
        pytest.skip("engine.models.model_cards is not there yet")
    cards = models.model_cards()
    assert cards
    for card in cards:
        shape = ModelShape.from_card(card)
        torch.testing.assert_close(
            float(shape.num_params), float(card.params), rtol=1e-3, atol=0, msg=card.name
        )
