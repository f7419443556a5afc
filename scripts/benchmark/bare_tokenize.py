"""Bare tiktoken on all cores: the other side of the benchmark's tokenization row, in a process of
its own. It reads a text file in blocks of lines and encodes them with tiktoken's own batch
encoding (`encode_ordinary_batch`, a thread per usable core), as a script of a few lines would,
and writes its time as JSON:

    python scripts/benchmark/bare_tokenize.py big.txt --encoding cl100k_base --out bare.json

The time covers reading and encoding, not loading the encoding (gptlab's cold and warm starts
both load it, so their difference leaves it out too).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import tiktoken

BLOCK = 1 << 20  # characters of whole lines per encoded piece


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("path", type=Path)
    p.add_argument("--encoding", default="cl100k_base")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    encoding = tiktoken.get_encoding(args.encoding)
    threads = len(os.sched_getaffinity(0))
    start = time.perf_counter()
    tokens = 0
    batch = []
    with open(args.path, encoding="utf-8", newline="") as f:
        for piece in iter(lambda: "".join(f.readlines(BLOCK)), ""):
            batch.append(piece)
            if len(batch) == 2 * threads:
                tokens += sum(map(len, encoding.encode_ordinary_batch(batch, num_threads=threads)))
                batch = []
    tokens += sum(map(len, encoding.encode_ordinary_batch(batch, num_threads=threads)))
    seconds = time.perf_counter() - start
    result = {
        "seconds": seconds,
        "tokens": tokens,
        "bytes": args.path.stat().st_size,
        "threads": threads,
        "api": "encode_ordinary_batch",
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
