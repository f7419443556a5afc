"""Rotary position embeddings (RoPE, `model.positional=rope`): instead of adding a position vector
to the token embedding, attention rotates each head's queries and keys by an angle that grows with
the position, so Q·Kᵀ depends on how far apart two tokens are, not on where they sit.

The angles are the sinusoidal encoding's: pair i of a head (features 2i and 2i+1) turns by
pos / 10000^(2i / head_size) at position pos."""

import torch


def rope_angles(context_length: int, head_size: int, base: float = 10000.0) -> torch.Tensor:
    """angle(pos, i) = pos / base^(2i / head_size): [context_length, head_size / 2]."""
    position = torch.arange(context_length, dtype=torch.float32).unsqueeze(1)  # [T, 1]
    two_i = torch.arange(0, head_size, 2, dtype=torch.float32)  # [head_size / 2]
    return position / torch.pow(base, two_i / head_size)  # [T, head_size / 2]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) by its position's angle, as a 2-D rotation matrix does.

    x: [batch, num_heads, context_length, head_size]; cos, sin: [context_length, head_size / 2]."""
    context_length = x.shape[-2]
    cos = cos[:context_length].to(x.dtype)  # [T, head_size / 2]
    sin = sin[:context_length].to(x.dtype)
    even = x[..., 0::2]  # [batch, num_heads, T, head_size / 2]
    odd = x[..., 1::2]
    rotated_even = even * cos - odd * sin
    rotated_odd = even * sin + odd * cos
    # interleave back: [batch, num_heads, T, head_size / 2, 2] -> [batch, num_heads, T, head_size]
    return torch.stack((rotated_even, rotated_odd), dim=-1).flatten(-2)
