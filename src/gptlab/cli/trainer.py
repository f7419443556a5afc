"""gptlab-train's Trainer, built once with everything it needs: callbacks, loggers, and the
checkpoint plugin told what this start continues."""

from inspect import signature
from pathlib import Path

import lightning as L
from hydra.utils import get_object
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from gptlab.config.build import build
from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.logs import SpawnedRank, own_checkpoint_dir
from gptlab.sweep.jobs import job_overrides, swept_overrides, tensorboard_version
from gptlab.training.callbacks import (
    BranchCheckpoints,
    DivergenceGuard,
    FinalValidation,
    GracefulStop,
    RngState,
    ValidationStep,
)
from gptlab.training.checkpoint_io import RunCheckpointIO
from gptlab.training.report import RunReport
from gptlab.training.run_stats import RunStats
from gptlab.training.trackers import StepLoggedBeforeSave


def build_trainer(cfg: DictConfig, run_dir: Path, module, start, length) -> L.Trainer:
    """The Trainer for `module`, starting at `start`, on the processes `length` was counted for:
    the config's callbacks and loggers, then gptlab's own callbacks, then all of it built."""
    folder = directory.checkpoint_dir(run_dir)
    with_loggers = any("_target_" in node for node in cfg.logger.values())
    configured = [*callback_nodes(cfg, folder, with_loggers), *logger_nodes(cfg, start.step)]
    own_checkpoint_dir(folder)
    ours = [
        SpawnedRank(run_dir),
        stats := RunStats(length.tokens_per_step, module.model.flops_per_token()),
        StepLoggedBeforeSave(),
        ValidationStep(),
        FinalValidation(),
        GracefulStop(),
        RngState(),
        DivergenceGuard(),
        BranchCheckpoints(length.branch_steps, str(run_dir)),
        RunReport(
            OmegaConf.to_container(cfg), str(run_dir), stats, job_overrides(), swept_overrides()
        ),
    ]
    plugin = RunCheckpointIO(run_dir)
    built = [(key, build(node, key, **extra)) for key, node, extra in configured]
    callbacks = [part for key, part in built if key.startswith("callbacks.")]
    loggers = [part for key, part in built if key.startswith("logger.")]
    trainer = build(
        cfg.trainer,
        "trainer",
        callbacks=[*callbacks, *ours],
        logger=loggers or False,
        plugins=[plugin],
    )
    if trainer.world_size != length.ranks:
        raise ConfigError(
            f"trainer: gptlab counted {length.ranks} process(es) from trainer.devices and "
            f"trainer.num_nodes, Lightning {trainer.world_size}: a run's tokens per step and a "
            "FLOP budget's steps would be wrong. Give trainer.devices as a number."
        )
    return trainer


def callback_nodes(cfg: DictConfig, folder: Path, with_loggers: bool) -> list[tuple]:
    """(key, node, extra) of the callbacks group's, checkpoints into the run's own checkpoints/
    `folder` (resume looks there); no learning rate without a logger. A node without _target_
    was removed (`callbacks=none`)."""
    nodes = []
    for name, node in cfg.callbacks.items():
        kind = get_object(node._target_) if "_target_" in node else None
        if kind is None or (issubclass(kind, LearningRateMonitor) and not with_loggers):
            continue
        where = {"dirpath": str(folder)} if issubclass(kind, ModelCheckpoint) else {}
        if where and node.get("dirpath") is not None:
            raise ConfigError(
                f"callbacks.{name}.dirpath={node.dirpath}: checkpoints go to the run "
                "directory's checkpoints/, where resume, eval and generate look; drop it."
            )
        if where and node.get("filename") is None and "filename" in signature(kind).parameters:
            where["filename"] = directory.BEST
        nodes.append((f"callbacks.{name}", node, where))
    return nodes


def logger_nodes(cfg: DictConfig, resume_step: int | None) -> list[tuple]:
    """(key, node, extra) of the logger group's. A resumed TensorBoard log drops the steps after
    its checkpoint; a sweep's job is a TensorBoard run named by its settings (unless the config
    names one)."""
    nodes = []
    for name, node in cfg.logger.items():
        if "_target_" not in node:  # an experiment may tune a logger that logger=none removed
            continue
        extra = {}
        if node._target_.endswith("TensorBoardLogger"):
            extra = {} if resume_step is None else {"purge_step": resume_step}
            folder = Path(str(node.get("save_dir"))) / str(node.get("name", "lightning_logs"))
            version = None if node.get("version") else tensorboard_version(folder)
            extra.update({"version": version} if version else {})
        nodes.append((f"logger.{name}", node, extra))
    return nodes
