"""tiktoken BPE files: a Llama-3 tiktoken file written from the real Llama-3 `tokenizer.json` (ranks
= ids, token bytes via the byte-level alphabet) must encode exactly as that `tokenizer.json` does."""

from __future__ import annotations

import base64
import json

import pytest
from tokenizers import Tokenizer as RustTokenizer

from engine.data.tokenizers import LLAMA3_PATTERN, TiktokenTokenizer, TokenizerError, load_tokenizer
from engine.data.tokenizers.rank_bpe import byte_level_alphabet

from .conftest import TEXTS


@pytest.fixture(scope="module")
def llama3_tiktoken(tmp_path_factory, request):
    from conftest import SHARED_ASSETS

    src = SHARED_ASSETS / "tokenizers" / "llama3"
    if not src.is_dir():
        pytest.skip(f"{src} is absent")
    data = json.loads((src / "tokenizer.json").read_text())
    alphabet = byte_level_alphabet()
    out = tmp_path_factory.mktemp("llama3_tiktoken")
    lines = []
    for token, rank in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1]):
        raw = bytes(alphabet[c] for c in token)
        lines.append(f"{base64.b64encode(raw).decode()} {rank}")
    (out / "tokenizer.model").write_text("\n".join(lines) + "\n")
    return out, src, data


def test_ids_equal_llama3_tokenizer_json(llama3_tiktoken):
    folder, src, data = llama3_tiktoken
    # The pattern in our module is Llama 3's: the same regex the tokenizer.json pre-tokenizer uses.
    assert data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == LLAMA3_PATTERN
    tok = load_tokenizer(folder)  # no side files: Llama 3.1 special-token layout
    ref = RustTokenizer.from_file(str(src / "tokenizer.json"))
    assert isinstance(tok, TiktokenTokenizer)
    assert tok.vocab_size == 128256
    assert (tok.bos_id, tok.eos_id) == (128000, 128001)
    assert tok.token_to_id("<|eot_id|>") == 128009 and 128009 in tok.stop_tokens
    assert tok.pad_id == tok.token_to_id("<|finetune_right_pad_id|>") == 128004
    for text in TEXTS:
        expected = ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_bos=False, add_eos=False) == expected, text
        assert tok.encode(text) == [128000, *expected, 128001]
        assert tok.decode(tok.encode(text)) == text
    special = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    assert (
        tok.encode(special, add_bos=False, add_eos=False) == ref.encode(special, add_special_tokens=False).ids
    )


def test_side_files_name_special_tokens(llama3_tiktoken, tmp_path):
    folder, src, _ = llama3_tiktoken
    (tmp_path / "tokenizer.model").write_bytes((folder / "tokenizer.model").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text())
    tok = load_tokenizer(tmp_path)
    # Llama 3.0's layout (from tokenizer_config.json): id 128004 is a reserved token there.
    assert tok.id_to_token(128004) == "<|reserved_special_token_2|>"
    assert tok.chat_template is not None
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True
    )
    assert ids[:2] == [128000, 128006] and ids[-1] == 271


def test_malformed_tiktoken_line(tmp_path):
    bad = tmp_path / "x.tiktoken"
    bad.write_text("SGVsbG8= 0\nnot-base64!! 1\n")
    with pytest.raises(TokenizerError, match=r"x.tiktoken:2: expected"):
        load_tokenizer(bad)


def test_encode_spans_equal_tokenizer_json_offsets(llama3_tiktoken):
    folder, src, _ = llama3_tiktoken
    tok = load_tokenizer(folder)
    ref = RustTokenizer.from_file(str(src / "tokenizer.json"))
    texts = [*TEXTS, "<|start_header_id|>user<|end_header_id|>\n\nünï 🤗<|eot_id|>"]
    for text, (ids, starts, ends) in zip(texts, tok.encode_spans(texts)):
        want = ref.encode(text, add_special_tokens=False)
        assert ids == want.ids and list(zip(starts, ends)) == want.offsets, text
