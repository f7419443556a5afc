"""Mixtures of sources on real parts: the book and Tiny Shakespeare from GPTLAB_DATA_DIR, tiktoken,
the token store, the samplers, and gptlab-train's own refusals (in-process)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import SHARED

from gptlab.data.datamodule import GPTDataModule
from gptlab.errors import ConfigError

B, T = 8, 32
CONF = Path(__file__).resolve().parents[1] / "conf"
TWO_BOOKS = yaml.safe_load((CONF / "data" / "two_books.yaml").read_text())
SHAKESPEARE = SHARED / "tinyshakespeare.txt"


def two_books(cache: Path, **kw) -> GPTDataModule:
    """data=two_books's sources, found in GPTLAB_DATA_DIR, at small sizes."""
    settings = dict(
        url=None,
        sha256=None,
        sources=TWO_BOOKS["sources"],
        weights=TWO_BOOKS["weights"],
        data_dir=str(SHARED),
        cache_dir=str(cache),
        batch_size=B,
        context_length=T,
    )
    return GPTDataModule(**{**settings, **kw})


def book_alone(cache: Path, **kw) -> GPTDataModule:
    book = TWO_BOOKS["sources"]["book"]
    settings = dict(data_dir=str(SHARED), cache_dir=str(cache), batch_size=B, context_length=T)
    return GPTDataModule(**{**settings, **book, **kw})


def set_up(module: GPTDataModule) -> GPTDataModule:
    module.prepare_data()
    module.setup("fit")
    return module


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One token cache for the module: each source tokenized once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def mixed(cache) -> GPTDataModule:
    return set_up(two_books(cache))


@pytest.fixture(scope="module")
def book(cache) -> GPTDataModule:
    return set_up(book_alone(cache))


# ------------------------------------------------------------------ the interface the module reads
def test_interface(mixed, book):
    assert mixed.source_names == ["book", "shakespeare"] and book.source_names is None
    val = mixed.val_dataloader()
    assert isinstance(val, list) and len(val) == 2
    for loader, source in zip(val, mixed.source_names, strict=True):
        x, y = next(iter(loader))
        first = next(iter(mixed.windows_of("val", source=source)))[0]
        assert x.shape == (B, T) and torch.equal(x, first)
    assert not isinstance(book.val_dataloader(), list)
    # epochs: steps x batch x context x ranks x share / the source's train tokens
    epochs = mixed.planned_epochs(300, world_size=2)
    shares = mixed.mixture.shares_at(0)
    for share, source in zip(shares, mixed.source_names, strict=True):
        train = len(mixed.part("train", source))
        assert epochs[source] == pytest.approx(300 * B * T * 2 * share / train)
    assert book.planned_epochs(300) is None
    assert mixed.settings.val_average == "micro"
    with pytest.raises(ConfigError, match="data.val_average='mean'"):
        two_books(Path("unused"), val_average="mean")


def test_each_source_splits_alone_into_its_own_store(mixed, book):
    """The book's split in the mixture is the book's alone (its text; ids differ by vocabulary),
    from the same store; the vocabulary is the union of the sources' ids."""
    for split in ("train", "val"):
        mine, alone = mixed.part(split, "book"), book.splits[split]
        assert len(mine) == len(alone)
        text = mixed.tokenizer.decode(mixed.tables["book"][np.asarray(mine)])
        assert text == book.tokenizer.decode(np.asarray(alone))
    assert mixed.token_store("book").folder == book.token_store().folder
    union = set(book.tokenizer.vocab.tolist()) | set(mixed.token_store("shakespeare").meta["vocab"])
    assert mixed.tokenizer.vocab.tolist() == sorted(union)
    assert mixed.tokenizer.vocab_size == 14_157  # 12,111 of Shakespeare's with the book's 3,771
    shakespeare = SHAKESPEARE.read_text(encoding="utf-8")
    parts = [mixed.part(split, "shakespeare") for split in ("train", "val")]
    ids = mixed.tables["shakespeare"][np.concatenate(parts)]
    assert mixed.tokenizer.decode(ids) == shakespeare
    sizes = [len(mixed.part("train", source)) for source in mixed.source_names]
    assert len(mixed.splits["train"]) == sum(sizes)
