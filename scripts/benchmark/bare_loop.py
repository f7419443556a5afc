"""gptlab's GPT in a bare PyTorch loop, no Lightning: the bare side of the benchmark's
Lightning-overhead row, in a process of its own like the gptlab-train run it is compared with.

It trains the model a finished gptlab-train run trained (the hyperparameters in its last.ckpt),
with the same AdamW and the same batches (its data settings in .hydra/config.yaml), freshly
initialised, and writes its training steps/s as JSON:

    python scripts/benchmark/bare_loop.py RUN_DIR --steps 400 --threads 2 --out bare.json

Run it in the directory the gptlab-train run ran in: the token cache is found there (or through
GPTLAB_DATA_DIR / GPTLAB_CACHE_DIR), as gptlab-train finds it.
"""

from __future__ import annotations

import gptlab  # first, before torch loads: gptlab's process defaults, as in gptlab-train

# isort: split
import argparse
import json
import os
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from gptlab.data.datamodule import GPTDataModule
from gptlab.training.module import GPTModule, lr_factor

DATA_KEYS = (  # the data node's plain settings (the directories are interpolations)
    "url",
    "path",
    "sha256",
    "encoding",
    "compact_vocab",
    "val_fraction",
    "batch_size",
    "context_length",
    "repeat_batches",
)


def data_module(run_dir: Path) -> GPTDataModule:
    """The run's data settings, with the data and cache directories conf/paths gives them."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    settings = {key: cfg.data[key] for key in DATA_KEYS}
    data_dir = os.environ.get("GPTLAB_DATA_DIR", "data")
    cache_dir = os.environ.get("GPTLAB_CACHE_DIR", "data/cache")
    return GPTDataModule(**settings, data_dir=data_dir, cache_dir=cache_dir, seed=cfg.seed)


def trained_module(run_dir: Path) -> GPTModule:
    """A fresh GPTModule with the hyperparameters of the run's last.ckpt."""
    checkpoint = torch.load(
        run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    return GPTModule.fresh(checkpoint["hyper_parameters"])


def clip_value(run_dir: Path) -> float | None:
    return OmegaConf.load(run_dir / ".hydra" / "config.yaml").trainer.gradient_clip_val


def bare_loop(run_dir: Path, steps: int, device: str) -> dict:
    """Train `steps` steps: forward, loss, backward, clipping, AdamW, schedule."""
    datamodule = data_module(run_dir)
    datamodule.setup("fit")
    torch.manual_seed(datamodule.settings.seed)
    module = trained_module(run_dir).to(device).train()
    optimizer = module.build_optimizer()  # the AdamW gptlab-train uses at 32-bit precision
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, module.optim, steps)
    )
    clip = clip_value(run_dir)
    batches = iter(datamodule.train_dataloader())  # endless random windows
    start = time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        loss = module.loss((x.to(device), y.to(device)))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
        scheduler.step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {
        "steps": steps,
        "train_seconds": seconds,
        "train_steps_per_s": steps / seconds,
        "last_loss": float(loss.detach()),
        "process_defaults": gptlab.PROCESS_DEFAULTS,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="gptlab's GPT in a bare loop; JSON of its steps/s.")
    p.add_argument("run_dir", type=Path, help="a finished gptlab-train run directory")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = bare_loop(args.run_dir, args.steps, args.device)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
