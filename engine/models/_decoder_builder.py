"""The one assembly routine every family builder calls: plain or LoRA linears, same module tree.

Family builders (`llama3(...)`, `qwen2(...)`, ...) differ only by defaults (QKV bias, q/k norm,
RoPE schedule, tying); LoRA builders differ only by passing `LoRASettings`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

from torch import nn

from engine.modules.attention import GroupedQueryAttention
from engine.modules.feed_forward import FeedForward
from engine.modules.moe import GroupedExperts, MoE, MoESettings
from engine.modules.peft.lora import LoRALinear
from engine.modules.rms_norm import RMSNorm
from engine.modules.rotary import Llama3RopeScaling, RotaryEmbedding
from engine.modules.transformer import TransformerBlock, TransformerDecoder

AttnModule = Literal["q_proj", "k_proj", "v_proj", "output_proj"]
ATTN_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "output_proj")


@dataclass(frozen=True)
class LoRASettings:
    """Where adapters go and how big they are (see `engine.modules.peft.LoRALinear`)."""

    lora_attn_modules: tuple[str, ...] = ("q_proj", "v_proj")
    apply_lora_to_mlp: bool = False
    apply_lora_to_output: bool = False
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    quantize_base: bool = False
    use_dora: bool = False
    apply_lora_to_experts: bool = False  # MoE: stacked adapters per expert (experts' base frozen)
    train_router: bool = False  # MoE: the router trains with the adapters

    def __post_init__(self) -> None:
        mods = self.lora_attn_modules
        if isinstance(mods, str) or (mods and all(isinstance(m, str) and len(m) == 1 for m in mods)):
            raise ValueError(
                f"lora_attn_modules: give a list such as [q_proj, v_proj], not the string {''.join(mods)!r}"
            )
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 1:
            raise ValueError(f"lora_rank: must be a positive integer, got {self.lora_rank!r}")
        unknown = [m for m in self.lora_attn_modules if m not in ATTN_MODULES]
        if unknown:
            raise ValueError(
                f"lora_attn_modules: unknown module(s) {unknown}; choose from {list(ATTN_MODULES)}"
            )


def _linear(in_dim: int, out_dim: int, bias: bool, lora: LoRASettings | None, adapt: bool) -> nn.Module:
    if lora is None or not adapt:
        return nn.Linear(in_dim, out_dim, bias=bias)
    return LoRALinear(
        in_dim,
        out_dim,
        rank=lora.lora_rank,
        alpha=lora.lora_alpha,
        dropout=lora.lora_dropout,
        use_bias=bias,
        quantize_base=lora.quantize_base,
        use_dora=lora.use_dora,
    )


def _moe(embed_dim: int, moe: MoESettings, lora: LoRASettings | None) -> MoE:
    adapt = bool(lora and lora.apply_lora_to_experts)
    experts = GroupedExperts(
        moe.num_experts,
        embed_dim,
        moe.moe_intermediate_dim,
        lora_rank=lora.lora_rank if adapt else 0,
        lora_alpha=lora.lora_alpha if adapt else 16.0,
    )
    block = MoE(router=nn.Linear(embed_dim, moe.num_experts, bias=False), experts=experts, settings=moe)
    block.router_trainable = bool(lora and lora.train_router)  # trains with the adapters
    return block


def build_decoder(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: int | None = None,
    norm_eps: float = 1e-5,
    rope_base: float = 10000.0,
    rope_scaling: Llama3RopeScaling | None = None,
    attn_bias: bool = False,
    qk_norm: bool = False,
    tie_word_embeddings: bool = False,
    sliding_window: int | None = None,
    attn_dropout: float = 0.0,
    moe: MoESettings | None = None,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """Assemble a pre-norm GQA/SwiGLU/RMSNorm decoder (every MLP a mixture of experts with `moe`). `head_dim` defaults to embed_dim // num_heads.

    Raises ValueError for a size that is not a positive integer, LoRA on a tied output projection
    (the adapter would also change the input embedding) and for inconsistent head counts.
    """
    sizes = dict(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
    )
    if head_dim is not None:
        sizes["head_dim"] = head_dim
    for field, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}: must be a positive integer, got {value!r}")
    if head_dim is None and embed_dim % num_heads:
        raise ValueError(
            f"embed_dim ({embed_dim}) must be a multiple of num_heads ({num_heads}), or set head_dim"
        )
    head_dim = head_dim or embed_dim // num_heads
    if lora is not None and lora.apply_lora_to_output and tie_word_embeddings:
        raise ValueError("apply_lora_to_output needs an untied output projection; set it to False")
    attn_targets = set(lora.lora_attn_modules) if lora else set()
    mlp_adapted = bool(lora and lora.apply_lora_to_mlp)
    layers = []
    for _ in range(num_layers):
        attn = GroupedQueryAttention(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=_linear(embed_dim, num_heads * head_dim, attn_bias, lora, "q_proj" in attn_targets),
            k_proj=_linear(embed_dim, num_kv_heads * head_dim, attn_bias, lora, "k_proj" in attn_targets),
            v_proj=_linear(embed_dim, num_kv_heads * head_dim, attn_bias, lora, "v_proj" in attn_targets),
            output_proj=_linear(num_heads * head_dim, embed_dim, False, lora, "output_proj" in attn_targets),
            q_norm=RMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            k_norm=RMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            attn_dropout=attn_dropout,
        )
        if moe is not None:
            mlp = _moe(embed_dim, moe, lora)
        else:
            mlp = FeedForward(
                gate_proj=_linear(embed_dim, intermediate_dim, False, lora, mlp_adapted),
                up_proj=_linear(embed_dim, intermediate_dim, False, lora, mlp_adapted),
                down_proj=_linear(intermediate_dim, embed_dim, False, lora, mlp_adapted),
            )
        layers.append(
            TransformerBlock(
                attn=attn,
                mlp=mlp,
                sa_norm=RMSNorm(embed_dim, eps=norm_eps),
                mlp_norm=RMSNorm(embed_dim, eps=norm_eps),
            )
        )
    output = None
    if not tie_word_embeddings:
        output = _linear(embed_dim, vocab_size, False, lora, bool(lora and lora.apply_lora_to_output))
    return TransformerDecoder(
        tok_embeddings=nn.Embedding(vocab_size, embed_dim),
        layers=layers,
        norm=RMSNorm(embed_dim, eps=norm_eps),
        output=output,
        rope=RotaryEmbedding(head_dim, max_seq_len, base=rope_base, scaling=rope_scaling),
        max_seq_len=max_seq_len,
        sliding_window=sliding_window,
    )


def forward_signature(lora_builder, model_builder) -> inspect.Signature:
    """The signature of `lora_builder(*, <LoRA args>, **model_kwargs)` with `model_kwargs` spelled
    out from `model_builder`, so config validation checks forwarded keys (set as `__signature__`)."""
    own = [p for p in inspect.signature(lora_builder).parameters.values() if p.kind is not p.VAR_KEYWORD]
    forwarded = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for name, p in inspect.signature(model_builder).parameters.items()
        if name != "lora"
    ]
    return inspect.Signature(own + forwarded, return_annotation=TransformerDecoder)


def lora_preset(lora_builder, name: str, module: str, **preset_kwargs):
    """A named LoRA/QLoRA size preset: `lora_builder` with `preset_kwargs` as overridable defaults.

    A real function (not a `functools.partial`) so `_component_` paths resolve inside `engine`, with a
    `__signature__` whose defaults are the preset's, so config validation checks keys and types.
    """

    def preset(**kwargs) -> TransformerDecoder:
        return lora_builder(**{**preset_kwargs, **kwargs})

    params = [
        p.replace(default=preset_kwargs[n]) if n in preset_kwargs else p
        for n, p in inspect.signature(lora_builder).parameters.items()
    ]
    preset.__signature__ = inspect.Signature(params, return_annotation=TransformerDecoder)
    preset.__name__ = preset.__qualname__ = name
    preset.__module__ = module
    preset.__doc__ = f"`{lora_builder.__name__}` with the `{name.split('_', 1)[1]}` sizes" + (
        " and an NF4 base (QLoRA)." if preset_kwargs.get("quantize_base") else "."
    )
    return preset


def moe_lora_builder(model_builder, name: str, module: str):
    """`lora_<family>` of a mixture-of-experts family: `model_builder(**model_kwargs)` with LoRA/DoRA
    adapters on attention and, by choice, on every expert (stacked per expert, `apply_lora_to_experts`);
    `train_router` trains the router with them (frozen otherwise); QLoRA when `quantize_base`."""

    def lora_builder(
        *,
        lora_attn_modules: tuple[str, ...] = ("q_proj", "v_proj"),
        apply_lora_to_experts: bool = False,
        train_router: bool = False,
        apply_lora_to_output: bool = False,
        lora_rank: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.0,
        quantize_base: bool = False,
        use_dora: bool = False,
        **model_kwargs,
    ) -> TransformerDecoder:
        lora = LoRASettings(
            tuple(lora_attn_modules), False, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout,
            quantize_base, use_dora, apply_lora_to_experts, train_router,
        )  # fmt: skip
        return model_builder(**model_kwargs, lora=lora)

    lora_builder.__signature__ = forward_signature(lora_builder, model_builder)
    lora_builder.__name__ = lora_builder.__qualname__ = name
    lora_builder.__module__ = module
    lora_builder.__doc__ = (
        f"`{model_builder.__name__}(**model_kwargs)` with LoRA adapters on attention and, by choice, on "
        "every expert (stacked per expert); `train_router` trains the router with them (frozen otherwise)."
    )
    return lora_builder
