"""Masked multi-head attention: `manual` spells out the seed articles' steps one per line, `sdpa`
runs them fused; before either, each head's queries and keys get qk_norm, then rotary (RoPE).
A KV cache (generation) gives the keys and values of the tokens before x's."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.model.cache import KVCache
from gptlab.model.config import GPTConfig
from gptlab.model.mup import attention_scale


class MultiHeadAttention(nn.Module):
    def __init__(self, config: GPTConfig, rotary: nn.Module):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.attention = config.attention
        self.scale = attention_scale(config)  # μP's 1/head_size; None: 1/sqrt(head_size)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)  # Wq, Wk, Wv
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)  # Wo
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # qk_norm: queries and keys at unit RMS keep the scores bounded (gains shared by the heads)
        norm = nn.RMSNorm if config.qk_norm else nn.Identity
        self.q_norm = norm(self.head_size)
        self.k_norm = norm(self.head_size)
        self.rotary = rotary  # position.Rotary (RoPE: one for all blocks), else Unchanged
        if config.attention == "manual":  # sdpa masks inside its kernel (is_causal)
            ones = torch.ones(config.context_length, config.context_length, dtype=torch.bool)
            self.register_buffer("mask", ones.triu(diagonal=1), persistent=False)  # the future

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """x [batch, T, d_model]; with a cache (generation), x holds the tokens after its ones."""
        batch, context_length, d_model = x.shape  # [batch, context_length, d_model]
        start = cache.length if cache is not None else 0  # the position of x's first token
        end = start + context_length
        heads = (batch, context_length, self.num_heads, self.head_size)
        q, k, v = self.qkv(x).split(d_model, dim=2)  # each [batch, context_length, d_model]
        q = q.view(heads).transpose(1, 2)  # [batch, num_heads, context_length, head_size]
        k = k.view(heads).transpose(1, 2)
        v = v.view(heads).transpose(1, 2)
        q = self.rotary(self.q_norm(q), start)  # QK-norm, then RoPE: each the identity when off
        k = self.rotary(self.k_norm(k), start)
        if cache is not None:  # the earlier tokens' keys and values, then these
            k, v = cache.append(k, v)  # [batch, num_heads, end, head_size]

        if self.attention == "sdpa":
            dropout = self.attn_dropout.p if self.training else 0.0
            # from position 0: the causal triangle; one new token after a cache: it sees them all
            causal = start == 0
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=causal, scale=self.scale
            )
        else:
            scores = q @ k.transpose(-2, -1)  # [batch, num_heads, T, end]
            scores = scores * self.scale if self.scale else scores / math.sqrt(self.head_size)
            scores = scores.masked_fill(self.mask[start:end, :end], float("-inf"))  # [T, end]
            weights = F.softmax(scores, dim=-1)  # each row sums to 1
            weights = self.attn_dropout(weights)
            out = weights @ v  # [batch, num_heads, context_length, head_size]

        out = out.transpose(1, 2).contiguous().view(batch, context_length, d_model)  # merge heads
        return self.resid_dropout(self.proj(out))  # Wo: [batch, context_length, d_model]
