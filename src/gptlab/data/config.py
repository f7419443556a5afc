"""The data module's settings as a plain dataclass: the data group's schema (a mistyped key fails
when Hydra composes, before torch loads) and the checks that need no data. A mixture's sources and
weights are checked here too (gptlab.data.mixture), before any file is read."""

import math
from dataclasses import dataclass, fields
from typing import Any

from gptlab.data.mixture import AVERAGES, SOURCE_KEYS, check_mixture
from gptlab.errors import ConfigError

SALES_TEXTBOOK_URL = (
    "https://huggingface.co/datasets/goendalf666/sales-textbook_for_convincing_and_selling"
    "/resolve/main/sales_textbook.txt"
)
SALES_TEXTBOOK_SHA256 = "1994f20f5becd3f0b3d7a632e5a68513cc38cf6c9737a9f38243f1b652e962da"
# tokens a validation (or test) covers: all of the book's val split (7,792), seconds on any corpus
EVAL_TOKENS = 65_536


@dataclass
class DataConfig:
    url: str | None = SALES_TEXTBOOK_URL
    path: str | None = None  # a text file, a folder, a glob, .jsonl(.gz) or .parquet
    sha256: str | None = SALES_TEXTBOOK_SHA256  # None skips the check
    name: str | None = None  # a Hugging Face dataset: a hub id or a local folder (data=hf)
    split: str = "train"  # the dataset's split
    text_field: str = "text"  # the JSONL field, Parquet or dataset column holding the text
    encoding: str = "cl100k_base"  # any tiktoken encoding, e.g. o200k_base
    compact_vocab: bool = True  # keep only the ids that occur: 3,771 rows instead of 100,070
    val_fraction: float = 0.1
    test_fraction: float = 0.0  # the last tokens, after val: 0 keeps the articles' 90/10 split
    val_tokens: int | None = EVAL_TOKENS  # a validation covers this prefix of val; null: all
    test_tokens: int | None = EVAL_TOKENS  # the same for the test split
    batch_size: int = 16  # per device
    context_length: int = 64
    num_workers: int = 0  # batches are tiny: worker processes cost more than they save
    data_dir: str = "data"
    cache_dir: str = "data/cache"
    seed: int = 0
    repeat_batches: int | None = None  # N: the same N batches over and over (debug=overfit)
    tokenizer: dict | None = None  # a checkpoint's (gptlab-eval): the text is encoded with it
    file_name: str | None = None  # data.url's file under another name (found, downloaded as it)
    # a mixture (docs/data.md): {name: {url, path, sha256, name, split, text_field, file_name}}
    sources: Any = None
    weights: Any = None  # {source: weight}, [{start: step, weights: ...}, ...], or proportional
    val_average: str = "micro"  # val/loss of a mixture: micro (per token) or macro (per source)
    max_epochs: float | None = None  # refuse a run that would repeat any source more often

    def __post_init__(self) -> None:
        """Every setting that can be checked without the data, before any download."""
        for key in ("batch_size", "context_length"):
            if getattr(self, key) < 1:
                raise ConfigError(
                    f"data.{key}={getattr(self, key)}: it must be a positive integer."
                )
        val, test = self.val_fraction, self.test_fraction
        if not 0.0 < val <= 1.0:
            raise ConfigError(
                f"data.val_fraction={val}: it must lie in (0, 1] (1: no train split)."
            )
        if not 0.0 <= test < 1.0 or val + test > 1.0:
            raise ConfigError(
                f"data.test_fraction={test}: it must lie in [0, 1) and leave "
                f"data.val_fraction={val} room (their sum at most 1; 0: no test split)."
            )
        for key in ("val_tokens", "test_tokens", "repeat_batches"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)}: it must be positive or null.")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers={self.num_workers}: it must be 0 or more.")
        self.check_mixing()

    def check_mixing(self) -> None:
        """A mixture's settings: its average, its repetition cap, its sources and weights."""
        if self.val_average not in AVERAGES:
            raise ConfigError(
                f"data.val_average={self.val_average!r}: choose micro (val/loss per token over "
                "every source's val tokens) or macro (the mean of the sources' val losses)."
            )
        cap = self.max_epochs
        positive = isinstance(cap, int | float) and math.isfinite(cap) and cap > 0
        if cap is not None and not positive:
            raise ConfigError(
                f"data.max_epochs={cap!r}: it must be a positive number of epochs, or null (no "
                "cap on how often a source repeats)."
            )
        if self.sources is not None:
            check_mixture(self)


def source_settings(settings: DataConfig, source: str) -> DataConfig:
    """One source of a mixture as a single-source DataConfig: its own keys (SOURCE_KEYS, unset ones
    at a single source's defaults, no download unless it names one), the shared ones as given."""
    given = settings.sources[source]
    own = {f.name: f.default for f in fields(DataConfig) if f.name in SOURCE_KEYS}
    own.update(url=None, sha256=None)  # the book's, unless the source names them
    own.update(given)
    shared = {f.name: getattr(settings, f.name) for f in fields(DataConfig)}
    shared.update(sources=None, weights=None)
    return DataConfig(**{**shared, **own})
