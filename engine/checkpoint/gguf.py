"""GGUF import: a `.gguf` file (llama.cpp's format) into a Hugging Face folder, for the architectures
`llama` (Llama 2/3, SmolLM2, Mistral; Mixtral when `llama.expert_count` is set), `qwen2` (Qwen2/2.5,
q/k/v biases), `qwen3` (per-head q/k RMSNorms) and `qwen3moe` (Qwen3-MoE: router + stacked experts).

    ckpt = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")       # config, weights, tokenizer in memory
    out = convert_gguf_to_hf("model.gguf", "models/smollm2")   # config.json + model.safetensors + tokenizer
    model = engine.models.from_pretrained(out)

What the conversion undoes:
- quantisation: every tensor is dequantised by the `gguf` package (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
  and the K-quants it knows) to float32;
- llama.cpp's Q/K row permutation (llama architecture only): its converter reorders the rows of
  `q_proj`/`k_proj` from HF's "rotate halves" RoPE layout to the interleaved-pairs layout; we apply
  the inverse. The Qwen architectures keep HF's order (llama.cpp runs them with NeoX-style RoPE);
- stacked experts: `blk.N.ffn_{gate,up,down}_exps` `[E, out, in]` are split into HF's per-expert keys;
- the tokenizer: a GPT-2 style byte-level BPE is rebuilt from `tokenizer.ggml.tokens/merges/token_type`
  and its pre-tokenizer from `tokenizer.ggml.pre`; a SentencePiece BPE (`llama`: Llama 2, Mistral) from
  the tokens and their scores (merges derived from the scores, byte fallback); the chat template comes
  from `tokenizer.chat_template`.

Quantised weights only approximate the original model (Q4 keeps ~4.5 bits per weight).

Why over 500 lines: one file format's reader, kept together: the architecture tables, the weight
import and the tokenizer rebuilt from the same metadata (`gguf_export` writes the inverse of each).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.checkpoint.checkpoint_errors import CheckpointError


class GGUFError(CheckpointError):
    """A GGUF file that cannot be imported: names the file (and tensor/key) and what to do."""


# llama.cpp tensor names -> Hugging Face names of the dense tensors (every architecture). `{}` is the
# layer index. Qwen2 adds the q/k/v biases, Qwen3 the per-head q/k RMSNorms; a llama file has neither.
GGUF_TO_HF: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.attn_q.bias": "model.layers.{}.self_attn.q_proj.bias",
    "blk.{}.attn_k.bias": "model.layers.{}.self_attn.k_proj.bias",
    "blk.{}.attn_v.bias": "model.layers.{}.self_attn.v_proj.bias",
    "blk.{}.attn_q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",
    "blk.{}.attn_k_norm.weight": "model.layers.{}.self_attn.k_norm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}
# Mixtures of experts: the router `blk.{}.ffn_gate_inp.weight` `[E, D]` and the experts stored stacked
# `[E, out, in]` (native projection names here); HF keeps one key per expert, spelled per family
# (`engine.checkpoint.hf_keys.MOE_NAMING`: Mixtral `block_sparse_moe.experts.{e}.w1`, Qwen3-MoE
# `mlp.experts.{e}.gate_proj`).
GGUF_ROUTER = "ffn_gate_inp.weight"
GGUF_EXPERTS: dict[str, str] = {
    "ffn_gate_exps.weight": "gate_proj",
    "ffn_up_exps.weight": "up_proj",
    "ffn_down_exps.weight": "down_proj",
}


@dataclass(frozen=True)
class GGUFArch:
    """How one llama.cpp architecture maps to a Hugging Face family.

    family: HF `model_type` (Mixtral is llama.cpp's `llama` with `expert_count`, see `_family`).
    architecture: HF `architectures[0]`. permute_qk: llama.cpp reorders the Q/K rows (its llama
    RoPE rotates interleaved pairs; the Qwen architectures use the "rotate halves" order HF keeps).
    qkv_bias / qk_norm: the tensors the family adds per layer.
    """

    family: str
    architecture: str
    permute_qk: bool
    qkv_bias: bool = False
    qk_norm: bool = False


GGUF_ARCHS: dict[str, GGUFArch] = {
    "llama": GGUFArch("llama", "LlamaForCausalLM", permute_qk=True),
    "qwen2": GGUFArch("qwen2", "Qwen2ForCausalLM", permute_qk=False, qkv_bias=True),
    "qwen3": GGUFArch("qwen3", "Qwen3ForCausalLM", permute_qk=False, qk_norm=True),
    "qwen3moe": GGUFArch("qwen3_moe", "Qwen3MoeForCausalLM", permute_qk=False, qk_norm=True),
}
MIXTRAL = GGUFArch("mixtral", "MixtralForCausalLM", permute_qk=True)
# Tensors that carry nothing the HF format stores (RoPE tables are recomputed from the config).
GGUF_SKIPPED = ("rope_freqs.weight",)

# Llama 3 and Qwen2 split regexes (the same ones their tokenizer.json files use).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` values whose pre-tokenizer we rebuild.
SUPPORTED_PRE = ("smollm", "gpt-2", "gpt2", "default", "llama-bpe", "llama3", "qwen2")
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4  # llama.cpp token types


@dataclass
class GGUFCheckpoint:
    """A GGUF file read into memory.

    config: Hugging Face `config.json` contents (LlamaForCausalLM).
    state_dict: HF parameter names -> float32 tensors (HF row order for q/k).
    tokenizer_json: `tokenizer.json` text rebuilt from the metadata.
    tokenizer_config: `tokenizer_config.json` contents (special tokens, BOS use, chat template).
    tensor_types: HF name -> the GGUF storage type it came from ("Q4_1", "F32", ...).
    """

    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    tensor_types: dict[str, str] = field(default_factory=dict)


def _open(path: Path):
    from gguf import GGUFReader

    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file; check the path")
    try:
        return GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/IndexError/struct.error on damaged files
        raise GGUFError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "the file is damaged or truncated, download it again"
        ) from None


def _field(reader, key: str, path: Path, default: Any = ..., required: bool = True) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is not ... or not required:
            return None if default is ... else default
        raise GGUFError(f"{path}: metadata key {key!r} is missing; this GGUF file is incomplete")
    return f.contents()


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation.

    llama.cpp stores, per head, rows as interleaved pairs (r0, r_h, r1, r_{h+1}, ...) where HF has
    the two halves one after the other. `weight`: `[num_heads * head_dim, D]` -> same shape, HF order.
    """
    rows = weight.shape[0]
    head_dim = rows // num_heads
    # [H, hd/2, 2, D] -> [H, 2, hd/2, D]
    return (
        weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
    )


def permute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's Q/K row permutation (the inverse of `unpermute_qk`); used to write GGUF test files."""
    rows = weight.shape[0]
    head_dim = rows // num_heads
    # [H, 2, hd/2, D] -> [H, hd/2, 2, D]
    return (
        weight.reshape(num_heads, 2, head_dim // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
    )


def _hf_name(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
        template = GGUF_TO_HF.get(".".join(["blk", "{}", *parts[2:]]))
        return None if template is None else template.format(parts[1])
    return GGUF_TO_HF.get(name)


def _dequantize(tensor, path: Path) -> torch.Tensor:
    import numpy as np
    from gguf import quants

    try:
        array = quants.dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, quants.QuantError, KeyError):
        raise GGUFError(
            f"{path}: tensor {tensor.name!r} is stored as {tensor.tensor_type.name}, which cannot be "
            "dequantised; use a GGUF with F32/F16/BF16/Q8_0/Q4_0/Q4_1 (or K-quant) tensors"
        ) from None
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims fastest-first
    return torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True).reshape(shape))


def gguf_arch(reader, path: Path) -> tuple[str, GGUFArch]:
    """`(llama.cpp architecture, GGUFArch)` of the file; Mixtral is `llama` with `llama.expert_count`.
    Raises GGUFError for an architecture the importer does not read."""
    arch = _field(reader, "general.architecture", path)
    if arch not in GGUF_ARCHS:
        raise GGUFError(
            f"{path}: architecture {arch!r} is not supported by the GGUF importer "
            f"({', '.join(GGUF_ARCHS)}; Mixtral as llama with experts); "
            "download the model's Hugging Face folder instead (`tunebench download REPO_ID`)"
        )
    if arch == "llama" and int(_field(reader, "llama.expert_count", path, 0) or 0):
        return arch, MIXTRAL
    return arch, GGUF_ARCHS[arch]


def _config(reader, path: Path, has_output: bool) -> dict[str, Any]:
    arch, spec = gguf_arch(reader, path)

    def meta(key: str, default: Any = ...) -> Any:
        return _field(reader, f"{arch}.{key}", path, default)

    dim = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    kv_heads = int(meta("attention.head_count_kv", heads))
    vocab = meta("vocab_size", None)
    if vocab is None:
        vocab = len(_field(reader, "tokenizer.ggml.tokens", path))
    # Qwen3 heads need not be dim / heads wide: llama.cpp writes attention.key_length then.
    head_dim = int(meta("attention.key_length", None) or meta("rope.dimension_count", dim // heads))
    eps = float(f"{float(meta('attention.layer_norm_rms_epsilon', 1e-5)):.6g}")
    experts = int(meta("expert_count", 0) or 0)
    ffn = meta("feed_forward_length", None) if spec.family == "qwen3_moe" else meta("feed_forward_length")
    config: dict[str, Any] = {
        "architectures": [spec.architecture],
        "model_type": spec.family,
        "hidden_size": dim,
        "intermediate_size": int(ffn) if ffn is not None else None,
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta("context_length", 4096)),
        "rms_norm_eps": eps,
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": not has_output,
        "rope_scaling": None,
    }
    if spec.family in ("llama", "mixtral", "qwen3", "qwen3_moe"):
        config["attention_bias"] = False
    if spec.family == "llama":
        config["mlp_bias"] = False
    if spec.family in ("qwen2", "qwen3", "qwen3_moe"):
        config.update(use_sliding_window=False, sliding_window=None)
    if spec.family == "mixtral":
        config.update(
            num_local_experts=experts,
            num_experts_per_tok=int(meta("expert_used_count")),
            router_jitter_noise=0.0,
            sliding_window=None,
        )
    if spec.family == "qwen3_moe":
        moe_ffn = int(meta("expert_feed_forward_length"))
        config.update(
            num_experts=experts,
            num_experts_per_tok=int(meta("expert_used_count")),
            moe_intermediate_size=moe_ffn,
            # llama.cpp's qwen3moe always renormalises the top-k router weights.
            norm_topk_prob=bool(meta("expert_weights_norm", True)),
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
        if config["intermediate_size"] is None:
            config["intermediate_size"] = moe_ffn
        if not experts:
            raise GGUFError(
                f"{path}: metadata key 'qwen3moe.expert_count' is missing; this GGUF file is incomplete"
            )
    scaling = meta("rope.scaling.type", None)
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(meta("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise GGUFError(
            f"{path}: RoPE scaling {scaling!r} is not supported by the GGUF importer (linear only)"
        )
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = _field(reader, f"tokenizer.ggml.{name}_token_id", path, None)
        if value is not None:
            config[key] = int(value)
    return config


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    if pre == "smollm":  # digits one by one, then GPT-2 byte-level with its built-in regex
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if pre in ("llama-bpe", "llama3", "qwen2"):
        pattern = _QWEN2_SPLIT if pre == "qwen2" else _LLAMA3_SPLIT
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False)  # gpt-2 / default


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece-BPE vocabulary (which stores scores, not merges).

    Every split of a piece into two pieces that are both in the vocabulary is a merge; merges are
    ranked by the merged piece's score (higher first), ties by the ids of the two halves.
    """
    ids = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[float, int, int, str, str]] = []
    for merged, score in zip(tokens, scores):
        for cut in range(1, len(merged)):
            left, right = merged[:cut], merged[cut:]
            if left in ids and right in ids:
                found.append((-float(score), ids[left], ids[right], left, right))
    found.sort(key=lambda m: (m[0], m[1], m[2]))
    return [(left, right) for _, _, _, left, right in found]


def _byte_level_bpe(reader, path: Path, tokens: list[str]):
    """GPT-2 style byte-level BPE (`tokenizer.ggml.model == "gpt2"`)."""
    from tokenizers import Tokenizer, decoders, models, processors

    pre = str(_field(reader, "tokenizer.ggml.pre", path, "default"))
    if pre not in SUPPORTED_PRE:
        raise GGUFError(
            f"{path}: pre-tokenizer {pre!r} is unknown (known: {', '.join(SUPPORTED_PRE)}); "
            "pass the model's tokenizer folder with `tokenizer_dir=` / `--tokenizer DIR`"
        )
    merges = [tuple(str(m).split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", path)]
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=merges,
        ignore_merges=pre in ("llama-bpe", "llama3"),
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _sentencepiece_bpe(reader, path: Path, tokens: list[str]):
    """SentencePiece BPE with byte fallback (`tokenizer.ggml.model == "llama"`: Llama 2, Mistral)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors

    scores = _field(reader, "tokenizer.ggml.scores", path)
    unk = _field(reader, "tokenizer.ggml.unknown_token_id", path, 0)
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=spm_merges(tokens, [float(x) for x in scores]),
        unk_token=tokens[int(unk)],
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    # SentencePiece writes spaces as U+2581 and (by default) prefixes the text with one.
    space = [normalizers.Replace(" ", "\u2581")]
    if bool(_field(reader, "tokenizer.ggml.add_space_prefix", path, True)):
        space.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(space)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    bos = _field(reader, "tokenizer.ggml.bos_token_id", path, None)
    if bos is not None and bool(_field(reader, "tokenizer.ggml.add_bos_token", path, True)):
        b = tokens[int(bos)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{b} $A", pair=f"{b} $A {b} $B", special_tokens=[(b, int(bos))]
        )
    return tok


def _tokenizer(reader, path: Path) -> tuple[str, dict[str, Any]]:
    from tokenizers import AddedToken

    kind = _field(reader, "tokenizer.ggml.model", path)
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens", path)]
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type", path, [1] * len(tokens))]
    if kind == "gpt2":
        tok = _byte_level_bpe(reader, path, tokens)
    elif kind == "llama":
        tok = _sentencepiece_bpe(reader, path, tokens)
    else:
        raise GGUFError(
            f"{path}: tokenizer model {kind!r} cannot be rebuilt (byte-level BPE 'gpt2' and SentencePiece "
            "'llama' only); pass the model's tokenizer folder with `tokenizer_dir=` / `--tokenizer DIR`"
        )
    added = [
        AddedToken(tokens[i], special=t in (_UNKNOWN, _CONTROL), normalized=False)
        for i, t in enumerate(types)
        if t in (_UNKNOWN, _CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])

    def name(key: str) -> str | None:
        value = _field(reader, f"tokenizer.ggml.{key}_token_id", path, None)
        return None if value is None or not 0 <= int(value) < len(tokens) else tokens[int(value)]

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("bos"),
        "eos_token": name("eos"),
        "pad_token": name("padding"),
        "unk_token": name("unknown"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", path, kind == "llama")),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", path, False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(
            _field(
                reader, f"{_field(reader, 'general.architecture', path, 'llama')}.context_length", path, 4096
            )
        ),
    }
    template = _field(reader, "tokenizer.chat_template", path, None)
    if template is not None:
        tokenizer_config["chat_template"] = str(template)
    return tok.to_str(), tokenizer_config


def _per_layer_count(config: dict[str, Any], spec: GGUFArch) -> int:
    """Weight tensors one decoder layer holds in HF form (per-expert keys counted one each)."""
    count = 2 + 4 + 3 * spec.qkv_bias + 2 * spec.qk_norm  # norms, q/k/v/o, biases, q/k norms
    experts = config.get("num_local_experts") or config.get("num_experts")
    return count + (1 + 3 * int(experts) if experts else 3)  # router + experts, or gate/up/down


def load_gguf(path: str | Path, *, rebuild_tokenizer: bool = True) -> GGUFCheckpoint:
    """Read a GGUF file of a supported architecture (llama incl. Mixtral, qwen2, qwen3, qwen3moe):
    dequantised float32 weights under HF names (llama Q/K rows back in HF order, stacked experts
    split into per-expert keys), an HF `config.json`, and the tokenizer rebuilt from the metadata.

    Raises `GGUFError` for a missing/damaged file, another architecture, a tensor type the `gguf`
    package cannot dequantise, an unknown tensor name, or a tokenizer that cannot be rebuilt.
    """
    from engine.checkpoint.hf_keys import MOE_NAMING

    path = Path(path)
    reader = _open(path)
    names = {t.name for t in reader.tensors}
    config = _config(reader, path, has_output="output.weight" in names)
    _, spec = gguf_arch(reader, path)
    moe = MOE_NAMING.get(spec.family)  # (HF module of the MoE block, {native proj: HF proj})
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    state_dict: dict[str, torch.Tensor] = {}
    tensor_types: dict[str, str] = {}
    for tensor in reader.tensors:
        if tensor.name in GGUF_SKIPPED:
            continue
        parts = tensor.name.split(".", 2)
        in_block = len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit()
        if moe is not None and in_block and parts[2] in GGUF_EXPERTS:
            stacked = _dequantize(tensor, path)  # [E, out, in]
            proj = moe[1][GGUF_EXPERTS[parts[2]]]
            for e in range(stacked.shape[0]):
                key = f"model.layers.{parts[1]}.{moe[0]}.experts.{e}.{proj}.weight"
                state_dict[key] = stacked[e].clone()
                tensor_types[key] = tensor.tensor_type.name
            continue
        if moe is not None and in_block and parts[2] == GGUF_ROUTER:
            hf = f"model.layers.{parts[1]}.{moe[0]}.gate.weight"
        else:
            hf = _hf_name(tensor.name)
        if hf is None:
            raise GGUFError(
                f"{path}: tensor {tensor.name!r} has no Hugging Face {spec.architecture} counterpart; "
                f"this is not a plain {spec.family} GGUF"
            )
        weight = _dequantize(tensor, path)
        if spec.permute_qk and hf.endswith("q_proj.weight"):
            weight = unpermute_qk(weight, heads)
        elif spec.permute_qk and hf.endswith("k_proj.weight"):
            weight = unpermute_qk(weight, kv_heads)
        state_dict[hf] = weight
        tensor_types[hf] = tensor.tensor_type.name
    per_layer = _per_layer_count(config, spec)
    expected = config["num_hidden_layers"] * per_layer + 2 + (0 if config["tie_word_embeddings"] else 1)
    if len(state_dict) != expected:
        raise GGUFError(
            f"{path}: {len(state_dict)} weight tensors found, {expected} expected for "
            f"{config['num_hidden_layers']} {spec.family} layers; the file is incomplete"
        )
    tokenizer_json, tokenizer_config = ("", {})
    if rebuild_tokenizer:
        tokenizer_json, tokenizer_config = _tokenizer(reader, path)
    return GGUFCheckpoint(config, state_dict, tokenizer_json, tokenizer_config, tensor_types)


def _copy_tokenizer_files(src: Path, dst: Path) -> None:
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
    found = [n for n in names if (src / n).is_file()]
    if not found:
        raise GGUFError(
            f"{src}: no tokenizer.json or tokenizer.model here; pass the model's tokenizer folder"
        )
    for n in found:
        shutil.copy2(src / n, dst / n)


def convert_gguf_to_hf(
    path: str | Path,
    out_dir: str | Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    tokenizer_dir: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a GGUF file as a Hugging Face folder that `engine.models.from_pretrained` and transformers load:
    `config.json`, `model.safetensors` (in `dtype`, default bfloat16), `generation_config.json`,
    `tokenizer.json` + `tokenizer_config.json` (rebuilt, or copied from `tokenizer_dir`).

    The folder is written under a temporary name and renamed into place, so `out_dir` is either
    complete or absent. Raises `GGUFError` (see `load_gguf`), or when `out_dir` exists and not `overwrite`.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise GGUFError(f"{out_dir}: already exists; remove it or pass overwrite=True / --overwrite")
    ckpt = load_gguf(path, rebuild_tokenizer=tokenizer_dir is None)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        config = dict(ckpt.config, torch_dtype=str(dtype).removeprefix("torch."))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        tensors = {k: v.to(dtype).contiguous() for k, v in ckpt.state_dict.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        if tokenizer_dir is None:
            (tmp / "tokenizer.json").write_text(ckpt.tokenizer_json)
            (tmp / "tokenizer_config.json").write_text(json.dumps(ckpt.tokenizer_config, indent=2) + "\n")
        else:
            _copy_tokenizer_files(Path(tokenizer_dir), tmp)
        if out_dir.exists():
            if not overwrite:  # another process finished the same conversion meanwhile
                raise GGUFError(f"{out_dir}: already exists; remove it or pass overwrite=True / --overwrite")
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def write_gguf_tokenizer(path: str | Path, out_dir: str | Path) -> Path:
    """Write only the tokenizer of a GGUF file (`tokenizer.json` + `tokenizer_config.json`, rebuilt
    from its metadata, as `convert_gguf_to_hf` does) into `out_dir`, reading no weights. Returns
    `out_dir`. Raises `GGUFError` as `load_gguf` does."""
    path, out_dir = Path(path), Path(out_dir)
    tokenizer_json, tokenizer_config = _tokenizer(_open(path), path)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(tokenizer_json)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return out_dir
