"""Tiny models, seeded so every rank (and the single-process reference) starts from the same weights.

Classes live at module level so they pickle by reference when a model crosses to a rank.
"""
from __future__ import annotations

import torch
from torch import nn


def mlp(in_dim: int = 8, hidden: int = 16, out_dim: int = 1, seed: int = 0, depth: int = 2) -> nn.Sequential:
    torch.manual_seed(seed)
    layers, d = [], in_dim
    for _ in range(depth - 1):
        layers += [nn.Linear(d, hidden), nn.Tanh()]
        d = hidden
    layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """A GPT-shaped model small enough to train on two CPU cores; the lm head is tied to the embedding."""

    def __init__(self, vocab=32, dim=32, heads=2, layers=2, seq_len=16, tie=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight  # tied parameters: a classic sharding edge case

    def forward(self, idx):
        x = self.embed(idx) + self.pos[:, : idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def tiny_transformer(vocab=32, dim=32, heads=2, layers=2, seq_len=16, seed=0, tie=True) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(vocab, dim, heads, layers, seq_len, tie)
