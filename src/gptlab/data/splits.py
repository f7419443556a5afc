"""A store's tokens as train, val and test, in token order like the seeds, and the checks that
each split (and the prefix of it a validation covers) holds a window. A mixture's split holds each
source's part (MixedSplit)."""

from dataclasses import dataclass

import numpy as np

from gptlab.errors import ConfigError

SPLITS = ("train", "val", "test")
# how to give a split that is too short more tokens (train gets what val and test leave)
SPLIT_SIZE = {
    "train": "lower data.val_fraction or data.test_fraction",
    "val": "raise data.val_fraction",
    "test": "raise data.test_fraction",
}


@dataclass
class MixedSplit:
    """A mixture's split: each source's part, a view of its own store. Its length is the tokens
    of them all; it has no windows of its own (each source's are drawn or walked on its own)."""

    parts: dict[str, np.ndarray]

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts.values())


def split_tokens(tokens: np.ndarray, val_fraction: float, test_fraction: float) -> dict:
    """Train, then val, then test (with test_fraction 0 the articles' 90/10 split exactly: the
    same n_train, val up to the last token)."""
    n_train = int(len(tokens) * (1.0 - val_fraction - test_fraction))
    n_test = int(len(tokens) * test_fraction)
    return {
        "train": tokens[:n_train],
        "val": tokens[n_train : len(tokens) - n_test],
        "test": tokens[len(tokens) - n_test :],
    }


def check_splits(splits: dict, stage: str | None, settings) -> None:
    """Train (when fitting), val and test (when there is one) each hold a window."""
    checked = {"train": stage == "fit", "val": True, "test": settings.test_fraction > 0}
    for split, part in splits.items():
        if checked[split]:
            check_split(split, len(part), settings)


def check_split(split: str, size: int, settings) -> None:
    """A split, and the prefix of it that is evaluated, hold at least one window."""
    context_length = settings.context_length
    window = context_length + 1
    if size < window:
        raise ConfigError(
            f"data.context_length={context_length}: the {split} split holds only "
            f"{size} tokens, fewer than one window of context_length + 1. Lower "
            f"data.context_length, {SPLIT_SIZE[split]}, or use a longer corpus."
        )
    budget = {"val": settings.val_tokens, "test": settings.test_tokens}.get(split)
    if budget is not None and budget < window:
        raise ConfigError(
            f"data.{split}_tokens={budget}: fewer than one window of context_length + 1 = "
            f"{window} tokens. Raise it, or set it to null (the whole {split} split)."
        )
