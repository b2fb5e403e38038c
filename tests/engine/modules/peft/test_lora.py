"""LoRA / DoRA / NF4 linears: against PEFT on the same weights, against the dense merged weight,
and the adapter helpers (trainable set, disable, merge for export)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models import LoRASettings, build_decoder, from_pretrained
from engine.models.llama3 import llama3_tiny, lora_llama3_tiny
from engine.modules.peft import (
    LoRALinear,
    disable_adapters,
    get_adapter_params,
    is_nf4,
    merged_state_dict,
    set_trainable_params,
)
from tests.engine.models.hf_reference import hf_model


def _randomize_adapters(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in get_adapter_params(model).items():
            if name.endswith("magnitude"):
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def test_rslora_scale_is_alpha_over_sqrt_rank():
    """rsLoRA's scale alpha / sqrt(r) (PEFT's use_rslora), LoRA's alpha / r, on linears and stacked
    experts alike; the update is the scale times B A."""
    from engine.modules.moe import GroupedExperts

    assert LoRALinear(8, 8, rank=16, alpha=8.0, use_rslora=True).scale == pytest.approx(2.0)
    assert LoRALinear(8, 8, rank=16, alpha=8.0).scale == pytest.approx(0.5)
    assert GroupedExperts(2, 8, 16, lora_rank=4, lora_alpha=8.0, use_rslora=True).scale == pytest.approx(4.0)
    layer = LoRALinear(32, 48, rank=4, alpha=8.0, use_rslora=True)
    _randomize_adapters(layer)
    x = torch.randn(3, 32)
    delta = 4.0 * (layer.lora_b.weight @ layer.lora_a.weight)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight + delta), atol=1e-5, rtol=1e-5)


def test_zero_initialised_adapter_equals_base_linear():
    torch.manual_seed(0)
    layer = LoRALinear(32, 48, rank=4, alpha=8.0, use_bias=True)
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    assert not layer.weight.requires_grad and layer.lora_a.weight.requires_grad


@pytest.mark.parametrize("use_dora", [False, True])
def test_forward_equals_dense_merged_weight(use_dora):
    torch.manual_seed(0)
    layer = LoRALinear(32, 48, rank=4, alpha=8.0, use_bias=True, use_dora=use_dora)
    _randomize_adapters(layer)
    x = torch.randn(3, 32)
    expected = F.linear(x, layer.merged_weight(), layer.bias)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "use_dora, use_rslora", [(False, False), (True, False), (False, True), (True, True)],
    ids=["lora", "dora", "rslora", "dora-rslora"],
)  # fmt: skip
def test_lora_llama_matches_peft(use_dora, use_rslora, tmp_path):
    peft = pytest.importorskip("peft")
    reference = hf_model("llama3")
    reference.save_pretrained(tmp_path / "base")
    settings = LoRASettings(
        lora_attn_modules=("q_proj", "v_proj", "output_proj"),
        apply_lora_to_mlp=True,
        lora_rank=4,
        lora_alpha=8.0,
        use_dora=use_dora,
        use_rslora=use_rslora,
    )
    ours = from_pretrained(tmp_path / "base", lora=settings)
    _randomize_adapters(ours)
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        use_dora=use_dora,
        use_rslora=use_rslora,
        target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    theirs = peft.get_peft_model(reference, config).eval()
    # PEFT names are a rename of ours: lora_a -> lora_A.default, magnitude -> lora_magnitude_vector.default
    rename = {
        "attn.": "self_attn.",
        "self_attn.output_proj": "self_attn.o_proj",
        "lora_a.weight": "lora_A.default.weight",
        "lora_b.weight": "lora_B.default.weight",
        "magnitude": "lora_magnitude_vector.default.weight",
    }
    peft_params = dict(theirs.named_parameters())
    with torch.no_grad():
        for name, p in get_adapter_params(ours).items():
            peft_name = "base_model.model.model." + name
            for a, b in rename.items():
                peft_name = peft_name.replace(a, b)
            peft_params[peft_name].copy_(p)
    tokens = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, atol=1e-5, rtol=1e-5)
        with disable_adapters(ours), theirs.disable_adapter():
            torch.testing.assert_close(ours(tokens), theirs(tokens).logits, atol=1e-5, rtol=1e-5)


def test_disable_adapters_gives_base_model_and_restores():
    torch.manual_seed(0)
    lora = lora_llama3_tiny(
        lora_attn_modules=("q_proj", "k_proj", "v_proj", "output_proj"), apply_lora_to_mlp=True
    )
    _randomize_adapters(lora)
    base = llama3_tiny()
    base.load_state_dict({k: v for k, v in lora.state_dict().items() if "lora_" not in k}, strict=True)
    tokens = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        adapted = lora(tokens)
        with disable_adapters(lora):
            torch.testing.assert_close(lora(tokens), base(tokens))
        torch.testing.assert_close(lora(tokens), adapted)
        assert (adapted - base(tokens)).abs().max() > 1e-3


@pytest.mark.parametrize("use_dora", [False, True])
def test_merged_state_dict_loads_into_plain_model_with_equal_logits(use_dora):
    torch.manual_seed(0)
    lora = lora_llama3_tiny(apply_lora_to_mlp=True, apply_lora_to_output=True, use_dora=use_dora)
    _randomize_adapters(lora)
    plain = llama3_tiny()
    plain.load_state_dict(merged_state_dict(lora), strict=True)
    tokens = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(plain(tokens), lora(tokens), atol=1e-4, rtol=1e-5)
        # output_weight of a LoRA output projection includes the adapter (for linear CE).
        torch.testing.assert_close(lora.output_weight, plain.output_weight, atol=1e-6, rtol=1e-6)


def test_adapter_param_names_and_trainable_set():
    model = lora_llama3_tiny(lora_attn_modules=("q_proj", "v_proj"), lora_rank=2)
    names = set(get_adapter_params(model))
    assert names == {
        f"layers.{i}.attn.{m}.{ab}.weight"
        for i in range(2)
        for m in ("q_proj", "v_proj")
        for ab in ("lora_a", "lora_b")
    }
    set_trainable_params(model, names)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == names
    with pytest.raises(KeyError, match="not.a.param"):
        set_trainable_params(model, ["not.a.param"])


def test_unknown_lora_module_is_a_clear_error():
    with pytest.raises(ValueError, match="lora_attn_modules: unknown module"):
        lora_llama3_tiny(lora_attn_modules=("o_proj",))


def test_qlora_base_is_nf4_and_matches_dequantised_reference():
    torch.manual_seed(0)
    layer = LoRALinear(128, 128, rank=4, alpha=8.0, quantize_base=True)
    assert is_nf4(layer.weight)
    _randomize_adapters(layer)
    x = torch.randn(2, 3, 128, requires_grad=True)
    dense = layer.weight.get_original_weight()
    expected = F.linear(x, dense) + (x @ layer.lora_a.weight.T @ layer.lora_b.weight.T) * layer.scale
    out = layer(x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert layer.lora_a.weight.grad is not None and layer.weight.grad is None


def test_qlora_from_pretrained_quantises_after_loading(tmp_path):
    reference = hf_model("llama2", hidden_size=128, intermediate_size=256)
    reference.save_pretrained(tmp_path / "base")
    settings = LoRASettings(("q_proj", "v_proj"), quantize_base=True)
    model = from_pretrained(tmp_path / "base", lora=settings)
    q = model.layers[0].attn.q_proj
    assert is_nf4(q.weight) and not q.lora_a.weight.is_meta
    tokens = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        # NF4 is lossy: compare with the model whose dense weights are the dequantised NF4 ones.
        dense = build_decoder(
            vocab_size=128, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=128,
            intermediate_dim=256, max_seq_len=128, norm_eps=1e-5,
        )  # fmt: skip
        dense.load_state_dict(merged_state_dict(model), strict=True)
        torch.testing.assert_close(model(tokens), dense(tokens), atol=1e-5, rtol=1e-5)
        close = (model(tokens) - reference(tokens).logits).abs().max()
        assert close < 0.5  # NF4 stays near the bf16/fp32 original


def test_dora_built_on_cpu_then_loaded_starts_equal_to_base(tmp_path):
    from engine.checkpoint import load_hf_weights

    hf_model("llama2").save_pretrained(tmp_path / "base")
    # Built with real (random) weights first, as a plain `_component_` would be, then loaded:
    # the DoRA magnitudes must follow the loaded weights, so the adapted model starts as the base.
    model = build_decoder(
        vocab_size=128, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=64, intermediate_dim=96,
        max_seq_len=128, norm_eps=1e-5, lora=LoRASettings(use_dora=True),
    )  # fmt: skip
    load_hf_weights(model, tmp_path / "base")
    tokens = torch.randint(0, 128, (1, 6))
    with torch.no_grad():
        with disable_adapters(model):
            base = model(tokens)
        torch.testing.assert_close(model(tokens), base, atol=1e-5, rtol=1e-5)


def test_nf4_block_sizes_fit_smollm2_shapes():
    from engine.modules.peft.lora import nf4_block_sizes, to_nf4

    assert nf4_block_sizes(4096 * 4096) == (64, 256)
    assert nf4_block_sizes(576 * 576) == (64, 64)  # 5184 scalers: 256 does not divide them
    with pytest.raises(ValueError, match="multiple of 64"):
        nf4_block_sizes(100)
    torch.manual_seed(0)
    w = torch.randn(192, 576)
    q = to_nf4(w)
    # NF4 of a unit Gaussian: mean abs error ~0.07 (QLoRA's 4-bit normal-float grid).
    assert (q.get_original_weight() - w).abs().mean() < 0.1
