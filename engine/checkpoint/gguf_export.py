"""GGUF export: a model folder or a run checkpoint (LoRA adapters folded in) as one llama.cpp `.gguf` file.

    path = export_gguf("runs/7/checkpoints/step_100/model", "smol.f16.gguf", "f16")

The inverse of `engine.checkpoint.gguf` (the importer), so the file reads back through it:
- architecture: `llama` for Llama 2/3, SmolLM2, Mistral and Mixtral (+ `llama.expert_count`), `qwen2`,
  `qwen3`, `qwen3moe` (`ARCH_OF`);
- names: native -> HF (`engine.checkpoint.hf_keys`) -> GGUF (the importer's `GGUF_TO_HF`, inverted);
  per-expert HF keys are stacked back into `blk.N.ffn_{gate,up,down}_exps` `[E, out, in]`, the router
  is `blk.N.ffn_gate_inp`;
- llama.cpp's Q/K row permutation is redone for the llama architecture (`permute_qk`), the importer
  undoes it; the Qwen architectures keep HF's row order;
- storage: `f16`/`bf16` store every matrix in that type, `q8_0` quantises matrices with the `gguf`
  package's `quants.quantize` (blocks of 32 weights, one f16 scale); norms, biases and the MoE router
  stay F32, as llama.cpp's converter keeps them (a router rounding flips which experts a token takes);
- metadata: the `<arch>.*` keys the importer reads (experts: `expert_count`, `expert_used_count`,
  Qwen3-MoE `expert_feed_forward_length`), and the tokenizer: a byte-level BPE as
  `tokenizer.ggml.model = "gpt2"` (tokens, merges, types, the `pre` name whose pre-tokenizer splits
  text as the source's does), a SentencePiece BPE (byte fallback) as `"llama"` (tokens, scores from
  the merge ranks, types), special token ids, BOS/EOS use and `tokenizer.chat_template`.

What a GGUF cannot say is refused with a one-line GGUFError: RoPE scaling, llama attention/MLP biases,
a Qwen3-MoE without top-k renormalisation (llama.cpp always renormalises). The file is written under
a temporary name beside the target and renamed into place.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine.checkpoint.gguf import (
    GGUF_ARCHS,
    GGUF_EXPERTS,
    GGUF_ROUTER,
    GGUF_TO_HF,
    SUPPORTED_PRE,
    GGUFError,
    _pre_tokenizer,
    permute_qk,
)

GGUF_TYPES = ("f16", "bf16", "q8_0")
HF_TO_GGUF: dict[str, str] = {hf: g for g, hf in GGUF_TO_HF.items()}
# HF family (`engine.models.hf_config.family_of`) -> the llama.cpp architecture that holds it.
ARCH_OF: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
}
_EXPERTS_OF: dict[str, str] = {proj: g for g, proj in GGUF_EXPERTS.items()}  # native proj -> GGUF name
# Texts the candidate pre-tokenizers must split exactly as the source one does.
_PRE_PROBES = (
    "Hello world! It's 2024, they'll pay $1234567.89 for 3.14 apples.",
    "  leading spaces\tand tabs\n\nnew lines\r\n ünïcödé 日本語 🤗 I'M",
    "def f(x):\n    return x ** 2  # code, don't",
)


def _gguf_name(hf: str) -> str | None:
    parts = hf.split(".")
    if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        template = HF_TO_GGUF.get(".".join(["model", "layers", "{}", *parts[3:]]))
        return None if template is None else template.format(parts[2])
    return HF_TO_GGUF.get(hf)


def check_family(config: dict[str, Any], source: str) -> str:
    """The family of `config` (`llama`, `mistral`, `mixtral`, `qwen2`, `qwen3`, `qwen3_moe`); raises
    GGUFError when no GGUF architecture the importer reads can hold it."""
    from engine.checkpoint.checkpoint_errors import CheckpointError
    from engine.models.hf_config import family_of

    try:
        family = family_of(config, source)
    except CheckpointError:
        family = None
    if family not in ARCH_OF:
        kind = config.get("model_type") or (config.get("architectures") or ["nothing"])[0]
        raise GGUFError(
            f"{source}: model_type {kind!r} cannot be exported to GGUF (supported: {', '.join(ARCH_OF)}); "
            "use llama.cpp's convert_hf_to_gguf.py on the Hugging Face folder instead"
        )
    if ARCH_OF[family] == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise GGUFError(f"{source}: attention/MLP biases cannot be exported to a llama GGUF")
    if config.get("mlp_bias"):
        raise GGUFError(f"{source}: MLP biases cannot be exported to a {ARCH_OF[family]} GGUF")
    if family == "qwen3" and config.get("attention_bias"):
        raise GGUFError(f"{source}: attention biases cannot be exported to a qwen3 GGUF")
    if family == "qwen3_moe" and not config.get("norm_topk_prob", True):
        raise GGUFError(
            f"{source}: norm_topk_prob=false cannot be exported: llama.cpp's qwen3moe always "
            "renormalises the top-k router weights, so the GGUF would compute another model"
        )
    rope_type = _rope(config).get("rope_type", _rope(config).get("type", "default"))
    if rope_type != "default":
        raise GGUFError(
            f"{source}: RoPE scaling {rope_type!r} cannot be exported (the GGUF importer reads unscaled RoPE only)"
        )
    return family


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE settings in either spelling (transformers 4 `rope_theta`/`rope_scaling`, 5 `rope_parameters`)."""
    return {
        "rope_theta": config.get("rope_theta", 10000.0),
        **(config.get("rope_scaling") or {}),
        **(config.get("rope_parameters") or {}),
    }


def _source_pre_name(tok) -> str:
    """The `tokenizer.ggml.pre` name whose rebuilt pre-tokenizer splits the probe texts as `tok`'s does."""
    source = tok.pre_tokenizer
    if source is None:
        raise GGUFError("the tokenizer has no pre-tokenizer; a byte-level BPE without one cannot be exported")
    want = [source.pre_tokenize_str(t) for t in _PRE_PROBES]
    for pre in ("smollm", "llama-bpe", "qwen2", "gpt-2"):
        if [_pre_tokenizer(pre).pre_tokenize_str(t) for t in _PRE_PROBES] == want:
            return pre
    raise GGUFError(
        f"the tokenizer's pre-tokenizer matches none the GGUF importer rebuilds ({', '.join(SUPPORTED_PRE)}); "
        "it cannot be exported to GGUF"
    )


def _tokenizer_metadata(writer, model_dir: Path, vocab: int) -> None:
    """The tokenizer keys; the token list is padded with unused `[PAD<id>]` tokens up to the model's
    `vocab` embedding rows (Qwen pads 151,669 tokens to 151,936 rows), as llama.cpp's converter does,
    since llama.cpp sizes the vocabulary from the token list."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise GGUFError(
            f"{model_dir}: no tokenizer.json; the GGUF needs the tokenizer (copy it into the folder)"
        )
    data = json.loads(path.read_text())
    tok = Tokenizer.from_str(path.read_text())
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise GGUFError(f"{path}: a {model.get('type')} tokenizer cannot be exported to GGUF (BPE only)")
    size = tok.get_vocab_size(with_added_tokens=True)
    by_id = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(size)):
        raise GGUFError(f"{path}: token ids are not contiguous from 0; it cannot be exported to GGUF")
    tokens = [by_id[i] for i in range(size)]
    added = {int(a["id"]): bool(a.get("special")) for a in data.get("added_tokens") or []}
    types = [(3 if added[i] else 4) if i in added else 1 for i in range(size)]  # control / user / normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    if size > vocab:
        raise GGUFError(
            f"{path}: {size} tokens but the model has {vocab} embedding rows; the tokenizer does not "
            "belong to this model"
        )
    pad = [f"[PAD{i}]" for i in range(size, vocab)]
    if model.get("byte_fallback"):  # SentencePiece BPE: scores rank the merges (the importer re-derives them)
        scores = [0.0] * size
        ids = tok.get_vocab(with_added_tokens=True)
        for rank, merge in enumerate(merges):
            merged = merge.replace(" ", "", 1)
            if merged in ids and scores[ids[merged]] == 0.0:
                scores[ids[merged]] = -float(rank + 1)
        for i, t in enumerate(tokens):
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                types[i] = 6  # byte
        writer.add_tokenizer_model("llama")
        writer.add_token_scores(scores + [-1e4] * len(pad))
        writer.add_add_space_prefix(_prepends_space(data))
        unk = model.get("unk_token")
        if unk in ids:
            writer.add_unk_token_id(ids[unk])
            types[ids[unk]] = 2
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_source_pre_name(tok))
        writer.add_token_merges(merges)
    writer.add_token_list(tokens + pad)
    writer.add_token_types(types + [5] * len(pad))  # 5: unused
    _special_tokens(writer, model_dir, tokens)


def _prepends_space(data: dict) -> bool:
    """Whether the SentencePiece tokenizer prefixes text with U+2581 (normalizer Prepend or Metaspace)."""
    text = json.dumps([data.get("normalizer"), data.get("pre_tokenizer")])
    return '"Prepend"' in text or ('"Metaspace"' in text and '"prepend_scheme": "never"' not in text)


def _special_tokens(writer, model_dir: Path, tokens: list[str]) -> None:
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    ids = {t: i for i, t in enumerate(tokens)}

    def token(key: str) -> int | None:
        value = cfg.get(key)
        if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
            value = value.get("content")
        return ids.get(value) if isinstance(value, str) else None

    for key, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
    ):
        found = token(key)
        if found is not None:
            add(found)
    if "add_bos_token" in cfg:
        writer.add_add_bos_token(bool(cfg["add_bos_token"]))
    if "add_eos_token" in cfg:
        writer.add_add_eos_token(bool(cfg["add_eos_token"]))
    template = _chat_template(model_dir, cfg)
    if template is not None:
        writer.add_chat_template(template)


def _chat_template(model_dir: Path, cfg: dict) -> str | None:
    """The chat template: `tokenizer_config.json`, else `chat_template.jinja` / `.json` (newer transformers)."""
    if isinstance(cfg.get("chat_template"), str):
        return cfg["chat_template"]
    if (model_dir / "chat_template.jinja").is_file():
        return (model_dir / "chat_template.jinja").read_text()
    if (model_dir / "chat_template.json").is_file():
        value = json.loads((model_dir / "chat_template.json").read_text()).get("chat_template")
        return value if isinstance(value, str) else None
    return None


def _model_metadata(writer, config: dict[str, Any], family: str, vocab: int, name: str) -> None:
    heads = int(config["num_attention_heads"])
    dim = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or dim // heads)
    writer.add_name(name)
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_context_length(int(config.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or heads))
    writer.add_key_length(head_dim)  # Qwen3 heads are wider than dim / heads
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(_rope(config)["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    writer.add_vocab_size(vocab)
    if family in ("mixtral", "qwen3_moe"):
        # transformers 4 spells Qwen3-MoE's count `num_experts`, 5 `num_local_experts` (as Mixtral)
        writer.add_expert_count(int(config.get("num_experts") or config["num_local_experts"]))
        writer.add_expert_used_count(int(config["num_experts_per_tok"]))
    if family == "qwen3_moe":
        writer.add_expert_feed_forward_length(int(config["moe_intermediate_size"]))


def _stored(weight: torch.Tensor, qtype: str):
    """`(array, raw_dtype)` for `writer.add_tensor`: 1-D tensors F32, matrices (and `[E, out, in]`
    expert stacks) in `qtype` (`f32` keeps them as they are)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    array = weight.detach().to(torch.float32).contiguous().numpy()
    if array.ndim == 1 or qtype == "f32":
        return array, None
    if qtype == "f16":
        return array.astype(np.float16), None
    if qtype == "bf16":
        return quants.quantize(array, GGMLQuantizationType.BF16), GGMLQuantizationType.BF16
    if array.shape[-1] % 32:  # Q8_0 blocks are 32 wide; llama.cpp falls back to F16 the same way
        return array.astype(np.float16), None
    return quants.quantize(array, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """HF-named float32 weights of a native decoder with its adapters folded in (tied output dropped;
    stacked experts as HF's per-expert keys, views of the merged stack)."""
    from engine.checkpoint.hf_keys import native_expert_to_hf, native_to_hf
    from engine.checkpoint.hf_safetensors import moe_naming
    from engine.modules.peft import merged_state_dict

    naming = moe_naming(model)
    out: dict[str, torch.Tensor] = {}
    for key, value in merged_state_dict(model, dtype=torch.float32).items():
        if key == "output.weight" and getattr(model, "tied", False):
            continue
        if native_expert_to_hf(key, 0, naming) is not None:
            for e in range(value.shape[0]):
                out[native_expert_to_hf(key, e, naming)] = value[e]
            continue
        hf = native_to_hf(key, naming)
        if hf is None:
            raise GGUFError(f"weight {key!r} has no GGUF counterpart; this model cannot be exported")
        out[hf] = value
    return out


def gguf_tensors(
    state_dict: dict[str, torch.Tensor], config: dict[str, Any], family: str
) -> dict[str, torch.Tensor]:
    """GGUF name -> float32 tensor for HF-named weights of `family`: dense names through the
    importer's table, Q/K rows permuted for the llama architecture, per-expert keys stacked
    `[E, out, in]`, routers as `ffn_gate_inp`. Raises GGUFError for a key with no GGUF name or an
    expert stack with gaps."""
    from engine.checkpoint.hf_keys import hf_expert_to_native, hf_to_native

    naming = family if family in ("mixtral", "qwen3_moe") else None
    permute = GGUF_ARCHS[ARCH_OF[family]].permute_qk
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for hf, weight in state_dict.items():
        expert = hf_expert_to_native(hf, naming)
        if expert is not None:  # ("layers.L.mlp.experts.<proj>", e)
            native, e = expert
            layer, proj = native.split(".")[1], native.rsplit(".", 1)[1]
            stacks.setdefault(f"blk.{layer}.{_EXPERTS_OF[proj]}", {})[e] = weight
            continue
        native = hf_to_native(hf, naming)
        if naming is not None and native is not None and native.endswith(".mlp.router.weight"):
            out[f"blk.{native.split('.')[1]}.{GGUF_ROUTER}"] = weight
            continue
        gname = _gguf_name(hf)
        if gname is None:
            raise GGUFError(
                f"weight {hf!r} has no {ARCH_OF[family]} GGUF counterpart; this model cannot be exported"
            )
        if permute and hf.endswith("q_proj.weight"):
            weight = permute_qk(weight, heads)
        elif permute and hf.endswith("k_proj.weight"):
            weight = permute_qk(weight, kv_heads)
        out[gname] = weight
    for gname, experts in stacks.items():
        if sorted(experts) != list(range(len(experts))):
            missing = sorted(set(range(max(experts) + 1)) - set(experts))
            raise GGUFError(
                f"{gname}: experts {missing} are missing from the weights; the model is incomplete"
            )
        out[gname] = torch.stack([experts[e] for e in range(len(experts))])  # [E, out, in]
    return out


def write_gguf(
    state_dict: dict[str, torch.Tensor],
    config: dict[str, Any],
    tokenizer_dir: str | os.PathLike,
    out: str | os.PathLike,
    qtype: str,
    *,
    name: str = "model",
) -> Path:
    """Write HF-named weights, their `config.json` contents and the tokenizer in `tokenizer_dir` to `out`."""
    import gguf

    if qtype not in GGUF_TYPES:
        raise GGUFError(f"GGUF type {qtype!r} is unknown; use one of {', '.join(GGUF_TYPES)}")
    family = check_family(config, str(tokenizer_dir))
    out = Path(out)
    tensors = [
        (gname, *_stored(weight, "f32" if gname.endswith(GGUF_ROUTER) else qtype))
        for gname, weight in gguf_tensors(state_dict, config, family).items()
    ]
    file_type = {"f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}[qtype]
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, ARCH_OF[family])
        vocab = int(state_dict["model.embed_tokens.weight"].shape[0])
        _model_metadata(writer, config, family, vocab, name)
        writer.add_file_type(gguf.LlamaFileType[file_type])
        _tokenizer_metadata(writer, Path(tokenizer_dir), vocab)
        for gname, array, raw in tensors:
            writer.add_tensor(gname, array, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def export_gguf(model_dir: str | os.PathLike, out: str | os.PathLike, qtype: str) -> Path:
    """Export a HF model folder or a PEFT adapter folder (merged onto the base it names) to GGUF `out`."""
    from engine.eval.model_loading import (
        adapter_base_dir,
        is_adapter_folder,
        load_eval_model,
        tokenizer_folder,
    )
    from engine.models.hf_config import read_hf_config

    if qtype not in GGUF_TYPES:
        raise GGUFError(f"GGUF type {qtype!r} is unknown; use one of {', '.join(GGUF_TYPES)}")
    model_dir = Path(model_dir)
    config_dir = adapter_base_dir(model_dir) if is_adapter_folder(model_dir) else model_dir
    config = read_hf_config(config_dir)
    check_family(config, str(config_dir / "config.json"))
    model = load_eval_model(model_dir, dtype=torch.float32)
    state = hf_state_dict(model)
    del model
    return write_gguf(state, config, tokenizer_folder(model_dir), out, qtype, name=config_dir.name)
