"""GGUF export against references: tiny transformers models (Llama with a byte-level BPE, Mistral with a
SentencePiece-style BPE, LoRA adapters applied by `peft`) written by `export_gguf`, read back by the
`gguf` package's GGUFReader and through tunebench's GGUF import, then run by transformers: logits equal
the source model's within the storage type's precision; the demo SmolLM2 round-trips and says "Paris"."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.checkpoint.gguf import convert_gguf_to_hf, load_gguf
from engine.checkpoint.gguf_export import export_gguf
from tests.engine.checkpoint.test_gguf import TEXT, _tiny_llama, _tiny_tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
# Max |logit difference| against the float32 source (logits here are O(1); stated per storage type:
# f16 keeps 11 significant bits, bf16 8, Q8_0 8 bits per weight plus an f16 scale per 32).
ATOL = {"f16": 1e-3, "bf16": 1e-2, "q8_0": 2e-2}
GGML_TYPE = {"f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}


def _save_folder(model, tok, folder):
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(folder)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    return folder


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _reimported(path, tmp_path):
    folder = convert_gguf_to_hf(path, tmp_path / "back", dtype=torch.float32)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval(), folder


@pytest.mark.parametrize("qtype", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("tied", [True, False])
def test_llama_round_trip_logits(tmp_path, qtype, tied):
    tok = _tiny_tokenizer()
    model = _tiny_llama(tok.get_vocab_size(), tied=tied)
    src = _save_folder(model, tok, tmp_path / "src")
    out = export_gguf(src, tmp_path / "m.gguf", qtype)

    reader = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == GGML_TYPE[qtype] and types["blk.0.attn_norm.weight"] == "F32"
    assert ("output.weight" in types) is not tied
    assert reader.fields["tokenizer.chat_template"].contents() == TEMPLATE
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert reader.fields["llama.rope.freq_base"].contents() == 50000.0
    assert list(reader.tensors)  # every tensor readable
    assert list(tmp_path.glob(".m.gguf.*")) == []

    back, folder = _reimported(out, tmp_path)
    ids = json.loads((folder / "tokenizer_config.json").read_text())
    assert ids["chat_template"] == TEMPLATE and ids["eos_token"] == "<|im_end|>"
    from tokenizers import Tokenizer

    rebuilt = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert rebuilt.encode(TEXT).ids == tok.encode(TEXT).ids
    prompt = tok.encode(TEXT).ids
    torch.testing.assert_close(_logits(back, prompt), _logits(model, prompt), atol=ATOL[qtype], rtol=0)


def test_llama3_pre_tokenizer_is_named_and_rebuilt(tmp_path):
    """A Llama-3 style byte-level BPE (its split regex, then byte-level) is written as `llama-bpe` and
    the importer's rebuilt tokenizer encodes as the source does."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from engine.checkpoint.gguf import _LLAMA3_SPLIT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 20, trainer)
    src = _save_folder(_tiny_llama(tok.get_vocab_size(), tied=True), tok, tmp_path / "src")
    out = export_gguf(src, tmp_path / "m.gguf", "bf16")
    assert gguf.GGUFReader(str(out)).fields["tokenizer.ggml.pre"].contents() == "llama-bpe"
    _, folder = _reimported(out, tmp_path)
    rebuilt = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in (TEXT, "cats 12345 sat, it's   here\n\n the  dog's 3.14 mat!"):
        assert rebuilt.encode(text).ids == tok.encode(text).ids, text


def test_q8_0_weights_equal_gguf_dequantize_of_the_source(tmp_path):
    """Q8_0 blocks are what gguf's own quantiser gives: the imported weight equals quantize->dequantize."""
    from gguf import GGMLQuantizationType, quants

    tok = _tiny_tokenizer()
    model = _tiny_llama(tok.get_vocab_size(), tied=True)
    out = export_gguf(_save_folder(model, tok, tmp_path / "src"), tmp_path / "m.gguf", "q8_0")
    w = model.model.layers[1].mlp.down_proj.weight.detach().numpy()
    ref = quants.dequantize(quants.quantize(w, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    got = load_gguf(out, rebuild_tokenizer=False).state_dict["model.layers.1.mlp.down_proj.weight"]
    np.testing.assert_array_equal(got.numpy(), ref)


def _spm_tokenizer():
    """A SentencePiece-style BPE (U+2581 spaces, prefix space, byte fallback), as Llama 2 / Mistral ship."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([TEXT] * 20, trainer)
    return tok


def test_mistral_sentencepiece_round_trip(tmp_path):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = _spm_tokenizer()
    cfg = transformers.MistralConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        sliding_window=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    model = transformers.MistralForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "src")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(tmp_path / "src")
    out = export_gguf(tmp_path / "src", tmp_path / "m.gguf", "f16")
    assert gguf.GGUFReader(str(out)).fields["tokenizer.ggml.model"].contents() == "llama"
    back, folder = _reimported(out, tmp_path)
    rebuilt = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in (TEXT, "the cats sat; 日本 dogs", "  two  spaces"):
        want = tok.encode(text).ids
        got = rebuilt.encode(text).ids
        assert got[1:] == want and got[0] == tok.token_to_id("<s>"), text  # GGUF adds BOS
    prompt = tok.encode(TEXT).ids
    torch.testing.assert_close(_logits(back, prompt), _logits(model, prompt), atol=ATOL["f16"], rtol=0)


def test_lora_adapters_are_folded_in(tmp_path):
    """A PEFT adapter folder (as LoRA runs save) exports merged: logits equal peft's on transformers."""
    peft = pytest.importorskip("peft")
    tok = _tiny_tokenizer()
    model = _tiny_llama(tok.get_vocab_size(), tied=True)
    base = _save_folder(model, tok, tmp_path / "base")
    lora_cfg = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
    )
    wrapped = peft.get_peft_model(_tiny_llama(tok.get_vocab_size(), tied=True), lora_cfg)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    wrapped.save_pretrained(tmp_path / "adapters")
    cfg_path = tmp_path / "adapters" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, base_model_name_or_path=str(base))))
    out = export_gguf(tmp_path / "adapters", tmp_path / "m.gguf", "f16")
    back, _ = _reimported(out, tmp_path)
    prompt = tok.encode(TEXT).ids
    ref = _logits(wrapped.eval(), prompt)
    assert (ref - _logits(model, prompt)).abs().max() > 0.05  # the adapters change the model
    torch.testing.assert_close(_logits(back, prompt), ref, atol=ATOL["f16"], rtol=0)


@pytest.mark.slow
def test_demo_round_trips_and_says_paris(tmp_path):
    """SmolLM2 (bf16 weights): bf16 export is lossless (logits equal); q8_0 still answers "Paris", its
    logits stay within 2.0 of the source's (a few % of their range) and agree on the top token almost
    everywhere; the `smollm` pre-tokenizer and the ChatML template come back."""
    from engine.config import ConfigError
    from engine.data.tokenizers import load_tokenizer
    from engine.generation import generate
    from engine.models import from_pretrained
    from engine.models.demo_model import demo_gguf_path, demo_model_dir

    try:
        demo_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    src = demo_model_dir(tmp_path / "home")
    source_tok = load_tokenizer(src)
    prompt = source_tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
    )
    with torch.no_grad():
        ref = from_pretrained(src, dtype=torch.float32)(torch.tensor([prompt]))[0]
    for qtype in ("bf16", "q8_0"):
        out = export_gguf(src, tmp_path / f"demo.{qtype}.gguf", qtype)
        folder = convert_gguf_to_hf(out, tmp_path / qtype, dtype=torch.float32)
        model = from_pretrained(folder, dtype=torch.float32)
        with torch.no_grad():
            got = model(torch.tensor([prompt]))[0]
        if qtype == "bf16":
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
            continue
        diff = (got - ref).abs().max().item()
        agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
        print(
            f"q8_0 demo: max |logit diff| {diff:.3f} (logit range {ref.abs().max().item():.1f}), top-1 agree {agree:.3f}"
        )
        assert diff < 2.0 and agree >= 0.9, (diff, agree)
        assert gguf.GGUFReader(str(out)).fields["tokenizer.ggml.pre"].contents() == "smollm"
        tok = load_tokenizer(folder)
        assert (
            tok.apply_chat_template(
                [{"role": "user", "content": "What is the capital of France?"}],
                add_generation_prompt=True,
                tokenize=True,
            )
            == prompt
        )
        text = "Numbers 1234567 and 3.14, code: def f(x): return x**2"
        assert tok.encode(text, add_bos=False, add_eos=False) == source_tok.encode(
            text, add_bos=False, add_eos=False
        )
        answer = generate(model, [prompt], max_new_tokens=24, stop_tokens=tok.stop_tokens, pad_id=tok.pad_id)
        assert "Paris" in tok.decode(answer.completions[0]), tok.decode(answer.completions[0])
