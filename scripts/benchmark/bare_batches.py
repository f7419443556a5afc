"""The training batches of a finished gptlab-train run's data module, drawn with no model: the
bare side of the benchmark's mixing row (mixing.py), in a process of its own.

    python scripts/benchmark/bare_batches.py RUN_DIR --batches 20000 --out batches.json

Run it in the directory the run ran in: its token stores are found there (or through
GPTLAB_DATA_DIR / GPTLAB_CACHE_DIR), as gptlab-train finds them.
"""

from __future__ import annotations

import gptlab  # noqa: F401 - first, before torch loads: gptlab's process defaults

# isort: split
import argparse
import itertools
import json
import os
import time
from pathlib import Path

from omegaconf import OmegaConf

from gptlab.data.datamodule import GPTDataModule

DIRECTORIES = ("data_dir", "cache_dir", "seed")  # interpolations in the saved config


def data_module(run_dir: Path) -> GPTDataModule:
    """The run's data settings (a mixture's sources included), its directories as conf/paths."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    node = OmegaConf.to_container(cfg.data, resolve=False)
    settings = {k: v for k, v in node.items() if k != "_target_" and k not in DIRECTORIES}
    data_dir = os.environ.get("GPTLAB_DATA_DIR", "data")
    cache_dir = os.environ.get("GPTLAB_CACHE_DIR", "data/cache")
    return GPTDataModule(**settings, data_dir=data_dir, cache_dir=cache_dir, seed=cfg.seed)


def time_batches(datamodule: GPTDataModule, batches: int) -> dict:
    """Seconds per training batch: the sampler's offsets and the windows' gather, as a run
    draws them (its DataLoader, no workers)."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    loader = iter(datamodule.train_dataloader())
    next(loader)  # the loader's first batch starts its iterator
    start = time.perf_counter()
    for _ in itertools.islice(loader, batches):
        pass
    seconds = time.perf_counter() - start
    return {"batches": batches, "seconds": seconds, "seconds_per_batch": seconds / batches}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="A run's training batches, no model; JSON of s/batch.")
    p.add_argument("run_dir", type=Path, help="a finished gptlab-train run directory")
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = time_batches(data_module(args.run_dir), args.batches)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
