"""`encode_spans`: ids and character spans of many texts, equal to the `tokenizers` library's own
`encode_batch` ids and offsets -- on tiktoken for the rank-BPE Llama 3 file, on the library otherwise."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as RustTokenizer

from engine.data.tokenizers import load_tokenizer
from engine.data.tokenizers.hf_json import FAST_AFTER
from engine.data.tokenizers.rank_bpe import rank_bpe_encoding

from .conftest import TEXTS

SPECIAL = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n🤗 ünï<|eot_id|> <|im_start|>x"


@pytest.mark.parametrize("name", ["llama3", "qwen3", "smollm2", "mistral7b_v01"])
def test_spans_equal_library_offsets(tok_dir, name, data_dir):
    tok = load_tokenizer(tok_dir / name)
    ref = RustTokenizer.from_file(str(tok_dir / name / "tokenizer.json"))
    rows = json.loads((data_dir / "alpaca_data_cleaned_1000.json").read_text())[:300]
    texts = [*TEXTS[:-1], SPECIAL, *(r["instruction"] + "\n" + r["output"] for r in rows)]
    assert len(texts) >= FAST_AFTER  # enough texts for the tiktoken path to be taken
    got = tok.encode_spans(texts)
    for text, (ids, starts, ends), want in zip(texts, got, ref.encode_batch(texts, add_special_tokens=False)):
        assert ids == want.ids, text
        assert list(zip(starts, ends)) == want.offsets, text
    # Only the Llama 3 file is rank BPE (Qwen3: NFC normaliser; SmolLM2: no ignore_merges; Mistral:
    # not byte-level), so only it runs on tiktoken.
    assert bool(tok._rank_bpe) == (name == "llama3")


def test_rank_bpe_needs_every_split_as_a_merge(tok_dir):
    data = json.loads((tok_dir / "llama3" / "tokenizer.json").read_text())  # rank BPE: test above
    data["model"]["merges"] = data["model"]["merges"][1:]  # drop the first merge ("Ġ Ġ")
    assert rank_bpe_encoding(data, "test-llama3-one-merge-less") is None
