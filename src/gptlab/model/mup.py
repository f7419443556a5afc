"""model.parametrization=mup: the μP rules (Yang et al. 2022, Tensor Programs V) for width and,
with model.base_depth, CompleteP's (Dey et al. 2025) for depth, all in one place. Every rule is a
ratio to the base shape (model.base_width, model.base_depth), so at the base shape μP is the
standard parametrisation exactly, and a learning rate tuned there transfers (docs/model.md)."""

import math

import torch
from torch import nn

from gptlab.model.config import GPTConfig


def width_mult(config: GPTConfig) -> float:
    """m = d_model / base_width: how much wider than the base the model is (1 under standard)."""
    if config.parametrization != "mup":
        return 1.0
    return config.d_model / config.base_width


def depth_mult(config: GPTConfig) -> float:
    """num_blocks / base_depth (1 under standard or without a base depth: no depth rule)."""
    if config.parametrization != "mup" or config.base_depth is None:
        return 1.0
    return config.num_blocks / config.base_depth


def embedding_multiplier(config: GPTConfig) -> float:
    """The article's sqrt(d_model) grows with width; μP keeps each coordinate Θ(1): sqrt(base)."""
    width = config.base_width if config.parametrization == "mup" else config.d_model
    return math.sqrt(width)


def output_multiplier(config: GPTConfig) -> float:
    """μP's readout multiplier 1/m (the logits' update stays Θ(1) as d_model grows)."""
    return 1.0 / width_mult(config)


def residual_multiplier(config: GPTConfig) -> float:
    """CompleteP (α = 1): each residual branch times base_depth / num_blocks."""
    return 1.0 / depth_mult(config)


def attention_scale(config: GPTConfig) -> float | None:
    """μP's 1/head_size (aligned queries and keys make Q·K grow as head_size, not its root),
    equal to 1/sqrt(head_size) at the base width; None: the standard 1/sqrt(head_size)."""
    if config.parametrization != "mup":
        return None
    base_head_size = config.base_width / config.num_heads
    return math.sqrt(base_head_size) / config.head_size


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The blocks' weight matrices: μP's "hidden" weights, both of whose dimensions grow with
    width (Wq, Wk, Wv, Wo and the FFN's); embeddings, readout, biases and gains are not."""
    return [p for p in model.blocks.parameters() if p.dim() == 2]


@torch.no_grad()
def rescale_init(model: nn.Module) -> None:
    """Hidden weights' variance ∝ 1/fan_in: the standard draw times 1/sqrt(m); with a base depth,
    the output projections' GPT-2 depth factor 1/sqrt(2 num_blocks) becomes the base depth's
    (CompleteP's branch multiplier scales them instead). A no-op at the base shape."""
    config = model.config
    for p in hidden_matrices(model):
        p.mul_(1.0 / math.sqrt(width_mult(config)))
    for block in model.blocks:
        for proj in (block.attn.proj, block.ffn.down):
            proj.weight.mul_(math.sqrt(depth_mult(config)))


def lr_groups(model: nn.Module, groups: list[dict], lr: float) -> list[dict]:
    """AdamW's groups split so that hidden matrices get lr / m (μP's Adam rule) and weight decay
    times m (lr * weight_decay, the shrink a step, kept: microsoft/mup's MuAdamW), the rest
    (embeddings, readout, biases, gains) lr itself; each group's own "lr" is what the schedule
    multiplies. Under standard the groups are returned as they are."""
    mult = width_mult(model.config)
    if mult == 1.0:
        return groups
    hidden = {id(p) for p in hidden_matrices(model)}
    split = []
    for group in groups:
        rest = [p for p in group["params"] if id(p) not in hidden]
        scaled = [p for p in group["params"] if id(p) in hidden]
        if rest:
            split.append({**group, "params": rest, "lr": lr})
        if scaled:
            decay = group["weight_decay"] * mult
            scaled = {"params": scaled, "lr": lr / mult, "weight_decay": decay, "name": "hidden"}
            split.append({**group, **scaled})
    return split


def muon_lr(config: GPTConfig, lr: float, adjust_lr: str) -> float:
    """Muon's step has every singular value near lr times its shape adjustment; the spectral
    condition (Yang, Simon & Bernstein 2023) asks for ||ΔW|| ∝ sqrt(fan_out / fan_in), which
    "original" (sqrt(max(1, fan_out / fan_in))) already gives at every width: lr unchanged.
    match_rms_adamw's 0.2 sqrt(max(fan_out, fan_in)) grows as sqrt(m): divided out."""
    if adjust_lr == "match_rms_adamw":
        return lr / math.sqrt(width_mult(config))
    return lr
