"""Where the positions enter, chosen once by `model.positional` (POSITIONAL): a table added to the
token embeddings (sinusoidal or learned), or RoPE's turn of each head's queries and keys."""

import torch
from torch import Tensor, nn

from gptlab.model.config import GPTConfig


def sinusoidal_angles(context_length: int, dim: int, base: float = 10000.0) -> Tensor:
    """pos / base^(2i / dim): the article's table (dim: d_model) and RoPE's turns (head_size,
    base: model.rope_theta)."""
    position = torch.arange(context_length, dtype=torch.float32).unsqueeze(1)  # [T, 1]
    two_i = torch.arange(0, dim, 2, dtype=torch.float32)  # [dim / 2]
    return position / torch.pow(base, two_i / dim)  # [T, dim / 2]


def interleave(even: Tensor, odd: Tensor) -> Tensor:
    """[..., dim / 2] twice -> [..., dim]: features 2i from `even`, 2i+1 from `odd`."""
    return torch.stack((even, odd), dim=-1).flatten(-2)


class SinusoidalEncoding(nn.Module):
    """The article's PE(pos, 2i) = sin(angle), PE(pos, 2i+1) = cos(angle): fixed, computed once."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.angle_settings = (config.context_length, config.d_model)
        self.compute_tables()

    def compute_tables(self) -> None:
        """From the settings alone: again where the model was built on torch's meta device."""
        angle = sinusoidal_angles(*self.angle_settings)
        table = interleave(angle.sin(), angle.cos())  # [context_length, d_model]
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:  # [batch, T, d_model]
        """x's first row is at position `start` (a KV cache's length; else 0)."""
        return x + self.table[start : start + x.shape[1]]


class LearnedEmbedding(nn.Embedding):
    """GPT-2's: one trained vector per position, added to the embeddings."""

    def __init__(self, config: GPTConfig):
        super().__init__(config.context_length, config.d_model)

    @property
    def table(self) -> Tensor:  # [context_length, d_model]
        return self.weight

    def forward(self, x: Tensor, start: int = 0) -> Tensor:  # [batch, T, d_model]
        return x + super().forward(torch.arange(start, start + x.shape[1], device=x.device))


class Rotary(nn.Module):
    """RoPE: pair i of a head's query or key (features 2i and 2i+1) at position pos turns by
    sinusoidal_angles(pos, i) of head_size, as a 2-D rotation matrix turns a point."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.angle_settings = (config.context_length, config.head_size, config.rope_theta)
        self.compute_tables()

    def compute_tables(self) -> None:
        """Fixed, so computed once (again where the model was built on torch's meta device):
        [context_length, head_size / 2] each."""
        angle = sinusoidal_angles(*self.angle_settings)
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    @property
    def table(self) -> Tensor:  # the angles as the sinusoidal table of head_size
        return interleave(self.sin, self.cos)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x [batch, num_heads, T, head_size], its first row at position `start`: pairs turned."""
        cos = self.cos[start : start + x.shape[-2]].to(x.dtype)  # [T, head_size / 2]
        sin = self.sin[start : start + x.shape[-2]].to(x.dtype)
        even = x[..., 0::2]  # [batch, num_heads, T, head_size / 2]
        odd = x[..., 1::2]
        return interleave(even * cos - odd * sin, even * sin + odd * cos)


class Unchanged(nn.Identity):
    """Where a kind does nothing (RoPE adds no table; the others turn no query): x as it is."""

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        return x


# model.positional -> (what GPT.embed adds to the token embeddings, what attention does to Q and K)
POSITIONAL = {
    "sinusoidal": (SinusoidalEncoding, Unchanged),
    "learned": (LearnedEmbedding, Unchanged),
    "rope": (Unchanged, Rotary),  # nothing added: the positions enter in attention
}
