"""Masked multi-head attention: `manual` spells out the seed articles' steps (Q/K/V projections,
split into heads, Q·Kᵀ / sqrt(head_size), -inf above the diagonal, softmax, dropout, times V, merge
heads, Wo); `sdpa` computes the same with torch's fused `scaled_dot_product_attention`.

Two toggles change Q and K per head before either path: `qk_norm` (RMSNorm over head_size) and
`rope` (rotary position embeddings, see rope.py)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.model.rope import apply_rope, rope_angles


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        context_length: int,
        dropout: float,
        bias: bool = True,
        attention: str = "sdpa",
        rope: bool = False,
        qk_norm: bool = False,
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
        self.rope = rope
        if rope:  # fixed angles, computed once: [context_length, head_size / 2] each
            angles = rope_angles(context_length, self.head_size)
            self.register_buffer("rope_cos", angles.cos(), persistent=False)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.qk_norm = qk_norm
        if qk_norm:  # one gain per feature of a head, shared by the heads
            self.q_norm = nn.RMSNorm(self.head_size)
            self.k_norm = nn.RMSNorm(self.head_size)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """[batch, context_length, d_model] -> [batch, num_heads, context_length, head_size]"""
        batch, context_length, _ = t.shape
        return t.view(batch, context_length, self.num_heads, self.head_size).transpose(1, 2)

    def position_and_norm(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm, then the rotary positions, on q and k [batch, num_heads, context_length,
        head_size]; the identity when both toggles are off (the articles' attention)."""
        if self.qk_norm:  # each head's query and key scaled to unit RMS: bounded scores
            q = self.q_norm(q)
            k = self.k_norm(k)
        if self.rope:
            q = apply_rope(q, self.rope_cos, self.rope_sin)
            k = apply_rope(k, self.rope_cos, self.rope_sin)
        return q, k

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
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        q, k = self.position_and_norm(q, k)  # [batch, num_heads, context_length, head_size]

        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        else:
            weights = F.softmax(self.masked(self.scores(q, k)), dim=-1)  # each row sums to 1
            out = self.attn_dropout(weights) @ v  # [batch, num_heads, context_length, head_size]

        out = out.transpose(1, 2).contiguous().view(batch, context_length, d_model)  # merge heads
        return self.resid_dropout(self.proj(out))  # Wo: [batch, context_length, d_model]
