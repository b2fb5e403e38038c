"""GGUF import and export for every family: Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE.

References, each independent of tunebench's own name tables:
- a llama.cpp-style file written here with the `gguf` package's tensor name map
  (`gguf.get_tensor_name_map`, the table llama.cpp's converter uses): stacked experts, Q/K rows
  permuted for the llama architecture only, the metadata keys llama.cpp writes;
- transformers' own models (the source logits) and transformers' own GGUF loader
  (`from_pretrained(..., gguf_file=...)`) reading what `export_gguf` wrote.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.checkpoint.gguf import GGUFError, convert_gguf_to_hf, load_gguf, permute_qk
from engine.checkpoint.gguf_export import export_gguf
from engine.models import from_pretrained
from tests.engine.checkpoint.test_gguf import TEXT, _tiny_tokenizer
from tests.engine.checkpoint.test_gguf_export import TEMPLATE, _save_folder
from tests.engine.models.hf_reference import hf_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

FAMILIES = ["llama2", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe"]
ARCH = {"llama2": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
ARCH["qwen3_moe"] = "qwen3moe"
# Sizes whose matrix rows are multiples of 32, so Q8_0 quantises every matrix (hf_reference's Mixtral
# experts are 48 wide); Mistral without hf_reference's 6-token sliding window, which llama.cpp's
# llama architecture does not apply (nor does a GGUF carry it).
OVERRIDES = {"mixtral": {"intermediate_size": 64}, "mistral": {"sliding_window": None}}
# Max |logit difference| against the float32 source, as a fraction of the source's max |logit|
# (~1.6 here): f16 keeps 11 significant bits, bf16 8, Q8_0 8 bits per weight plus an f16 scale per 32.
REL_TOL = {"f16": 1.5e-3, "bf16": 1.2e-2, "q8_0": 2.5e-2}
GGML_TYPE = {"f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}


def _qwen_tokenizer():
    """A byte-level BPE with Qwen2's split regex (digits one by one), as Qwen2/2.5/3 ship."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from engine.checkpoint.gguf import _QWEN2_SPLIT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 20, trainer)
    return tok


def _source(family: str, tmp_path, seed: int = 0):
    """(transformers model, tokenizer, saved HF folder) of a tiny random model of `family`."""
    tok = _qwen_tokenizer() if family.startswith("qwen") else _tiny_tokenizer()
    model = hf_model(family, seed=seed, vocab_size=tok.get_vocab_size(), **OVERRIDES.get(family, {}))
    return model, tok, _save_folder(model, tok, tmp_path / f"src_{family}")


def _split_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5 holds experts fused in memory (`mlp.experts.gate_up_proj` [E, 2H, D],
    `mlp.experts.down_proj` [E, D, H]); llama.cpp's converter sees them as stacked gate/up/down."""
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            hidden = t.shape[1] // 2
            out[name.replace("gate_up_proj", "gate_proj")] = t[:, :hidden]
            out[name.replace("gate_up_proj", "up_proj")] = t[:, hidden:]
        else:
            out[name] = t
    return out


def _llama_cpp_file(path, model, tok, arch: str) -> None:
    """`model` as llama.cpp's converter lays it out (F32 tensors): names from gguf's own tensor name map,
    Q/K rows permuted only for the llama architecture, the metadata keys it writes for `arch`."""
    import json

    from gguf.constants import MODEL_ARCH_NAMES

    cfg = model.config
    arch_enum = next(a for a, n in MODEL_ARCH_NAMES.items() if n == arch)
    names = gguf.get_tensor_name_map(arch_enum, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "qwen3moe":
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    elif getattr(cfg, "num_local_experts", None):
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    data = json.loads(tok.to_str())
    vocab = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "gpt-2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    w.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    for hf, t in _split_experts(model.state_dict()).items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = hf.rsplit(".", 1) if hf.endswith((".weight", ".bias")) else (hf, "weight")
        gname = names.get_name(base)
        assert gname is not None, hf
        t = t.detach().float()
        if arch == "llama" and base.endswith("q_proj"):
            t = permute_qk(t, cfg.num_attention_heads)
        elif arch == "llama" and base.endswith("k_proj"):
            t = permute_qk(t, cfg.num_key_value_heads)
        w.add_tensor(f"{gname}.{suffix}", t.contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return (out.logits if hasattr(out, "logits") else out)[0].float()


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_moe"])
def test_llama_cpp_qwen_file_imports_to_the_same_logits(tmp_path, family):
    """A llama.cpp-layout Qwen GGUF (F32) converts to a folder that tunebench's Qwen2/Qwen3/Qwen3-MoE
    and transformers load to the source's logits (fp32, 1e-5)."""
    import json

    model, tok, _ = _source(family, tmp_path)
    _llama_cpp_file(tmp_path / "m.gguf", model, tok, ARCH[family])
    out = convert_gguf_to_hf(tmp_path / "m.gguf", tmp_path / "hf", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [type(model).__name__]
    ids = tok.encode(TEXT).ids[:32]
    ref = _logits(model, ids)
    torch.testing.assert_close(_logits(from_pretrained(out), ids), ref, atol=1e-5, rtol=0)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(theirs, ids), ref, atol=1e-5, rtol=0)


def test_qwen_import_refuses_an_incomplete_file(tmp_path):
    """A qwen2 file without its q/k/v biases is not silently loaded as a bias-free model."""
    model, tok, _ = _source("qwen2", tmp_path)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias = None
    _llama_cpp_file(tmp_path / "m.gguf", model, tok, "qwen2")
    with pytest.raises(GGUFError, match=r"m\.gguf: 25 weight tensors found, 27 expected for 2 qwen2 layers"):
        load_gguf(tmp_path / "m.gguf")


@pytest.mark.parametrize("qtype", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_export_reads_back_with_the_same_logits(tmp_path, family, qtype):
    model, tok, src = _source(family, tmp_path)
    out = export_gguf(src, tmp_path / "m.gguf", qtype)
    _llama_cpp_file(tmp_path / "ref.gguf", model, tok, ARCH[family])

    # gguf's reader: the architecture, the metadata llama.cpp needs, tensor names and shapes as
    # llama.cpp's converter lays them out, matrices in the chosen type, norms/biases/router F32.
    reader, ref = gguf.GGUFReader(str(out)), gguf.GGUFReader(str(tmp_path / "ref.gguf"))
    arch = ARCH[family]
    assert reader.fields["general.architecture"].contents() == arch
    keys = ["block_count", "embedding_length", "feed_forward_length", "attention.head_count"]
    keys += ["attention.head_count_kv", "attention.key_length", "rope.freq_base", "context_length"]
    keys += ["expert_count", "expert_used_count"] if "expert_count" in str(list(ref.fields)) else []
    keys += ["expert_feed_forward_length"] if arch == "qwen3moe" else []
    for key in keys:
        assert reader.fields[f"{arch}.{key}"].contents() == ref.fields[f"{arch}.{key}"].contents(), key
    assert {t.name: t.shape.tolist() for t in reader.tensors} == {
        t.name: t.shape.tolist() for t in ref.tensors
    }
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == GGML_TYPE[qtype] and types["blk.0.attn_norm.weight"] == "F32"
    if "blk.0.ffn_gate_exps.weight" in types:
        assert types["blk.0.ffn_gate_exps.weight"] == GGML_TYPE[qtype]
        assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    if family == "qwen2":
        assert types["blk.0.attn_q.bias"] == "F32"
    assert reader.fields["tokenizer.chat_template"].contents() == TEMPLATE
    assert reader.fields["tokenizer.ggml.pre"].contents() == ("qwen2" if arch.startswith("qwen") else "gpt-2")

    # tunebench's own import, into tunebench's model of the family: the source's logits.
    folder = convert_gguf_to_hf(out, tmp_path / "back", dtype=torch.float32)
    ids = tok.encode(TEXT).ids[:32]
    ref_logits = _logits(model, ids)
    got = _logits(from_pretrained(folder), ids)
    bound = REL_TOL[qtype] * ref_logits.abs().max().item()
    diff = (got - ref_logits).abs().max().item()
    print(f"{family} {qtype}: max |logit diff| {diff:.2e} (bound {bound:.2e})")
    torch.testing.assert_close(got, ref_logits, atol=bound, rtol=0)


# transformers' GGUF config tables (integrations/ggml.py) read no `qwen3.attention.key_length` and no
# `qwen3moe.expert_feed_forward_length`, so for those two it is given the source's config; the weights
# still come through its own tensor name map and dequantiser.
CONFIG_GIVEN = ("qwen3", "qwen3_moe")


@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_reads_the_export(tmp_path, family, qtype):
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if family == "mixtral":
        pytest.skip(
            "transformers reads a llama-architecture GGUF as a dense LlamaForCausalLM (its GGUF tensor map "
            "has no Mixtral experts); tunebench's own import is the check for Mixtral"
        )
    hf_arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}[ARCH[family]]
    if hf_arch not in GGUF_SUPPORTED_ARCHITECTURES:
        pytest.skip(f"transformers {transformers.__version__} cannot load {hf_arch} GGUF files")
    model, tok, src = _source(family, tmp_path)
    out = export_gguf(src, tmp_path / "m.gguf", qtype)
    extra = {"config": transformers.AutoConfig.from_pretrained(src)} if family in CONFIG_GIVEN else {}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=out.name, dtype=torch.float32, **extra
    ).eval()
    assert type(theirs).__name__ == type(model).__name__ or family == "mistral"  # a llama GGUF: Llama
    ids = tok.encode(TEXT).ids[:32]
    ref = _logits(model, ids)
    bound = REL_TOL[qtype] * ref.abs().max().item()
    torch.testing.assert_close(_logits(theirs, ids), ref, atol=bound, rtol=0)


def test_q8_0_expert_stacks_equal_gguf_dequantize_of_the_source(tmp_path):
    """Q8_0 expert stacks are what gguf's own quantiser gives for `[E, out, in]`; the router stays exact."""
    from gguf import GGMLQuantizationType, quants

    model, _, src = _source("qwen3_moe", tmp_path)
    out = export_gguf(src, tmp_path / "m.gguf", "q8_0")
    state = load_gguf(out, rebuild_tokenizer=False).state_dict
    down = model.model.layers[1].mlp.experts.down_proj.detach().numpy()  # [E, D, H]
    q = GGMLQuantizationType.Q8_0
    want = quants.dequantize(quants.quantize(down, q), q)
    for e in range(down.shape[0]):
        np.testing.assert_array_equal(
            state[f"model.layers.1.mlp.experts.{e}.down_proj.weight"].numpy(), want[e]
        )
    router = model.model.layers[1].mlp.gate.weight.detach()
    assert torch.equal(state["model.layers.1.mlp.gate.weight"], router)


def test_what_gguf_cannot_hold_is_refused(tmp_path):
    import json

    def folder(name: str, config: dict):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return tmp_path / name

    gemma = folder("gemma", {"architectures": ["GemmaForCausalLM"], "model_type": "gemma"})
    with pytest.raises(GGUFError, match="model_type 'gemma' cannot be exported"):
        export_gguf(gemma, tmp_path / "g.gguf", "f16")
    moe = folder(
        "moe", {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "norm_topk_prob": False}
    )
    with pytest.raises(GGUFError, match="norm_topk_prob=false cannot be exported"):
        export_gguf(moe, tmp_path / "m.gguf", "f16")
    rope = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    scaled = folder(
        "scaled", {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_parameters": rope}
    )
    with pytest.raises(GGUFError, match="RoPE scaling 'llama3' cannot be exported"):
        export_gguf(scaled, tmp_path / "s.gguf", "f16")
    assert list(tmp_path.glob("*.gguf*")) == [] and list(tmp_path.glob(".*.gguf*")) == []


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_moe_lora_checkpoint_exports_merged(tmp_path, family):
    """A MoE LoRA run's checkpoint (PEFT folder: attention adapters, one adapter per expert, the
    router trained as `modules_to_save`) exports with everything folded in: the GGUF's logits equal
    the LoRA model's, not the base's."""
    from engine.checkpoint.peft import save_adapters
    from engine.models._decoder_builder import LoRASettings

    model, tok, src = _source(family, tmp_path)
    lora = LoRASettings(
        lora_attn_modules=("q_proj", "v_proj"),
        apply_lora_to_experts=True,
        train_router=True,
        lora_rank=4,
        lora_alpha=8.0,
    )
    tuned = from_pretrained(src, lora=lora)
    torch.manual_seed(3)
    with torch.no_grad():  # fresh adapters are zero (B = 0): give them and the router a change
        for name, p in tuned.named_parameters():
            if "lora_b" in name.lower() or "router" in name:
                p.add_(torch.randn_like(p) * 0.2)
    save_adapters(tuned, tmp_path / "adapters", base_model_dir=src)
    out = export_gguf(tmp_path / "adapters", tmp_path / "m.gguf", "f16")
    back = from_pretrained(convert_gguf_to_hf(out, tmp_path / "back", dtype=torch.float32))
    ids = tok.encode(TEXT).ids[:32]
    ref = _logits(tuned, ids)
    assert (ref - _logits(model, ids)).abs().max() > 0.5  # the adapters and router change the model
    torch.testing.assert_close(_logits(back, ids), ref, atol=REL_TOL["f16"] * ref.abs().max().item(), rtol=0)


def test_token_list_padded_to_the_embedding_rows(tmp_path):
    """Embedding rows beyond the tokenizer's tokens (Qwen pads its vocabulary to a multiple of 64)
    become unused `[PAD<id>]` tokens, so llama.cpp sizes the vocabulary as the embedding; the rebuilt
    tokenizer and transformers' GGUF tokenizer still encode as the source does, and the logits
    survive the round trip."""
    from tokenizers import Tokenizer

    tok = _qwen_tokenizer()
    size = tok.get_vocab_size()
    model = hf_model("qwen3", vocab_size=size + 20)
    src = _save_folder(model, tok, tmp_path / "src")
    out = export_gguf(src, tmp_path / "q.gguf", "f16")
    reader = gguf.GGUFReader(str(out))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == size + 20 and tokens[size] == f"[PAD{size}]" and tokens[-1] == f"[PAD{size + 19}]"
    assert types[size:] == [5] * 20 and types[size - 1] != 5  # 5: unused

    folder = convert_gguf_to_hf(out, tmp_path / "back", dtype=torch.float32)
    ours = Tokenizer.from_file(str(folder / "tokenizer.json"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=out.name)
    for text in (TEXT, "<|im_start|>user\n12 + 345?<|im_end|>\n"):
        want = tok.encode(text).ids
        assert ours.encode(text).ids == want and theirs(text)["input_ids"] == want, text
    ids = tok.encode(TEXT).ids[:16]
    ref = _logits(model, ids)
    torch.testing.assert_close(
        _logits(from_pretrained(folder), ids), ref, atol=REL_TOL["f16"] * ref.abs().max().item(), rtol=0
    )


def test_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    tok = _qwen_tokenizer()
    model = hf_model("qwen3", vocab_size=tok.get_vocab_size() - 10)
    src = _save_folder(model, tok, tmp_path / "src")
    with pytest.raises(GGUFError, match="tokenizer does not belong to this model"):
        export_gguf(src, tmp_path / "q.gguf", "f16")
    assert not (tmp_path / "q.gguf").exists()


@pytest.mark.slow
def test_real_qwen3_tokenizer_round_trips(real_assets, tmp_path):
    """A tiny Qwen3 with the real Qwen3 tokenizer (151,669 tokens, 151,936 embedding rows): the token
    list is padded to the rows as llama.cpp pads it, the pre-tokenizer is named `qwen2`, and both our
    rebuilt tokenizer and transformers' GGUF tokenizer encode chat text as the real one does."""
    import shutil

    from tokenizers import Tokenizer

    real = real_assets("it exports the real Qwen3 tokenizer and compares encodings") / "tokenizers" / "qwen3"
    model = hf_model("qwen3", vocab_size=151_936, num_hidden_layers=1)
    src = tmp_path / "src"
    model.save_pretrained(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(real / name, src / name)
    out = export_gguf(src, tmp_path / "q.gguf", "f16")
    reader = gguf.GGUFReader(str(out))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 151_936 and tokens[151_669] == "[PAD151669]" and tokens[151_645] == "<|im_end|>"
    assert reader.fields["tokenizer.ggml.pre"].contents() == "qwen2"
    assert reader.fields["tokenizer.ggml.token_type"].contents()[151_700] == 5  # unused

    folder = convert_gguf_to_hf(out, tmp_path / "back", dtype=torch.float32)
    ref = Tokenizer.from_file(str(real / "tokenizer.json"))
    ours = Tokenizer.from_file(str(folder / "tokenizer.json"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=out.name)
    texts = [
        "<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "  spaces, tabs\t\tand ünïcödé 日本語 🤗 def f(x): return x**2",
    ]
    for text in texts:
        want = ref.encode(text).ids
        assert ours.encode(text).ids == want, text
        assert theirs(text)["input_ids"] == want, text
    import json

    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    real_cfg = json.loads((real / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == real_cfg["chat_template"] and cfg["eos_token"] == "<|im_end|>"
    ids = ref.encode(texts[0]).ids
    torch.testing.assert_close(
        _logits(from_pretrained(folder), ids), _logits(model, ids), atol=REL_TOL["f16"] * 10, rtol=0
    )
