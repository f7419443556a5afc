"""Streaming tokenization and the token store, on real tiktoken, real files and a real process
killed with SIGKILL: many-piece encoding equals encode_ordinary of the whole text, documents are
joined with the end-of-text token, the store is uint16 for a compact vocabulary, a kill leaves
nothing the next start uses, and a data module pickles by the store's path."""

from __future__ import annotations

import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tiktoken

from gptlab.data import store as token_store
from gptlab.data import stream
from gptlab.data.corpus import remove_stale
from gptlab.data.datamodule import GPTDataModule
from gptlab.errors import ConfigError

ENCODINGS = ("cl100k_base", "o200k_base")  # the two cached offline
# fragments that meet at every kind of boundary: newline runs, CR LF, spaces before newlines,
# punctuation before a newline, digits, contractions, letters of other scripts, combining marks,
# tabs, emoji, a special token's text, lines that start with a letter, a digit, a space
FRAGMENTS = [
    "word", "Word", " word", "  spaced", "\n", "\n\n", "\r\n", " \n", "\t", ".", "!\n", "?",
    "'s", "'LL", " don't", "123", "4567890", " 42", "Ünïcödé", "Привет", " мир", "日本語",
    "中文", "e\u0301", "\u0301", "😀", " ", "   ", "<|endoftext|>", ",", ";\n", "\nA", "\n1",
    "\n ", "-", "(", ")", "\u00a0", "\u3000", "x/y", ".\n/", "ΑΒΓ", "ß", "ǅ",
]  # fmt: skip


def tricky_text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(FRAGMENTS) for _ in range(n))


def blocks(text: str, size: int) -> list[tuple[str, bool]]:
    """One document, given in blocks of `size` characters (cut anywhere, as a file is read)."""
    return [(text[i : i + size], i == 0) for i in range(0, len(text), size)]


def streamed(encoding, documents) -> np.ndarray:
    return np.concatenate(list(stream.encode_documents(encoding, documents)))


@pytest.fixture
def small_tasks(monkeypatch):
    """Pieces of about 2,000 characters: many cuts even in a short text."""
    monkeypatch.setattr(stream, "TASK_CHARS", 2000)


@pytest.mark.parametrize("name", ENCODINGS)
def test_many_pieces_encode_as_the_whole_book(name, corpus_text, small_tasks):
    encoding = tiktoken.get_encoding(name)
    pieces = list(stream.pieces(blocks(corpus_text, 997)))
    assert len(pieces) > 100  # really cut, and only where the pre-tokenizer splits
    assert "".join(p for p, _ in pieces) == corpus_text
    whole = encoding.encode_ordinary(corpus_text)
    assert streamed(encoding, blocks(corpus_text, 997)).tolist() == whole


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("seed", range(4))
def test_many_pieces_encode_as_the_whole_of_tricky_text(name, seed, small_tasks):
    text = tricky_text(6000, seed)
    encoding = tiktoken.get_encoding(name)
    assert len(list(stream.pieces(blocks(text, 1009)))) > 5
    assert streamed(encoding, blocks(text, 1009)).tolist() == encoding.encode_ordinary(text)


def test_a_cut_is_never_made_where_the_pre_tokenizer_joins():
    """Each refused boundary is one where cutting would change the ids (with some encoding)."""
    for text in ("a\n\nB", "a \nB", "a\r\nB", "a\n1", "a\n B", "1 2", "a .b"):
        assert stream.last_cut(text) == 0, text
    assert stream.last_cut("ab.\nCd") == 4 and stream.last_cut("ab cd") == 2


def test_documents_are_joined_with_end_of_text(small_tasks):
    encoding = tiktoken.get_encoding("cl100k_base")
    docs = ["First document.\n", "Second one", "", "Third"]
    got = streamed(encoding, [(d, True) for d in docs]).tolist()
    eot = [encoding.eot_token]
    expected = [*encoding.encode_ordinary(docs[0]), *eot, *encoding.encode_ordinary(docs[1])]
    expected += [*eot, *eot, *encoding.encode_ordinary(docs[3])]  # the empty one: eot, nothing
    assert got == expected


def test_special_token_text_is_plain_text():
    encoding = tiktoken.get_encoding("cl100k_base")
    ids = streamed(encoding, [("a <|endoftext|> b", True)])
    assert encoding.eot_token not in ids.tolist()


# ------------------------------------------------------------------ the store
def write(tmp_path: Path, ids: list[np.ndarray], vocab, name: str = "s") -> token_store.TokenStore:
    encoding = tiktoken.get_encoding("cl100k_base")
    folder = tmp_path / name
    token_store.write_store(folder, iter(ids), encoding, vocab, {"sources": []})
    return token_store.open_store(folder)


def test_compact_store_is_uint16_and_maps_back(tmp_path, corpus_text):
    encoding = tiktoken.get_encoding("cl100k_base")
    ids = np.asarray(encoding.encode_ordinary(corpus_text), dtype=np.uint32)
    store = write(tmp_path, np.array_split(ids, 7), "compact")
    assert store.meta["dtype"] == "uint16" and store.meta["count"] == len(ids)
    assert (tmp_path / "s" / "tokens.bin").stat().st_size == 2 * len(ids)
    assert store.meta["vocab"] == np.unique(ids).tolist()
    assert np.array_equal(np.asarray(store.meta["vocab"])[store.tokens], ids)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["meta.json", "tokens.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporary folder left


def test_full_vocabulary_store_is_uint32_and_a_given_vocabulary_refuses_unseen_ids(tmp_path):
    encoding = tiktoken.get_encoding("cl100k_base")
    ids = np.asarray(encoding.encode_ordinary("Clar sells. Sales!"), dtype=np.uint32)
    full = write(tmp_path, [ids], "full", "full")
    assert full.meta["dtype"] == "uint32" and full.meta["vocab"] is None
    assert np.array_equal(full.tokens, ids)
    given = sorted(set(ids.tolist()))
    assert np.array_equal(np.asarray(given)[write(tmp_path, [ids], given, "v").tokens], ids)
    with pytest.raises(ConfigError, match="compact vocabulary has never seen"):
        write(tmp_path, [ids], given[:-1], "short")
    assert not (tmp_path / "short").exists() and not list(tmp_path.glob(".*"))


def test_a_damaged_store_is_not_used(tmp_path):
    store = write(tmp_path, [np.arange(100, dtype=np.uint32)], "compact")
    tokens = store.folder / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    assert token_store.open_store(store.folder) is None
    (store.folder / "meta.json").write_text("{not json")
    assert token_store.open_store(store.folder) is None


KILLED = """
import sys
from gptlab.data.datamodule import GPTDataModule
GPTDataModule(path=sys.argv[1], sha256=None, url=None, cache_dir=sys.argv[2]).prepare_data()
"""


def test_a_kill_mid_tokenizing_leaves_nothing_the_next_start_uses(tmp_path, corpus_text):
    """SIGKILL while the raw ids are being written; the next start removes the dead process's
    folder and builds a store of exactly the size of an uninterrupted one."""
    text = tmp_path / "big.txt"
    text.write_text(corpus_text * 20, encoding="utf-8")  # 9 MB: a second or two to tokenize
    cache = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(text), str(cache)])
    deadline = time.monotonic() + 120
    raw = []
    while not raw and child.poll() is None and time.monotonic() < deadline:
        raw = [p for p in cache.glob(".*.tmp/raw.uint32") if p.stat().st_size > 1 << 20]
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert raw, "the child finished (or never started) before it could be killed"
    assert [p.name for p in cache.iterdir()] == [raw[0].parent.name]  # only its temporary folder
    again = GPTDataModule(path=str(text), sha256=None, url=None, cache_dir=str(cache))
    again.setup("fit")
    (folder,) = cache.iterdir()  # the store, and nothing else
    count = len(tiktoken.get_encoding("cl100k_base").encode_ordinary(corpus_text * 20))
    assert (folder / "tokens.bin").stat().st_size == 2 * count
    assert len(again.splits["train"]) + len(again.splits["val"]) == count


def test_a_live_tokenization_is_left_alone(tmp_path):
    """A temporary folder whose process still runs (another job tokenizing) is kept."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        host = socket.gethostname()
        live = tmp_path / f".x-cl100k_base-compact.{host}.{sleeper.pid}.tmp"
        live.mkdir()
        other_host = tmp_path / ".y-cl100k_base-compact.elsewhere.1.tmp"
        other_host.mkdir()
        remove_stale(tmp_path)
        assert live.is_dir() and other_host.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()
    remove_stale(tmp_path)
    assert not live.exists() and other_host.is_dir()  # another host's is never guessed at


def test_a_data_module_pickles_by_the_stores_path(tmp_path, corpus_path):
    module = GPTDataModule(path=str(corpus_path), url=None, cache_dir=str(tmp_path))
    module.setup("fit")
    data = pickle.dumps(module)
    assert len(data) < 10_000 < len(module.splits["train"])  # no token array travels
    copy = pickle.loads(data)
    assert copy.tokenizer is None and copy.splits == {}
    copy.setup("fit")  # maps the same store, no tokenizing, no hashing
    assert isinstance(copy.splits["train"], np.memmap)
    assert np.array_equal(copy.splits["train"], module.splits["train"])
    assert copy.tokenizer.vocab_size == module.tokenizer.vocab_size == 3771
