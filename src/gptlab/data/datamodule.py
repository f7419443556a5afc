"""LightningDataModule: sources -> token store (tokenized once) -> train, val, test -> batches.
The store is mapped, not loaded: the splits are views of one np.memmap, shared through the page
cache by the processes of a DDP run (a spawned rank gets the module pickled by the store's path).
A mixture (data.sources, docs/data.md) runs the same path once per source: a store, a split and a
val loader each; its training batches mix the sources' windows (windows.MixtureSampler)."""

import hashlib
import json
import logging
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from gptlab.data.config import DataConfig, source_settings
from gptlab.data.corpus import remove_stale
from gptlab.data.mixture import Mixture, of_source, union_vocabulary
from gptlab.data.sources import find_corpus, is_many
from gptlab.data.splits import SPLITS, MixedSplit, check_splits, split_tokens
from gptlab.data.store import TokenStore, open_store, store_folder, store_key
from gptlab.data.store import write_store as write_token_store
from gptlab.data.stream import encode_documents
from gptlab.data.tokenizer import Tokenizer, check_encoding
from gptlab.data.windows import (
    MixedWindows,
    MixtureSampler,
    RandomWindowSampler,
    Windows,
    every_window,
)
from gptlab.errors import ConfigError

log = logging.getLogger(__name__)


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
        # by source: None for a single source, else each of the mixture's names
        self._corpora: dict = {}  # the sources, found and checked once
        self._stores: dict[str | None, TokenStore] = {}
        self._store_folders: dict[str | None, Path] = {}  # kept when pickled: a rank maps them
        self.tokenizer: Tokenizer | None = None
        # train, val, test once set up: views of the store (np.memmap); a mixture's are
        # MixedSplits, each source's part its own store's view
        self.splits: dict = {}
        self.tables: dict[str, np.ndarray | None] = {}  # a mixture's: ids -> the union's
        self.mixture: Mixture | None = None  # a mixture's weights, once its sizes are known

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

    @property
    def source_names(self) -> list[str] | None:
        """A mixture's source names in config order; None for a single source."""
        return None if self.settings.sources is None else list(self.settings.sources)

    def __getstate__(self) -> dict:
        """By the stores' paths: a spawned DDP rank maps the stores itself, no tokens travel."""
        state = dict(self.__dict__)
        state.update(_corpora={}, _stores={}, tokenizer=None, splits={}, tables={}, mixture=None)
        return state

    def source_settings(self, source: str | None) -> DataConfig:
        """The settings a source is read with: data's own (None), or a mixture's source's."""
        return self.settings if source is None else source_settings(self.settings, source)

    def corpus(self, source: str | None = None):
        """A Hugging Face dataset (data.name), else the files of data.path or data.url."""
        if source not in self._corpora:
            try:
                self._corpora[source] = find_corpus(self.source_settings(source))
            except ConfigError as e:
                raise ConfigError(of_source(str(e), source)) from None
        return self._corpora[source]

    def corpus_path(self, source: str | None = None) -> Path:
        """The corpus file (downloaded if need be), or the folder, glob or dataset named."""
        settings = self.source_settings(source)
        name, path = settings.name, settings.path
        if name:
            return Path(name)
        if is_many(path):
            return Path(path)
        return self.corpus(source).paths[0]

    def token_store(self, source: str | None = None) -> TokenStore:
        """The mapped store of a source, tokenized first if no whole one exists. Its key is the
        source's alone: a mixture shares each source's store with a run on it alone."""
        if source not in self._stores and source in self._store_folders:
            self._stores[source] = open_store(self._store_folders[source])
        if self._stores.get(source) is not None:
            return self._stores[source]
        corpus = self.corpus(source)
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
        self._stores[source] = store
        self._store_folders[source] = folder
        return store

    def prepare_data(self) -> None:
        """Download (once), tokenize (once) into the stores. Lightning runs it on rank 0 only.
        Every source is found and checked before any is tokenized."""
        if self.tokenizer is None:
            sources = self.source_names or [None]
            for source in sources:
                self.corpus(source)
            for source in sources:
                self.token_store(source)

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        if self.source_names is not None:
            return self.setup_mixture(stage)
        store = self.token_store()
        tokenizer = Tokenizer(
            self.store_encoding, store.meta["vocab"]
        )  # a checkpoint's vocab is stored
        splits = split_tokens(store.tokens, self.val_fraction, self.test_fraction)
        check_splits(splits, stage, self.settings)
        # set only once the split is valid: `self.tokenizer` marks setup as done
        self.splits = splits
        self.tokenizer = tokenizer

    def setup_mixture(self, stage: str | None) -> None:
        """Each source split on its own (so no source's val text is trained on through another),
        its ids mapped into one vocabulary; the weights resolved with the train sizes."""
        if any(source not in self._store_folders for source in self.source_names):
            self.prepare_data()  # every source found and checked, then tokenized
        stores = {source: self.token_store(source) for source in self.source_names}
        vocab, tables = union_vocabulary(stores, self.vocab_mode)
        parts = {}
        for source, store in stores.items():
            parts[source] = split_tokens(store.tokens, self.val_fraction, self.test_fraction)
            try:
                check_splits(parts[source], stage, self.settings)
            except ConfigError as e:
                raise ConfigError(of_source(str(e), source)) from None
        sizes = {source: len(splits["train"]) for source, splits in parts.items()}
        self.mixture = Mixture(self.settings.weights, sizes)
        self.tables = tables
        self.splits = {
            split: MixedSplit({source: parts[source][split] for source in parts})
            for split in SPLITS
        }
        self.tokenizer = Tokenizer(self.store_encoding, vocab)

    def part(self, split: str, source: str | None = None) -> np.ndarray:
        """A split's tokens: the single source's, or a mixture's source's."""
        if source is None:
            return self.splits[split]
        return self.splits[split].parts[source]

    def evaluated(self, split: str, source: str | None = None) -> int:
        """How many tokens of the val or test split (of a source) a validation (or test) covers."""
        budget = self.settings.val_tokens if split == "val" else self.settings.test_tokens
        size = len(self.part(split, source))
        return size if budget is None else min(budget, size)

    def planned_epochs(self, steps: int, world_size: int = 1) -> dict[str, float] | None:
        """A mixture's epochs of each source's train split that `steps` steps take (None for a
        single source): steps x batch x context x ranks x share / the source's train tokens."""
        if self.mixture is None:
            return None
        return self.mixture.epochs(steps, self.batch_size * self.context_length * world_size)

    def check_epochs(self, steps: int, world_size: int = 1) -> None:
        """data.max_epochs: a run that would repeat a source more often is refused."""
        cap = self.settings.max_epochs
        epochs = self.planned_epochs(steps, world_size) or {}
        over = {source: n for source, n in epochs.items() if cap is not None and n > cap}
        if over:
            source, n = max(over.items(), key=lambda item: item[1])
            raise ConfigError(
                f"data.max_epochs={cap:g}: {steps:,} steps of {self.batch_size} x "
                f"{self.context_length} tokens on {world_size} rank(s) would train on source "
                f"'{source}' {n:.2f} times over ({len(self.part('train', source)):,} train "
                f"tokens). Train fewer steps (trainer.max_steps, flops_budget), lower its "
                f"weight (data.weights.{source}), or raise data.max_epochs (null: no cap)."
            )

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        # continuing from a checkpoint: start at the first batch the stopped run had not trained on
        start = self.trainer.global_step if self.trainer is not None else 0
        batch, seed, repeat = self.batch_size, self.settings.seed, self.settings.repeat_batches
        if self.source_names is None:
            windows = Windows(self.splits["train"], self.context_length)
            sampler = RandomWindowSampler(
                windows.num_starts, batch, seed, *self._rank(), start, repeat
            )
            return self._loader(windows, sampler)
        if self.trainer is not None:  # every rank: none starts a run the cap refuses
            self.check_epochs(self.trainer.max_steps, self.trainer.world_size)
        sources = [
            Windows(self.part("train", source), self.context_length, self.tables[source])
            for source in self.source_names
        ]
        starts = [windows.num_starts for windows in sources]
        sampler = MixtureSampler(self.mixture, starts, batch, seed, *self._rank(), start, repeat)
        return self._loader(MixedWindows(sources), sampler)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """One loader; a mixture's: one per source, in source_names order (dataloader_idx)."""
        return self.loaders_of("val")

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        if self.test_fraction == 0:
            raise ConfigError(
                "data.test_fraction=0: there is no test split to evaluate. Train with "
                "data.test_fraction=0.1 (or more) to hold one out."
            )
        return self.loaders_of("test")

    def loaders_of(self, split: str) -> DataLoader | list[DataLoader]:
        if self.source_names is None:
            return self.windows_of(split, *self._rank())
        return [self.windows_of(split, *self._rank(), source) for source in self.source_names]

    def windows_of(
        self, split: str, rank: int = 0, world_size: int = 1, source: str | None = None
    ) -> DataLoader:
        """Each window of the split's evaluated prefix once, in order (a rank's share); of one
        source of a mixture."""
        tokens = self.part(split, source)[: self.evaluated(split, source)]
        windows = Windows(tokens, self.context_length, self.tables.get(source))
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
