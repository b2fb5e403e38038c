"""A 2-layer, 64-dim decoder for toolbox tests, with the submodule names of engine.modules'
TransformerDecoder (layers[i].attn.q_proj/..., mlp.gate_proj/..., forward_hidden, output_weight)."""

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, num_heads, num_kv_heads):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, dim // num_heads
        self.q_proj = nn.Linear(dim, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=False)
        self.output_proj = nn.Linear(num_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, S, hd]
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, KV, S, hd]
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.output_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim, num_heads, num_kv_heads, hidden):
        super().__init__()
        self.sa_norm, self.mlp_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attn, self.mlp = Attention(dim, num_heads, num_kv_heads), MLP(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.sa_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyDecoder(nn.Module):
    def __init__(self, vocab=128, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, hidden=128):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, num_heads, num_kv_heads, hidden) for _ in range(num_layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    @property
    def output_weight(self):
        return self.output.weight

    def forward_hidden(self, tokens):
        x = self.tok_embeddings(tokens)  # [B, S, D]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward(self, tokens):
        return self.output(self.forward_hidden(tokens))  # [B, S, V]


def tiny_decoder(seed=0, **kwargs):
    torch.manual_seed(seed)
    return TinyDecoder(**kwargs)
