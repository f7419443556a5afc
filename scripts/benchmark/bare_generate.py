"""gptlab's GPT generating with and without its KV cache: the generation row's measurement, in a
process of its own like every other side of the benchmark.

A freshly initialised model (generation's speed does not depend on the weights) with the default
model's settings, the book's compact vocabulary and the given sizes decodes greedily from a
random prompt, first with the cache, then without; both must give the same tokens. It writes
each batch size's new tokens per second (every row of the batch counted) as JSON:

    python scripts/benchmark/bare_generate.py --d-model 512 --num-blocks 8 --context-length 512 \
        --batch 1 8 --prompt 32 --new 256 --threads 2 --out generation.json
"""

from __future__ import annotations

import gptlab  # first, before torch loads: gptlab's process defaults, as in gptlab-generate

# isort: split
import argparse
import json
import time
from pathlib import Path

import torch

from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT

BOOK_VOCAB = 3771  # the default run's compact vocabulary of the book (docs/data.md)


def timed(model: GPT, prompt: torch.Tensor, new: int, use_cache: bool):
    """Greedy generation of `new` tokens: the ids [batch, prompt + new] and the seconds."""
    start = time.perf_counter()
    ids = model.generate(prompt, new, temperature=0, use_cache=use_cache)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return ids, time.perf_counter() - start


def measure(model: GPT, batch: int, prompt_length: int, new: int, device: str) -> dict:
    """One batch size: tokens/s with the cache and without, and whether the tokens agree."""
    seeded = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, BOOK_VOCAB, (batch, prompt_length), generator=seeded).to(device)
    timed(model, prompt, 4, True)  # the first calls' one-off costs, untimed
    cached, cache_s = timed(model, prompt, new, True)
    plain, plain_s = timed(model, prompt, new, False)
    return {
        "batch": batch,
        "cache_tokens_per_s": batch * new / cache_s,
        "no_cache_tokens_per_s": batch * new / plain_s,
        "speedup": plain_s / cache_s,
        "same_tokens": torch.equal(cached, plain),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="GPT.generate with and without the KV cache: JSON.")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--num-blocks", type=int, default=4)
    p.add_argument("--context-length", type=int, default=512)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sizes = {"d_model": args.d_model, "num_blocks": args.num_blocks}
    config = GPTConfig(vocab_size=BOOK_VOCAB, context_length=args.context_length, **sizes)
    model = GPT(config).to(args.device).eval()
    result = {
        "model": {**sizes, "context_length": args.context_length, "vocab_size": BOOK_VOCAB},
        "prompt": args.prompt,
        "new_tokens": args.new,
        "threads": torch.get_num_threads(),
        "process_defaults": gptlab.PROCESS_DEFAULTS,
        "batches": [measure(model, b, args.prompt, args.new, args.device) for b in args.batch],
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
