"""Fixtures for the data pipeline tests: real tokenizers from the shared assets, loaded once."""

from __future__ import annotations

from functools import cache

import pytest


@cache
def _load(path: str):
    from engine.data.tokenizers import load_tokenizer

    return load_tokenizer(path)


@cache
def _rust(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


@pytest.fixture
def tok(shared_assets):
    """`tok("qwen3")` -> the project's tokenizer for ../shared/assets/tokenizers/qwen3."""
    return lambda name: _load(str(shared_assets / "tokenizers" / name))


@pytest.fixture
def rust(shared_assets):
    """`rust("qwen3")` -> the `tokenizers` library's own Tokenizer (the reference encoder)."""
    return lambda name: _rust(str(shared_assets / "tokenizers" / name / "tokenizer.json"))


def meta_llama3_layout(encode, messages, mask_headers: bool = False) -> tuple[list[int], list[bool]]:
    """Meta's llama3 `ChatFormat.encode_dialog_prompt` (meta-llama/llama3, llama/tokenizer.py) without
    the trailing generation header, with masks: <|begin_of_text|> (masked), then per message
    <|start_header_id|> + encode(role) + <|end_header_id|> + encode("\\n\\n") (the header: the
    message's mask, or masked with `mask_headers`) and encode(content.strip()) + <|eot_id|> (the
    message's mask), each part encoded on its own by `encode` (text -> ids, no special tokens added)."""
    ids, mask = [128000], [True]
    for m in messages:
        head = [128006, *encode(m.role), 128007, *encode("\n\n")]
        body = [*encode(m.content.strip()), 128009]
        ids += head + body
        mask += [m.masked or mask_headers] * len(head) + [m.masked] * len(body)
    return ids, mask


@pytest.fixture
def meta_llama3():
    return meta_llama3_layout


@pytest.fixture
def data_dir(shared_assets):
    return shared_assets / "data"


@pytest.fixture(autouse=True)
def _private_home(tunebench_home):
    """Every data test gets its own TUNEBENCH_HOME, so the tokenized-data cache starts empty."""
    return tunebench_home
