"""gptlab-train: compose the config, build data, model and trainer, fit, report.

Every check of the input runs before the corpus is downloaded or tokenized; bad input ends the
run with one paragraph naming the key or file, and exit code 2."""

import logging
import sys
import warnings
from pathlib import Path

import hydra
import lightning as L
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from gptlab.cli.app import main_or_exit, run_or_exit
from gptlab.config.schemas import register_configs
from gptlab.config.trust import build, check_targets
from gptlab.errors import ConfigError
from gptlab.run.checkpoints import load_checkpoint
from gptlab.run.report import RunReport, best_then_test, print_first_screen
from gptlab.run.resume import check_architecture, checkpoint_to_continue, resume_argv
from gptlab.sweep.jobs import in_multirun, job_overrides, sweep_job
from gptlab.training.callbacks import (
    AtomicCheckpointIO,
    DivergenceGuard,
    FinalValidation,
    GracefulStop,
    RngState,
    RunStats,
)
from gptlab.training.module import GPTModule

log = logging.getLogger("gptlab.train")
register_configs()


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
    rank_zero.addFilter(lambda record: "litlogger" not in record.getMessage())  # an advert
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r"The `srun` command is available")  # a local run


def build_loggers(cfg: DictConfig, resume_step: int | None) -> list:
    """The logger group's loggers; a resumed TensorBoard log drops the steps after its checkpoint."""
    loggers = []
    for name, node in cfg.logger.items():
        if "_target_" in node:  # an experiment may tune a logger that logger=none removed
            purge = resume_step is not None and node._target_.endswith("TensorBoardLogger")
            loggers.append(
                build(node, f"logger.{name}", **({"purge_step": resume_step} if purge else {}))
            )
    return loggers


def train(cfg: DictConfig) -> float:
    """Train one model as `cfg` says; return its best validation loss."""
    route_lightning_logs()
    check_targets(cfg)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    # everything a config can get wrong is built first: cheap, and it must not wait for a download
    model_config, optim_config = build(cfg.model, "model"), build(cfg.optim, "optim")
    output_dir = Path(cfg.paths.output_dir)
    ckpt_path = checkpoint_to_continue(cfg, output_dir)
    checkpoint = load_checkpoint(ckpt_path) if ckpt_path else None
    datamodule = build(cfg.data, "data")
    loggers = build_loggers(cfg, checkpoint["global_step"] if checkpoint else None)
    # an experiment may tune a callback that `callbacks=none` removed: a node without _target_
    callbacks = [
        build(c, f"callbacks.{name}") for name, c in cfg.callbacks.items() if "_target_" in c
    ]
    if not loggers:  # nothing to log the learning rate to (logger=none)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    stats = RunStats()
    resolved = OmegaConf.to_container(cfg, resolve=True)  # plain: it travels to spawned DDP ranks
    callbacks += [
        stats,
        FinalValidation(),
        GracefulStop(),
        RngState(),
        DivergenceGuard(),
        RunReport(resolved, str(output_dir), stats, job_overrides()),
    ]
    trainer: L.Trainer = build(
        cfg.trainer,
        "trainer",
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO()],
    )

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_config.vocab_size = datamodule.vocab_size
    hparams = GPTModule.hparams_from(model_config, optim_config, datamodule.tokenizer)
    if checkpoint:
        check_architecture(ckpt_path, checkpoint, hparams)
    module = GPTModule(**hparams)
    if trainer.is_global_zero:
        print_first_screen(OmegaConf.create(resolved), module.model, output_dir, in_multirun())
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:
        stop = next(c for c in callbacks if isinstance(c, GracefulStop))
        if trainer.is_global_zero:
            log.warning(
                "Stopped by %s after step %d; saved checkpoints/last.ckpt. Continue this run with:\n"
                "  gptlab-train resume=%s",
                stop.signal_name,
                trainer.global_step,
                output_dir,
            )
        sys.exit(130 if stop.signal_name == "Ctrl-C" else 143)
    return best_then_test(trainer, module, datamodule)  # test_fraction > 0: test_* in metrics.json


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="train")
def run_job(cfg: DictConfig) -> float:
    """The Hydra task: bad input ends in one paragraph and exit code 2; in a multirun the failed
    job is recorded in its metrics.json instead and the sweep goes on."""
    return sweep_job(train, cfg) if in_multirun() else run_or_exit(train, cfg, log)


def main() -> None:
    """Console entry point `gptlab-train`; `resume=<dir>` is turned into its overrides first."""
    try:
        sys.argv = resume_argv(sys.argv)
    except ConfigError as e:
        print(f"gptlab-train: {e}", file=sys.stderr)
        sys.exit(2)
    main_or_exit(run_job, "gptlab-train")


if __name__ == "__main__":
    main()
