"""Batches of windows of the token store: random ones for training (of one source, or of a
mixture's sources in their shares), every one in order for validation and test."""

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


class Windows(Dataset):
    """Windows of `context_length + 1` tokens of a split. An item is a whole batch, given its start
    offsets: one gather, not `batch_size` small tensors collated (it matters at batch 4 x 16)."""

    def __init__(self, tokens: np.ndarray, context_length: int, table: np.ndarray | None = None):
        self.tokens = tokens
        self.offsets = np.arange(context_length + 1)
        self.num_starts = len(tokens) - context_length
        self.table = table  # a mixture's source: its store's ids -> the union vocabulary's

    def __len__(self) -> int:
        return self.num_starts

    def __getitem__(self, starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.from_numpy(self.gather(starts))
        return window[:, :-1], window[:, 1:]  # x, y: [batch, context_length], y shifted by one

    def gather(self, starts: list[int]) -> np.ndarray:
        """[batch, T + 1] int64 model ids of the windows at `starts`."""
        window = self.tokens[np.asarray(starts)[:, None] + self.offsets]
        return window.astype(np.int64) if self.table is None else self.table[window]


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
        draws = batch_draws(self.seed, self.rank, self.world_size, self.start, self.repeat)
        for _, generator in draws:
            yield torch.randint(self.num_starts, (self.batch_size,), generator=generator).tolist()


def batch_draws(seed: int, rank: int, world_size: int, start: int, repeat: int | None):
    """(key, generator) of batch start, start + 1, ...: batch i's key is i (i % repeat with
    `repeat`), its generator seeded by (seed, rank, world size, key) alone."""
    for i in itertools.count(start):
        key = i % repeat if repeat else i
        entropy = np.random.SeedSequence([seed, rank, world_size, key])
        yield key, torch.Generator().manual_seed(int(entropy.generate_state(1)[0]))


class MixedWindows(Dataset):
    """A mixture's training windows: an item gives each source's start offsets (MixtureSampler);
    the batch is their windows, source after source, in the union vocabulary."""

    def __init__(self, sources: list[Windows]):
        self.sources = sources

    def __len__(self) -> int:
        return sum(len(windows) for windows in self.sources)

    def __getitem__(self, starts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [windows.gather(s) for windows, s in zip(self.sources, starts, strict=True) if s]
        window = torch.from_numpy(np.concatenate(parts))  # [batch, T + 1]
        return window[:, :-1], window[:, 1:]


@dataclass
class MixtureSampler(Sampler[list[list[int]]]):
    """Endless batches of a mixture: batch i holds mixture.counts(i) windows of each source (a pure
    function of the weights and i), drawn source after source, in config order, from batch i's
    generator (RandomWindowSampler's): a source with the whole batch draws exactly what a run on it
    alone draws. Which windows: a pure function of (seed, rank, world size, i, source)."""

    mixture: object  # gptlab.data.mixture.Mixture
    num_starts: list[int]  # [source]
    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1
    start: int = 0
    repeat: int | None = None

    def __iter__(self):
        draws = batch_draws(self.seed, self.rank, self.world_size, self.start, self.repeat)
        for key, generator in draws:
            counts = self.mixture.counts(key, self.batch_size)
            yield [
                torch.randint(n, (int(c),), generator=generator).tolist() if c else []
                for n, c in zip(self.num_starts, counts, strict=True)
            ]


def every_window(num_tokens: int, context_length: int, batch_size: int) -> list[list[int]]:
    """The start offsets of every non-overlapping window of a split, in batches, in order."""
    starts = list(range(0, num_tokens - context_length, context_length))
    return [starts[i : i + batch_size] for i in range(0, len(starts), batch_size)]
