"""Loggers: names that follow the run directory, and what every logger gets at a run's end.

The logger configs (conf/logger/) build Lightning's own loggers; these resolvers fill in what
depends on the run: `${gptlab.run_name:}` (the run directory relative to where gptlab-train
runs), `${gptlab.sweep_name:default}` (a sweep's directory, the default outside a sweep),
`${gptlab.run_info:prefix}` (run dir, sweep dir, job, overrides: tags), `${gptlab.run_id:}` (a
W&B id fixed by the run directory, so a continued run logs into the same W&B run),
`${gptlab.mlflow_run:uri,experiment}` (the MLflow run of this run directory when it is
continued) and `${gptlab.mlflow_artifacts:uri}` (a local store's files beside it).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger(__name__)
RUN_DIR_TAG = "gptlab.run_dir"  # the MLflow tag a continued run is found by


def _dirs() -> tuple[Path, Path | None, Path] | None:
    """(run dir, sweep dir or None, cwd) of this Hydra job; None outside one (--cfg job)."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir).resolve()
    return out, out.parent if hc.mode == RunMode.MULTIRUN else None, Path(hc.runtime.cwd).resolve()


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def run_name() -> str | None:
    dirs = _dirs()
    return None if dirs is None else _relative(dirs[0], dirs[2])


def sweep_name(default=None):
    dirs = _dirs()
    return default if dirs is None or dirs[1] is None else _relative(dirs[1], dirs[2])


def run_info(prefix: str = "") -> dict:
    dirs = _dirs()
    if dirs is None:
        return {}
    info = {"run_dir": str(dirs[0]), "overrides": " ".join(HydraConfig.get().overrides.task)}
    if dirs[1] is not None:
        info.update(sweep_dir=str(dirs[1]), job=dirs[0].name)
    return {f"{prefix}{k}": v for k, v in info.items()}


def run_id() -> str | None:
    dirs = _dirs()
    return None if dirs is None else hashlib.sha1(str(dirs[0]).encode()).hexdigest()[:16]


def mlflow_artifacts(tracking_uri: str) -> str | None:
    """`<folder>/mlartifacts` for a local SQLite store in <folder>; a server chooses for itself."""
    if not str(tracking_uri).startswith("sqlite:///"):
        return None
    return str(Path(str(tracking_uri)[len("sqlite:///"):]).parent / "mlartifacts")


def mlflow_run(tracking_uri: str, experiment_name: str, resume=None) -> str | None:
    """The id of the MLflow run of this run directory when the run continues it (resume=, a
    SLURM requeue): the run goes on instead of a second one starting."""
    dirs = _dirs()
    requeued = int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0
    if dirs is None or not (resume or requeued) or not (dirs[0] / "checkpoints" / "last.ckpt").is_file():
        return None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = [] if experiment is None else client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{dirs[0]}'", max_results=1)
    return runs[0].info.run_id if runs else None


def register_resolvers() -> None:
    """Make the gptlab.* resolvers known to OmegaConf; safe to call more than once."""
    for name, fn in (("run_name", run_name), ("sweep_name", sweep_name), ("run_id", run_id),
                     ("run_info", run_info), ("mlflow_run", mlflow_run),
                     ("mlflow_artifacts", mlflow_artifacts)):
        OmegaConf.register_new_resolver(f"gptlab.{name}", fn, replace=True)


# ---------------------------------------------------------------- the end of a run
def hparams_of(cfg: DictConfig, metrics: dict, model: dict) -> dict:
    """The knobs worth comparing runs by, flat and of plain types (`model`: as built)."""
    params = {
        **{f"model/{k}": v for k, v in model.items()},
        **{f"optim/{k}": v for k, v in OmegaConf.to_container(cfg.optim, resolve=True).items()},
        **{f"data/{k}": cfg.data[k] for k in ("encoding", "compact_vocab", "batch_size", "context_length")},
        "trainer/max_steps": cfg.trainer.max_steps,
        "seed": cfg.seed,
        "num_params": metrics["num_params"],
    }
    return {k: (str(v) if isinstance(v, (list, tuple, dict, type(None))) else v) for k, v in params.items()
            if not k.endswith("_target_")}


def run_files(output_dir: Path) -> list[Path]:
    """What a tracker keeps of the run directory: `.hydra/` (the composed config, overrides,
    resumed starts) and metrics.json."""
    hydra_files = sorted(p for p in (output_dir / ".hydra").rglob("*") if p.is_file())
    return [*hydra_files, output_dir / "metrics.json"]


def log_results(trainer: L.Trainer, cfg: DictConfig, metrics: dict, output_dir: Path) -> None:
    """Hyperparameters next to the real results, so each logger compares runs: TensorBoard's
    HPARAMS tab, MLflow's compare view, W&B's runs table; MLflow and W&B also keep the run's
    config and metrics.json."""
    params = hparams_of(cfg, metrics, trainer.lightning_module.hparams["model"])
    numbers = {k: float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    results = {f"hparams/{k}": metrics[k] for k in ("best_val_loss", "best_val_bpb", "final_val_loss")}
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
                folder = path.parent.relative_to(output_dir).as_posix().replace(".hydra", "hydra", 1)
                client.log_artifact(run, str(path), None if folder == "." else folder)
        elif isinstance(logger, WandbLogger):
            run = logger.experiment
            run.config.update(params, allow_val_change=True)
            run.summary.update({k: v for k, v in metrics.items() if isinstance(v, str) or k in numbers})
            for path in run_files(output_dir):
                run.save(str(path), base_path=str(output_dir), policy="now")
            run.finish()  # the next job of a sweep in this process starts a W&B run of its own
        else:
            logger.log_hyperparams(params)
            logger.log_metrics(results, step=trainer.global_step)


register_resolvers()
