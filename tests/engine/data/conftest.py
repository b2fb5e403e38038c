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


@pytest.fixture
def data_dir(shared_assets):
    return shared_assets / "data"


@pytest.fixture(autouse=True)
def _private_home(tunebench_home):
    """Every data test gets its own TUNEBENCH_HOME, so the tokenized-data cache starts empty."""
    return tunebench_home
