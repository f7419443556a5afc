"""Mixtures of sources on real parts: the book and Tiny Shakespeare from GPTLAB_DATA_DIR, tiktoken,
the token store, the samplers, and gptlab-train's own refusals (in-process)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import SHARED
from helpers import LocalServer, run_main, scalars

from gptlab.data.datamodule import GPTDataModule
from gptlab.data.mixture import Mixture
from gptlab.data.windows import MixtureSampler
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


# ------------------------------------------------------------------ sampling
def tiktoken_ids(module: GPTDataModule, x: torch.Tensor) -> np.ndarray:
    """The tiktoken ids of model ids: comparable across vocabularies."""
    return module.tokenizer.vocab[x.numpy()]


def test_a_source_with_every_window_draws_as_a_run_on_it_alone(cache, book):
    """weights {book: 1, shakespeare: 0}: the same windows of text, in the same order, as the book
    alone with the same seed, on every rank; Shakespeare is still validated, never trained on."""
    only_book = set_up(two_books(cache, weights={"book": 1, "shakespeare": 0}, seed=7))
    alone = set_up(book_alone(cache, seed=7))
    assert len(only_book.val_dataloader()) == 2
    mixed_loader, alone_loader = only_book.train_dataloader(), alone.train_dataloader()
    for rank in (0, 1):  # a DDP rank's sampler, of two
        mixed_sampler = dataclasses.replace(mixed_loader.sampler, rank=rank, world_size=2)
        alone_sampler = dataclasses.replace(alone_loader.sampler, rank=rank, world_size=2)
        for starts, alone_starts in itertools.islice(
            zip(mixed_sampler, alone_sampler, strict=False), 50
        ):
            assert starts[1] == []
            (x, y), (x1, y1) = mixed_loader.dataset[starts], alone_loader.dataset[alone_starts]
            assert np.array_equal(tiktoken_ids(only_book, x), tiktoken_ids(alone, x1))
            assert np.array_equal(tiktoken_ids(only_book, y), tiktoken_ids(alone, y1))


@pytest.mark.parametrize("weights", [{"book": 0.3, "shakespeare": 0.7}, "proportional"])
def test_each_source_gets_its_share_of_the_train_tokens(mixed, weights):
    """Over 1,000 steps each source's share of the windows (hence of the train tokens: every
    window has context_length of them) is within 2% of its weight; every batch is whole."""
    sizes = {source: len(mixed.part("train", source)) for source in mixed.source_names}
    mixture = Mixture(weights, sizes)
    starts = [size - T for size in sizes.values()]
    sampler = MixtureSampler(mixture, starts, 16, seed=0)
    drawn = np.zeros(2)
    for batch in itertools.islice(sampler, 1000):
        assert sum(len(s) for s in batch) == 16
        drawn += [len(s) for s in batch]
    share = drawn / drawn.sum()
    expected = mixture.shares_at(0)
    if weights == "proportional":
        assert expected == pytest.approx(np.array(list(sizes.values())) / sum(sizes.values()))
    assert np.all(np.abs(share - expected) <= 0.02 * expected), (share, expected)


def test_batches_hold_each_sources_windows_in_the_union_vocabulary(mixed):
    """A batch: the book's windows, then Shakespeare's, each a window of its own train split."""
    loader = mixed.train_dataloader()
    (x, y), starts = next(iter(loader)), next(iter(loader.sampler))
    assert x.shape == y.shape == (B, T) and torch.equal(x[:, 1:], y[:, :-1])
    rows = iter(x)
    for source, offsets in zip(mixed.source_names, starts, strict=True):
        train = mixed.tables[source][np.asarray(mixed.part("train", source))]
        for start in offsets:
            assert next(rows).tolist() == train[start : start + T].tolist()


def test_staged_weights_switch_at_their_step(mixed):
    sizes = {source: len(mixed.part("train", source)) for source in mixed.source_names}
    stages = [
        {"start": 0, "weights": {"book": 1}},
        {"start": 5, "weights": {"shakespeare": 1}},
        {"start": 10, "weights": "proportional"},
    ]
    mixture = Mixture(stages, sizes)
    assert [mixture.counts(step, 16) for step in (0, 4, 5, 9)] == [[16, 0]] * 2 + [[0, 16]] * 2
    assert 0 < mixture.counts(10, 16)[0] < 16
    epochs = mixture.epochs(20, 100)
    assert epochs["book"] == pytest.approx((500 + 1000 * mixture.shares_at(10)[0]) / sizes["book"])


def test_a_continued_run_draws_what_the_stopped_one_would_have(mixed):
    """Batch i is a pure function of (seed, rank, world size, i): a sampler started at step 37
    (trainer.global_step after a kill -9 or a requeue) goes on exactly; ranks draw their own."""
    starts = [len(mixed.part("train", source)) - T for source in mixed.source_names]
    whole = MixtureSampler(mixed.mixture, starts, B, seed=3)
    resumed = MixtureSampler(mixed.mixture, starts, B, seed=3, start=37)
    assert list(itertools.islice(whole, 37, 60)) == list(itertools.islice(resumed, 23))
    rank0 = MixtureSampler(mixed.mixture, starts, B, seed=3, rank=0, world_size=2)
    rank1 = MixtureSampler(mixed.mixture, starts, B, seed=3, rank=1, world_size=2)
    for a, b in itertools.islice(zip(rank0, rank1, strict=True), 20):
        assert [len(s) for s in a] == [len(s) for s in b] and a != b


# ------------------------------------------------------------------ refusals, before any tokenizing
@pytest.mark.parametrize(
    "override, needle",
    [
        ("data.weights={book:-1,shakespeare:1}", "data.weights.book=-1: a weight is a finite"),
        ("data.weights={book:nan,shakespeare:1}", "data.weights.book=nan: a weight is a finite"),
        ("data.weights={book:0,shakespeare:0}", "every weight is 0"),
        ("data.weights={book:1,poetry:1}", "data.weights.poetry: there is no source 'poetry'"),
        ("+data.sources.shakespeare.path=nowhere.txt", "data.sources.shakespeare.path: no file"),
        ("data.weights=[{start:5,weights:{book:1}}]", "data.weights[0].start=5: the first stage"),
        ("+data.sources.book.colour=red", "data.sources.book.colour: a source has no such"),
        ("data.val_average=mean", "data.val_average='mean'"),
        ("data.max_epochs=-1", "data.max_epochs=-1"),
        ("+data.sources.micro.path=x.txt", "data.sources.micro: 'micro' names one of the averages"),
    ],
)
def test_bad_mixtures_are_refused_before_any_tokenizing(tmp_path, override, needle):
    cache = tmp_path / "cache"
    args = ["experiment=two_books", "debug=fast", override, "logger=none", "hydra.run.dir=run"]
    result = run_main(*args, cwd=tmp_path, env={"GPTLAB_CACHE_DIR": str(cache)})
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert needle in error, result.stderr[-3000:]
    assert not cache.exists() or not any(cache.iterdir())  # nothing tokenized


def test_a_run_that_would_repeat_a_source_past_the_cap_is_refused(tmp_path):
    """data.max_epochs: the planned epochs of each source, checked before the first step."""
    args = ["experiment=two_books", "debug=fast", "logger=none", "hydra.run.dir=run"]
    capped = run_main(*args, "data.max_epochs=1", "trainer.max_steps=2000", cwd=tmp_path)
    assert capped.returncode == 2, capped.stderr[-3000:]
    message = capped.stderr.strip().splitlines()[-1]
    # 2,000 steps of 8 x 32 tokens, 20.5% of them the book's 70,127 train tokens: 1.50 epochs
    assert "data.max_epochs=1: 2,000 steps of 8 x 32 tokens" in message
    assert "source 'book' 1.50 times over (70,127 train tokens)" in message
    assert not (tmp_path / "run" / "checkpoints").exists()


# ------------------------------------------------------------------ a run, killed and resumed
def test_sigkill_then_resume_gives_the_same_per_source_losses(tmp_path):
    """experiment=two_books at debug sizes: kill -9 at a periodic save, resume=, and every val
    scalar (each source's loss and bpb, the averages) equals the unbroken run's, as do weights."""
    from test_resume import TINY, kill_at_save, start, weights

    from gptlab.run import directory

    args = [*TINY, "experiment=two_books", "trainer.max_steps=30", "trainer.val_check_interval=15"]
    union = set_up(two_books(tmp_path / "cache")).tokenizer.vocab.tolist()
    whole = run_main(*args, "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    run_dir = tmp_path / "run"
    last = run_dir / directory.CHECKPOINTS / "last.ckpt"
    stopped = kill_at_save(start(*args, f"hydra.run.dir={run_dir}", cwd=tmp_path), last, 10)
    assert 10 <= stopped < 30
    resumed = run_main(f"resume={run_dir}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = weights(tmp_path / "whole" / directory.CHECKPOINTS / "last.ckpt"), weights(last)
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0
    saved = torch.load(last, map_location="cpu", weights_only=True)["hyper_parameters"]
    assert saved["tokenizer"]["vocab"] == union  # the checkpoint holds the union vocabulary
    tags = scalars(tmp_path / "whole" / "tensorboard")
    again = scalars(run_dir / "tensorboard")
    per_source = [tag for tag in tags if tag.startswith(("val/book/", "val/shakespeare/"))]
    assert per_source, sorted(tags)
    for tag in [t for t in tags if t.startswith("val/")]:
        assert dict(again[tag])[30] == dict(tags[tag])[30], tag


# ------------------------------------------------------------------ Tiny Shakespeare's download
def test_a_source_downloads_once_under_its_file_name(tmp_path, monkeypatch):
    """char-rnn's input.txt is found, or downloaded once and checked, as tinyshakespeare.txt
    (data.sources.shakespeare.file_name); the book comes from the data folder."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = LocalServer(files={"/tinyshakespeare/input.txt": SHAKESPEARE.read_bytes()})
    try:
        shakespeare = {**TWO_BOOKS["sources"]["shakespeare"]}
        shakespeare["url"] = server.url("/tinyshakespeare/input.txt")
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        (data_dir / "sales_textbook.txt").write_bytes((SHARED / "sales_textbook.txt").read_bytes())
        sources = {"book": TWO_BOOKS["sources"]["book"], "shakespeare": shakespeare}
        for _ in range(2):  # the second finds the download
            module = two_books(tmp_path / "cache", sources=sources, data_dir=str(data_dir))
            got = module.corpus_path("shakespeare")
            assert got == data_dir / "sha256" / shakespeare["sha256"] / "tinyshakespeare.txt"
        assert server.hits == ["/tinyshakespeare/input.txt"]
    finally:
        server.close()
    with pytest.raises(ConfigError, match="data.sources.shakespeare.file_name='../x.txt'"):
        bad = {**sources, "shakespeare": {**shakespeare, "file_name": "../x.txt"}}
        two_books(tmp_path / "cache", sources=bad, data_dir=str(data_dir)).prepare_data()


# ------------------------------------------------------------------ the benchmark's mixing row
def test_the_benchmarks_mixing_row(tmp_path):
    """scripts/benchmark's row 9: its halves, the batches drawn with no model, its rows."""
    from scripts.benchmark.bare_batches import time_batches
    from scripts.benchmark.mixing import halves, mixing_rows

    book = SHARED / "sales_textbook.txt"
    first, second = halves(book, tmp_path)
    assert first.read_text() + second.read_text() == book.read_text()
    assert first.read_text().endswith("\n")
    assert abs(first.stat().st_size - second.stat().st_size) < 1000
    sources = {"first": {"path": str(first)}, "second": {"path": str(second)}}
    module = two_books(tmp_path / "cache", sources=sources, weights=None)
    timed = time_batches(module, 50)
    assert timed["batches"] == 50 and timed["seconds_per_batch"] > 0
    run = {"train_steps_per_s": 10.0, "steps": 400, "all_steps_per_s": [10.0, 9.0]}
    measured = {
        "runs": {"single": run, "mixture": {**run, "train_steps_per_s": 9.8}},
        "bare": {"single": {"seconds_per_batch": 1e-4}, "mixture": {"seconds_per_batch": 3e-4}},
    }
    cost, batches = mixing_rows(measured)
    assert cost["value"] == pytest.approx(100 * (10.0 / 9.8 - 1))
    assert batches["value"] == pytest.approx(100 * 2e-4 / 0.1)  # 0.2 ms of a 100 ms step
