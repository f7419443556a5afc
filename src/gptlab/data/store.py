"""The token store: a corpus tokenized once, as a flat file of model ids that training maps (its
layout, key and compact vocabulary: docs/data.md). It is written in a temporary folder
`.<name>.<host>.<pid>.tmp` and renamed into place whole: a kill leaves only that folder, which the
next start on this host removes once its process is gone."""

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptlab import files, reader
from gptlab.data.corpus import temporary
from gptlab.data.tokenizer import check_state, unseen_tokens_error
from gptlab.errors import ConfigError

log = logging.getLogger(__name__)

VERSION = 1
TOKENS = "tokens.bin"
META = "meta.json"
RAW = "raw.uint32"  # the tiktoken ids while tokenizing, in the temporary folder only
MAP_BLOCK = 1 << 22  # ids mapped at a time
UINT16_IDS = 1 << 16


@dataclass
class TokenStore:
    folder: Path
    meta: dict
    tokens: np.ndarray  # [count] model ids, an np.memmap of tokens.bin


def store_key(identity: list[dict], encoding: str, vocab_mode: str) -> str:
    """The sources' content (not where the files lie), the encoding and the vocabulary mode."""
    content = [{k: v for k, v in source.items() if k != "path"} for source in identity]
    material = {"version": VERSION, "sources": content, "encoding": encoding, "vocab": vocab_mode}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def store_folder(cache_dir: Path, key: str, encoding: str, vocab_mode: str) -> Path:
    return Path(cache_dir) / f"{key[:16]}-{encoding}-{vocab_mode}"


def open_store(folder: Path) -> TokenStore | None:
    """The store in `folder`, mapped read-only; None when it is missing or damaged."""
    meta = reader.read_json(folder / META)  # a cache's: anyone's, bounded
    tokens = folder / TOKENS
    try:
        dtype = np.dtype(meta["dtype"])
        count = int(meta["count"])
        if meta["version"] != VERSION or dtype not in (np.uint16, np.uint32) or count < 1:
            raise ValueError("an unknown layout")
        problem = check_state({"encoding": meta["encoding"], "vocab": meta["vocab"]})
        if problem:
            raise ValueError(problem)
        if tokens.stat().st_size != count * dtype.itemsize:
            raise ValueError(f"{TOKENS} holds {tokens.stat().st_size} bytes, not {count} ids")
        mapped = np.memmap(tokens, dtype=dtype, mode="r", shape=(count,))
    except (TypeError, KeyError, ValueError, OSError) as e:
        if folder.exists():
            log.warning("Token store %s is damaged (%s); rebuilding it", folder, e)
        return None
    return TokenStore(folder, meta, mapped)


def write_store(
    folder: Path, encoded: Iterable[np.ndarray], encoding, vocab: str | list[int], meta: dict
) -> None:
    """Write `encoded` (tiktoken ids) as a store; `vocab`: compact, full, or a checkpoint's ids."""
    tmp = temporary(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise ConfigError(
            f"paths.cache_dir: cannot create the token store in '{folder.parent}' "
            f"({e.strerror}). Point paths.cache_dir (or GPTLAB_CACHE_DIR) at a writable folder."
        ) from e
    try:
        n_vocab = encoding.max_token_value + 1
        counts = np.zeros(n_vocab, dtype=np.int64)
        with open(tmp / RAW, "wb") as raw:
            for ids in encoded:
                raw.write(memoryview(ids))
                counts += np.bincount(ids, minlength=n_vocab)
        kept, table = vocabulary(counts, vocab, encoding)
        size = n_vocab if kept is None else len(kept)
        dtype = np.dtype(np.uint16 if size <= UINT16_IDS else np.uint32)
        remap(tmp / RAW, tmp / TOKENS, table, dtype)
        count = int(counts.sum())
        meta = {**meta, "version": VERSION, "encoding": encoding.name, "count": count}
        meta.update(dtype=dtype.name, vocab=kept)
        files.write_text(tmp / META, files.as_json(meta))
        publish(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def vocabulary(counts: np.ndarray, vocab, encoding) -> tuple[list[int] | None, np.ndarray | None]:
    """(the store's vocabulary, None: tiktoken's; a tiktoken id -> model id table, None: same)."""
    if vocab == "full":
        return None, None
    kept = np.flatnonzero(counts) if vocab == "compact" else np.asarray(vocab, dtype=np.int64)
    table = np.full(len(counts), -1, dtype=np.int64)
    table[kept[kept < len(counts)]] = np.flatnonzero(kept < len(counts))
    unseen = np.flatnonzero((counts > 0) & (table < 0))
    if len(unseen):
        raise unseen_tokens_error(encoding, unseen)
    return kept.tolist(), table


def remap(raw: Path, tokens: Path, table: np.ndarray | None, dtype: np.dtype) -> None:
    """tokens.bin: each raw id through `table`, a block at a time (memory stays flat)."""
    if table is None and dtype == np.uint32:  # tiktoken's ids as they are
        os.replace(raw, tokens)
        return
    lookup = (np.arange(UINT16_IDS) if table is None else table).astype(dtype)
    with open(raw, "rb") as source, open(tokens, "wb") as out:
        while len(block := np.fromfile(source, dtype=np.uint32, count=MAP_BLOCK)):
            out.write(memoryview(lookup[block]))
    raw.unlink()


def publish(tmp: Path, folder: Path) -> None:
    """Rename the store into place; a whole one there already (a quicker process) is kept."""
    if folder.exists():
        if open_store(folder) is not None:
            return
        old = temporary(folder.with_name(f"{folder.name}-old"))
        os.replace(folder, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:
        if open_store(folder) is None:  # not another process's whole store: a real error
            raise
