"""The data layer on real parts: tiktoken, files in tmp_path, an HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch
from helpers import LocalServer

from gptlab.data import datamodule
from gptlab.data.config import SALES_TEXTBOOK_SHA256
from gptlab.data.corpus import check_url, download, resolve_corpus, sha256_of
from gptlab.data.datamodule import GPTDataModule
from gptlab.data.tokenizer import Tokenizer
from gptlab.data.windows import RandomWindowSampler
from gptlab.errors import ConfigError

B, T = 4, 16  # batch_size, context_length used throughout


def make_dm(tmp: Path, path: Path, **kw) -> GPTDataModule:
    args = dict(
        path=str(path),
        sha256=None,
        url=None,
        data_dir=str(tmp / "data"),
        cache_dir=str(tmp / "cache"),
        batch_size=B,
        context_length=T,
    )
    args.update(kw)
    return GPTDataModule(**args)


@pytest.fixture(scope="module")
def dm(corpus_path, tmp_path_factory) -> GPTDataModule:
    """The shared corpus, prepared and set up once (cl100k_base, compact vocabulary)."""
    module = make_dm(tmp_path_factory.mktemp("dm"), corpus_path, sha256=SALES_TEXTBOOK_SHA256)
    module.prepare_data()
    module.setup("fit")
    return module


@pytest.fixture(scope="module")
def cl100k_ids(corpus_text) -> np.ndarray:
    return np.asarray(tiktoken.get_encoding("cl100k_base").encode_ordinary(corpus_text))


# ------------------------------------------------------------------ tokenizer facts
def test_cl100k_facts_on_sales_textbook(cl100k_ids):
    enc = tiktoken.get_encoding("cl100k_base")
    assert cl100k_ids.max() == 100069
    assert enc.decode([int(cl100k_ids.max())]) == "Clar"
    assert len(np.unique(cl100k_ids)) == 3771


def test_o200k_facts_on_sales_textbook(corpus_text):
    tok = Tokenizer("o200k_base")
    ids = tok.encode_tiktoken(corpus_text)
    assert ids[:7].tolist() == [45990, 220, 16, 25, 22478, 158287, 326]
    assert ids.max() == 199853


def test_compact_vocab_round_trip(corpus_text, cl100k_ids):
    tok = Tokenizer.fit("cl100k_base", cl100k_ids, compact=True)
    assert tok.vocab_size == 3771
    ids = tok.encode(corpus_text)
    assert min(ids) == 0 and max(ids) == 3770
    assert tok.decode(ids) == corpus_text
    # the checkpoint form rebuilds the same tokenizer
    again = Tokenizer(**tok.state_dict())
    assert again.vocab_size == 3771 and again.encode(corpus_text) == ids


def test_full_vocab_size_is_tiktokens(corpus_text, cl100k_ids, tmp_path, corpus_path):
    enc = tiktoken.get_encoding("cl100k_base")
    tok = Tokenizer.fit("cl100k_base", cl100k_ids, compact=False)
    assert tok.vocab is None
    assert tok.vocab_size == enc.n_vocab == enc.max_token_value + 1
    assert tok.decode(tok.encode(corpus_text)) == corpus_text
    full = make_dm(tmp_path, corpus_path, compact_vocab=False)
    full.setup("fit")
    assert full.tokenizer.vocab_size == enc.n_vocab
    assert np.array_equal(np.concatenate([full.splits["train"], full.splits["val"]]), cl100k_ids)
    assert full.token_store().meta["dtype"] == "uint32"  # 100,277 ids do not fit in 16 bits


def test_unseen_token_raises_config_error(cl100k_ids):
    enc = tiktoken.get_encoding("cl100k_base")
    tok = Tokenizer.fit("cl100k_base", cl100k_ids, compact=True)
    seen = set(tok.vocab.tolist())
    inside = " xylophone"  # ids inside the vocabulary's range, but never in the corpus
    assert not set(enc.encode_ordinary(inside)) <= seen
    # a token above the largest corpus id: searchsorted lands past the end of the vocabulary
    above = next(
        s
        for s in (enc.decode([i]) for i in range(int(cl100k_ids.max()) + 1, enc.n_vocab))
        if len(enc.encode_ordinary(s)) == 1 and enc.encode_ordinary(s)[0] not in seen
    )
    assert enc.encode_ordinary(above)[0] > tok.vocab[-1]
    for prompt in (inside, "Sales " + above):
        with pytest.raises(ConfigError, match="compact vocabulary has never seen"):
            tok.encode(prompt)
    assert tok.decode(tok.encode("Sales")) == "Sales"  # seen text still encodes


def test_unknown_encoding(tmp_path, corpus_path):
    with pytest.raises(ConfigError, match="data.encoding: 'cl100k_bogus'"):
        Tokenizer("cl100k_bogus")
    with pytest.raises(ConfigError, match="data.encoding"):
        make_dm(tmp_path, corpus_path, encoding="cl100k_bogus").prepare_data()


# ------------------------------------------------------------------ corpus file errors
def test_missing_corpus_file(tmp_path):
    missing = tmp_path / "nowhere" / "corpus.txt"
    module = make_dm(tmp_path, missing)
    with pytest.raises(ConfigError) as err:
        module.prepare_data()
    assert str(missing) in str(err.value) and "data.path" in str(err.value)


@pytest.mark.parametrize(
    "content, phrase",
    [
        (b"", "is empty"),
        (b"  \n\t\n", "is empty"),
        (b"plain text\x00\x01\x02 then binary", "NUL bytes"),
        ("caf\u00e9 cr\u00e8me".encode("latin-1"), "not UTF-8"),
    ],
    ids=["empty", "whitespace", "binary", "latin1"],
)
def test_bad_corpus_files(tmp_path, content, phrase):
    bad = tmp_path / "corpus.txt"
    bad.write_bytes(content)
    module = make_dm(tmp_path, bad)
    with pytest.raises(ConfigError, match=phrase) as err:
        module.setup("fit")
    assert str(bad) in str(err.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_corpus_too_short_for_a_val_window(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("The quick brown fox jumps over the lazy dog. " * 6, encoding="utf-8")
    module = make_dm(tmp_path, short, val_fraction=0.1)
    module.prepare_data()
    with pytest.raises(ConfigError, match=r"data.context_length=16: the val split") as err:
        module.setup("fit")
    assert "fewer than one window" in str(err.value)
    with pytest.raises(ConfigError, match="data.context_length"):
        module.setup("validate")  # a failed setup is not remembered as done
    with pytest.raises(ConfigError, match="data.context_length"):
        module.setup("fit")


@pytest.mark.parametrize(
    "fractions, split, advice",
    [
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "train", "lower data.val_fraction or data"),
        ({"val_fraction": 0.0001}, "val", "raise data.val_fraction"),
        ({"test_fraction": 0.0001}, "test", "raise data.test_fraction"),
    ],
)
def test_a_split_too_short_says_which_fraction_to_change(tmp_path, fractions, split, advice):
    """The advice names keys that exist: train gets what val and test leave."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    module = make_dm(tmp_path, corpus, **fractions)
    module.prepare_data()
    with pytest.raises(ConfigError, match=rf"the {split} split holds only") as err:
        module.setup("fit")
    assert advice in str(err.value)


# ------------------------------------------------------------------ token store
def test_second_setup_loads_the_store_without_tokenizing(
    tmp_path, corpus_path, caplog, monkeypatch
):
    caplog.set_level(logging.INFO, logger="gptlab.data")
    before = sorted(p.name for p in corpus_path.parent.iterdir())
    first = make_dm(tmp_path, corpus_path)
    first.prepare_data()
    first.setup("fit")
    caches = list((tmp_path / "cache").iterdir())
    assert len(caches) == 1 and (caches[0] / "tokens.bin").is_file()
    mtime = (caches[0] / "tokens.bin").stat().st_mtime_ns
    assert sorted(p.name for p in corpus_path.parent.iterdir()) == before  # nothing written there
    assert not (tmp_path / "data").exists()  # data_dir untouched when data.path is given

    def no_tokenizing(*_args, **_kw):
        raise AssertionError("tokenized again despite a valid cache")

    monkeypatch.setattr(datamodule, "encode_documents", no_tokenizing)
    caplog.clear()
    second = make_dm(tmp_path, corpus_path)
    second.prepare_data()
    second.setup("fit")
    assert "Loaded token store" in caplog.text and "Tokenizing" not in caplog.text
    assert (caches[0] / "tokens.bin").stat().st_mtime_ns == mtime
    assert second.tokenizer.vocab_size == first.tokenizer.vocab_size == 3771
    assert np.array_equal(second.splits["train"], first.splits["train"])
    assert np.array_equal(second.splits["val"], first.splits["val"])


def test_truncated_store_is_rebuilt(tmp_path, corpus_path, caplog):
    first = make_dm(tmp_path, corpus_path)
    first.setup("fit")
    # a copy, not the mapping
    expected = np.concatenate([first.splits["train"], first.splits["val"]])
    del first  # truncating a mapped file in place would fault its readers (gptlab never does)
    (folder,) = (tmp_path / "cache").iterdir()
    tokens = folder / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[: tokens.stat().st_size // 2])
    caplog.set_level(logging.INFO, logger="gptlab.data")
    second = make_dm(tmp_path, corpus_path)
    second.setup("fit")
    assert any(r.levelno == logging.WARNING and "damaged" in r.getMessage() for r in caplog.records)
    assert "Tokenizing" in caplog.text
    assert np.array_equal(np.concatenate([second.splits["train"], second.splits["val"]]), expected)
    assert tokens.stat().st_size == 2 * (len(second.splits["train"]) + len(second.splits["val"]))
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]  # no temp folder


# ------------------------------------------------------------------ split, windows, batches
def test_split_is_train_then_val_in_token_order(dm, cl100k_ids):
    expected = np.searchsorted(np.unique(cl100k_ids), cl100k_ids)
    assert len(dm.splits["train"]) == int(len(expected) * 0.9)
    assert np.array_equal(np.concatenate([dm.splits["train"], dm.splits["val"]]), expected)
    assert isinstance(dm.splits["train"], np.memmap) and dm.splits["train"].dtype == np.uint16


def test_train_windows_use_train_positions_only(dm):
    loader = dm.train_dataloader()
    n_train = len(dm.splits["train"])
    assert loader.dataset.tokens is dm.splits["train"]
    assert loader.sampler.num_starts == n_train - T  # the last start still ends inside train
    offsets = np.arange(T + 1)
    highest = 0
    for starts, (x, y) in itertools.islice(
        zip(loader.sampler, loader, strict=True), 200
    ):  # endless
        starts = np.asarray(starts)
        highest = max(highest, int(starts.max()) + T)  # last token position the window reads
        window = torch.from_numpy(dm.splits["train"][starts[:, None] + offsets].astype(np.int64))
        assert torch.equal(x, window[:, :-1]) and torch.equal(y, window[:, 1:])
    assert highest < n_train  # never a val position (those start at n_train)


def test_batches_shape_and_shift(dm):
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        tokens = loader.dataset.tokens
        starts, (x, y) = next(iter(loader.sampler)), next(iter(loader))
        assert x.shape == y.shape == (B, T)
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(y[:, :-1], x[:, 1:])
        assert y[:, -1].tolist() == tokens[np.asarray(starts) + T].tolist()  # the next token
        assert x[:, 0].tolist() == tokens[np.asarray(starts)].tolist()


def test_val_windows_cover_val_split_once(dm):
    loader = dm.val_dataloader()
    starts = [s for batch in loader.sampler for s in batch]
    n_val = len(dm.splits["val"])
    assert starts == list(range(0, n_val - T, T))
    assert len(starts) == (n_val - 1) // T  # what is left over is shorter than one window
    xs, ys = zip(*loader, strict=True)
    x = torch.cat(xs)
    y = torch.cat(ys)
    assert len(x) == len(starts)
    assert x.flatten().tolist() == dm.splits["val"][: len(starts) * T].tolist()
    assert y.flatten().tolist() == dm.splits["val"][1 : len(starts) * T + 1].tolist()
    assert dm.evaluated("val") == n_val  # the default budget keeps the book's whole val split


def test_val_loader_is_deterministic(dm):
    first = list(dm.val_dataloader())
    second = list(dm.val_dataloader())
    assert len(first) == len(second) > 1
    for (x1, y1), (x2, y2) in zip(first, second, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_test_fraction_zero_keeps_the_articles_split(dm, corpus_path, tmp_path):
    """data.test_fraction=0 (the default): the same 90/10 split to the token, no test split."""
    zero = make_dm(tmp_path, corpus_path, sha256=SALES_TEXTBOOK_SHA256, test_fraction=0.0)
    zero.setup("fit")
    assert np.array_equal(zero.splits["train"], dm.splits["train"])
    assert np.array_equal(zero.splits["val"], dm.splits["val"])
    assert len(zero.splits["test"]) == 0
    with pytest.raises(ConfigError, match="data.test_fraction=0"):
        zero.test_dataloader()


def test_test_split_comes_after_train_and_val(dm, corpus_path, tmp_path):
    held = make_dm(tmp_path, corpus_path, sha256=SALES_TEXTBOOK_SHA256, test_fraction=0.1)
    held.setup("fit")
    everything = np.concatenate([dm.splits["train"], dm.splits["val"]])
    n = len(everything)
    assert len(held.splits["train"]) == int(n * 0.8)
    assert len(held.splits["test"]) == int(n * 0.1)
    assert np.array_equal(
        np.concatenate([held.splits["train"], held.splits["val"], held.splits["test"]]), everything
    )
    assert np.array_equal(held.splits["test"], everything[n - int(n * 0.1) :])  # the last tokens
    # the test loader walks every non-overlapping window of the test split once, in order
    xs, ys = zip(*held.test_dataloader(), strict=True)
    x = torch.cat(xs)
    y = torch.cat(ys)
    assert len(x) == (len(held.splits["test"]) - 1) // T
    assert x.flatten().tolist() == held.splits["test"][: len(x) * T].tolist()
    assert y.flatten().tolist() == held.splits["test"][1 : len(x) * T + 1].tolist()


def test_validation_covers_a_fixed_prefix_of_its_split(corpus_path, tmp_path):
    """data.splits["val"] / data.splits["test"]: every window of the first N tokens, the same each
    time, exact over them; too few for one window is refused."""
    capped = make_dm(tmp_path, corpus_path, val_tokens=1000, test_fraction=0.1, test_tokens=500)
    capped.setup("fit")
    for split, budget in (("val", 1000), ("test", 500)):
        loader = capped.val_dataloader() if split == "val" else capped.test_dataloader()
        tokens = capped.splits["val"] if split == "val" else capped.splits["test"]
        assert capped.evaluated(split) == budget < len(tokens)
        x = torch.cat([x for x, _ in loader])
        assert len(x) == (budget - 1) // T  # every whole window of the prefix
        assert x.flatten().tolist() == tokens[: len(x) * T].tolist()
        again = torch.cat([x for x, _ in loader])
        assert torch.equal(x, again)
    with pytest.raises(ConfigError, match="data.val_tokens=10: fewer than one window"):
        make_dm(tmp_path, corpus_path, val_tokens=10).setup("fit")
    with pytest.raises(ConfigError, match="data.test_tokens=0: it must be positive or null"):
        make_dm(tmp_path, corpus_path, test_tokens=0)


@pytest.mark.parametrize("test_fraction, val_fraction", [(-0.1, 0.1), (1.0, 0.1), (0.5, 0.6)])
def test_bad_test_fraction(tmp_path, corpus_path, test_fraction, val_fraction):
    with pytest.raises(ConfigError, match=rf"data.test_fraction={test_fraction}") as err:
        make_dm(tmp_path, corpus_path, test_fraction=test_fraction, val_fraction=val_fraction)
    assert "data.val_fraction" in str(err.value)
    assert not (tmp_path / "cache").exists()  # refused before any data work


# ------------------------------------------------------------------ train sampler
def draws(n: int = 5, **kw) -> list[list[int]]:
    args = dict(num_starts=10_000, batch_size=8, seed=0)
    args.update(kw)
    return list(itertools.islice(RandomWindowSampler(**args), n))


def test_sampler_seeded():
    assert draws(seed=1) == draws(seed=1)
    assert draws(seed=1) != draws(seed=2)
    assert len(draws()) == 5 and all(len(b) == 8 for b in draws())


def test_sampler_ranks_draw_different_windows():
    rank0 = draws(rank=0, world_size=2)
    rank1 = draws(rank=1, world_size=2)
    assert rank0 == draws(rank=0, world_size=2)
    assert rank0 != rank1
    assert not set(map(tuple, rank0)) & set(map(tuple, rank1))


def test_sampler_continues_where_a_run_stopped():
    """Batch i depends on i alone: starting at batch 7 gives batches 7, 8, ... of a fresh start."""
    assert draws(5, start=7) == draws(12)[7:]


def test_sampler_bounds_and_repeat():
    batches = draws(20, num_starts=7, batch_size=16, seed=3)
    assert {s for batch in batches for s in batch} == set(
        range(7)
    )  # every start reachable, none out
    repeated = draws(6, num_starts=10_000, repeat=2)
    assert repeated[:2] == repeated[2:4] == repeated[4:] == draws(2)


# ------------------------------------------------------------------ download
@pytest.fixture
def mirror(corpus_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # a proxy must not get in between
    server = LocalServer(files={"/mirror/sales_textbook.txt": corpus_path.read_bytes()})
    yield server
    server.close()


def test_download_saves_and_verifies(mirror, tmp_path, corpus_path):
    url = mirror.url("/mirror/sales_textbook.txt")
    data_dir = tmp_path / "fresh" / "data"  # created on demand
    got = resolve_corpus(url, None, SALES_TEXTBOOK_SHA256, data_dir, timeout=10)
    assert got == data_dir / "sha256" / SALES_TEXTBOOK_SHA256 / "sales_textbook.txt"  # its own
    assert sha256_of(got) == SALES_TEXTBOOK_SHA256
    assert got.read_bytes() == corpus_path.read_bytes()
    assert [p.relative_to(data_dir) for p in data_dir.rglob("*") if p.is_file()] == [
        got.relative_to(data_dir)
    ]  # no temporary file left
    assert mirror.hits == ["/mirror/sales_textbook.txt"]


def test_present_file_is_not_fetched_again(mirror, tmp_path, corpus_path):
    url = mirror.url("/mirror/sales_textbook.txt")
    target = resolve_corpus(url, None, SALES_TEXTBOOK_SHA256, tmp_path, timeout=10)
    mtime = target.stat().st_mtime_ns
    assert resolve_corpus(url, None, SALES_TEXTBOOK_SHA256, tmp_path, timeout=10) == target
    assert mirror.hits.count("/mirror/sales_textbook.txt") == 1
    assert target.stat().st_mtime_ns == mtime
    placed = tmp_path / "sales_textbook.txt"  # put there by hand: used when it is the corpus
    placed.write_bytes(corpus_path.read_bytes())
    assert resolve_corpus(url, None, SALES_TEXTBOOK_SHA256, tmp_path, timeout=10) == placed


def test_a_download_never_replaces_a_file_another_run_reads(mirror, tmp_path, corpus_path):
    """A config (planted or not) naming another content for the same file name downloads it
    under a name of its own: the book another run reads stays as it is."""
    placed = tmp_path / "sales_textbook.txt"
    placed.write_bytes(corpus_path.read_bytes())
    other = b"not the book " * 100
    mirror.files["/evil/sales_textbook.txt"] = other
    other_sha = hashlib.sha256(other).hexdigest()
    got = resolve_corpus(mirror.url("/evil/sales_textbook.txt"), None, other_sha, tmp_path)
    assert got == tmp_path / "sha256" / other_sha / "sales_textbook.txt" != placed
    assert got.read_bytes() == other and placed.read_bytes() == corpus_path.read_bytes()
    assert resolve_corpus(mirror.url("/mirror/sales_textbook.txt"), None, None, tmp_path) == placed


def test_datamodule_downloads_through_mirror(mirror, tmp_path):
    module = GPTDataModule(
        url=mirror.url("/mirror/sales_textbook.txt"),
        path=None,
        sha256=SALES_TEXTBOOK_SHA256,
        data_dir=str(tmp_path / "data"),
        cache_dir=str(tmp_path / "cache"),
        batch_size=B,
        context_length=T,
    )
    module.setup("fit")
    assert module.tokenizer.vocab_size == 3771
    assert (tmp_path / "data" / "sha256" / SALES_TEXTBOOK_SHA256 / "sales_textbook.txt").is_file()
    (store,) = (tmp_path / "cache").iterdir()
    assert sorted(p.name for p in store.iterdir()) == ["meta.json", "tokens.bin"]


def test_every_redirect_hop_is_checked_and_an_untrusted_one_saves_nothing(
    mirror, tmp_path, corpus_path
):
    """A redirect to plain http on another host is refused before it is followed; a redirect
    to another path of the same loopback mirror is fine."""
    mirror.redirects["/evil/sales_textbook.txt"] = "http://example.invalid/sales_textbook.txt"
    mirror.redirects["/moved/sales_textbook.txt"] = mirror.url("/mirror/sales_textbook.txt")
    with pytest.raises(ConfigError, match="example.invalid.*redirect from"):
        resolve_corpus(
            mirror.url("/evil/sales_textbook.txt"), None, SALES_TEXTBOOK_SHA256, tmp_path / "bad"
        )
    assert not [p for p in (tmp_path / "bad").rglob("*") if p.is_file()]  # nothing saved
    moved = mirror.url("/moved/sales_textbook.txt")
    assert (
        resolve_corpus(moved, None, SALES_TEXTBOOK_SHA256, tmp_path / "ok").read_bytes()
        == corpus_path.read_bytes()
    )


def test_a_killed_download_leaves_nothing_after_the_next_start(mirror, tmp_path):
    """A download killed mid-way leaves .download.<host>.<pid>.tmp behind (its pid gone); the
    next start removes it. The file of a live download (another running process) is left alone."""
    data_dir = tmp_path / "data" / "sha256"  # where downloads are made
    data_dir.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    (data_dir / f".download.{host}.{dead.pid}.tmp").write_bytes(b"half a file")
    running = subprocess.Popen(["sleep", "60"])
    live = data_dir / f".download.{host}.{running.pid}.tmp"
    live.write_bytes(b"in progress")
    try:
        resolve_corpus(
            mirror.url("/mirror/sales_textbook.txt"), None, SALES_TEXTBOOK_SHA256, data_dir.parent
        )
    finally:
        running.kill()
        running.wait()
    assert sorted(p.name for p in data_dir.iterdir()) == [live.name, SALES_TEXTBOOK_SHA256]


def test_download_wrong_sha256_leaves_nothing(mirror, tmp_path):
    url = mirror.url("/mirror/sales_textbook.txt")
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ConfigError, match="data.sha256") as err:
        resolve_corpus(url, None, wrong, tmp_path / "data", timeout=10)
    assert url in str(err.value) and SALES_TEXTBOOK_SHA256 in str(err.value)
    assert mirror.hits == ["/mirror/sales_textbook.txt"]
    assert not [
        p for p in (tmp_path / "data").rglob("*") if p.is_file()
    ]  # no file, no temporary one


def test_download_without_server(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with socket.socket() as s:  # a port nobody listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/sales_textbook.txt"
    target = tmp_path / "data" / "sales_textbook.txt"
    with pytest.raises(ConfigError) as err:
        resolve_corpus(url, None, SALES_TEXTBOOK_SHA256, tmp_path / "data", timeout=5)
    message = str(err.value)
    assert url in message and f"place the file as {target}" in message and "data.path" in message
    assert not [p for p in (tmp_path / "data").rglob("*") if p.is_file()]


def test_plain_http_to_other_hosts_is_refused(tmp_path):
    for url in (
        "http://example.com/sales_textbook.txt",
        "http://10.1.2.3/c.txt",
        "ftp://127.0.0.1/c",
    ):
        with pytest.raises(ConfigError, match="data.url") as err:
            check_url(url)
        assert url in str(err.value)
    folder = tmp_path / "data" / "sha256"
    with pytest.raises(ConfigError, match="not an https"):
        download("http://example.com/c.txt", folder, "c.txt", None, timeout=0.001)
    assert not folder.exists()  # refused before creating anything or connecting
    for url in ("https://example.com/c.txt", "http://127.0.0.1:8000/c.txt", "http://localhost/c"):
        check_url(url)  # allowed: returns without raising


def test_data_dir_from_env_is_not_written(corpus_path, tmp_path, monkeypatch):
    """data.path on the read-only shared mount, run from another directory: nothing is written."""
    monkeypatch.chdir(tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in corpus_path.parent.iterdir()}
    module = make_dm(
        tmp_path, Path(os.environ.get("GPTLAB_DATA_DIR", corpus_path.parent)) / "sales_textbook.txt"
    )
    module.setup("fit")
    assert {p.name: p.stat().st_mtime_ns for p in corpus_path.parent.iterdir()} == before
    assert list((tmp_path / "cache").glob("*/tokens.bin"))
