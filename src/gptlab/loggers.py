"""What every logger gets at the end of a run: hyperparameters next to the real results."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf


def hparams_of(cfg: DictConfig, metrics: dict) -> dict:
    """The knobs worth comparing runs by, flat and of plain types."""
    params = {
        **{f"model/{k}": v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items()},
        **{f"optim/{k}": v for k, v in OmegaConf.to_container(cfg.optim, resolve=True).items()},
        **{f"data/{k}": cfg.data[k] for k in ("encoding", "compact_vocab", "batch_size", "context_length")},
        "trainer/max_steps": cfg.trainer.max_steps,
        "seed": cfg.seed,
        "num_params": metrics["num_params"],
    }
    return {k: (str(v) if isinstance(v, (list, type(None))) else v) for k, v in params.items()
            if not k.endswith("_target_")}


def log_results(trainer: L.Trainer, cfg: DictConfig, metrics: dict, output_dir: Path) -> None:
    """Hyperparameters with real results, so TensorBoard's HPARAMS tab can compare runs."""
    params = hparams_of(cfg, metrics)
    results = {f"hparams/{k}": metrics[k] for k in ("best_val_loss", "final_val_loss", "best_val_perplexity")}
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(params, metrics=results)
        else:
            logger.log_hyperparams(params)
            logger.log_metrics(results, step=trainer.global_step)
