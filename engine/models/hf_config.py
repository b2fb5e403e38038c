"""`config.json` of a Hugging Face model <-> arguments of `build_decoder`.

Supported architectures: LlamaForCausalLM (Llama 2/3.x, SmolLM2), Qwen2ForCausalLM (Qwen2/2.5),
Qwen3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM (Phi-3/3.5/4: fused qkv_proj and gate_up_proj,
LongRoPE, partial rotary), and the mixtures of experts Qwen3MoeForCausalLM and
MixtralForCausalLM (their `moe` argument). Reads both the transformers 4 (`rope_theta`,
`rope_scaling`) and 5 (`rope_parameters`) spellings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from engine.checkpoint.checkpoint_errors import CheckpointError
from engine.modules.moe import MoESettings, moe_layers
from engine.modules.rope_scaling import (
    RopeScaling,
    from_rope_parameters,
    hf_max_position_embeddings,
    model_max_seq_len,
    to_rope_parameters,
)

ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "Phi3ForCausalLM": "phi3",
}
MOE_FAMILIES = ("qwen3_moe", "mixtral")
_MODEL_TYPES = {v: k for k, v in ARCHITECTURES.items()}
# Reward models: the same decoders with a scalar `score` head (engine.modules.score_decoder).
SEQUENCE_CLASSIFIERS: dict[str, str] = {
    arch.replace("ForCausalLM", "ForSequenceClassification"): family for arch, family in ARCHITECTURES.items()
}
ARCHITECTURES.update(SEQUENCE_CLASSIFIERS)


def num_labels_of(config: dict) -> int | None:
    """The head size of a `*ForSequenceClassification` config (`num_labels`, else `id2label`); None
    for a causal LM."""
    if not any(a in SEQUENCE_CLASSIFIERS for a in config.get("architectures") or []):
        return None
    if config.get("num_labels") is not None:
        return int(config["num_labels"])
    return len(config.get("id2label") or {0: "LABEL_0", 1: "LABEL_1"})


def read_hf_config(model_dir: str | os.PathLike) -> dict:
    """The parsed `config.json` of `model_dir`. Raises CheckpointError when absent or not JSON."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; a Hugging Face model folder needs its config.json")
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}); re-download it") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object; re-download it")
    return config


def family_of(config: dict, source: str = "config.json") -> str:
    """`llama`, `qwen2`, `qwen3`, `mistral`, `qwen3_moe` or `mixtral`. Raises CheckpointError for anything else."""
    archs = config.get("architectures") or []
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    if config.get("model_type") in _MODEL_TYPES:
        return config["model_type"]
    found = archs[0] if archs else config.get("model_type", "nothing")
    raise CheckpointError(
        f"{source}: architecture {found} is not supported; supported: {', '.join(ARCHITECTURES)}"
    )


def _partial_rotary_factor(config: dict, family: str, source: str) -> float:
    """Phi's `partial_rotary_factor` (top level, or in the rope block as transformers 5 writes it)."""
    params = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    factor = float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) or 1.0)
    if factor != 1.0 and family != "phi3":
        raise CheckpointError(f"{source}: partial_rotary_factor={factor} is supported for Phi-3 only")
    return factor


def _rope(config: dict, source: str, head_dim: int, family: str = "") -> tuple[float, RopeScaling | None]:
    """RoPE theta and schedule from `rope_parameters` (transformers 5) over `rope_scaling` (4)."""
    params = dict(config.get("rope_parameters") or {})
    legacy = config.get("rope_scaling") or {}
    params = {**legacy, **params}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    if family == "phi3" and params.get("rope_type", params.get("type")) in ("su", "yarn"):
        params["rope_type"] = "longrope"  # early Phi-3 configs' names for it (transformers maps them too)
    try:
        scaling = from_rope_parameters(
            params,
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            rotary_dim=head_dim,
            original_max_position_embeddings=config.get("original_max_position_embeddings"),
        )
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}; fix config.json") from None
    return float(theta), scaling


def decoder_kwargs(config: dict, source: str = "config.json") -> dict:
    """Keyword arguments of `engine.models._decoder_builder.build_decoder` for `config`.

    Raises CheckpointError naming the config field that is missing or unsupported.
    """
    family = family_of(config, source)
    try:
        if config.get("hidden_act", "silu") != "silu":
            raise CheckpointError(
                f"{source}: hidden_act {config['hidden_act']!r} is not supported; only silu"
            )
        if config.get("mlp_bias"):
            raise CheckpointError(f"{source}: mlp_bias=true is not supported")
        if family == "qwen2" and config.get("use_sliding_window"):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported for Qwen2")
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        partial = _partial_rotary_factor(config, family, source)
        rope_base, rope_scaling = _rope(config, source, int(head_dim * partial), family)
        max_positions = int(config.get("max_position_embeddings", 4096))
        moe = _moe_settings(config, family, source)
        return dict(
            vocab_size=int(config["vocab_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            embed_dim=int(config["hidden_size"]),
            intermediate_dim=moe.moe_intermediate_dim if moe else int(config["intermediate_size"]),
            max_seq_len=model_max_seq_len(rope_scaling, max_positions),
            head_dim=head_dim,
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_base=rope_base,
            rope_scaling=rope_scaling,
            attn_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
            qk_norm=family in ("qwen3", "qwen3_moe"),
            fused_projections=family == "phi3",
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            sliding_window=config.get("sliding_window") if family in ("mistral", "mixtral", "phi3") else None,
            moe=moe,
            **({"partial_rotary_factor": partial} if partial != 1.0 else {}),
        )
    except KeyError as exc:
        raise CheckpointError(f"{source}: field {exc.args[0]} is missing; re-download config.json") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: a size field is not a number ({exc}); fix config.json") from None


def _moe_settings(config: dict, family: str, source: str) -> MoESettings | None:
    if family not in MOE_FAMILIES:
        return None
    if family == "qwen3_moe":
        if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1)) != 1:
            raise CheckpointError(
                f"{source}: dense layers among the experts (mlp_only_layers / decoder_sparse_step) are "
                "not supported; every layer must be a mixture of experts"
            )
        if config.get("use_sliding_window"):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported for Qwen3-MoE")
    elif float(config.get("router_jitter_noise") or 0.0) != 0.0:
        raise CheckpointError(f"{source}: router_jitter_noise is not supported; set it to 0.0")
    experts = config.get("num_experts", config.get("num_local_experts"))
    if experts is None:
        raise KeyError("num_experts")
    hidden = config["moe_intermediate_size"] if family == "qwen3_moe" else config["intermediate_size"]
    try:
        return MoESettings(
            num_experts=int(experts),
            top_k=int(config["num_experts_per_tok"]),
            moe_intermediate_dim=int(hidden),
            norm_topk_prob=bool(config.get("norm_topk_prob", True)) if family == "qwen3_moe" else True,
            router_aux_loss_coef=float(config.get("router_aux_loss_coef", 0.001)),
            naming=family,
        )
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def torch_dtype_of(config: dict) -> torch.dtype | None:
    """The dtype config.json declares (`dtype` or `torch_dtype`), or None."""
    name = config.get("dtype") or config.get("torch_dtype")
    value = getattr(torch, str(name), None) if name else None
    return value if isinstance(value, torch.dtype) else None


def hf_config_from_model(model: nn.Module, dtype: torch.dtype | None = None) -> dict:
    """A transformers-loadable `config.json` dict describing a native decoder."""
    attn = model.layers[0].attn
    q_proj = attn.q_proj
    has_bias = getattr(q_proj, "bias", None) is not None
    qk_norm = attn.q_norm is not None
    moe = moe_layers(model)
    if attn.qkv_proj is not None:
        family = "phi3"
    elif moe:
        family = moe[0].settings.naming
    elif qk_norm:
        family = "qwen3"
    elif has_bias:
        family = "qwen2"
    elif model.sliding_window is not None:
        family = "mistral"
    else:
        family = "llama"
    rope = model.rope
    rope_parameters = to_rope_parameters(rope.scaling, rope.base)
    vocab, dim = model.tok_embeddings.weight.shape
    dtype = dtype or model.tok_embeddings.weight.dtype
    config = {
        "architectures": [_MODEL_TYPES[family]],
        "model_type": family,
        "vocab_size": int(vocab),
        "hidden_size": int(dim),
        # An all-sparse Qwen3-MoE never uses its dense size; experts x k is what the presets declare.
        "intermediate_size": int(
            model.layers[0].mlp.hidden_dim
            if not moe
            else moe[0].settings.moe_intermediate_dim * moe[0].settings.top_k
        ),
        "num_hidden_layers": len(model.layers),
        "num_attention_heads": attn.num_heads,
        "num_key_value_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim,
        "max_position_embeddings": hf_max_position_embeddings(rope.scaling, model.max_seq_len),
        "rms_norm_eps": model.norm.eps,
        "hidden_act": "silu",
        "tie_word_embeddings": model.tied,
        "rope_theta": rope.base,
        "rope_scaling": None if rope.scaling is None else rope_parameters,
        "rope_parameters": rope_parameters,
        "attention_bias": has_bias,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if hasattr(model, "score"):  # a reward / value model
        labels = int(model.score.weight.shape[0])
        config["architectures"] = [_MODEL_TYPES[family].replace("ForCausalLM", "ForSequenceClassification")]
        config["num_labels"] = labels
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    if family in ("mistral", "mixtral", "phi3"):
        config["sliding_window"] = model.sliding_window
    if family == "phi3":  # transformers' Phi-3 reads these top-level fields over the rope block's
        config["original_max_position_embeddings"] = rope_parameters.get(
            "original_max_position_embeddings", config["max_position_embeddings"]
        )
        config["partial_rotary_factor"] = rope.rotary_dim / rope.head_dim
        rope_parameters["partial_rotary_factor"] = rope.rotary_dim / rope.head_dim
    if moe:
        settings = moe[0].settings
        config["num_experts_per_tok"] = settings.top_k
        config["router_aux_loss_coef"] = settings.router_aux_loss_coef
        config["output_router_logits"] = False
        if family == "mixtral":
            config["num_local_experts"] = settings.num_experts
            config["intermediate_size"] = settings.moe_intermediate_dim
            config["router_jitter_noise"] = 0.0
        else:
            config["num_experts"] = settings.num_experts
            config["moe_intermediate_size"] = settings.moe_intermediate_dim
            config["norm_topk_prob"] = settings.norm_topk_prob
            config["decoder_sparse_step"] = 1
            config["mlp_only_layers"] = []
            config["use_sliding_window"] = False
    if family == "qwen2":
        config["use_sliding_window"] = False
    return config
