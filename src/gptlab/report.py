"""What a run tells its user: the first screen, metrics.json, the loggers' results, the report.

`RunReport` works in the process that trains rank 0 (also a DDP process Lightning spawned), at
the end of `fit`, so every launch path writes metrics.json once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.tree import Tree

from gptlab.callbacks import RunStats
from gptlab.errors import ConfigError
from gptlab.loggers import log_results
from gptlab.model.gpt import GPT

log = logging.getLogger("gptlab.train")
GROUPS = ("data", "model", "optim", "trainer", "callbacks", "logger", "paths")
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def config_tree(cfg: DictConfig) -> Tree:
    """The composed config, one branch per group, as lightning-hydra-template prints it (keys
    left unset are not shown)."""
    tree = Tree("config", guide_style="dim")
    rest = {k: v for k, v in cfg.items() if k not in GROUPS}
    for name, node in [*((g, cfg[g]) for g in GROUPS if g in cfg), ("(top level)", rest)]:
        settings = {k: v for k, v in OmegaConf.to_container(OmegaConf.create(node), resolve=True).items()
                    if v is not None}  # unset keys (null) stay in .hydra/config.yaml
        tree.add(f"[bold]{name}[/bold]").add(OmegaConf.to_yaml(settings).rstrip() or "{}")
    return tree


def print_first_screen(cfg: DictConfig, model: GPT, output_dir: Path, multirun: bool) -> None:
    """Before training: the composed config (saved as config_tree.log), the model, the run dir.

    In a multirun a job prints only the model and its directory: the rest is the sweep's."""
    c = model.config
    model = (f"GPT: {model.num_params()['total']:,} parameters (d_model {c.d_model}, {c.num_heads} heads, "
             f"{c.num_blocks} blocks, context {c.context_length}, vocab {c.vocab_size})")
    if output_dir.is_dir():
        with open(output_dir / "config_tree.log", "w") as f:
            Console(file=f, width=110, color_system=None).print(config_tree(cfg))
    if multirun:
        log.info("%s\nRun directory: %s", model, output_dir)
        return
    Console(stderr=True, width=110).print(config_tree(cfg))
    log.info("%s\nRun directory: %s", model, output_dir)


class RunReport(L.Callback):
    """At the end of fit, on rank 0: metrics.json, results to every logger, a report."""

    def __init__(self, cfg: dict, output_dir: str, stats: RunStats, overrides: list[str]):
        self.cfg, self.output_dir, self.stats, self.overrides = cfg, Path(output_dir), stats, overrides

    def setup(self, trainer, pl_module, stage: str) -> None:
        """A DDP process that Lightning spawned starts without Hydra's logging: give it the same
        file and console, so the run's messages still reach train.log."""
        root = logging.getLogger()
        if root.handlers or not trainer.is_global_zero:
            return
        formatter = logging.Formatter(LOG_FORMAT)
        handlers = (logging.FileHandler(self.output_dir / "train.log"), logging.StreamHandler(sys.stderr))
        for handler in handlers:
            handler.setFormatter(formatter)
            root.addHandler(handler)
        root.setLevel(logging.INFO)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        metrics = self.metrics(trainer, pl_module)
        (self.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        log_results(trainer, OmegaConf.create(self.cfg), metrics, self.output_dir)
        log.info("\n".join(self.report(trainer, pl_module, metrics)))

    def metrics(self, trainer, pl_module) -> dict:
        final_loss = float(trainer.callback_metrics.get("val/loss", math.nan))
        final_bpb = float(trainer.callback_metrics.get("val/bpb", math.nan))
        best = pl_module.best_val_loss if math.isfinite(pl_module.best_val_loss) else final_loss
        device = trainer.strategy.root_device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        tokens = trainer.global_step * self.stats.tokens_per_step
        rate = tokens / self.stats.train_seconds if self.stats.train_seconds else 0.0
        mfu = self.stats.mfu(rate, pl_module, trainer.world_size)
        return {
            "best_val_loss": best,
            "final_val_loss": final_loss,
            "best_val_perplexity": math.exp(best) if math.isfinite(best) else math.inf,
            # bits per byte and nats per token differ by a constant factor over the same val text
            "best_val_bpb": best * final_bpb / final_loss if final_loss else math.nan,
            "final_val_bpb": final_bpb,
            "num_params": pl_module.model.num_params()["total"],
            "steps": trainer.global_step,
            "tokens_seen": tokens,
            "wall_seconds": round(self.stats.wall_seconds, 3),
            "tokens_per_sec": round(rate, 1),
            "flops_per_token": pl_module.flops_per_batch // pl_module.example_input_array.numel(),
            "mfu": None if mfu is None else round(mfu, 4),
            "device": f"{name} x{trainer.world_size}",
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "overrides": self.overrides,  # what a continued sweep recognises its finished jobs by
            "status": "ok",
        }

    def report(self, trainer, pl_module, m: dict) -> list[str]:
        lines = [
            f"Done: {m['steps']} steps, {m['tokens_seen']:,} tokens in {m['wall_seconds']:.0f} s "
            f"({m['tokens_per_sec']:,.0f} tokens/s on {m['device']}).",
            f"Best val loss {m['best_val_loss']:.4f} (perplexity {m['best_val_perplexity']:.1f}, "
            f"{m['best_val_bpb']:.3f} bits per byte), final {m['final_val_loss']:.4f}.",
            f"Run directory: {self.output_dir}",
        ]
        checkpoint = trainer.checkpoint_callback
        if checkpoint is not None and checkpoint.best_model_path:
            lines.append(f"Best checkpoint: {checkpoint.best_model_path}")
        if any(isinstance(logger, TensorBoardLogger) for logger in trainer.loggers):
            lines.append(f"TensorBoard: tensorboard --logdir {self.output_dir}")
        try:
            lines.append(f"Sample: {pl_module.sample(self.cfg['sample_prompt'], max_new_tokens=40)!r}")
        except ConfigError as e:
            lines.append(f"No sample: {e}")
        return lines
