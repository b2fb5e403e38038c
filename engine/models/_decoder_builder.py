"""The one assembly routine every family builder calls: plain or LoRA linears, same module tree.

Family builders (`llama3(...)`, `qwen2(...)`, ...) differ only by defaults (QKV bias, q/k norm,
RoPE schedule, tying, router knobs); LoRA builders differ only by passing `LoRASettings`. So a
family module holds only what is particular to it, a `Family` (defaults and sizes as data), and
`family_builders` makes its builder, its LoRA builder and its size presets from that, once for all.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Literal

from torch import nn

from engine.modules.attention import GroupedQueryAttention
from engine.modules.feed_forward import FeedForward
from engine.modules.moe import GroupedExperts, MoE, MoESettings
from engine.modules.peft.lora import LoRALinear
from engine.modules.rms_norm import RMSNorm
from engine.modules.rope_scaling import RopeScaling
from engine.modules.rotary import RotaryEmbedding
from engine.modules.transformer import TransformerBlock, TransformerDecoder

AttnModule = Literal["q_proj", "k_proj", "v_proj", "qkv_proj", "output_proj"]
ATTN_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "qkv_proj", "output_proj")
# The attention projections of a decoder with fused projections (Phi-3): one adapter on qkv_proj
# (PEFT's layout for Phi-3), none on q/k/v apart.
FUSED_ATTN_MODULES: tuple[str, ...] = ("qkv_proj", "output_proj")


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
    use_rslora: bool = False  # rank-stabilised scale alpha / sqrt(rank) (PEFT's use_rslora)
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
        use_rslora=lora.use_rslora,
    )


def _moe(embed_dim: int, moe: MoESettings, lora: LoRASettings | None) -> MoE:
    adapt = bool(lora and lora.apply_lora_to_experts)
    experts = GroupedExperts(
        moe.num_experts,
        embed_dim,
        moe.moe_intermediate_dim,
        lora_rank=lora.lora_rank if adapt else 0,
        lora_alpha=lora.lora_alpha if adapt else 16.0,
        use_rslora=bool(adapt and lora.use_rslora),
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
    rope_scaling: RopeScaling | None = None,
    partial_rotary_factor: float = 1.0,
    attn_bias: bool = False,
    qk_norm: bool = False,
    fused_projections: bool = False,
    tie_word_embeddings: bool = False,
    sliding_window: int | None = None,
    attn_dropout: float = 0.0,
    moe: MoESettings | None = None,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """Assemble a pre-norm GQA/SwiGLU/RMSNorm decoder (every MLP a mixture of experts with `moe`). `head_dim` defaults to embed_dim // num_heads.

    `partial_rotary_factor`: the fraction of each head that RoPE rotates (Phi-4-mini 0.75).
    `fused_projections`: one `qkv_proj` and one `gate_up_proj` per layer (Phi-3's layout and keys),
    LoRA then on `qkv_proj` / `output_proj` and, with `apply_lora_to_mlp`, `gate_up_proj` / `down_proj`.
    Raises ValueError for a size that is not a positive integer, LoRA on a tied output projection
    (the adapter would also change the input embedding), for inconsistent head counts, and for
    LoRA targets the projection layout does not have.
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
    layout = FUSED_ATTN_MODULES if fused_projections else tuple(m for m in ATTN_MODULES if m != "qkv_proj")
    if attn_targets - set(layout):
        raise ValueError(
            f"lora_attn_modules: {sorted(attn_targets - set(layout))} not in this model's attention; "
            f"choose from {list(layout)}"
            + (" (q, k and v are one fused qkv_proj)" if fused_projections else "")
        )
    rotary_dim = int(head_dim * partial_rotary_factor)
    if not 0 < partial_rotary_factor <= 1 or rotary_dim % 2:
        raise ValueError(
            f"partial_rotary_factor: {partial_rotary_factor} of head_dim {head_dim} must give an even "
            "number of rotated dimensions in (0, head_dim]"
        )
    mlp_adapted = bool(lora and lora.apply_lora_to_mlp)
    layers = []
    for _ in range(num_layers):
        q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
        if fused_projections:  # one [D -> q_dim + 2 kv_dim] projection
            qkv = dict(
                qkv_proj=_linear(embed_dim, q_dim + 2 * kv_dim, attn_bias, lora, "qkv_proj" in attn_targets)
            )
        else:
            qkv = dict(
                q_proj=_linear(embed_dim, q_dim, attn_bias, lora, "q_proj" in attn_targets),
                k_proj=_linear(embed_dim, kv_dim, attn_bias, lora, "k_proj" in attn_targets),
                v_proj=_linear(embed_dim, kv_dim, attn_bias, lora, "v_proj" in attn_targets),
            )
        attn = GroupedQueryAttention(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            **qkv,
            output_proj=_linear(q_dim, embed_dim, False, lora, "output_proj" in attn_targets),
            q_norm=RMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            k_norm=RMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            attn_dropout=attn_dropout,
        )
        if moe is not None:
            mlp = _moe(embed_dim, moe, lora)
        elif fused_projections:  # gate_up_proj [D -> 2 * hidden], gate first
            mlp = FeedForward(
                gate_up_proj=_linear(embed_dim, 2 * intermediate_dim, False, lora, mlp_adapted),
                down_proj=_linear(intermediate_dim, embed_dim, False, lora, mlp_adapted),
            )
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
        rope=RotaryEmbedding(
            head_dim, max_seq_len, base=rope_base, scaling=rope_scaling, rotary_dim=rotary_dim
        ),
        max_seq_len=max_seq_len,
        sliding_window=sliding_window,
    )


# `build_decoder` arguments no family builder takes: a family fixes them (`Family.fixed`), and `moe`
# is made from the router knobs of a mixture-of-experts family.
_NOT_ARGUMENTS = ("attn_bias", "qk_norm", "fused_projections", "moe")
# `build_decoder` arguments a family builder takes only when its family gives them a default (only
# Mistral, Mixtral and Phi-3 slide their attention window; only Phi rotates part of each head). Every family takes `rope_scaling` (default None:
# a long-context schedule of `engine.modules.rope_scaling` on any of them).
_OPTIONAL = ("sliding_window", "partial_rotary_factor")
# Router knobs of a mixture-of-experts family builder -> the `MoESettings` field each sets.
_MOE_KNOBS = {
    "num_experts": "num_experts",
    "num_experts_per_tok": "top_k",
    "norm_topk_prob": "norm_topk_prob",
    "router_aux_loss_coef": "router_aux_loss_coef",
    "router_z_loss_coef": "router_z_loss_coef",
}
# The `LoRASettings` fields a `lora_<family>` builder takes, in signature order: dense families adapt
# the MLP, mixtures of experts their experts (and may train the router).
_DENSE_LORA = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank",
               "lora_alpha", "lora_dropout", "quantize_base", "use_dora", "use_rslora")  # fmt: skip
_MOE_LORA = ("lora_attn_modules", "apply_lora_to_experts", "train_router", "apply_lora_to_output",
             "lora_rank", "lora_alpha", "lora_dropout", "quantize_base", "use_dora", "use_rslora")  # fmt: skip


@dataclass(frozen=True)
class Family:
    """What makes one decoder family particular, as data; `family_builders` makes its functions.

    name: the family builder's name and its presets' prefix (`llama3`, `lora_llama3`, `llama3_8b`).
    module: the family module's `__name__`, so `_component_` paths and cards name that module.
    doc: the family builder's docstring.
    defaults: the family's defaults for `build_decoder` arguments, which become keyword defaults of
        its builder; `sliding_window` is an argument only where given here.
    sizes: preset name -> builder arguments; each is a zero-argument `<name>()`, a `lora_<name>` and
        (see `qlora`) a `qlora_<name>` whose arguments default to these sizes.
    fixed: `build_decoder` arguments the family always sets and does not take (Qwen2's `attn_bias`).
    moe: for a mixture of experts, its router knobs (keys of `_MOE_KNOBS`) and their defaults; the
        builder then makes every MLP a mixture (`norm_topk_prob` is True where not a knob).
    expert_dim: the name the builder gives `intermediate_dim` (Qwen3-MoE: `moe_intermediate_dim`).
    qlora: the sizes with a QLoRA preset; None is every size but the `_tiny` test ones.
    """

    name: str
    module: str
    doc: str
    defaults: dict
    sizes: dict[str, dict]
    fixed: dict = dataclasses.field(default_factory=dict)
    moe: dict | None = None
    expert_dim: str = "intermediate_dim"
    qlora: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        known = inspect.signature(build_decoder).parameters
        unknown = [k for k in self.defaults if k not in known or k in _NOT_ARGUMENTS or k == "lora"]
        unknown += [k for k in self.fixed if k not in known or k == "lora"]
        unknown += [k for k in self.moe or {} if k not in _MOE_KNOBS]
        if unknown:
            raise ValueError(
                f"Family {self.name}: {unknown} cannot be set here; defaults and fixed take build_decoder "
                f"arguments (attn_bias, qk_norm only as fixed), moe the router knobs {list(_MOE_KNOBS)}"
            )


def _named(fn, name: str, module: str, doc: str, signature: inspect.Signature):
    """`fn` under `module.name` (how `_component_` paths and model cards find it), with `signature`
    (what config validation checks keys and types against)."""
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = module
    fn.__doc__ = doc
    fn.__signature__ = signature
    return fn


def _model_builder(family: Family):
    """`<family>(**sizes)`: `build_decoder` with the family's defaults, fixed arguments and router knobs."""
    params = []
    for name, p in inspect.signature(build_decoder).parameters.items():
        if (
            name in _NOT_ARGUMENTS
            or name in family.fixed
            or (name in _OPTIONAL and name not in family.defaults)
        ):
            continue
        if name in family.defaults:
            p = p.replace(default=family.defaults[name])
        if name != "intermediate_dim":
            params.append(p)
            continue
        params.append(p.replace(name=family.expert_dim))
        types = {f.name: f.type for f in dataclasses.fields(MoESettings)}
        kw = inspect.Parameter.KEYWORD_ONLY
        params += [
            inspect.Parameter(k, kw, default=v, annotation=types[_MOE_KNOBS[k]])
            for k, v in (family.moe or {}).items()
        ]
    signature = inspect.Signature(params, return_annotation=TransformerDecoder)

    def builder(**kwargs) -> TransformerDecoder:
        try:
            bound = signature.bind(**kwargs)
        except TypeError as exc:
            raise TypeError(f"{family.name}(): {exc}") from None
        bound.apply_defaults()
        args = dict(bound.arguments)
        args["intermediate_dim"] = args.pop(family.expert_dim)
        if family.moe is not None:
            knobs = {_MOE_KNOBS[k]: args.pop(k) for k in family.moe}
            args["moe"] = MoESettings(
                moe_intermediate_dim=args["intermediate_dim"], naming=family.name, **knobs
            )
        return build_decoder(**args, **family.fixed)

    return _named(builder, family.name, family.module, family.doc, signature)


def _lora_builder(model_builder, family: Family):
    """`lora_<family>(*, <LoRA knobs>, **model_kwargs)`, with `model_kwargs` spelled out in its
    signature from `model_builder`, so config validation checks the forwarded keys too."""
    knobs = _MOE_LORA if family.moe is not None else _DENSE_LORA
    settings = {f.name: f for f in dataclasses.fields(LoRASettings)}
    defaults = {k: settings[k].default for k in knobs}
    if family.fixed.get("fused_projections"):  # q, k, v are one projection: adapt it
        defaults["lora_attn_modules"] = ("qkv_proj",)
    own = [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=defaults[k], annotation=settings[k].type)
        for k in knobs
    ]
    forwarded = [p for n, p in inspect.signature(model_builder).parameters.items() if n != "lora"]
    signature = inspect.Signature(own + forwarded, return_annotation=TransformerDecoder)

    def lora_builder(**kwargs) -> TransformerDecoder:
        lora = {k: kwargs.pop(k) for k in knobs if k in kwargs}
        lora["lora_attn_modules"] = tuple(lora.get("lora_attn_modules", defaults["lora_attn_modules"]))
        return model_builder(**kwargs, lora=LoRASettings(**lora))

    if family.moe is None:
        doc = f"`{family.name}(**model_kwargs)` with LoRA/DoRA adapters (QLoRA when `quantize_base`)."
    else:
        doc = (
            f"`{family.name}(**model_kwargs)` with LoRA/DoRA adapters on attention and, by choice, on every "
            "expert (stacked per expert); `train_router` trains the router with them (frozen otherwise); "
            "QLoRA when `quantize_base` (NF4 attention; the experts stay in the base dtype)."
        )
    return _named(lora_builder, f"lora_{family.name}", family.module, doc, signature)


def _size_preset(builder, size: str, module: str, sizes: dict):
    """`<size>()`: the family builder with one preset's sizes, no arguments."""

    def preset() -> TransformerDecoder:
        return builder(**sizes)

    doc = f"`{builder.__name__}` with the `{size}` sizes."
    return _named(preset, size, module, doc, inspect.Signature(return_annotation=TransformerDecoder))


def _lora_preset(lora_builder, name: str, size: str, module: str, preset_kwargs: dict):
    """A named LoRA/QLoRA size preset: `lora_builder` with `preset_kwargs` as overridable defaults
    (its signature shows them, so config validation checks keys and types)."""

    def preset(**kwargs) -> TransformerDecoder:
        return lora_builder(**{**preset_kwargs, **kwargs})

    params = [
        p.replace(default=preset_kwargs[n]) if n in preset_kwargs else p
        for n, p in inspect.signature(lora_builder).parameters.items()
    ]
    doc = f"`{lora_builder.__name__}` with the `{size}` sizes" + (
        " and an NF4 base (QLoRA)." if preset_kwargs.get("quantize_base") else "."
    )
    return _named(preset, name, module, doc, inspect.Signature(params, return_annotation=TransformerDecoder))


def family_builders(family: Family) -> dict:
    """Every function of `family`, by name: the family builder `<name>(**sizes)`, `lora_<name>`, and
    for each size `<size>()`, `lora_<size>(**overrides)` and (see `Family.qlora`) `qlora_<size>`.

    A family module publishes them with `globals().update(family_builders(FAMILY))`; they are real
    functions of that module (not `functools.partial`s), so `_component_` paths resolve there.
    """
    model = _model_builder(family)
    lora = _lora_builder(model, family)
    built = {model.__name__: model, lora.__name__: lora}
    qlora = family.qlora if family.qlora is not None else [s for s in family.sizes if not s.endswith("_tiny")]
    for size, sizes in family.sizes.items():
        built[size] = _size_preset(model, size, family.module, sizes)
        built[f"lora_{size}"] = _lora_preset(lora, f"lora_{size}", size, family.module, sizes)
        if size in qlora:
            qlora_kwargs = {**sizes, "quantize_base": True}
            built[f"qlora_{size}"] = _lora_preset(lora, f"qlora_{size}", size, family.module, qlora_kwargs)
    return built
