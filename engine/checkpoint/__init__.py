"""Checkpoints: HF safetensors in/out (state-dict invariant), Meta's original format, recipe state, GGUF.

The names below load on first use, so `engine.checkpoint.layout` (which folders are complete
checkpoints) can be imported by the CLI without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CheckpointError": "engine.checkpoint.checkpoint_errors",
    "load_hf_weights": "engine.checkpoint.hf_safetensors",
    "save_pretrained": "engine.checkpoint.hf_safetensors",
    "load_meta": "engine.checkpoint.meta_format",
    "save_meta": "engine.checkpoint.meta_format",
}

__all__ = ["CheckpointError", "load_hf_weights", "load_meta", "save_meta", "save_pretrained"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'engine.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
