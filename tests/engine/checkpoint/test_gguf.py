"""GGUF import against references: a tiny transformers Llama written to GGUF the way llama.cpp does
(Q/K rows permuted, tensors quantised by the `gguf` package), imported back and loaded by transformers;
the SmolLM2 tokenizer rebuilt from the real GGUF's metadata against its published tokenizer.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.checkpoint.gguf import GGUFError, convert_gguf_to_hf, load_gguf, permute_qk, unpermute_qk
from engine.config import ConfigError

transformers = pytest.importorskip("transformers")

TEXT = "the cat sat on the mat. the dog sat on the log. 12 cats and 3 dogs!\n"
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _tiny_tokenizer():
    """A real byte-level BPE trained on a few sentences (vocab 300), with two special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 20, trainer)
    return tok


def _tiny_llama(vocab: int, tied: bool):
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=50000.0,  # not the default, so a dropped rope_theta shows in the logits
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _write_gguf(path, model, tok, qtype_name: str):
    import gguf
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[qtype_name]
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    data = json.loads(tok.to_str())
    vocab = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_merges(merges)
    w.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        t = p.detach().float()
        if name.endswith("q_proj.weight"):
            t = permute_qk(t, heads)
        elif name.endswith("k_proj.weight"):
            t = permute_qk(t, kv_heads)
        parts = name.split(".")
        gname = HF_TO_GGUF.get(name) or f"blk.{parts[2]}.{HF_TO_GGUF['.'.join(parts[3:])]}"
        arr = t.numpy()
        if arr.ndim == 1 or qtype_name == "F32":
            w.add_tensor(gname, arr)
        elif qtype_name == "F16":
            w.add_tensor(gname, arr.astype(np.float16))
        else:
            w.add_tensor(gname, quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unpermute_inverts_permute():
    w = torch.randn(4 * 16, 8)
    assert torch.equal(unpermute_qk(permute_qk(w, 4), 4), w)
    assert not torch.equal(permute_qk(w, 4), w)


# Max abs error allowed per storage type, relative to the weight's max abs value.
TOLERANCE = {"F32": 0.0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2, "Q5_0": 0.08, "Q4_0": 0.15, "Q4_1": 0.1}


@pytest.mark.parametrize("qtype", list(TOLERANCE))
def test_weights_come_back(tmp_path, qtype):
    tok = _tiny_tokenizer()
    model = _tiny_llama(tok.get_vocab_size(), tied=qtype != "Q8_0")
    path = tmp_path / f"tiny.{qtype}.gguf"
    _write_gguf(path, model, tok, qtype)
    ckpt = load_gguf(path)
    ref = {
        k: v
        for k, v in model.state_dict().items()
        if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    }
    assert set(ckpt.state_dict) == set(ref)
    for name, expected in ref.items():
        got = ckpt.state_dict[name]
        assert got.shape == expected.shape, name
        bound = TOLERANCE[qtype if expected.dim() == 2 else "F32"] * expected.abs().max().item()
        torch.testing.assert_close(got, expected, atol=bound, rtol=0, msg=name)
    assert ckpt.config["tie_word_embeddings"] == model.config.tie_word_embeddings
    assert ckpt.tensor_types["model.layers.0.self_attn.q_proj.weight"] == qtype


def test_f32_gguf_gives_transformers_the_same_logits(tmp_path):
    tok = _tiny_tokenizer()
    model = _tiny_llama(tok.get_vocab_size(), tied=True)
    _write_gguf(tmp_path / "tiny.gguf", model, tok, "F32")
    out = convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "hf", dtype=torch.float32)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode(TEXT).ids[:24]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    # The rebuilt tokenizer encodes exactly as the one it was written from; specials and template kept.
    from engine.data.tokenizers import load_tokenizer

    rebuilt = load_tokenizer(out)
    for text in (TEXT, "a dog and 42 mats", "<|im_start|>the cat<|im_end|>"):
        assert rebuilt.encode(text, add_bos=False, add_eos=False) == tok.encode(text).ids
    assert (rebuilt.bos_id, rebuilt.eos_id, rebuilt.adds_bos) == (1, 2, False)
    assert rebuilt.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|im_start|>hi<|im_end|>"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_smollm2_tokenizer_rebuilt_from_real_gguf(real_assets):
    from tokenizers import Tokenizer

    from engine.checkpoint.gguf import _open, _tokenizer
    from engine.models.demo_model import demo_gguf_path

    try:
        path = demo_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    tok_json, tok_cfg = _tokenizer(_open(path), path)
    rebuilt = Tokenizer.from_str(tok_json)
    real = real_assets("it compares the rebuilt tokenizer with SmolLM2's published tokenizer.json")
    ref = Tokenizer.from_file(str(real / "tokenizers" / "smollm2" / "tokenizer.json"))
    texts = [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "Numbers 1234567 and 3.14, code: def f(x): return x**2",
        "  spaces, tabs\t\tand ünïcödé 日本語 🤗",
    ]
    for text in texts:
        assert rebuilt.encode(text).ids == ref.encode(text).ids, text
    assert rebuilt.get_vocab_size() == ref.get_vocab_size() == 49152
    assert tok_cfg["eos_token"] == "<|im_end|>" and tok_cfg["add_bos_token"] is False
    assert "<|im_start|>" in tok_cfg["chat_template"]


def test_bad_files_one_line(tmp_path):
    with pytest.raises(GGUFError, match="no such GGUF file"):
        load_gguf(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 5)
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        load_gguf(bad)
    tok = _tiny_tokenizer()
    _write_gguf(tmp_path / "ok.gguf", _tiny_llama(tok.get_vocab_size(), tied=True), tok, "F32")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes((tmp_path / "ok.gguf").read_bytes()[:-4096])
    with pytest.raises(GGUFError, match="truncated.gguf"):
        load_gguf(truncated)
    (tmp_path / "out").mkdir()
    with pytest.raises(GGUFError, match="already exists"):
        convert_gguf_to_hf(tmp_path / "ok.gguf", tmp_path / "out")
    assert list(tmp_path.glob(".out.*")) == []  # nothing half-written


def test_sentencepiece_tokenizer_rebuilt_from_gguf_metadata(real_assets, tmp_path):
    """Llama-2/Mistral GGUFs carry a SentencePiece vocabulary (pieces, scores, types); the rebuilt
    tokenizer must encode as Mistral's own tokenizer.json does."""
    import gguf
    import sentencepiece as spm
    from tokenizers import Tokenizer

    from engine.checkpoint.gguf import _open, _tokenizer

    real = real_assets("it rebuilds the real Mistral 7B v0.1 SentencePiece vocabulary and compares encodings")
    src = real / "tokenizers" / "mistral7b_v01"
    sp = spm.SentencePieceProcessor(model_file=str(src / "tokenizer.model"))
    n = sp.GetPieceSize()
    types = [2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 6 if sp.IsByte(i) else 1 for i in range(n)]
    w = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.IdToPiece(i) for i in range(n)])
    w.add_token_scores([sp.GetScore(i) for i in range(n)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok_json, tok_cfg = _tokenizer(_open(tmp_path / "spm.gguf"), tmp_path / "spm.gguf")
    rebuilt = Tokenizer.from_str(tok_json)
    ref = Tokenizer.from_file(str(src / "tokenizer.json"))
    texts = [
        "Hello world! The year 2024 had 366 days.",
        "  leading spaces, tabs\tand ünïcödé 日本語 🤗",
        "def f(x):\n    return x ** 2  # code",
        "[INST] What is the capital of France? [/INST]",
    ]
    for text in texts:
        assert rebuilt.encode(text).ids == ref.encode(text).ids, text
        assert rebuilt.decode(rebuilt.encode(text).ids) == ref.decode(ref.encode(text).ids)
    assert tok_cfg["bos_token"] == "<s>" and tok_cfg["add_bos_token"] is True


def test_demo_conversion_race_keeps_the_finished_folder(tmp_path, monkeypatch):
    """Two processes converting the demo at once: the one that finishes second keeps the first's folder."""
    from engine.models import demo_model as demo

    tok = _tiny_tokenizer()
    _write_gguf(tmp_path / "tiny.gguf", _tiny_llama(tok.get_vocab_size(), tied=True), tok, "F32")
    monkeypatch.setattr(demo, "demo_gguf_path", lambda: tmp_path / "tiny.gguf")
    home = tmp_path / "home"
    target = home / "models" / demo.DEMO_NAME
    real_save = __import__("safetensors.torch", fromlist=["save_file"]).save_file

    raced = []

    def save_then_lose_the_race(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)
        if not raced:  # the other process renames its finished folder into place now
            raced.append(True)
            convert_gguf_to_hf(tmp_path / "tiny.gguf", target, dtype=torch.float32)
            (target / "winner").touch()  # marks the first finished folder

    monkeypatch.setattr("safetensors.torch.save_file", save_then_lose_the_race)
    assert demo.demo_model_dir(home) == target
    assert (target / "winner").is_file()  # the finished folder was kept, not replaced or deleted
    assert [p.name for p in target.parent.iterdir()] == [demo.DEMO_NAME]  # no temp folder left behind


def test_mixtral_gguf_with_stacked_experts_gives_the_same_logits(tmp_path):
    """A Mixtral GGUF (llama architecture + expert_count, experts stacked as ffn_*_exps) imports to a
    MixtralForCausalLM folder: per-expert keys, transformers' and tunebench's logits equal the source."""
    import gguf

    from engine.models import from_pretrained

    tok = _tiny_tokenizer()
    cfg = transformers.MixtralConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=128, rms_norm_eps=1e-5,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    w = gguf.GGUFWriter(str(tmp_path / "moe.gguf"), "llama")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_feed_forward_length(48)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(cfg.vocab_size)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    data = json.loads(tok.to_str())
    vocab = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    w.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    w.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    w.add_tensor("output.weight", state["lm_head.weight"].numpy())
    for i in range(2):
        pre = f"model.layers.{i}."
        gate_up = state[pre + "mlp.experts.gate_up_proj"]  # [E, 2H, D] in memory
        tensors = {
            "attn_norm.weight": state[pre + "input_layernorm.weight"],
            "ffn_norm.weight": state[pre + "post_attention_layernorm.weight"],
            "attn_q.weight": permute_qk(state[pre + "self_attn.q_proj.weight"], 4),
            "attn_k.weight": permute_qk(state[pre + "self_attn.k_proj.weight"], 2),
            "attn_v.weight": state[pre + "self_attn.v_proj.weight"],
            "attn_output.weight": state[pre + "self_attn.o_proj.weight"],
            "ffn_gate_inp.weight": state[pre + "mlp.gate.weight"],
            "ffn_gate_exps.weight": gate_up[:, :48],
            "ffn_up_exps.weight": gate_up[:, 48:],
            "ffn_down_exps.weight": state[pre + "mlp.experts.down_proj"],
        }
        for name, t in tensors.items():
            w.add_tensor(f"blk.{i}.{name}", t.contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = convert_gguf_to_hf(tmp_path / "moe.gguf", tmp_path / "hf", dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MixtralForCausalLM"]
    ids = torch.tensor([tok.encode(TEXT).ids[:24]])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = from_pretrained(out)
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(loaded(ids).logits, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=0)
