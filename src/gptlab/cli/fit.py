"""gptlab-train's task: build data, model and trainer from the checked config, fit, report.

Every check of the input runs before the corpus is downloaded or tokenized; bad input ends the
run with one paragraph naming the key or file, and exit code 2. The command line itself was
composed and checked before any of this was imported (gptlab.cli.train)."""

import contextlib
import logging
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from gptlab.config.trust import build, checked
from gptlab.exits import code_of_signal
from gptlab.run import directory, place
from gptlab.run.checkpoints import check_architecture, check_weights, load_checkpoint, step_of
from gptlab.run.checkpoints import weights as checkpoint_weights
from gptlab.run.logs import own_checkpoint_dir, route_lightning_logs
from gptlab.run.resume import checkpoint_to_continue
from gptlab.run.screen import print_first_screen
from gptlab.sweep.jobs import (
    claim,
    in_multirun,
    job_overrides,
    sweep_dir,
    tensorboard_version,
)
from gptlab.training.budget import apply_budget
from gptlab.training.callbacks import (
    DivergenceGuard,
    FinalValidation,
    GracefulStop,
    RngState,
    ValidationStep,
    into_run_dir,
)
from gptlab.training.checkpoint_io import RunCheckpointIO
from gptlab.training.module import GPTModule
from gptlab.training.report import RunReport, best_then_test
from gptlab.training.run_stats import RunStats
from gptlab.training.trackers import require_wandb_login

log = logging.getLogger("gptlab.train")


def build_loggers(cfg: DictConfig, resume_step: int | None) -> list:
    """The logger group's loggers (TensorBoard's: tensorboard_options)."""
    loggers = []
    for name, node in cfg.logger.items():
        if "_target_" in node:  # an experiment may tune a logger that logger=none removed
            if node._target_.endswith("WandbLogger"):
                require_wandb_login(offline=bool(node.get("offline")))
            extra = {}
            if node._target_.endswith("TensorBoardLogger"):
                extra = tensorboard_options(node, resume_step)
            loggers.append(build(node, f"logger.{name}", **extra))
    return loggers


def tensorboard_options(node: DictConfig, resume_step: int | None) -> dict:
    """A resumed TensorBoard log drops the steps after its checkpoint; a sweep's job is a run
    named by its settings (version=, unless the config names one)."""
    options = {} if resume_step is None else {"purge_step": resume_step}
    folder = Path(str(node.get("save_dir"))) / str(node.get("name", "lightning_logs"))
    version = None if node.get("version") else tensorboard_version(folder)
    return {**options, "version": version} if version else options


def checkpoint_io_for(output_dir: Path, ckpt_path: str | None, whole: bool) -> RunCheckpointIO:
    """The plugin every checkpoint passes through, told which one this start continues."""
    checkpoint_io = RunCheckpointIO(output_dir)
    if ckpt_path and whole:
        checkpoint_io.continued = Path(ckpt_path)
    elif ckpt_path:
        checkpoint_io.started_from = Path(ckpt_path)
    return checkpoint_io


def build_callbacks(cfg: DictConfig, resolved: dict, output_dir: Path, with_loggers: bool):
    """The callbacks group's callbacks, then the ones every run has (stats, final validation,
    stops, RNG state, divergence, the report)."""
    # an experiment may tune a callback that `callbacks=none` removed: a node without _target_
    callbacks = [
        build(c, f"callbacks.{name}") for name, c in cfg.callbacks.items() if "_target_" in c
    ]
    if not with_loggers:  # nothing to log the learning rate to (logger=none)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    into_run_dir(callbacks, output_dir)
    own_checkpoint_dir(directory.checkpoint_dir(output_dir))
    stats = RunStats()
    return [
        *callbacks,
        stats,
        ValidationStep(),
        FinalValidation(),
        GracefulStop(),
        RngState(),
        DivergenceGuard(),
        RunReport(resolved, str(output_dir), stats, job_overrides()),
    ]


def build_trainer(cfg: DictConfig, callbacks: list, loggers: list, checkpoint_io) -> L.Trainer:
    """The Trainer of the trainer group, with gptlab's callbacks, loggers and checkpoint plugin."""
    trainer = build(
        cfg.trainer,
        "trainer",
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[checkpoint_io],
    )
    checkpoint_io.fit_loop = trainer.fit_loop.state_dict()  # the loops before any step
    return trainer


def build_module(model_config, optim_config, datamodule, checkpoint, ckpt_path, whole):
    """The GPTModule for the data's vocabulary; a checkpoint it starts from must hold this
    architecture (and, read for its tensors, weights of its shapes)."""
    model_config.vocab_size = datamodule.vocab_size
    hparams = GPTModule.hparams_from(model_config, optim_config, datamodule.tokenizer)
    if checkpoint:
        check_architecture(ckpt_path, checkpoint, hparams)
    module = GPTModule(**hparams)
    if checkpoint and not whole:
        check_weights(module, checkpoint_weights(checkpoint, ckpt_path), ckpt_path)
    return module


def fit(trainer: L.Trainer, module, datamodule, ckpt_path: str | None, output_dir: Path) -> None:
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
                sweep_dir() or output_dir,  # a sweep's job continues with its sweep
            )
        sys.exit(code_of_signal(stop.signal_name))


def train(cfg: DictConfig) -> float:
    """Train one model as `cfg` says; return its best validation loss."""
    route_lightning_logs()
    cfg = checked(cfg)  # resolved once and checked: what is built below
    place.check_data_places(cfg.data.data_dir, cfg.data.cache_dir)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    # everything a config can get wrong is built first: cheap, and it must not wait for a download
    model_config = build(cfg.model, "model")
    optim_config = build(cfg.optim, "optim")
    output_dir = Path(cfg.paths.output_dir)
    claim(output_dir)
    ckpt_path, whole = checkpoint_to_continue(cfg, output_dir)
    checkpoint = load_checkpoint(ckpt_path) if ckpt_path else None
    datamodule = build(cfg.data, "data")
    loggers = build_loggers(cfg, step_of(checkpoint) if checkpoint else None)
    resolved = OmegaConf.to_container(cfg, resolve=True)  # plain: it travels to spawned DDP ranks
    callbacks = build_callbacks(cfg, resolved, output_dir, with_loggers=bool(loggers))
    checkpoint_io = checkpoint_io_for(output_dir, ckpt_path, whole)
    checkpoint_io.optimizer = optim_config.name
    trainer = build_trainer(cfg, callbacks, loggers, checkpoint_io)

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    module = build_module(model_config, optim_config, datamodule, checkpoint, ckpt_path, whole)
    if cfg.flops_budget is not None:  # the run's length: vocab and world size are known now
        resolved["trainer"]["max_steps"] = apply_budget(  # as the first screen and trackers show
            trainer, cfg.flops_budget, module.config, datamodule
        )
    if trainer.is_global_zero:
        first_screen = (OmegaConf.create(resolved), module.model, output_dir, in_multirun())
        print_first_screen(*first_screen, datamodule=datamodule)
    fit(trainer, module, datamodule, ckpt_path, output_dir)
    return best_then_test(trainer, module, datamodule)  # test_fraction > 0: test_* in metrics.json
