"""Reward and value models: any family's decoder with a scalar `score` head.

    model:
      _component_: engine.models.reward.reward_model
      decoder: {_component_: engine.models.smollm2.smollm2_135m}   # or lora_*, qwen2_5_0_5b, llama3_2_1b, ...
      num_labels: 1

The decoder's blocks are kept and its vocabulary projection dropped; weights load from a Hugging
Face `*ForSequenceClassification` folder (the head included) or from a causal LM's folder (the head
then starts fresh, normal with std 0.02, and `model.fresh_score_head` is True).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from engine.modules.score_decoder import ScoreDecoder
from engine.modules.transformer import TransformerDecoder


def reward_model(decoder: TransformerDecoder, num_labels: int = 1) -> ScoreDecoder:
    """`decoder`'s embeddings, blocks and final norm under a `Linear(D, num_labels, bias=False)` head.

    Args:
        decoder: a built decoder (a `_component_` node in configs; a `lora_*` builder gives LoRA
            adapters in the blocks, the head is then trained in full by the recipes).
        num_labels: head size (1 for a reward or value model).
    Raises:
        ValueError: num_labels < 1 or a decoder that is not a TransformerDecoder.
    """
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ValueError(f"num_labels: must be a positive integer, got {num_labels!r}")
    if not isinstance(decoder, TransformerDecoder) or isinstance(decoder, ScoreDecoder):
        raise ValueError(
            "decoder: give a decoder builder node, e.g. {_component_: engine.models.smollm2.smollm2_135m}"
        )
    dim = decoder.tok_embeddings.weight.shape[1]
    device = decoder.tok_embeddings.weight.device
    score = nn.Linear(dim, num_labels, bias=False, device=device, dtype=decoder.tok_embeddings.weight.dtype)
    if not score.weight.is_meta:
        with torch.no_grad():
            score.weight.normal_(0.0, 0.02)
    return ScoreDecoder(decoder, score)


def reward_from_pretrained(
    model_dir: str | os.PathLike,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    *,
    num_labels: int = 1,
    lora=None,
) -> ScoreDecoder:
    """A reward/value model from a HF folder: a `*ForSequenceClassification` one (head loaded, its
    `num_labels`) or a causal LM's (fresh head of `num_labels`). Raises CheckpointError like
    `engine.models.from_pretrained`."""
    from engine.checkpoint.hf_safetensors import load_hf_weights
    from engine.models._decoder_builder import build_decoder
    from engine.models.hf_config import decoder_kwargs, num_labels_of, read_hf_config, torch_dtype_of

    config = read_hf_config(model_dir)
    kwargs = decoder_kwargs(config, source=f"{os.fspath(model_dir)}/config.json")
    with torch.device("meta"):
        model = reward_model(
            build_decoder(**kwargs, lora=lora), num_labels=num_labels_of(config) or num_labels
        )
    model.hf_config = config
    load_hf_weights(model, model_dir, dtype=dtype or torch_dtype_of(config), device=device)
    return model.eval()
