"""A plain PyTorch training loop written the way the seed articles' reference script is written.

This is gptlab's own re-implementation of that style, kept only as the baseline of the
benchmark (scripts/benchmark/): the text tokenized with tiktoken's cl100k_base, one `Head` module
per attention head (its own key/query/value Linear), the heads looped in Python and concatenated,
the sinusoidal table rebuilt inside every forward, the full cl100k_base vocabulary (max id + 1
rows), random `get_batch` windows, AdamW at a constant 1e-3, and `estimate_loss` (20 random
batches of the train and of the val split, every `eval_interval` steps), as the reference script
prints train/val loss every 20 steps.

The benchmark runs it in a process of its own, as a user runs the reference script:

    python scripts/reference_loop.py sales_textbook.txt --steps 400 --threads 2 --out result.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field

import tiktoken
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ReferenceSettings:
    batch_size: int = 4
    context_length: int = 16
    d_model: int = 64
    num_heads: int = 4
    num_blocks: int = 8
    dropout: float = 0.1
    learning_rate: float = 1e-3
    eval_interval: int = 20
    eval_iters: int = 20
    seed: int = 1337


class FeedForward(nn.Module):
    def __init__(self, s: ReferenceSettings):
        super().__init__()
        self.ffn = nn.Sequential(
            nn.Linear(s.d_model, 4 * s.d_model),
            nn.ReLU(),
            nn.Linear(4 * s.d_model, s.d_model),
            nn.Dropout(s.dropout),
        )

    def forward(self, x):
        return self.ffn(x)


class Head(nn.Module):
    """One attention head with its own Wq, Wk, Wv."""

    def __init__(self, s: ReferenceSettings):
        super().__init__()
        self.head_size = s.d_model // s.num_heads
        self.key_layer = nn.Linear(s.d_model, self.head_size, bias=False)
        self.query_layer = nn.Linear(s.d_model, self.head_size, bias=False)
        self.value_layer = nn.Linear(s.d_model, self.head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(s.context_length, s.context_length)))
        self.dropout_layer = nn.Dropout(s.dropout)

    def forward(self, x):
        B, T, C = x.shape
        q = self.query_layer(x)
        k = self.key_layer(x)
        v = self.value_layer(x)
        weights = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_size))
        weights = weights.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        weights = F.softmax(weights, dim=-1)
        weights = self.dropout_layer(weights)
        return weights @ v


class MultiHeadAttention(nn.Module):
    def __init__(self, s: ReferenceSettings):
        super().__init__()
        self.heads = nn.ModuleList([Head(s) for _ in range(s.num_heads)])
        self.projection_layer = nn.Linear(s.d_model, s.d_model)
        self.dropout_layer = nn.Dropout(s.dropout)

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        return self.dropout_layer(self.projection_layer(out))


class TransformerBlock(nn.Module):
    def __init__(self, s: ReferenceSettings):
        super().__init__()
        self.layer_norm_1 = nn.LayerNorm(s.d_model)
        self.layer_norm_2 = nn.LayerNorm(s.d_model)
        self.multi_head_attention_layer = MultiHeadAttention(s)
        self.feed_forward_layer = FeedForward(s)

    def forward(self, x):
        x = x + self.multi_head_attention_layer(self.layer_norm_1(x))
        x = x + self.feed_forward_layer(self.layer_norm_2(x))
        return x


class TransformerLanguageModel(nn.Module):
    def __init__(self, s: ReferenceSettings, vocab_size: int):
        super().__init__()
        self.s = s
        self.token_embedding_lookup_table = nn.Embedding(vocab_size, s.d_model)
        self.transformer_blocks = nn.Sequential(
            *[TransformerBlock(s) for _ in range(s.num_blocks)], nn.LayerNorm(s.d_model)
        )
        self.language_model_out_linear_layer = nn.Linear(s.d_model, vocab_size)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        d_model, context_length = self.s.d_model, self.s.context_length
        # the sinusoidal table, rebuilt on every call as the reference script does
        position_encoding_lookup_table = torch.zeros(context_length, d_model)
        position = torch.arange(0, context_length, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        position_encoding_lookup_table[:, 0::2] = torch.sin(position * div_term)
        position_encoding_lookup_table[:, 1::2] = torch.cos(position * div_term)
        position_embedding = position_encoding_lookup_table[:T, :].to(idx.device)
        x = self.token_embedding_lookup_table(idx) + position_embedding
        x = self.transformer_blocks(x)
        logits = self.language_model_out_linear_layer(x)
        if targets is None:
            return logits, None
        B, T, C = logits.shape
        loss = F.cross_entropy(logits.view(B * T, C), targets.view(B * T))
        return logits, loss


@dataclass
class LoopResult:
    steps: int
    train_seconds: float  # the training steps only (get_batch, forward, backward, step)
    eval_seconds: float  # estimate_loss calls
    wall_seconds: float  # the whole loop
    final_val_estimate: float | None
    losses: list[tuple[int, float, float]] = field(default_factory=list)  # (step, train, val)


def get_batch(data: torch.Tensor, s: ReferenceSettings, device: str):
    """Random windows of the split, as the reference script's get_batch."""
    idxs = torch.randint(low=0, high=len(data) - s.context_length, size=(s.batch_size,))
    x = torch.stack([data[i : i + s.context_length] for i in idxs]).to(device)
    y = torch.stack([data[i + 1 : i + s.context_length + 1] for i in idxs]).to(device)
    return x, y


@torch.no_grad()
def estimate_loss(model, splits: dict, s: ReferenceSettings, device: str) -> dict:
    """The mean loss of `eval_iters` random batches of each split, as the reference script's."""
    out = {}
    model.eval()
    for split_name, data in splits.items():
        losses = torch.zeros(s.eval_iters)
        for k in range(s.eval_iters):
            x_batch, y_batch = get_batch(data, s, device)
            _, loss = model(x_batch, y_batch)
            losses[k] = loss.item()
        out[split_name] = losses.mean().item()
    model.train()
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_reference_loop(
    tokens: torch.Tensor,
    steps: int,
    settings: ReferenceSettings | None = None,
    evaluate: bool = True,
    device: str = "cpu",
) -> LoopResult:
    """Train the reference-style model for `steps` steps on `tokens` (full cl100k ids)."""
    s = settings or ReferenceSettings()
    torch.manual_seed(s.seed)
    vocab_size = int(tokens.max()) + 1
    split = int(len(tokens) * 0.9)
    splits = {"train": tokens[:split], "valid": tokens[split:]}
    model = TransformerLanguageModel(s, vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.learning_rate)
    result = LoopResult(steps, 0.0, 0.0, 0.0, None)
    start = time.perf_counter()
    for step in range(steps):
        if evaluate and (step % s.eval_interval == 0 or step == steps - 1):
            sync(device)
            t = time.perf_counter()
            losses = estimate_loss(model, splits, s, device)
            result.eval_seconds += time.perf_counter() - t
            result.losses.append((step, losses["train"], losses["valid"]))
            result.final_val_estimate = losses["valid"]
        t = time.perf_counter()
        xb, yb = get_batch(splits["train"], s, device)
        _, loss = model(xb, yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(device)
        result.train_seconds += time.perf_counter() - t
    result.wall_seconds = time.perf_counter() - start
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description="Train the reference-style model; write LoopResult as JSON."
    )
    p.add_argument("corpus", help="the text file to train on (sales_textbook.txt)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--eval-iters", type=int, default=ReferenceSettings.eval_iters)
    p.add_argument("--no-eval", action="store_true", help="leave estimate_loss out")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with open(args.corpus, encoding="utf-8") as f:
        text = f.read()
    tokens = torch.tensor(tiktoken.get_encoding("cl100k_base").encode(text), dtype=torch.long)
    vocab_size = int(tokens.max()) + 1
    settings = ReferenceSettings(eval_iters=args.eval_iters)
    result = run_reference_loop(
        tokens,
        args.steps,
        settings,
        evaluate=not args.no_eval,
        device=args.device,
    )
    with open(args.out, "w") as f:
        json.dump({**asdict(result), "settings": asdict(settings), "vocab_size": vocab_size}, f)


if __name__ == "__main__":
    main()
