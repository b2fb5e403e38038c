"""`load_tokenizer` picks the backend from the files and names the path in every error."""

from __future__ import annotations

import pytest

from engine.config import ConfigError
from engine.data.tokenizers import HFTokenizer, SentencePieceTokenizer, TokenizerError, load_tokenizer


def test_picks_backend(tok_dir, tmp_path):
    assert isinstance(load_tokenizer(tok_dir / "mistral7b_v01"), HFTokenizer)  # tokenizer.json wins
    only_sp = tmp_path / "sp"
    only_sp.mkdir()
    (only_sp / "tokenizer.model").write_bytes((tok_dir / "mistral7b_v01" / "tokenizer.model").read_bytes())
    assert isinstance(load_tokenizer(only_sp), SentencePieceTokenizer)


def test_errors_name_the_path(tmp_path):
    assert issubclass(TokenizerError, ConfigError)  # the CLI prints it as one line, exit 2
    with pytest.raises(TokenizerError, match="no such tokenizer file or folder"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(TokenizerError, match="no tokenizer.json, tokenizer.model"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"truncated": ')
    with pytest.raises(TokenizerError, match=r"tokenizer.json: not a valid tokenizer.json"):
        load_tokenizer(tmp_path)


def test_bad_side_file(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((tok_dir / "smollm2" / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: not readable JSON"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        '{"eos_token": {"content": "<|im_end|>"}, "pad_token": null}'
    )
    tok = load_tokenizer(tmp_path)
    assert tok.eos_id == 2 and tok.stop_tokens[0] == 2
