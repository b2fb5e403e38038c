"""Hugging Face <-> native parameter names, as plain data.

Mixtures of experts (`naming` `qwen3_moe` or `mixtral`): the router is `layers.{}.mlp.router.weight`
and each layer's experts are three stacked tensors `layers.{}.mlp.experts.<proj>` `[E, out, in]`,
while HF folders hold one key per expert (`model.layers.{}.mlp.experts.{e}.gate_proj.weight`,
Mixtral `model.layers.{}.block_sparse_moe.experts.{e}.w1.weight`); `hf_expert_to_native` and
`native_expert_to_hf` map between a per-expert key and (stacked name, expert index).

Native names are what `engine.models` builders produce (`layers.3.attn.q_proj.weight`); LoRA
models keep the same names for their frozen base weights, so one table serves both. `{}` stands
for the layer index.
"""

from __future__ import annotations

import re

HF_TO_NATIVE: dict[str, str] = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    "score.weight": "score.weight",  # *ForSequenceClassification head (engine.modules.score_decoder)
    "model.layers.{}.input_layernorm.weight": "layers.{}.sa_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.mlp_norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.layers.{}.self_attn.q_proj.bias": "layers.{}.attn.q_proj.bias",
    "model.layers.{}.self_attn.k_proj.bias": "layers.{}.attn.k_proj.bias",
    "model.layers.{}.self_attn.v_proj.bias": "layers.{}.attn.v_proj.bias",
    "model.layers.{}.self_attn.qkv_proj.weight": "layers.{}.attn.qkv_proj.weight",  # Phi-3: q, k, v fused
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.output_proj.weight",
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attn.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attn.k_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.mlp.gate_proj.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.mlp.up_proj.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.mlp.down_proj.weight",
    "model.layers.{}.mlp.gate_up_proj.weight": "layers.{}.mlp.gate_up_proj.weight",  # Phi-3: gate, up fused
}
NATIVE_TO_HF: dict[str, str] = {v: k for k, v in HF_TO_NATIVE.items()}

# Keys some checkpoints carry that hold no weights (recomputed from the config).
HF_IGNORED: tuple[str, ...] = ("model.layers.{}.self_attn.rotary_emb.inv_freq",)

# naming -> (HF module of the MoE block, {native projection: HF projection})
MOE_NAMING: dict[str, tuple[str, dict[str, str]]] = {
    "qwen3_moe": ("mlp", {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}),
    "mixtral": ("block_sparse_moe", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}),
}
_NATIVE_EXPERT = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(gate_proj|up_proj|down_proj)$")
_NATIVE_ROUTER = re.compile(r"^layers\.(\d+)\.mlp\.router\.weight$")

_LAYER = re.compile(r"\.(\d+)\.")


def _template(key: str) -> tuple[str, str | None]:
    match = _LAYER.search(key)
    if match is None:
        return key, None
    return key[: match.start()] + ".{}." + key[match.end() :], match.group(1)


def _rename(key: str, table: dict[str, str]) -> str | None:
    template, layer = _template(key)
    target = table.get(template)
    if target is None:
        return None
    return target if layer is None else target.format(layer)


def _expert_pattern(naming: str) -> re.Pattern:
    module, projs = MOE_NAMING[naming]
    names = "|".join(projs.values())
    return re.compile(rf"^model\.layers\.(\d+)\.{module}\.experts\.(\d+)\.({names})\.weight$")


def hf_to_native(key: str, naming: str | None = None) -> str | None:
    """The native name of HF key `key`, or None when it has no native counterpart (per-expert keys:
    see `hf_expert_to_native`). `naming`: the MoE spelling of the model, None for dense models."""
    if naming is not None:
        match = re.match(rf"^model\.layers\.(\d+)\.{MOE_NAMING[naming][0]}\.gate\.weight$", key)
        if match:
            return f"layers.{match.group(1)}.mlp.router.weight"
    return _rename(key, HF_TO_NATIVE)


def native_to_hf(key: str, naming: str | None = None) -> str | None:
    """The HF name of native key `key`, or None (adapter parameters, stacked experts)."""
    match = _NATIVE_ROUTER.match(key)
    if match and naming is not None:
        return f"model.layers.{match.group(1)}.{MOE_NAMING[naming][0]}.gate.weight"
    return _rename(key, NATIVE_TO_HF)


def hf_expert_to_native(key: str, naming: str | None) -> tuple[str, int] | None:
    """`(stacked native name, expert index)` of a per-expert HF key, or None for any other key."""
    if naming is None:
        return None
    match = _expert_pattern(naming).match(key)
    if match is None:
        return None
    layer, expert, hf_proj = match.groups()
    native_proj = {v: k for k, v in MOE_NAMING[naming][1].items()}[hf_proj]
    return f"layers.{layer}.mlp.experts.{native_proj}", int(expert)


def native_expert_to_hf(key: str, expert: int, naming: str | None) -> str | None:
    """The HF key of expert `expert` of stacked native tensor `key`, or None if `key` is not one."""
    match = _NATIVE_EXPERT.match(key)
    if match is None or naming is None:
        return None
    module, projs = MOE_NAMING[naming]
    return f"model.layers.{match.group(1)}.{module}.experts.{expert}.{projs[match.group(2)]}.weight"


def is_ignored_hf_key(key: str) -> bool:
    return _template(key)[0] in HF_IGNORED
