"""model.parametrization=mup: the μP rules (Yang et al. 2022, Tensor Programs V) for width and,
with model.base_depth, CompleteP's (Dey et al. 2025) for depth, all in one place. Every rule is a
ratio to the base shape (model.base_width, model.base_depth), so at the base shape μP is the
standard parametrisation exactly, and a learning rate tuned there transfers (docs/model.md)."""

import math
from typing import NamedTuple

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


class Scales(NamedTuple):
    """What μP changes in the model, computed once by `scales`: each the article's (or 1) under
    standard and at the base shape."""

    embedding: float  # times the token embedding
    output: float  # times the logits
    residual: float  # times each residual branch
    attention: float | None  # times Q·Kᵀ; None: the article's 1/sqrt(head_size)
    hidden_init: float  # times the hidden matrices' initial draw
    proj_init: float  # times the output projections' (Wo, the FFN's last) initial draw


def scales(config: GPTConfig) -> Scales:
    """The rules' multipliers times μTransfer's base ones (model.mup_*, 1 by default), which are
    tuned at the base and so hold at every width, as the rate does."""
    mup = config.parametrization == "mup"
    # the article's sqrt(d_model) grows with width; μP keeps each coordinate Θ(1): sqrt(base)
    embedding = math.sqrt(config.base_width if mup else config.d_model)
    # μP's 1/head_size (aligned queries and keys make Q·K grow as head_size, not its root),
    # equal to 1/sqrt(head_size) at the base width
    base_head = config.base_width / config.num_heads if mup else config.head_size
    attention = config.mup_attention * math.sqrt(base_head) / config.head_size
    return Scales(
        embedding=embedding * config.mup_embedding,
        # μP's readout 1/m: the logits' update stays Θ(1) (microsoft/mup's MuReadout)
        output=config.mup_output / width_mult(config),
        residual=1.0 / depth_mult(config),  # CompleteP (α = 1): base_depth / num_blocks
        attention=attention if mup or config.mup_attention != 1 else None,
        hidden_init=config.mup_init / math.sqrt(width_mult(config)),  # variance ∝ 1/fan_in
        # GPT-2's 1/sqrt(2 num_blocks) becomes the base depth's: CompleteP's branch multiplier
        # scales the branches instead
        proj_init=math.sqrt(depth_mult(config)),
    )


def lr_groups(model: nn.Module, groups: list[dict], lr: float) -> list[dict]:
    """AdamW's groups split so that hidden matrices get lr / m (μP's Adam rule) and weight decay
    times m (lr * weight_decay, the shrink a step, kept: microsoft/mup's MuAdamW), the rest
    (embeddings, readout, biases, gains) lr itself; each group's own "lr" is what the schedule
    multiplies. Under standard the groups are returned as they are."""
    mult = width_mult(model.config)
    if mult == 1.0:
        return groups
    hidden = {id(p) for p in model.block_matrices()}
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
