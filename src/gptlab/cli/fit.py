"""gptlab-train's task: build data, model and trainer from the checked config, fit, report.

Every check of the input runs before the corpus is downloaded or tokenized; bad input ends the
run with one paragraph naming the key or file, and exit code 2. The command line itself was
composed and checked before any of this was imported (gptlab.cli.train)."""

import logging
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from gptlab.config.trust import build, checked
from gptlab.exits import code_of_signal
from gptlab.run.checkpoints import check_architecture, check_weights, load_checkpoint, step_of
from gptlab.run.checkpoints import weights as checkpoint_weights
from gptlab.run.logs import route_lightning_logs
from gptlab.run.resume import checkpoint_to_continue
from gptlab.run.screen import print_first_screen
from gptlab.sweep.jobs import claim, in_multirun, job_overrides, sweep_dir
from gptlab.training.budget import apply_budget
from gptlab.training.callbacks import (
    DivergenceGuard,
    FinalValidation,
    GracefulStop,
    RngState,
    RunStats,
    into_run_dir,
)
from gptlab.training.checkpoint_io import RunCheckpointIO
from gptlab.training.module import GPTModule
from gptlab.training.report import RunReport, best_then_test
from gptlab.training.trackers import require_wandb_login

log = logging.getLogger("gptlab.train")


def build_loggers(cfg: DictConfig, resume_step: int | None) -> list:
    """The logger group's loggers; a resumed TensorBoard log drops steps after the checkpoint."""
    loggers = []
    for name, node in cfg.logger.items():
        if "_target_" in node:  # an experiment may tune a logger that logger=none removed
            if node._target_.endswith("WandbLogger"):
                require_wandb_login(offline=bool(node.get("offline")))
            purge = resume_step is not None and node._target_.endswith("TensorBoardLogger")
            loggers.append(
                build(node, f"logger.{name}", **({"purge_step": resume_step} if purge else {}))
            )
    return loggers


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
    stats = RunStats()
    return [
        *callbacks,
        stats,
        FinalValidation(),
        GracefulStop(),
        RngState(),
        DivergenceGuard(),
        RunReport(resolved, str(output_dir), stats, job_overrides()),
    ]


def train(cfg: DictConfig) -> float:
    """Train one model as `cfg` says; return its best validation loss."""
    route_lightning_logs()
    cfg = checked(cfg)  # resolved once and checked: what is built below
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
    trainer: L.Trainer = build(
        cfg.trainer,
        "trainer",
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[checkpoint_io],
    )
    checkpoint_io.fit_loop = trainer.fit_loop.state_dict()  # the loops before any step
    checkpoint_io.optimizer = optim_config.name

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_config.vocab_size = datamodule.vocab_size
    if cfg.flops_budget is not None:  # the run's length: vocab and world size are known now
        resolved["trainer"]["max_steps"] = apply_budget(  # as the first screen and trackers show
            trainer, cfg.flops_budget, model_config, datamodule
        )
    hparams = GPTModule.hparams_from(model_config, optim_config, datamodule.tokenizer)
    if checkpoint:
        check_architecture(ckpt_path, checkpoint, hparams)
    module = GPTModule(**hparams)
    if checkpoint and not whole:
        check_weights(module, checkpoint_weights(checkpoint, ckpt_path), ckpt_path)
    if trainer.is_global_zero:
        print_first_screen(OmegaConf.create(resolved), module.model, output_dir, in_multirun())
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:
        stop = next(c for c in callbacks if isinstance(c, GracefulStop))
        if trainer.is_global_zero:
            log.warning(
                "Stopped by %s after step %d; saved its last checkpoint. Continue with:\n"
                "  gptlab-train resume=%s",
                stop.signal_name,
                trainer.global_step,
                sweep_dir() or output_dir,  # a sweep's job continues with its sweep
            )
        sys.exit(code_of_signal(stop.signal_name))
    return best_then_test(trainer, module, datamodule)  # test_fraction > 0: test_* in metrics.json
