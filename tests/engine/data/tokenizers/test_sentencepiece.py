"""SentencePiece `tokenizer.model` against the same model's `tokenizer.json` run by `tokenizers`
(Mistral-7B-v0.1 ships both, with the same ids)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as RustTokenizer

from engine.data.tokenizers import SentencePieceTokenizer, TokenizerError, load_tokenizer

from .conftest import TEXTS


@pytest.fixture
def mistral(tok_dir):
    return load_tokenizer(tok_dir / "mistral7b_v01" / "tokenizer.model")


def test_ids_equal_tokenizer_json(tok_dir, mistral):
    ref = RustTokenizer.from_file(str(tok_dir / "mistral7b_v01" / "tokenizer.json"))
    assert isinstance(mistral, SentencePieceTokenizer)
    assert mistral.vocab_size == 32000
    assert (mistral.bos_id, mistral.eos_id, mistral.unk_id) == (1, 2, 0)
    for text in [*TEXTS, "a </s> b", "ends with eos</s>"]:
        assert mistral.encode(text, add_eos=False) == ref.encode(text, add_special_tokens=True).ids, text
        assert (
            mistral.encode(text, add_bos=False, add_eos=False)
            == ref.encode(text, add_special_tokens=False).ids
        )


def test_decode_and_specials(mistral):
    ids = mistral.encode("Hello world!")
    assert ids[0] == 1 and ids[-1] == 2
    assert mistral.decode(ids) == "Hello world!"
    assert mistral.decode(ids, skip_special_tokens=False) == "<s>Hello world!</s>"
    assert mistral.token_to_id("</s>") == 2 and mistral.token_to_id("▁Hello") == 22557
    assert mistral.id_to_token(22557) == "▁Hello"
    assert mistral.stop_tokens == [2]
    # A text that already starts with BOS does not get a second one.
    assert mistral.encode("<s>Hi", add_eos=False) == [1, 15359]


def test_not_a_sentencepiece_model(tmp_path):
    bad = tmp_path / "tokenizer.model"
    bad.write_bytes(b"\x00\x01garbage that is not a protobuf\xff")
    with pytest.raises(TokenizerError, match="not a SentencePiece model"):
        load_tokenizer(bad)
