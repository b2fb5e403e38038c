"""Hugging Face <-> native parameter names, as plain data.

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
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.output_proj.weight",
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attn.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attn.k_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.mlp.gate_proj.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.mlp.up_proj.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.mlp.down_proj.weight",
}
NATIVE_TO_HF: dict[str, str] = {v: k for k, v in HF_TO_NATIVE.items()}

# Keys some checkpoints carry that hold no weights (recomputed from the config).
HF_IGNORED: tuple[str, ...] = ("model.layers.{}.self_attn.rotary_emb.inv_freq",)

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


def hf_to_native(key: str) -> str | None:
    """The native name of HF key `key`, or None when it has no native counterpart."""
    return _rename(key, HF_TO_NATIVE)


def native_to_hf(key: str) -> str | None:
    """The HF name of native key `key`, or None (adapter parameters, for instance)."""
    return _rename(key, NATIVE_TO_HF)


def is_ignored_hf_key(key: str) -> bool:
    return _template(key)[0] in HF_IGNORED
