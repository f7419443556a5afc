"""LightningDataModule: corpus -> token cache -> 90/10 split -> batches of windows.

Train batches are random windows of `context_length + 1` tokens, like the seed articles'
`get_batch`; under DDP each rank draws its own windows. Validation walks every
non-overlapping window of the val split once, in order, so the val loss is exact and the
same from run to run.
"""

from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gptlab.data.corpus import read_text, resolve_corpus, sha256_of
from gptlab.data.tokenizer import Tokenizer, check_encoding
from gptlab.errors import ConfigError

log = logging.getLogger(__name__)

SALES_TEXTBOOK_URL = (
    "https://huggingface.co/datasets/goendalf666/sales-textbook_for_convincing_and_selling"
    "/resolve/main/sales_textbook.txt"
)
SALES_TEXTBOOK_SHA256 = "1994f20f5becd3f0b3d7a632e5a68513cc38cf6c9737a9f38243f1b652e962da"


class Windows(Dataset):
    """Windows of `context_length + 1` tokens; an item is a whole batch, given its start offsets.

    Indexing with a list of starts gathers the batch in one tensor operation instead of
    collating `batch_size` small tensors, which matters for batch 4 x context 16.
    """

    def __init__(self, tokens: torch.Tensor, context_length: int):
        self.tokens = tokens
        self.offsets = torch.arange(context_length + 1)
        self.num_starts = len(tokens) - context_length

    def __len__(self) -> int:
        return self.num_starts

    def __getitem__(self, starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[torch.as_tensor(starts)[:, None] + self.offsets]  # [batch, T + 1]
        return window[:, :-1], window[:, 1:]  # x, y: [batch, context_length], y shifted by one


class RandomWindowSampler(Sampler[list[int]]):
    """Yields batches of random start offsets, a pure function of (seed, epoch, rank, batch).

    Knowing that, a resumed run can skip exactly the batches it already trained on.
    """

    def __init__(self, num_starts: int, batch_size: int, batches_per_epoch: int, seed: int,
                 rank: int = 0, world_size: int = 1, fixed: bool = False):
        self.num_starts, self.batch_size = num_starts, batch_size
        self.batches_per_epoch, self.seed = batches_per_epoch, seed
        self.rank, self.world_size = rank, world_size
        self.fixed = fixed  # the same windows every epoch (debug=overfit)
        self.epoch = 0
        self.skip = 0  # batches of the current epoch already consumed (set when resuming)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.skip = 0
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self):
        entropy = [self.seed, 0 if self.fixed else self.epoch, self.rank, self.world_size]
        generator = torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))
        for i in range(self.batches_per_epoch):
            starts = torch.randint(self.num_starts, (self.batch_size,), generator=generator)
            if i >= self.skip:
                yield starts.tolist()
        self.skip = 0


class GPTDataModule(L.LightningDataModule):
    """The tokenized corpus, its train/val split and loaders; also the tokenizer for generation."""

    def __init__(
        self,
        url: str | None = SALES_TEXTBOOK_URL,
        path: str | None = None,
        sha256: str | None = SALES_TEXTBOOK_SHA256,
        encoding: str = "cl100k_base",
        compact_vocab: bool = True,
        val_fraction: float = 0.1,
        batch_size: int = 16,
        context_length: int = 64,
        num_workers: int = 0,
        data_dir: str = "data",
        cache_dir: str = "data/cache",
        seed: int = 0,
        batches_per_epoch: int | None = None,
        fixed_windows: bool = False,
    ):
        super().__init__()
        for key, value in (("batch_size", batch_size), ("context_length", context_length)):
            if value < 1:
                raise ConfigError(f"data.{key}={value}: it must be a positive integer.")
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={val_fraction}: it must lie strictly between 0 and 1.")
        check_encoding(encoding)
        if num_workers < 0:
            raise ConfigError(f"data.num_workers={num_workers}: it must be 0 or more.")
        if batches_per_epoch is not None and batches_per_epoch < 1:
            raise ConfigError(f"data.batches_per_epoch={batches_per_epoch}: it must be positive or null.")
        self.url, self.path, self.sha256 = url, path, sha256
        self.encoding, self.compact_vocab = encoding, compact_vocab
        self.val_fraction, self.batch_size = val_fraction, batch_size
        self.context_length, self.num_workers = context_length, num_workers
        self.data_dir, self.cache_dir = Path(data_dir), Path(cache_dir)
        self.seed, self.batches_per_epoch = seed, batches_per_epoch
        self.fixed_windows = fixed_windows
        self._corpus: Path | None = None
        self.tokenizer: Tokenizer | None = None
        self.train_tokens: torch.Tensor | None = None
        self.val_tokens: torch.Tensor | None = None

    # ---------------------------------------------------------------- corpus and token cache
    def corpus_path(self) -> Path:
        if self._corpus is None:
            self._corpus = resolve_corpus(self.url, self.path, self.sha256, self.data_dir)
        return self._corpus

    def cache_path(self, corpus: Path) -> Path:
        digest = self.sha256 or sha256_of(corpus)
        kind = "compact" if self.compact_vocab else "full"
        return self.cache_dir / f"{digest[:16]}-{self.encoding}-{kind}.npz"

    def prepare_data(self) -> None:
        """Download (once), tokenize (once) and cache. Lightning runs it on rank 0 only."""
        if self.tokenizer is not None:  # already set up from the cache (gptlab-train does it first)
            return
        corpus = self.corpus_path()
        cache = self.cache_path(corpus)
        if self.load_cache(cache) is not None:
            return
        log.info("Tokenizing %s with %s", corpus, self.encoding)
        text = read_text(corpus)
        tokenizer = Tokenizer(self.encoding)
        tiktoken_ids = tokenizer.encode_tiktoken(text)
        tokenizer = Tokenizer.fit(self.encoding, tiktoken_ids, self.compact_vocab)
        ids = tokenizer.to_model_ids(tiktoken_ids).astype(np.uint32)
        vocab = np.asarray([] if tokenizer.vocab is None else tokenizer.vocab, dtype=np.int64)
        self.write_cache(cache, ids, vocab)
        log.info("Wrote token cache %s (%d tokens, vocab_size %d)", cache, len(ids), tokenizer.vocab_size)

    def write_cache(self, cache: Path, ids: np.ndarray, vocab: np.ndarray) -> None:
        """Write to a temporary file and rename it, so a crash never leaves half a cache."""
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cache.name}.", suffix=".tmp", dir=cache.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, ids=ids, vocab=vocab)
            os.replace(tmp, cache)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def load_cache(self, cache: Path) -> tuple[np.ndarray, np.ndarray] | None:
        """The cached (ids, vocab), or None when the cache is missing or damaged."""
        if not cache.is_file():
            return None
        try:
            with np.load(cache) as f:
                ids, vocab = f["ids"], f["vocab"]
            if ids.dtype != np.uint32 or len(ids) == 0 or (len(vocab) and ids.max() >= len(vocab)):
                raise ValueError("inconsistent arrays")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            log.warning("Token cache %s is damaged (%s); rebuilding it", cache, e)
            return None
        return ids, vocab

    # ---------------------------------------------------------------- split and loaders
    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        cache = self.cache_path(self.corpus_path())
        loaded = self.load_cache(cache)
        if loaded is None:
            self.prepare_data()
            loaded = self.load_cache(cache)
        ids, vocab = loaded
        log.info("Loaded token cache %s (%d tokens)", cache, len(ids))
        tokenizer = Tokenizer(self.encoding, vocab if len(vocab) else None)

        tokens = torch.from_numpy(ids.astype(np.int64))
        n_train = int(len(tokens) * (1.0 - self.val_fraction))  # token order, like the seeds
        train_tokens, val_tokens = tokens[:n_train], tokens[n_train:]
        for split, part in (("train", train_tokens), ("val", val_tokens)):
            if len(part) < self.context_length + 1:
                raise ConfigError(
                    f"data.context_length={self.context_length}: the {split} split holds only "
                    f"{len(part)} tokens, fewer than one window of context_length + 1. Lower "
                    "data.context_length, change data.val_fraction, or use a longer corpus."
                )
        # set only once the split is valid: `self.tokenizer` marks setup as done
        self.train_tokens, self.val_tokens = train_tokens, val_tokens
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        if self.tokenizer is None:
            self.prepare_data()
            self.setup()
        return self.tokenizer.vocab_size

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world_size = self._rank()
        windows = Windows(self.train_tokens, self.context_length)
        per_epoch = self.batches_per_epoch or max(
            1, len(self.train_tokens) // (self.batch_size * self.context_length * world_size)
        )
        sampler = RandomWindowSampler(
            windows.num_starts, self.batch_size, per_epoch, self.seed, rank, world_size,
            self.fixed_windows,
        )
        trainer = self.trainer
        if trainer is not None:  # resuming mid-epoch: skip the batches already trained on
            sampler.epoch = trainer.current_epoch
            sampler.skip = trainer.fit_loop.epoch_loop.batch_progress.current.completed % per_epoch
        return self._loader(windows, sampler)

    def val_dataloader(self) -> DataLoader:
        rank, world_size = self._rank()
        windows = Windows(self.val_tokens, self.context_length)
        starts = list(range(0, windows.num_starts, self.context_length))
        batches = [starts[i : i + self.batch_size] for i in range(0, len(starts), self.batch_size)]
        return self._loader(windows, batches[rank::world_size])

    def _loader(self, windows: Windows, sampler) -> DataLoader:
        return DataLoader(
            windows,
            sampler=sampler,
            batch_size=None,  # each item already is a batch
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            # its own generator: creating an iterator then draws no number from torch's global
            # RNG, which a resumed run would otherwise see in a different state (dropout masks)
            generator=torch.Generator().manual_seed(self.seed),
        )
