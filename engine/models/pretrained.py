"""Load a Hugging Face model folder into a native decoder, built on `meta` and filled while loading."""

from __future__ import annotations

import os

import torch

from engine.checkpoint.hf_safetensors import load_hf_weights
from engine.models._decoder_builder import LoRASettings, build_decoder
from engine.models.hf_config import decoder_kwargs, num_labels_of, read_hf_config, torch_dtype_of
from engine.modules.transformer import TransformerDecoder


def from_pretrained(
    model_dir: str | os.PathLike,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    *,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """The native decoder of a HF folder (`config.json` + safetensors), family chosen from config;
    a `*ForSequenceClassification` folder gives an `engine.modules.score_decoder.ScoreDecoder`.

    Args:
        model_dir: the folder. dtype: compute/storage dtype (default: config's dtype, else as stored).
        device: where to put the weights. lora: add adapters (base weights frozen, adapters fresh).
    Raises CheckpointError (a ConfigError) for an unknown architecture, a missing or corrupt file,
    or a key/shape mismatch; the message names the file and key.
    """
    config = read_hf_config(model_dir)
    if num_labels_of(config) is not None:  # a *ForSequenceClassification folder: a reward model
        from engine.models.reward import reward_from_pretrained

        return reward_from_pretrained(model_dir, dtype, device, lora=lora)
    kwargs = decoder_kwargs(config, source=f"{os.fspath(model_dir)}/config.json")
    with torch.device("meta"):
        model = build_decoder(**kwargs, lora=lora)
    model.hf_config = config
    load_hf_weights(model, model_dir, dtype=dtype or torch_dtype_of(config), device=device)
    return model.eval()
