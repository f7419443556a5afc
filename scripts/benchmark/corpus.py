"""Row 7: a corpus of any size. The book repeated to N MB of text, then in this order:

- bare tiktoken: bare_tokenize.py reads the text and batch-encodes it on every core;
- cold: `gptlab-train data=text_file data.path=<text>` with an empty token store folder (it
  hashes, tokenizes and writes the store, then trains a few steps);
- warm: the same command again (it hashes, maps the store, trains the same steps).

Tokenization time is cold minus warm (the issue's definition; the cold run's own log span from
"Tokenizing" to "Wrote token store" comes with it); it is compared with bare tiktoken measured in
the same run, so a burst of load on a shared machine is seen by both. Each gptlab-train process's
peak resident memory, the store's bytes per byte of text, and the warm run's training tokens/s
(against the default run's on the book) come with it.

--quick starts no gptlab-train process of its own: its default run (row 5) tokenizes the book into
an empty store folder, and that run is the cold one (no warm run: the log span is the time)."""

from __future__ import annotations

import json
import math
import shutil
import sys
from datetime import datetime
from pathlib import Path

from .processes import run_child
from .runs import Setup, train_run

BARE_TOKENIZE = Path(__file__).resolve().parent / "bare_tokenize.py"
FULL_MB = (100, 400)
QUICK_CACHE = "corpus/cache-quick"  # --quick: the default run's store folder, empty at the start
STAMP = "%Y-%m-%d %H:%M:%S,%f"  # Hydra's log time stamps


def make_text(book: Path, folder: Path, megabytes: float) -> Path:
    """The book repeated to at least `megabytes` MB (1e6 bytes), made once per size."""
    path = folder / f"text-{megabytes:g}MB.txt"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    text = book.read_bytes()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for _ in range(math.ceil(megabytes * 1e6 / len(text))):
            f.write(text)
    tmp.replace(path)
    return path


def bare_tokenize(setup: Setup, text: Path, name: str) -> dict:
    out = setup.workdir / f"{name}.json"
    run_child(
        [sys.executable, str(BARE_TOKENIZE), str(text), "--out", str(out)], setup.workdir, name
    )
    return json.loads(out.read_text())


def store_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.glob("*/tokens.bin"))


def log_span(run_dir: Path) -> float:
    """Seconds from the run's "Tokenizing" log line to its "Wrote token store" one."""
    times = {}
    for line in (run_dir / "train.log").read_text(errors="replace").splitlines():
        for mark in ("] - Tokenizing ", "] - Wrote token store "):
            if mark in line:
                times[mark] = datetime.strptime(line[1:24], STAMP).timestamp()
    return times["] - Wrote token store "] - times["] - Tokenizing "]


def measured(text: Path, cache: Path, bare: dict, cold: dict, warm: dict | None) -> dict:
    """Row 7's numbers for one size."""
    text_bytes = text.stat().st_size
    span = log_span(Path(cold["run_dir"]))
    tokenize_s = (
        span if warm is None else cold["command_wall_seconds"] - warm["command_wall_seconds"]
    )
    runs = [cold] if warm is None else [cold, warm]
    return {
        "megabytes": text_bytes / 1e6,
        "text": str(text),
        "bare": bare,
        "cold": cold,
        "warm": warm or cold,
        "tokenize_s": tokenize_s,
        "tokenize_log_span_s": span,
        "tokenize_mb_per_s": text_bytes / 1e6 / tokenize_s if tokenize_s > 0 else math.nan,
        "tokenize_vs_bare": tokenize_s / bare["seconds"] if tokenize_s > 0 else math.nan,
        "store_bytes_per_text_byte": store_bytes(cache) / text_bytes,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
    }


def corpus_size(setup: Setup, book: Path, megabytes: float, steps: int) -> dict:
    """Bare tiktoken, a cold and a warm gptlab-train on the book repeated to `megabytes` MB."""
    folder = setup.workdir / "corpus"
    text = make_text(book, folder, megabytes)
    cache = folder / f"cache-{megabytes:g}MB"
    shutil.rmtree(cache, ignore_errors=True)
    overrides = [
        "data=text_file",
        f"data.path={text}",
        f"data.cache_dir={cache}",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        "logger=none",
        "callbacks=none",
    ]
    tag = f"{megabytes:g}MB"
    bare = bare_tokenize(setup, text, f"bare-tokenize-{tag}")
    cold = train_run(setup, f"corpus-cold-{tag}", overrides)
    warm = train_run(setup, f"corpus-warm-{tag}", overrides)
    return measured(text, cache, bare, cold, warm)


def corpus_stage(setup: Setup, book: Path, sizes: tuple[float, ...], steps: int) -> dict:
    """Every size, smallest first; the largest is the one the targets judge."""
    return {"sizes": [corpus_size(setup, book, mb, steps) for mb in sizes]}


def quick_stage(setup: Setup, book: Path, default_run: dict) -> dict:
    """--quick: the book itself, the default run (which tokenized it) as the cold run."""
    bare = bare_tokenize(setup, book, "bare-tokenize-book")
    return {"sizes": [measured(book, setup.workdir / QUICK_CACHE, bare, default_run, None)]}
