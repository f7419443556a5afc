"""A run's results published to its experiment trackers at the end of fit, and the run's
TensorBoard logger (one TensorBoard run per training run)."""

import math
import os
import tempfile
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard.summary import hparams, scalar
from torch.utils.tensorboard.writer import FileWriter

from gptlab.run import directory

HPARAMS_EVENTS = "events.out.tfevents.hparams"  # the event file of a run's HPARAMS
# the results beside the hyperparameters: a group TensorBoard lists after train/ and val/
RESULTS = "val_results"


class RunTensorBoardLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger without `epoch` (a run is one epoch); the HPARAMS tab in an
    event file replaced at each start's end (TensorBoard keeps the first hparams it reads)."""

    @rank_zero_only
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)

    @rank_zero_only
    def log_hyperparams(self, params, metrics: dict | None = None, step: int | None = None) -> None:
        if not metrics:  # nothing to compare runs by (Lightning's call at the start)
            super().log_hyperparams(params, metrics, step)
            return
        folder = Path(self.log_dir)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".hparams.") as fresh:
            writer = FileWriter(fresh)
            for summary in hparams(params, metrics):  # experiment, session start, session end
                writer.add_summary(summary, step)
            for name, value in metrics.items():
                writer.add_summary(scalar(name, value), step)
            writer.close()
            [written] = Path(fresh).iterdir()
            os.replace(written, folder / HPARAMS_EVENTS)  # the earlier start's, replaced


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
    """What a tracker keeps of the run directory: `.hydra/` and metrics.json."""
    saved = (output_dir / directory.HYDRA).rglob("*")
    hydra_files = sorted(p for p in saved if p.is_file() and not p.is_symlink())
    return [*hydra_files, directory.metrics_file(output_dir)]


def log_results(trainer: L.Trainer, cfg: DictConfig, metrics: dict, output_dir: Path) -> None:
    """Hyperparameters beside the results: each tracker compares runs (MLflow, W&B keep files)."""
    params = hparams_of(cfg, metrics, trainer.lightning_module.hparams["model"])
    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    results = {
        f"{RESULTS}/{k.replace('_val', '')}": metrics[k]
        for k in ("best_val_loss", "best_val_bpb", "final_val_loss")
    }
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger):
            client, run = logger.experiment, logger.run_id
            held = client.get_run(run).data.params  # MLflow refuses to change a logged parameter
            logger.log_hyperparams({k: v for k, v in params.items() if k not in held})
            logger.log_metrics(numbers, step=trainer.global_step)
            client.set_tag(run, "gptlab.status", metrics["status"])
            for path in run_files(output_dir):
                folder = path.parent.relative_to(output_dir).as_posix()
                folder = folder.replace(directory.HYDRA, "hydra", 1)
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
        elif isinstance(logger, TensorBoardLogger):  # RunTensorBoardLogger: into the run itself
            logger.log_hyperparams(params, metrics=results, step=trainer.global_step)
        else:
            logger.log_hyperparams(params)
            logger.log_metrics(results, step=trainer.global_step)
