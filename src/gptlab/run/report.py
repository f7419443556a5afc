"""What a run tells its user: the first screen, then at the end of `fit` (in the process that
trains rank 0, whatever the launch path) metrics.json, the loggers' results and a report."""

import io
import json
import logging
import math
import os
import shutil
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.tree import Tree
from torch.utils.tensorboard import SummaryWriter

from gptlab.errors import ConfigError
from gptlab.model.gpt import GPT
from gptlab.run import directory
from gptlab.training.callbacks import RunStats
from gptlab.training.pruning import pruning_result

log = logging.getLogger("gptlab.train")
GROUPS = ("data", "model", "optim", "trainer", "callbacks", "logger", "paths")


def not_an_advert(record: logging.LogRecord) -> bool:
    """Lightning's rank-zero advert for litlogger is dropped."""
    return "litlogger" not in record.getMessage()


def route_lightning_logs() -> None:
    """Lightning installs its own stderr handlers when imported before Hydra sets up logging;
    send its messages through Hydra's handlers instead, so they also reach the run's log file."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    if rank_zero_only.rank > 0:  # a DDP rank other than 0: only warnings reach the shared log
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.WARNING)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero.addFilter(not_an_advert)  # added once, however many jobs a multirun runs here
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r"The `srun` command is available")  # a local run


def config_tree(cfg: DictConfig) -> Tree:
    """The composed config, a branch per group, as lightning-hydra-template prints it (unset keys
    hidden)."""
    tree = Tree("config", guide_style="dim")
    rest = {k: v for k, v in cfg.items() if k not in GROUPS}
    for name, node in [*((g, cfg[g]) for g in GROUPS if g in cfg), ("(top level)", rest)]:
        settings = {
            k: v
            for k, v in OmegaConf.to_container(OmegaConf.create(node), resolve=True).items()
            if v is not None
        }  # unset keys (null) stay in .hydra/config.yaml
        tree.add(f"[bold]{name}[/bold]").add(OmegaConf.to_yaml(settings).rstrip() or "{}")
    return tree


def print_first_screen(cfg: DictConfig, model: GPT, output_dir: Path, multirun: bool) -> None:
    """The config tree (not printed by a sweep's jobs; saved in the run dir), model and run dir."""
    c, tree = model.config, config_tree(cfg)
    if output_dir.is_dir():
        console = Console(file=io.StringIO(), width=110, color_system=None)
        console.print(tree)
        directory.write_text(output_dir / directory.CONFIG_TREE, console.file.getvalue())
    if not multirun:
        Console(stderr=True, width=110).print(tree)
    log.info(
        "GPT: %s parameters (d_model %d, %d heads, %d blocks, context %d, vocab %d)\n"
        "Run directory: %s",
        f"{model.num_params()['total']:,}",
        c.d_model,
        c.num_heads,
        c.num_blocks,
        c.context_length,
        c.vocab_size,
        output_dir,
    )


def hparams_of(cfg: DictConfig, metrics: dict, model: dict) -> dict:
    """The knobs worth comparing runs by, flat and of plain types (`model`: as built)."""
    params = {
        **{f"model/{k}": v for k, v in model.items()},
        **{f"optim/{k}": v for k, v in OmegaConf.to_container(cfg.optim, resolve=True).items()},
        **{
            f"data/{k}": cfg.data[k]
            for k in ("encoding", "compact_vocab", "batch_size", "context_length")
        },
        "trainer/max_steps": cfg.trainer.max_steps,
        "seed": cfg.seed,
        "num_params": metrics["num_params"],
    }
    return {
        k: (str(v) if isinstance(v, (list, tuple, dict, type(None))) else v)
        for k, v in params.items()
        if not k.endswith("_target_")
    }


def run_files(output_dir: Path) -> list[Path]:
    """What a tracker keeps of the run directory: `.hydra/` (configs, overrides) and
    metrics.json."""
    hydra_files = sorted(p for p in (output_dir / directory.HYDRA).rglob("*") if p.is_file())
    return [*hydra_files, directory.metrics_file(output_dir)]


def log_results(trainer: L.Trainer, cfg: DictConfig, metrics: dict, output_dir: Path) -> None:
    """Hyperparameters next to the real results, so each logger compares runs: TensorBoard's
    HPARAMS tab, MLflow's compare view, W&B's runs table; MLflow and W&B also keep the run's
    config and metrics.json."""
    params = hparams_of(cfg, metrics, trainer.lightning_module.hparams["model"])
    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    results = {
        f"hparams/{k}": metrics[k] for k in ("best_val_loss", "best_val_bpb", "final_val_loss")
    }
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):  # its own folder: a continued run replaces them
            hparams_dir = Path(logger.log_dir) / "hparams"
            shutil.rmtree(hparams_dir, ignore_errors=True)
            with SummaryWriter(str(hparams_dir)) as writer:
                writer.add_hparams(params, results, run_name=".")
        elif isinstance(logger, MLFlowLogger):
            client, run = logger.experiment, logger.run_id
            held = client.get_run(run).data.params  # MLflow refuses to change a logged parameter
            logger.log_hyperparams({k: v for k, v in params.items() if k not in held})
            logger.log_metrics(numbers, step=trainer.global_step)
            client.set_tag(run, "gptlab.status", metrics["status"])
            for path in run_files(output_dir):
                folder = (
                    path.parent.relative_to(output_dir)
                    .as_posix()
                    .replace(directory.HYDRA, "hydra", 1)
                )
                client.log_artifact(run, str(path), None if folder == "." else folder)
        elif isinstance(logger, WandbLogger):
            run = logger.experiment
            run.config.update(params, allow_val_change=True)
            run.summary.update(
                {k: v for k, v in metrics.items() if isinstance(v, str) or k in numbers}
            )
            for path in run_files(output_dir):
                run.save(str(path), base_path=str(output_dir), policy="now")
            run.finish()  # the next job of a sweep in this process starts a W&B run of its own
        else:
            logger.log_hyperparams(params)
            logger.log_metrics(results, step=trainer.global_step)


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
                logging.FileHandler(self.output_dir / directory.TRAIN_LOG),
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
        directory.write_text(
            directory.metrics_file(self.output_dir), json.dumps(metrics, indent=2) + "\n"
        )
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
            "val_curve": self.stats.val_curve,  # [step, wall seconds, val loss] per validation
            **pruning_result(trainer),  # "status": "pruned" when an Optuna pruner stopped it
        }

    def on_test_end(self, trainer, pl_module) -> None:
        """After fit, the test split's exact loss and bpb (see evaluate_test) join metrics.json."""
        if not trainer.is_global_zero:
            return
        path = self.output_dir / "metrics.json"
        test = {
            "test_loss": float(trainer.callback_metrics["test/loss"]),
            "test_bpb": float(trainer.callback_metrics["test/bpb"]),
        }
        path.write_text(json.dumps({**json.loads(path.read_text()), **test}, indent=2) + "\n")
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
