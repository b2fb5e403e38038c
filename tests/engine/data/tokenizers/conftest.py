"""Fixtures for the tokenizer tests: the real tokenizers in `../shared/assets/tokenizers/`."""

from __future__ import annotations

from pathlib import Path

import pytest

TEXTS = [
    "Hello world!",
    "The year 2024 had 366 days; 3.14159 is pi.",
    "  leading and trailing spaces  ",
    "Multi-line\n\ntext with\ttabs and ünïcödé, 日本語, emoji 🤗.",
    "def f(x):\n    return x ** 2  # code",
    "",
]


@pytest.fixture
def tok_dir(shared_assets) -> Path:
    return shared_assets / "tokenizers"
