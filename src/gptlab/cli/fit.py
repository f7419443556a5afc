"""gptlab-train's task: one run, built in the order data flows, top to bottom: the checked config
and where the run starts from; the data (the vocabulary known); the model (its settings final);
the run's length; the Trainer, built once with everything it needs; fit; the end of the run
(gptlab.training.report). Nothing is patched after it is built.

Every check of the input runs before the corpus is downloaded or tokenized; bad input ends the
run with one paragraph naming the key or file, and exit code 2. The command line itself was
composed and checked, and the run directory made, before any of this was imported
(gptlab.cli.train, gptlab.run.place)."""

import contextlib
import logging
import sys
from dataclasses import replace
from inspect import signature
from pathlib import Path

import lightning as L
import torch
from hydra.utils import get_object
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from gptlab.config.trust import build, checked
from gptlab.errors import ConfigError
from gptlab.exits import code_of_signal
from gptlab.model.gpt import GPT
from gptlab.run import directory, place
from gptlab.run.bounds import check_memory
from gptlab.run.checkpoints import check_architecture, check_weights, load_checkpoint, step_of
from gptlab.run.checkpoints import weights as checkpoint_weights
from gptlab.run.logs import SpawnedRankLog, own_checkpoint_dir, route_lightning_logs
from gptlab.run.resume import checkpoint_to_continue
from gptlab.run.screen import print_first_screen
from gptlab.sweep.jobs import claim, job_overrides, tensorboard_version
from gptlab.training.budget import run_length, tokens_per_step, world_size
from gptlab.training.callbacks import (
    DivergenceGuard,
    FinalValidation,
    GracefulStop,
    RngState,
    ValidationStep,
)
from gptlab.training.checkpoint_io import RunCheckpointIO
from gptlab.training.module import GPTModule
from gptlab.training.report import RunReport, best_val_loss
from gptlab.training.run_stats import RunStats
from gptlab.training.trackers import require_wandb_login

log = logging.getLogger("gptlab.train")


def train(cfg: DictConfig) -> float:
    """Train one model as `cfg` says; return its best validation loss."""
    # the checked config, and where this run starts from: everything a config can get wrong is
    # built first (cheap), before any download
    route_lightning_logs()
    cfg = checked(cfg)  # resolved once and checked: what is built below
    place.check_data_places(cfg.data.data_dir, cfg.data.cache_dir)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    model_config = build(cfg.model, "model")
    optim_config = build(cfg.optim, "optim")
    check_logins(cfg)
    run_dir = Path(cfg.paths.output_dir)
    claim(run_dir)
    ckpt_path, whole = checkpoint_to_continue(cfg, run_dir)
    checkpoint = load_checkpoint(ckpt_path) if ckpt_path else None

    # the data: the corpus tokenized once and split; the vocabulary known
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = build(cfg.data, "data")
    datamodule.prepare_data()
    datamodule.setup("fit")

    # the model, its settings final
    model_config = replace(model_config, vocab_size=datamodule.tokenizer.vocab_size)
    module = build_module(model_config, optim_config, datamodule, ckpt_path, checkpoint, whole)

    # the run's length, then the Trainer built once with it
    ranks = world_size(cfg.trainer)
    max_steps = run_length(cfg, module.model.flops_per_token(), ranks)
    cfg = OmegaConf.merge(cfg, {"trainer": {"max_steps": max_steps}})  # as the screen shows it
    from_step = step_of(checkpoint) if checkpoint else None
    plugin = RunCheckpointIO(
        run_dir,
        continued=Path(ckpt_path) if ckpt_path and whole else None,
        started_from=Path(ckpt_path) if ckpt_path and not whole else None,
        optimizer=optim_config.name,
    )
    trainer = build_trainer(cfg, run_dir, module, plugin, from_step, ranks)
    if trainer.is_global_zero:
        print_first_screen(cfg, module.model, run_dir, datamodule)

    fit(trainer, module, datamodule, ckpt_path, run_dir)
    return best_val_loss(trainer, module)


def build_module(model_config, optim_config, datamodule, ckpt_path, checkpoint, whole):
    """The GPTModule for the data's vocabulary, once its memory is known to fit; a checkpoint it
    starts from must hold this architecture (and, read for its tensors, weights of its shapes)."""
    with torch.device("meta"):  # shapes without memory: what it needs, before it is taken
        check_memory(GPT(replace(model_config, compile=False)), datamodule.batch_size, "model")
    hparams = GPTModule.hparams_from(model_config, optim_config, datamodule.tokenizer)
    if checkpoint:
        check_architecture(ckpt_path, checkpoint, hparams)
    module = GPTModule(**hparams)
    if checkpoint and not whole:
        check_weights(module, checkpoint_weights(checkpoint, ckpt_path), ckpt_path)
    return module


def build_trainer(cfg: DictConfig, run_dir: Path, module, plugin, from_step, ranks) -> L.Trainer:
    """The Trainer of the trainer group, built once: the callbacks group's callbacks (checkpoints
    into the run's own checkpoints/), the ones every run has, the loggers, the checkpoint plugin;
    on the `ranks` processes its length was counted for."""
    loggers = build_loggers(cfg, from_step)
    stats = RunStats(tokens_per_step(cfg, ranks), module.model.flops_per_token())
    callbacks = [
        *build_callbacks(cfg, run_dir, with_loggers=bool(loggers)),
        stats,
        ValidationStep(),
        FinalValidation(),
        GracefulStop(),
        RngState(),
        DivergenceGuard(),
        SpawnedRankLog(run_dir),
        RunReport(OmegaConf.to_container(cfg), str(run_dir), stats, job_overrides()),
    ]
    trainer = build(
        cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False, plugins=[plugin]
    )
    if trainer.world_size != ranks:
        raise ConfigError(
            f"trainer: gptlab counted {ranks} process(es) from trainer.devices and "
            f"trainer.num_nodes, Lightning {trainer.world_size}: a run's tokens per step and a "
            "FLOP budget's steps would be wrong. Give trainer.devices as a number."
        )
    return trainer


def build_callbacks(cfg: DictConfig, run_dir: Path, with_loggers: bool) -> list:
    """The callbacks group's: a checkpoint goes to the run directory's checkpoints/, where resume,
    eval and generate find it (the run directory decides, not a setting); nothing logs the
    learning rate without a logger. A node without _target_ is one an experiment tunes but
    `callbacks=none` removed."""
    folder = directory.checkpoint_dir(run_dir)
    own_checkpoint_dir(folder)
    callbacks = []
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
        callbacks.append(build(node, f"callbacks.{name}", **where))
    return callbacks


def check_logins(cfg: DictConfig) -> None:
    """A tracker that needs an account is checked before any long work."""
    for node in cfg.logger.values():
        if str(node.get("_target_", "")).endswith("WandbLogger"):
            require_wandb_login(offline=bool(node.get("offline")))


def build_loggers(cfg: DictConfig, resume_step: int | None) -> list:
    """The logger group's loggers. A resumed TensorBoard log drops the steps after its
    checkpoint; a sweep's job is a TensorBoard run named by its settings (unless the config names
    one)."""
    loggers = []
    for name, node in cfg.logger.items():
        if "_target_" not in node:  # an experiment may tune a logger that logger=none removed
            continue
        extra = {}
        if node._target_.endswith("TensorBoardLogger"):
            extra = {} if resume_step is None else {"purge_step": resume_step}
            folder = Path(str(node.get("save_dir"))) / str(node.get("name", "lightning_logs"))
            version = None if node.get("version") else tensorboard_version(folder)
            extra.update({"version": version} if version else {})
        loggers.append(build(node, f"logger.{name}", **extra))
    return loggers


def fit(trainer: L.Trainer, module, datamodule, ckpt_path: str | None, run_dir: Path) -> None:
    """trainer.fit, its messages on lines of their own above the progress bar (tqdm.write); a
    stop (SIGTERM, Ctrl-C) ends the process with the command that continues the run."""
    console = logging_redirect_tqdm() if trainer.is_global_zero else contextlib.nullcontext()
    try:
        with console:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:
        stop = next(c for c in trainer.callbacks if isinstance(c, GracefulStop))
        if trainer.is_global_zero:
            log.warning(
                "Stopped by %s after step %d; saved its last checkpoint. Continue with:\n"
                "  gptlab-train resume=%s",
                stop.signal_name,
                trainer.global_step,
                place.sweep_dir() or run_dir,  # a sweep's job continues with its sweep
            )
        sys.exit(code_of_signal(stop.signal_name))
