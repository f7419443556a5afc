"""Masked multi-head attention, step by step as in the seed articles, plus a fused SDPA path.

`manual` spells out every step: Q/K/V projections, split into heads, Q·Kᵀ / sqrt(head_size),
upper triangle masked with -inf, softmax, dropout, times V, merge heads, Wo.
`sdpa` computes the same thing with torch's fused `scaled_dot_product_attention`.
Setting `trace` to a dict records the intermediate tensors of one forward pass (the manual
steps are then taken whatever `attention` says), which is how gptlab-inspect draws them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, context_length: int, dropout: float,
                 bias: bool = True, attention: str = "sdpa"):
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
        self.trace: dict[str, torch.Tensor] | None = None

    def _record(self, name: str, tensor: torch.Tensor) -> None:
        if self.trace is not None:
            self.trace[name] = tensor.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, context_length, d_model = x.shape  # [batch, context_length, d_model]
        q, k, v = self.qkv(x).split(d_model, dim=2)  # each [batch, context_length, d_model]
        self._record("q", q)
        self._record("k", k)
        self._record("v", v)

        # split into heads: [batch, num_heads, context_length, head_size]
        q, k, v = (
            t.view(batch, context_length, self.num_heads, self.head_size).transpose(1, 2)
            for t in (q, k, v)
        )
        self._record("heads", q)

        if self.attention == "sdpa" and self.trace is None:
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size)  # [batch, heads, T, T]
            self._record("scores", scores)
            scores = scores.masked_fill(self.mask[:context_length, :context_length], float("-inf"))
            self._record("masked", scores)
            weights = F.softmax(scores, dim=-1)  # each row sums to 1, zero above the diagonal
            self._record("softmax", weights)
            out = self.attn_dropout(weights) @ v  # [batch, num_heads, context_length, head_size]
        self._record("weighted", out)

        out = out.transpose(1, 2).contiguous().view(batch, context_length, d_model)  # merge heads
        self._record("merged", out)
        out = self.resid_dropout(self.proj(out))  # Wo: [batch, context_length, d_model]
        self._record("wo", out)
        return out
