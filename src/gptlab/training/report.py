"""What a run tells at the end of `fit`, in the process that trains rank 0 whatever the launch
path: metrics.json, the trackers' results and a report; then the held-out test split."""

import json
import logging
import math
import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import OmegaConf

from gptlab import files
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.training.budget import budget_metrics
from gptlab.training.pruning import pruning_result
from gptlab.training.run_stats import RunStats
from gptlab.training.trackers import log_results

log = logging.getLogger("gptlab.train")


class RunReport(L.Callback):
    """At the end of fit, on rank 0: metrics.json, results to every logger, a report."""

    def __init__(self, cfg: dict, output_dir: str, stats: RunStats, overrides: list[str]):
        self.cfg, self.output_dir, self.stats, self.overrides = (
            cfg,
            Path(output_dir),
            stats,
            overrides,
        )

    def setup(self, trainer, pl_module, stage: str) -> None:
        """A DDP process Lightning spawned has no Hydra logging: give it train.log and stderr
        too."""
        if trainer.is_global_zero and not logging.getLogger().handlers:
            handlers = [
                files.LogFile(self.output_dir / directory.TRAIN_LOG),
                logging.StreamHandler(sys.stderr),
            ]
            logging.basicConfig(
                format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",  # Hydra's
                level=logging.INFO,
                handlers=handlers,
            )

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        metrics = self.metrics(trainer, pl_module)
        write_metrics(self.output_dir, metrics)
        log_results(trainer, OmegaConf.create(self.cfg), metrics, self.output_dir)
        log.info("\n".join(self.report(trainer, pl_module, metrics)))

    def metrics(self, trainer, pl_module) -> dict:
        """The run's results. A run resumed after its last step validates no more: its final
        values are the ones its checkpoint kept (RunStats), its best the module's."""
        last = self.stats.last_validation
        final_loss = float(trainer.callback_metrics.get("val/loss", last.get("val/loss", math.nan)))
        final_bpb = float(trainer.callback_metrics.get("val/bpb", last.get("val/bpb", math.nan)))
        best = pl_module.best_val_loss if math.isfinite(pl_module.best_val_loss) else final_loss
        device = trainer.strategy.root_device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        # tokens_per_step is a batch's over every rank: an optimizer step takes accumulated ones
        tokens = trainer.global_step * self.stats.tokens_per_step * trainer.accumulate_grad_batches
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
            "max_steps": trainer.max_steps,  # what it was set to train: a FLOP budget's steps
            "tokens_seen": tokens,
            "wall_seconds": round(self.stats.wall_seconds, 3),
            "tokens_per_sec": round(rate, 1),
            "flops_per_token": pl_module.flops_per_batch // pl_module.example_input_array.numel(),
            "mfu": None if mfu is None else round(mfu, 4),
            "device": f"{name} x{trainer.world_size}",
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "overrides": self.overrides,  # what a continued sweep recognises its finished jobs by
            "status": "ok",
            "val_curve": self.stats.val_curve,  # [step, wall seconds, val loss] per validation
            **budget_metrics(self.cfg, trainer, pl_module, tokens),  # for scaling-law fits
            **pruning_result(trainer),  # "status": "pruned" when an Optuna pruner stopped it
        }

    def on_test_end(self, trainer, pl_module) -> None:
        """After fit, the test split's exact loss and bpb (see evaluate_test) join metrics.json."""
        if not trainer.is_global_zero:
            return
        test = {
            "test_loss": float(trainer.callback_metrics["test/loss"]),
            "test_bpb": float(trainer.callback_metrics["test/bpb"]),
        }
        saved = files.read_json(directory.metrics_file(self.output_dir))
        write_metrics(self.output_dir, {**(saved if isinstance(saved, dict) else {}), **test})
        log.info("Test loss %.4f (%.3f bits per byte) of checkpoints/best.ckpt.", *test.values())

    def report(self, trainer, pl_module, m: dict) -> list[str]:
        lines = [
            f"Done: {m['steps']} steps, {m['tokens_seen']:,} tokens in {m['wall_seconds']:.0f} s "
            f"({m['tokens_per_sec']:,.0f} tokens/s on {m['device']}).",
            f"Best val loss {m['best_val_loss']:.4f} (perplexity {m['best_val_perplexity']:.1f}, "
            f"{m['best_val_bpb']:.3f} bits per byte), final {m['final_val_loss']:.4f}.",
            f"Run directory: {self.output_dir}",
        ]
        if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path:
            lines.append(f"Best checkpoint: {trainer.checkpoint_callback.best_model_path}")
        if any(isinstance(logger, TensorBoardLogger) for logger in trainer.loggers):
            lines.append(f"TensorBoard: tensorboard --logdir {self.output_dir}")
        try:
            lines.append(
                f"Sample: {pl_module.sample(self.cfg['sample_prompt'], max_new_tokens=40)!r}"
            )
        except ConfigError as e:
            lines.append(f"No sample: {e}")
        return lines


def write_metrics(output_dir: Path, metrics: dict) -> None:
    """metrics.json, written whole and recorded in the run's manifest."""
    text = json.dumps(metrics, indent=2) + "\n"
    ownership.write_recorded(output_dir, directory.METRICS, lambda f: f.write(text))


def best_then_test(trainer: L.Trainer, module: L.LightningModule, datamodule) -> float:
    """The run's best val loss, read first (trainer.test resets the trainer's metrics). Then, with
    data.test_fraction > 0, best.ckpt (the final weights where there is none) on the held-out test
    split through the module's test_step; RunReport.on_test_end adds it to metrics.json."""
    best = trainer.callback_metrics.get("val/best_loss")  # none when resumed after the last step
    best_val_loss = float(module.best_val_loss if best is None else best)
    if datamodule.test_fraction > 0 and trainer.global_step > 0:
        best = [c.best_model_path for c in trainer.checkpoint_callbacks if c.monitor == "val/loss"]
        ckpt_path = best[0] if best and best[0] else None
        trainer.test(
            module, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False, weights_only=True
        )
    return best_val_loss
