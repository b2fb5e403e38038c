"""The one error tokenizer loading raises: a bad tokenizer file, folder or chat template."""

from __future__ import annotations

from engine.config import ConfigError


class TokenizerError(ConfigError):
    """A tokenizer file or chat template that cannot be used; the message names the file and the fix."""
