"""Documents -> tiktoken ids, streamed, on every core. Each document is cut only where tiktoken's
pre-tokenizer splits anyway (docs/data.md says where and why), so its pieces encode to exactly the
ids of the whole text; documents are joined with the end-of-text token. Tasks of about a megabyte
go to a thread pool: tiktoken releases the GIL."""

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm.auto import tqdm

TASK_CHARS = 1 << 20  # characters of text per encoding task


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def last_between(text: str, char: str, before) -> int:
    """The last i > 0 with text[i] == `char`, a letter after it and `before(text[i - 1])`, or 0."""
    i = text.rfind(char, 0, len(text) - 1)
    while i > 0:
        if text[i + 1].isalpha() and before(text[i - 1]):
            return i
        i = text.rfind(char, 0, i)
    return 0


def last_cut(text: str) -> int:
    """The last position where `text` may be cut: after a newline between a non-space and a letter,
    else before a space between two letters; 0 when there is none."""
    newline = last_between(text, "\n", lambda c: not c.isspace())
    return newline + 1 if newline else last_between(text, " ", str.isalpha)


def pieces(documents: Iterable[tuple[str, bool]]) -> Iterator[tuple[str, bool]]:
    """(piece, after_end_of_text): each document's blocks regrouped into pieces that end at a
    cut; after_end_of_text marks the first piece of every document but the first."""
    carry = None  # the text of the current document not yet given out
    joined = False  # an end-of-text token goes before `carry`
    started = False
    for text, new_document in documents:
        if new_document:
            if carry is not None:
                yield carry, joined
            carry, joined, started = text, started, True
        else:
            carry += text
        cut = last_cut(carry) if len(carry) >= TASK_CHARS else 0
        if cut:
            yield carry[:cut], joined
            carry, joined = carry[cut:], False
    if carry is not None:
        yield carry, joined


def tasks(documents: Iterable[tuple[str, bool]]) -> Iterator[list[tuple[str, bool]]]:
    """Pieces grouped into tasks of about TASK_CHARS characters."""
    task, size = [], 0
    for piece in pieces(documents):
        task.append(piece)
        size += len(piece[0])
        if size >= TASK_CHARS:
            yield task
            task, size = [], 0
    if task:
        yield task


def encode_task(encoding, task: list[tuple[str, bool]]) -> np.ndarray:
    """The ids of a task's pieces, an end-of-text token before each document but the first."""
    eot = np.array([encoding.eot_token], dtype=np.uint32)
    parts = []
    for text, joined in task:
        if joined:
            parts.append(eot)
        try:  # a buffer, not a list of ints: no Python object per token
            parts.append(encoding.encode_to_numpy(text, disallowed_special=()))
        except UnicodeEncodeError:  # a lone surrogate (JSON's \ud800): tiktoken replaces it
            parts.append(np.asarray(encoding.encode_ordinary(text), dtype=np.uint32))
    return np.concatenate(parts)


def text_bytes(task: list[tuple[str, bool]]) -> int:
    return sum(len(t) if t.isascii() else len(t.encode("utf-8", "replace")) for t, _ in task)


def submitted(pool, encoding, documents, ahead: int) -> Iterator[tuple]:
    """(future, text bytes) of each task, submitted `ahead` early: few in flight, memory flat."""
    pending = deque()
    for task in tasks(documents):
        pending.append((pool.submit(encode_task, encoding, task), text_bytes(task)))
        if len(pending) > ahead:
            yield pending.popleft()
    yield from pending


def encode_documents(
    encoding, documents: Iterable[tuple[str, bool]], total_bytes: int | None = None
) -> Iterator[np.ndarray]:
    """The documents' tiktoken ids (uint32), a task at a time, with a bar of MB/s and tokens."""
    threads = usable_cores()
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="Tokenizing", mininterval=1)
    tokens = 0
    with ThreadPoolExecutor(threads) as pool, bar:
        for future, size in submitted(pool, encoding, documents, 2 * threads):
            ids = future.result()
            tokens += len(ids)
            bar.update(size)
            bar.set_postfix_str(f"{tokens:,} tokens", refresh=False)
            yield ids
