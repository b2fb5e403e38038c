"""Building blocks: attention (GQA, RoPE, KV cache), norms, MLP, LoRA/NF4 linears, losses."""

from engine.modules.attention import GroupedQueryAttention
from engine.modules.feed_forward import FeedForward
from engine.modules.kv_cache import KVCache
from engine.modules.rms_norm import RMSNorm
from engine.modules.rotary import Llama3RopeScaling, RotaryEmbedding
from engine.modules.transformer import TransformerBlock, TransformerDecoder

__all__ = [
    "FeedForward",
    "GroupedQueryAttention",
    "KVCache",
    "Llama3RopeScaling",
    "RMSNorm",
    "RotaryEmbedding",
    "TransformerBlock",
    "TransformerDecoder",
]
