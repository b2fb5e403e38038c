"""Native decoders: family builders, size presets, LoRA/QLoRA variants, model cards, HF loading."""

from engine.models._decoder_builder import LoRASettings, build_decoder
from engine.models.cards import ModelCard, model_card, model_cards
from engine.models.pretrained import from_pretrained

__all__ = ["LoRASettings", "ModelCard", "build_decoder", "from_pretrained", "model_card", "model_cards"]
