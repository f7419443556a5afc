"""Batches of windows of the token store: random ones for training, every one in order for
validation and test."""

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


class Windows(Dataset):
    """Windows of `context_length + 1` tokens of a split. An item is a whole batch, given its start
    offsets: one gather, not `batch_size` small tensors collated (it matters at batch 4 x 16)."""

    def __init__(self, tokens: np.ndarray, context_length: int):
        self.tokens = tokens
        self.offsets = np.arange(context_length + 1)
        self.num_starts = len(tokens) - context_length

    def __len__(self) -> int:
        return self.num_starts

    def __getitem__(self, starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[np.asarray(starts)[:, None] + self.offsets]  # [batch, T + 1]
        window = torch.from_numpy(window.astype(np.int64))
        return window[:, :-1], window[:, 1:]  # x, y: [batch, context_length], y shifted by one


@dataclass
class RandomWindowSampler(Sampler[list[int]]):
    """Endless batches of random start offsets, batch i a pure function of (seed, rank, world size,
    i): a run continued from step n draws what the stopped run would have. `repeat`: i % repeat."""

    num_starts: int
    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1
    start: int = 0
    repeat: int | None = None

    def __iter__(self):
        for i in itertools.count(self.start):
            key = i % self.repeat if self.repeat else i
            entropy = np.random.SeedSequence([self.seed, self.rank, self.world_size, key])
            generator = torch.Generator().manual_seed(int(entropy.generate_state(1)[0]))
            yield torch.randint(self.num_starts, (self.batch_size,), generator=generator).tolist()


def every_window(num_tokens: int, context_length: int, batch_size: int) -> list[list[int]]:
    """The start offsets of every non-overlapping window of a split, in batches, in order."""
    starts = list(range(0, num_tokens - context_length, context_length))
    return [starts[i : i + batch_size] for i in range(0, len(starts), batch_size)]
