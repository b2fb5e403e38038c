"""Checkpoints: HF safetensors in/out (state-dict invariant), Meta's original format, recipe state, GGUF."""

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.hf_safetensors import load_hf_weights, save_pretrained
from engine.checkpoint.meta_format import load_meta, save_meta

__all__ = ["CheckpointError", "load_hf_weights", "load_meta", "save_meta", "save_pretrained"]
