"""The reference script's loop (scripts/reference_loop.py) in a process of its own, as a user
runs the seed article's script: plain python, the user's environment, its own tokenization."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .processes import run_child
from .runs import Setup

REFERENCE_LOOP = Path(__file__).resolve().parents[1] / "reference_loop.py"
CORPUS_NAME = "sales_textbook.txt"


def default_corpus(workdir: Path) -> Path:
    """Where gptlab-train, run in `workdir`, finds the corpus (conf/paths: data_dir)."""
    return Path(os.environ.get("GPTLAB_DATA_DIR", workdir / "data")) / CORPUS_NAME


def reference_command(corpus: Path, steps: int, setup: Setup, options: dict, out: Path) -> list:
    """`python scripts/reference_loop.py corpus --steps ...`."""
    command = [sys.executable, str(REFERENCE_LOOP), str(corpus), "--steps", str(steps)]
    command += ["--threads", str(setup.threads), "--device", setup.device, "--out", str(out)]
    if options.get("eval_iters"):
        command += ["--eval-iters", str(options["eval_iters"])]
    if options.get("no_eval"):
        command.append("--no-eval")
    return command


def reference_rates(result: dict) -> dict:
    """Steps/s of the loop's JSON: training steps only, and with its estimate_loss."""
    settings = result["settings"]
    evaluated = result["eval_seconds"] > 0
    return {
        "steps": result["steps"],
        "train_steps_per_s": result["steps"] / result["train_seconds"],
        "steps_per_s_incl_eval": result["steps"] / result["wall_seconds"],
        "train_seconds": result["train_seconds"],
        "eval_seconds": result["eval_seconds"],
        "wall_seconds": result["wall_seconds"],
        "final_val_estimate": result["final_val_estimate"],
        "vocab_size": result["vocab_size"],
        "eval": (
            f"every {settings['eval_interval']} steps, {settings['eval_iters']} batches each "
            "of train and val"
            if evaluated
            else "none"
        ),
    }


def reference_run(
    setup: Setup, corpus: Path, steps: int, name: str, options: dict | None = None
) -> dict:
    """One run of the reference loop; its rates."""
    out = setup.workdir / f"{name}.json"
    command = reference_command(corpus, steps, setup, options or {}, out)
    run_child(command, setup.workdir, name)
    return reference_rates(json.loads(out.read_text()))
