"""Row 8, generation: GPT.generate's new tokens/s with the KV cache and without (bare_generate.py,
a process per model), prompt 32, 256 new tokens, batch 1 and 8, on the default model and on
model.d_model=512 model.num_blocks=8; context_length 512, so the window holds the whole text.
Past context_length the window slides and is run afresh every step, cache or not: the larger
model at the default context_length 64, batch 1, shows what is left of the gain there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .processes import run_child
from .runs import Setup
from .table import row

BARE_GENERATE = Path(__file__).resolve().parent / "bare_generate.py"
MODELS = {  # row key: (d_model, num_blocks, context_length, batch sizes)
    "default": (128, 4, 512, (1, 8)),
    "d512x8": (512, 8, 512, (1, 8)),
    "d512x8_context64": (512, 8, 64, (1,)),
}
JUDGED = ("d512x8", 1)  # the target's model and batch size


def generation_stage(setup: Setup, quick: bool) -> dict:
    """Each model's measurements; --quick: prompt 8, 16 new tokens."""
    results = {}
    for key, (d_model, num_blocks, context_length, batches) in MODELS.items():
        out = setup.workdir / f"generation-{key}.json"
        command = [sys.executable, str(BARE_GENERATE), "--d-model", str(d_model)]
        command += ["--num-blocks", str(num_blocks), "--context-length", str(context_length)]
        command += ["--batch", *map(str, batches), "--out", str(out)]
        command += ["--threads", str(setup.threads), "--device", setup.device]
        if quick:
            command += ["--prompt", "8", "--new", "16"]
        run_child(command, setup.workdir, f"generation-{key}")
        results[key] = json.loads(out.read_text()) | {"command": " ".join(command)}
    return results


def generation_rows(generation: dict | None) -> list[dict]:
    """Per model and batch size: tokens/s with the cache, without, and their ratio."""
    if not generation:
        return []
    rows = []
    for key, result in generation.items():
        size = result["model"]
        model = f"d_model {size['d_model']} x {size['num_blocks']} blocks"
        for b in result["batches"]:
            name = f"generation, {model}, context {size['context_length']}, batch {b['batch']}"
            tag = f"generation_{key}_batch{b['batch']}"
            judged = (key, b["batch"]) == JUDGED
            same = "same tokens" if b["same_tokens"] else "DIFFERENT tokens"
            rows += [
                row(
                    f"{tag}_cache_tokens_per_s",
                    f"{name}: KV cache",
                    b["cache_tokens_per_s"],
                    "tokens/s",
                ),
                row(
                    f"{tag}_no_cache_tokens_per_s",
                    f"{name}: no cache",
                    b["no_cache_tokens_per_s"],
                    "tokens/s",
                ),
                row(
                    "generation_cache_speedup" if judged else f"{tag}_speedup",
                    f"{name}: cache / no cache",
                    b["speedup"],
                    "x",
                    "generation_cache_speedup" if judged else None,
                    detail=f"prompt {result['prompt']}, {result['new_tokens']} new, greedy, {same}",
                ),
            ]
    return rows
