"""Masked multi-head attention: `manual` spells out the seed articles' steps (Q/K/V projections,
split into heads, Q·Kᵀ / sqrt(head_size), -inf above the diagonal, softmax, dropout, times V, merge
heads, Wo); `sdpa` computes the same with torch's fused `scaled_dot_product_attention`."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        context_length: int,
        dropout: float,
        bias: bool = True,
        attention: str = "sdpa",
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = d_model // num_heads
        self.attention = attention
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # Wq, Wk, Wv side by side
        self.proj = nn.Linear(d_model, d_model, bias=bias)  # Wo
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        mask = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)  # True above the diagonal: the future

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """[batch, context_length, d_model] -> [batch, num_heads, context_length, head_size]"""
        batch, context_length, _ = t.shape
        return t.view(batch, context_length, self.num_heads, self.head_size).transpose(1, 2)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Q·Kᵀ / sqrt(head_size): [batch, num_heads, context_length, context_length]"""
        return q @ k.transpose(-2, -1) / math.sqrt(self.head_size)

    def masked(self, scores: torch.Tensor) -> torch.Tensor:
        """-inf above the diagonal: a token attends to itself and the tokens before it."""
        context_length = scores.shape[-1]
        return scores.masked_fill(self.mask[:context_length, :context_length], float("-inf"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, context_length, d_model = x.shape  # [batch, context_length, d_model]
        q, k, v = self.qkv(x).split(d_model, dim=2)  # each [batch, context_length, d_model]
        q = self.split_heads(q)
        k = self.split_heads(k)
        v = self.split_heads(v)

        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        else:
            weights = F.softmax(self.masked(self.scores(q, k)), dim=-1)  # each row sums to 1
            out = self.attn_dropout(weights) @ v  # [batch, num_heads, context_length, head_size]

        out = out.transpose(1, 2).contiguous().view(batch, context_length, d_model)  # merge heads
        return self.resid_dropout(self.proj(out))  # Wo: [batch, context_length, d_model]
