"""Errors of the evaluation package."""

from __future__ import annotations

from engine.config import ConfigError


class EvalError(ConfigError):
    """A model, task or evaluation setting that cannot be used; one line naming it and what to change."""
