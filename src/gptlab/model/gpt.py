"""The seed articles' decoder-only GPT, read top to bottom: token ids -> token embedding
+ positional encoding -> num_blocks x (masked multi-head attention, Add & Norm, ReLU feed-forward,
Add & Norm) -> linear head -> logits. The toggles since 2017 are each off by default."""

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.errors import ConfigError
from gptlab.model import mup
from gptlab.model.cache import KVCache
from gptlab.model.config import GPTConfig
from gptlab.model.position import POSITIONAL

# the FFN's non-linearity: the articles' ReLU, GELU, or ReLU² (Primer; modded-nanogpt)
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "relu2": lambda x: F.relu(x).square()}
ACTIVATIONS["gelu_new"] = lambda x: F.gelu(x, approximate="tanh")  # GPT-2's tanh GELU


class MultiHeadAttention(nn.Module):
    """Masked multi-head attention: `manual` spells out the seed articles' steps one per line,
    `sdpa` runs them fused; before either, each head's queries and keys get qk_norm, then rotary
    (RoPE). A KV cache (generation) gives the keys and values of the tokens before x's."""

    def __init__(self, config: GPTConfig, rotary: nn.Module, scale: float | None):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.attention = config.attention
        self.scale = scale  # μP's 1/head_size; None: the article's 1/sqrt(head_size)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)  # Wq, Wk, Wv
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)  # Wo
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # qk_norm: queries and keys at unit RMS keep the scores bounded (gains shared by the heads)
        norm = nn.RMSNorm if config.qk_norm else nn.Identity
        self.q_norm = norm(self.head_size, eps=config.norm_eps)
        self.k_norm = norm(self.head_size, eps=config.norm_eps)
        self.rotary = rotary  # position.Rotary (RoPE: one for all blocks), else Unchanged
        self.context_length = config.context_length
        self.compute_tables()

    def compute_tables(self) -> None:
        """manual's mask of the future (sdpa masks inside its kernel: is_causal), from settings."""
        if self.attention == "manual":
            ones = torch.ones(self.context_length, self.context_length, dtype=torch.bool)
            self.register_buffer("mask", ones.triu(diagonal=1), persistent=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """x [batch, T, d_model]; with a cache (generation), x holds the tokens after its ones."""
        batch, context_length, d_model = x.shape  # [batch, context_length, d_model]
        start = cache.length if cache is not None else 0  # the position of x's first token
        end = start + context_length
        heads = (batch, context_length, self.num_heads, self.head_size)
        q, k, v = self.qkv(x).split(d_model, dim=2)  # each [batch, context_length, d_model]
        # each split into heads: [batch, num_heads, context_length, head_size]
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
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


class FeedForward(nn.Module):
    """d_model -> hidden -> ReLU (or GELU, ReLU²) -> d_model; SwiGLU: W2(silu(W1 x) * W3 x)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.ffn_hidden
        self.activation = config.activation
        self.up = nn.Linear(config.d_model, hidden, bias=config.bias)  # W1; SwiGLU's W3
        if config.activation == "swiglu":
            self.gate = nn.Linear(config.d_model, hidden, bias=config.bias)  # SwiGLU's W1
        self.down = nn.Linear(hidden, config.d_model, bias=config.bias)  # W2
        self.dropout = nn.Dropout(config.dropout)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, context_length, d_model] -> [batch, context_length, hidden]"""
        if self.activation == "swiglu":  # a gate in (-0.28, inf) times a linear branch
            return F.silu(self.gate(x)) * self.up(x)
        return ACTIVATIONS[self.activation](self.up(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(self.hidden(x)))


def make_norm(config: GPTConfig) -> nn.Module:
    """LayerNorm (the articles'), or RMSNorm: x / RMS(x) * gain, no mean subtracted, no bias."""
    if config.norm_layer == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps or 1e-5, bias=config.bias)


class Block(nn.Module):
    """Attention and feed-forward, each with a residual connection and a LayerNorm."""

    def __init__(self, config: GPTConfig, rotary: nn.Module, scales: mup.Scales):
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.ln1 = make_norm(config)
        self.attn = MultiHeadAttention(config, rotary, scales.attention)
        self.ln2 = make_norm(config)
        self.ffn = FeedForward(config)
        self.branch = scales.residual  # 1 but under mup's depth rule

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """[batch, context_length, d_model] -> the same shape; cache: this block's (generation)."""
        if self.pre_norm:  # the reference script's: trains better deep
            x = x + self.branch * self.attn(self.ln1(x), cache)
            return x + self.branch * self.ffn(self.ln2(x))
        x = self.ln1(x + self.branch * self.attn(x, cache))  # the article's Add & Norm
        return self.ln2(x + self.branch * self.ffn(x))  # Add & Norm


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.vocab_size is None:
            raise ConfigError("model.vocab_size is not set; it comes from the data module.")
        self.config = config
        self.scales = scales = mup.scales(config)  # μP's, once (the article's under standard)
        added, rotary = POSITIONAL[config.positional]  # the one place the kind is chosen
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = added(config)
        self.dropout = nn.Dropout(config.dropout)
        rotary = rotary(config)  # one for all blocks: the angles are computed once
        self.blocks = nn.ModuleList(Block(config, rotary, scales) for _ in range(config.num_blocks))
        self.ln_f = make_norm(config) if config.norm == "pre" else nn.Identity()
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.tie()
        self.embed_mult = scales.embedding  # sqrt(d_model); μP: sqrt(base_width)
        self.output_mult = scales.output  # 1; μP: base_width / d_model
        self.init_weights()  # after the modules' own defaults, drawn as each was built

    def tie(self) -> None:
        """tie_weights: the head reads out with the token embedding's matrix (one parameter)."""
        if self.config.tie_weights:
            self.head.weight = self.token_embedding.weight

    def init_weights(self) -> None:
        """Normal(0, 0.02) for weights, zeros for biases: small logits, stable first steps."""
        config = self.config
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # GPT-2's depth scaling (μP: the base depth's) keeps the residual stream's variance
        # steady; zero_init: each block starts as the identity, learns what to add (modded-nanogpt)
        scales = self.scales
        std = 0.02 / math.sqrt(2 * config.num_blocks) * scales.proj_init
        for weight in [w for b in self.blocks for w in (b.attn.proj.weight, b.ffn.down.weight)]:
            if config.zero_init:
                nn.init.zeros_(weight)
            else:
                nn.init.normal_(weight, std=std)
        with torch.no_grad():  # μP's (times 1 under standard): hidden variance ∝ 1/fan_in
            for weight in self.block_matrices():
                weight.mul_(scales.hidden_init)
            # μTransfer's model.mup_init: the embedding's and readout's draws (a set: once if tied)
            for weight in {self.token_embedding.weight, self.head.weight}:
                weight.mul_(config.mup_init)

    def materialise(self, weights: dict) -> "GPT":
        """This model, built on torch's meta device, given memory on the CPU in place: its tables
        computed, then `weights` (its state dict, under `model.`) copied in, or without them
        torch's draws replayed, module by module in the order GPT(config) made them, then
        init_weights: the same numbers as GPT(config) after the same seed."""
        self.to_empty(device="cpu")
        self.tie()  # to_empty gives each module a parameter of its own
        for module in self.modules():
            if hasattr(module, "compute_tables"):
                module.compute_tables()
        if weights:
            self.load_state_dict({k.removeprefix("model."): v for k, v in weights.items()})
            return self
        for module in self.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        self.init_weights()
        return self

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Token embedding, scaled as in "Attention Is All You Need", + position (none: RoPE);
        the first token at position `start` (the KV cache's length)."""
        x = self.token_embedding(ids) * self.embed_mult  # [batch, T, d_model]
        return self.position_embedding(x, start)

    def forward(self, ids: torch.Tensor, cache: list[KVCache] | None = None) -> torch.Tensor:
        """ids [batch, context_length] -> logits [batch, context_length, vocab_size].
        cache: one KVCache per block (generation): ids are the tokens after the cached ones,
        all of the prompt at once, then one at a time."""
        start = cache[0].length if cache else 0
        most = self.config.context_length
        length = start + ids.shape[1]  # the cached tokens and these
        if length > most:
            raise ValueError(f"input of length {length} exceeds context_length={most}")
        if start and ids.shape[1] > 1:  # attention masks no new token from another
            raise ValueError("after the prompt, a KV cache takes one token at a time")
        x = self.dropout(self.embed(ids, start))
        for i, block in enumerate(self.blocks):
            x = block(x, cache[i] if cache else None)
        logits = self.head(self.ln_f(x))  # [batch, context_length, vocab_size]
        if self.output_mult != 1.0:  # μP's readout multiplier
            logits = logits * self.output_mult
        cap = self.config.logit_softcap
        if cap:  # smoothly squashed into (-cap, cap): no logit runs away
            logits = cap * torch.tanh(logits / cap)
        return logits

    def num_params(self) -> dict[str, int]:
        """Total, embedding (token + learned position) and non-embedding parameter counts."""
        total = sum(p.numel() for p in self.parameters())
        embeddings = (self.token_embedding, self.position_embedding)
        embedding = sum(p.numel() for module in embeddings for p in module.parameters())
        return {"total": total, "embedding": embedding, "non_embedding": total - embedding}

    def block_matrices(self) -> list[nn.Parameter]:
        """The blocks' weight matrices (Wq, Wk, Wv, Wo, the FFN's): μP's hidden weights, both of
        whose dimensions grow with width, and Muon's share; not embeddings, head, biases, gains."""
        return [p for p in self.blocks.parameters() if p.dim() == 2]

    def scaling_params(self) -> int:
        """A scaling law's N: the matrices whose FLOPs grow with every token (blocks', head)."""
        return sum(p.numel() for p in [*self.block_matrices(), self.head.weight])

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6 per weight (forward 2, backward 4) + attention's."""
        c = self.config
        return 6 * self.scaling_params() + 12 * c.num_blocks * c.context_length * c.d_model

    @torch.no_grad()
    def generate_stream(
        self,
        ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> Iterator[torch.Tensor]:
        """Yield the next token ids [batch, 1] one at a time; temperature 0 is greedy. The model
        sees the last context_length tokens at positions 0, 1, ...; use_cache: keys and values
        are kept (KVCache), so each step runs the newest token alone until the window is full.
        Then it slides: every token changes position, so the window is run afresh each step."""
        window = self.config.context_length
        cache = None
        for _ in range(max_new_tokens):
            if cache is not None and cache[0].length < window:  # one new token, after the cache
                logits = self(ids[:, -1:], cache)[:, -1, :]  # [batch, vocab_size]
            else:  # the prompt, or a slid window
                fresh = use_cache and ids.shape[1] < window  # a full window's would go unused
                cache = [KVCache(window) for _ in self.blocks] if fresh else None
                logits = self(ids[:, -window:], cache)[:, -1, :]
            if temperature == 0:
                next_ids = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.size(-1):
                    kth = torch.topk(logits, top_k).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_ids = torch.multinomial(probs, num_samples=1, generator=generator)
            ids = torch.cat([ids, next_ids], dim=1)
            yield next_ids

    def generate(self, ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """ids [batch, t] -> [batch, t + max_new_tokens]; generate_stream's arguments."""
        return torch.cat([ids, *self.generate_stream(ids, *args, **kwargs)], dim=1)
