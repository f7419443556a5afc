"""LightningDataModule: sources -> token store (tokenized once) -> train, val, test -> batches.
The store is mapped, not loaded: the splits are views of one np.memmap, shared through the page
cache by the processes of a DDP run (a spawned rank gets the module pickled by the store's path)."""

import hashlib
import json
import logging
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from gptlab.data.config import DataConfig
from gptlab.data.corpus import remove_stale
from gptlab.data.sources import find_corpus, is_many
from gptlab.data.store import TokenStore, open_store, store_folder, store_key
from gptlab.data.store import write_store as write_token_store
from gptlab.data.stream import encode_documents
from gptlab.data.tokenizer import Tokenizer, check_encoding
from gptlab.data.windows import RandomWindowSampler, Windows, every_window
from gptlab.errors import ConfigError

log = logging.getLogger(__name__)

# how to give a split that is too short more tokens (train gets what val and test leave)
SPLIT_SIZE = {
    "train": "lower data.val_fraction or data.test_fraction",
    "val": "raise data.val_fraction",
    "test": "raise data.test_fraction",
}


class GPTDataModule(L.LightningDataModule):
    """The tokenized corpus, its splits and their loaders; the tokenizer for generation too."""

    def __init__(self, **settings):
        """The settings of gptlab.data.config.DataConfig, kept as one typed `settings`."""
        super().__init__()
        self.settings = DataConfig(**settings)
        check_encoding(self.settings.encoding)
        given = self.settings.tokenizer  # a checkpoint's: the text is encoded with it
        self.cache_dir = Path(self.settings.cache_dir)
        self.store_encoding: str = self.settings.encoding
        self.vocab_mode = "full"
        if given:
            self.store_encoding = given["encoding"]
        elif self.settings.compact_vocab:
            self.vocab_mode = "compact"
        self.store_vocab: str | list = self.vocab_mode  # write_store's: the mode, or the ids
        if given and given.get("vocab") is not None:
            self.store_vocab = list(given["vocab"])
            digest = hashlib.sha256(json.dumps(self.store_vocab).encode()).hexdigest()[:12]
            self.vocab_mode = f"vocab-{digest}"
        self._corpus = None  # the sources, found and checked once
        self._store: TokenStore | None = None
        self._store_folder: Path | None = None  # kept when pickled: a DDP rank maps it itself
        self.tokenizer: Tokenizer | None = None
        self.splits: dict = {}  # train, val, test once set up: views of the store (np.memmap)

    # the settings other layers read (the module's batch size, eval's header, the screen)
    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def context_length(self) -> int:
        return self.settings.context_length

    @property
    def val_fraction(self) -> float:
        return self.settings.val_fraction

    @property
    def test_fraction(self) -> float:
        return self.settings.test_fraction

    def __getstate__(self) -> dict:
        """By the store's path: a spawned DDP rank maps the store itself, no tokens travel."""
        state = dict(self.__dict__)
        state.update(dict.fromkeys(("_corpus", "_store", "tokenizer")), splits={})
        return state

    def corpus(self):
        """A Hugging Face dataset (data.name), else the files of data.path or data.url."""
        if self._corpus is None:
            self._corpus = find_corpus(self.settings)
        return self._corpus

    def corpus_path(self) -> Path:
        """The corpus file (downloaded if need be), or the folder, glob or dataset named."""
        name, path = self.settings.name, self.settings.path
        if name:
            return Path(name)
        if is_many(path):
            return Path(path)
        return self.corpus().paths[0]

    def token_store(self) -> TokenStore:
        """The mapped store of the corpus, tokenized first if no whole one exists."""
        if self._store is None and self._store_folder is not None:
            self._store = open_store(self._store_folder)
        if self._store is not None:
            return self._store
        corpus = self.corpus()
        encoding, mode = self.store_encoding, self.vocab_mode
        identity = corpus.identity()
        key = store_key(identity, encoding, mode)
        folder = store_folder(self.cache_dir, key, encoding, mode)
        remove_stale(self.cache_dir)
        store = open_store(folder)
        if store is None:
            log.info("Tokenizing %s with %s", corpus.describe(), encoding)
            tiktoken_encoding = Tokenizer(encoding).encoding
            encoded = encode_documents(tiktoken_encoding, corpus.documents(), corpus.total_bytes())
            meta = {"encoding": encoding, "vocab_mode": mode, "key": key, "sources": identity}
            write_token_store(folder, encoded, tiktoken_encoding, self.store_vocab, meta)
            store = open_store(folder)
            log.info("Wrote token store %s (%s tokens)", folder, f"{len(store.tokens):,}")
        else:
            log.info("Loaded token store %s (%s tokens)", folder, f"{len(store.tokens):,}")
        self._store = store
        self._store_folder = folder
        return store

    def prepare_data(self) -> None:
        """Download (once), tokenize (once) into the store. Lightning runs it on rank 0 only."""
        if self.tokenizer is None:
            self.token_store()

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        store = self.token_store()
        tokenizer = Tokenizer(
            self.store_encoding, store.meta["vocab"]
        )  # a checkpoint's vocab is stored
        tokens = store.tokens
        # token order, like the seeds: train, then val, then test (with test_fraction 0 the
        # articles' 90/10 split exactly: the same n_train, val up to the last token)
        n_train = int(len(tokens) * (1.0 - self.val_fraction - self.test_fraction))
        n_test = int(len(tokens) * self.test_fraction)
        splits = {
            "train": tokens[:n_train],
            "val": tokens[n_train : len(tokens) - n_test],
            "test": tokens[len(tokens) - n_test :],
        }
        checked = {"train": stage == "fit", "val": True, "test": self.test_fraction > 0}
        for split, part in splits.items():
            if checked[split]:
                self.check_split(split, len(part))
        # set only once the split is valid: `self.tokenizer` marks setup as done
        self.splits = splits
        self.tokenizer = tokenizer

    def check_split(self, split: str, size: int) -> None:
        """A split, and the prefix of it that is evaluated, hold at least one window."""
        window = self.context_length + 1
        if size < window:
            raise ConfigError(
                f"data.context_length={self.context_length}: the {split} split holds only "
                f"{size} tokens, fewer than one window of context_length + 1. Lower "
                f"data.context_length, {SPLIT_SIZE[split]}, or use a longer corpus."
            )
        budget = {"val": self.settings.val_tokens, "test": self.settings.test_tokens}.get(split)
        if budget is not None and budget < window:
            raise ConfigError(
                f"data.{split}_tokens={budget}: fewer than one window of context_length + 1 = "
                f"{window} tokens. Raise it, or set it to null (the whole {split} split)."
            )

    def evaluated(self, split: str) -> int:
        """How many tokens of the val or test split a validation (or test) covers."""
        budget = self.settings.val_tokens if split == "val" else self.settings.test_tokens
        size = len(self.splits[split])
        return size if budget is None else min(budget, size)

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        windows = Windows(self.splits["train"], self.context_length)
        # continuing from a checkpoint: start at the first batch the stopped run had not trained on
        start = self.trainer.global_step if self.trainer is not None else 0
        batch, seed, repeat = self.batch_size, self.settings.seed, self.settings.repeat_batches
        sampler = RandomWindowSampler(windows.num_starts, batch, seed, *self._rank(), start, repeat)
        return self._loader(windows, sampler)

    def val_dataloader(self) -> DataLoader:
        return self.windows_of("val", *self._rank())

    def test_dataloader(self) -> DataLoader:
        if self.test_fraction == 0:
            raise ConfigError(
                "data.test_fraction=0: there is no test split to evaluate. Train with "
                "data.test_fraction=0.1 (or more) to hold one out."
            )
        return self.windows_of("test", *self._rank())

    def windows_of(self, split: str, rank: int = 0, world_size: int = 1) -> DataLoader:
        """Each window of the split's evaluated prefix once, in order (a rank's share)."""
        tokens = self.splits[split][: self.evaluated(split)]
        windows = Windows(tokens, self.context_length)
        batches = every_window(len(tokens), self.context_length, self.batch_size)
        return self._loader(windows, batches[rank::world_size])

    def _loader(self, windows: Windows, sampler) -> DataLoader:
        # its own generator: creating an iterator then draws no number from torch's global
        # RNG, which a resumed run would otherwise see in a different state (dropout masks)
        generator = torch.Generator().manual_seed(self.settings.seed)
        return DataLoader(
            windows,
            sampler=sampler,
            batch_size=None,  # each item already is a batch
            num_workers=self.settings.num_workers,
            persistent_workers=self.settings.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            generator=generator,
        )
