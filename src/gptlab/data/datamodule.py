"""LightningDataModule: corpus -> token cache -> 90/10 split (and an optional test split after
it) -> batches of windows.

Train batches are random windows of `context_length + 1` tokens, like the seed articles'
`get_batch`; each DDP rank draws its own. Validation (and test) walk every non-overlapping window
of their split once, in order, so the val and test losses are exact and the same from run to run."""

import itertools
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


# how to give a split that is too short more tokens (train gets what val and test leave)
SPLIT_SIZE = {
    "train": "lower data.val_fraction or data.test_fraction",
    "val": "raise data.val_fraction",
    "test": "raise data.test_fraction",
}


class Windows(Dataset):
    """Windows of `context_length + 1` tokens. An item is a whole batch, given its start offsets:
    one gather instead of collating `batch_size` small tensors (it matters at batch 4 x context
    16)."""

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
    """Endless batches of random start offsets (one epoch that `trainer.max_steps` ends). Batch i
    is a pure function of (seed, rank, i): a run continued from step n draws the batches the
    stopped run would have drawn next. With `repeat`, batch i is batch i % repeat."""

    def __init__(
        self,
        num_starts: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
        repeat: int | None = None,
    ):
        self.num_starts = num_starts
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.start = start
        self.repeat = repeat

    def __iter__(self):
        for i in itertools.count(self.start):
            key = i % self.repeat if self.repeat else i
            entropy = np.random.SeedSequence([self.seed, self.rank, self.world_size, key])
            generator = torch.Generator().manual_seed(int(entropy.generate_state(1)[0]))
            yield torch.randint(self.num_starts, (self.batch_size,), generator=generator).tolist()


class GPTDataModule(L.LightningDataModule):
    """The tokenized corpus, its train/val(/test) split and loaders; also the tokenizer for
    generation."""

    def __init__(
        self,
        url: str | None = SALES_TEXTBOOK_URL,
        path: str | None = None,  # a local copy; when set, nothing is downloaded
        sha256: str | None = SALES_TEXTBOOK_SHA256,  # None skips the check
        encoding: str = "cl100k_base",  # any tiktoken encoding, e.g. o200k_base
        compact_vocab: bool = True,  # keep only the ids that occur: 3,771 rows instead of 100,070
        val_fraction: float = 0.1,
        test_fraction: float = 0.0,  # the last tokens, after val: 0 keeps the articles' 90/10 split
        batch_size: int = 16,  # per device
        context_length: int = 64,
        num_workers: int = 0,  # batches are tiny: worker processes cost more than they save
        data_dir: str = "data",
        cache_dir: str = "data/cache",
        seed: int = 0,
        repeat_batches: int | None = None,  # N: the same N batches over and over (debug=overfit)
        tokenizer: dict | None = None,  # a checkpoint's (gptlab-eval): the text is encoded with it
    ):
        super().__init__()
        for key, value in (("batch_size", batch_size), ("context_length", context_length)):
            if value < 1:
                raise ConfigError(f"data.{key}={value}: it must be a positive integer.")
        if not 0.0 < val_fraction <= 1.0:
            raise ConfigError(
                f"data.val_fraction={val_fraction}: it must lie in (0, 1] (1: no train split)."
            )
        if not 0.0 <= test_fraction < 1.0 or val_fraction + test_fraction > 1.0:
            raise ConfigError(
                f"data.test_fraction={test_fraction}: it must lie in [0, 1) and leave "
                f"data.val_fraction={val_fraction} room (their sum at most 1; 0: no test split)."
            )
        check_encoding(encoding)
        if num_workers < 0:
            raise ConfigError(f"data.num_workers={num_workers}: it must be 0 or more.")
        if repeat_batches is not None and repeat_batches < 1:
            raise ConfigError(f"data.repeat_batches={repeat_batches}: it must be positive or null.")
        self.url = url
        self.path = path
        self.sha256 = sha256
        self.encoding = encoding
        self.compact_vocab = compact_vocab
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.batch_size = batch_size
        self.context_length = context_length
        self.num_workers = num_workers
        self.data_dir = Path(data_dir)
        self.cache_dir = Path(cache_dir)
        self.seed = seed
        self.repeat_batches = repeat_batches
        self._corpus: Path | None = None
        self.given_tokenizer = tokenizer
        self.tokenizer: Tokenizer | None = None
        self.train_tokens = None  # token ids, a torch.Tensor each once set up
        self.val_tokens = None
        self.test_tokens = None  # stays empty with test_fraction 0

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
        if (
            self.tokenizer is not None or self.given_tokenizer
        ):  # set up already, or nothing to cache
            return
        corpus = self.corpus_path()
        cache = self.cache_path(corpus)
        if self.load_cache(cache) is not None:
            return
        log.info("Tokenizing %s with %s", corpus, self.encoding)
        tiktoken_ids = Tokenizer(self.encoding).encode_tiktoken(read_text(corpus))
        tokenizer = Tokenizer.fit(self.encoding, tiktoken_ids, self.compact_vocab)
        ids = tokenizer.to_model_ids(tiktoken_ids).astype(np.uint32)
        vocab = np.asarray([] if tokenizer.vocab is None else tokenizer.vocab, dtype=np.int64)
        # a temporary file renamed once whole: a crash never leaves half a cache
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cache.name}.", suffix=".tmp", dir=cache.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, ids=ids, vocab=vocab)
            os.replace(tmp, cache)
        finally:
            Path(tmp).unlink(missing_ok=True)
        log.info(
            "Wrote token cache %s (%d tokens, vocab_size %d)", cache, len(ids), tokenizer.vocab_size
        )

    def load_cache(self, cache: Path) -> tuple[np.ndarray, np.ndarray] | None:
        """The cached (ids, vocab), or None when the cache is missing or damaged."""
        if not cache.is_file():
            return None
        try:
            with np.load(cache) as f:
                ids = f["ids"]
                vocab = f["vocab"]
            if ids.dtype != np.uint32 or len(ids) == 0 or (len(vocab) and ids.max() >= len(vocab)):
                raise ValueError("inconsistent arrays")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            log.warning("Token cache %s is damaged (%s); rebuilding it", cache, e)
            return None
        return ids, vocab

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        if self.given_tokenizer:
            tokenizer = Tokenizer.from_state_dict(self.given_tokenizer)
            ids = tokenizer.to_model_ids(tokenizer.encode_tiktoken(read_text(self.corpus_path())))
        else:
            cache = self.cache_path(self.corpus_path())
            loaded = self.load_cache(cache)
            if loaded is None:  # not prepared yet in this process or on this node
                self.prepare_data()
                loaded = self.load_cache(cache)
            ids, vocab = loaded
            log.info("Loaded token cache %s (%d tokens)", cache, len(ids))
            tokenizer = Tokenizer(self.encoding, vocab if len(vocab) else None)

        tokens = torch.from_numpy(ids.astype(np.int64))
        # token order, like the seeds: train, then val, then test (with test_fraction 0 the
        # articles' 90/10 split exactly: the same n_train, val up to the last token)
        n_train = int(len(tokens) * (1.0 - self.val_fraction - self.test_fraction))
        n_test = int(len(tokens) * self.test_fraction)
        train_tokens = tokens[:n_train]
        val_tokens = tokens[n_train : len(tokens) - n_test]
        test_tokens = tokens[len(tokens) - n_test :]
        splits = [("train", train_tokens), ("val", val_tokens)]
        if self.test_fraction > 0:
            splits.append(("test", test_tokens))
        for split, part in splits:
            if len(part) < self.context_length + 1 and (split != "train" or stage == "fit"):
                raise ConfigError(
                    f"data.context_length={self.context_length}: the {split} split holds only "
                    f"{len(part)} tokens, fewer than one window of context_length + 1. Lower "
                    f"data.context_length, {SPLIT_SIZE[split]}, or use a longer corpus."
                )
        # set only once the split is valid: `self.tokenizer` marks setup as done
        self.train_tokens = train_tokens
        self.val_tokens = val_tokens
        self.test_tokens = test_tokens
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        self.setup()  # a no-op once set up; else it prepares the data first if need be
        return self.tokenizer.vocab_size

    def _rank(self) -> tuple[int, int]:
        return (
            (self.trainer.global_rank, self.trainer.world_size)
            if self.trainer is not None
            else (0, 1)
        )

    def train_dataloader(self) -> DataLoader:
        rank, world_size = self._rank()
        windows = Windows(self.train_tokens, self.context_length)
        # continuing from a checkpoint: start at the first batch the stopped run had not trained on
        start = self.trainer.global_step if self.trainer is not None else 0
        sampler = RandomWindowSampler(
            windows.num_starts,
            self.batch_size,
            self.seed,
            rank,
            world_size,
            start,
            self.repeat_batches,
        )
        return self._loader(windows, sampler)

    def val_dataloader(self) -> DataLoader:
        return self._every_window(self.val_tokens)

    def test_dataloader(self) -> DataLoader:
        if self.test_fraction == 0:
            raise ConfigError(
                "data.test_fraction=0: there is no test split to evaluate. Train with "
                "data.test_fraction=0.1 (or more) to hold one out."
            )
        return self._every_window(self.test_tokens)

    def _every_window(self, tokens: torch.Tensor) -> DataLoader:
        """Every non-overlapping window of a split once, in order: an exact loss over it."""
        rank, world_size = self._rank()
        windows = Windows(tokens, self.context_length)
        starts = list(range(0, windows.num_starts, self.context_length))
        batches = [starts[i : i + self.batch_size] for i in range(0, len(starts), self.batch_size)]
        return self._loader(windows, batches[rank::world_size])

    def _loader(self, windows: Windows, sampler) -> DataLoader:
        # its own generator: creating an iterator then draws no number from torch's global
        # RNG, which a resumed run would otherwise see in a different state (dropout masks)
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            windows,
            sampler=sampler,
            batch_size=None,  # each item already is a batch
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            generator=generator,
        )
