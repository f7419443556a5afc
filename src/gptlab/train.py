"""gptlab-train: compose the config, check it, build data/model/trainer, fit, report.

Every check that can fail on bad input runs before the corpus is downloaded or tokenized,
and a bad input ends the run with one paragraph that names the key or file.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, ListConfig

from gptlab.callbacks import RunStats
from gptlab.config import register_configs
from gptlab.ddp import finish_ddp_job
from gptlab.errors import ConfigError, run_or_exit
from gptlab.loggers import log_results
from gptlab.malloc import keep_freed_memory
from gptlab.module import GPTModule
from gptlab.resilience import AtomicCheckpointIO, DivergenceGuard, GracefulStop, RngState
from gptlab.resume import check_checkpoint, resume_argv

log = logging.getLogger("gptlab.train")
register_configs()


# Configs may only build these packages' classes: a `_target_` is code that runs.
TRUSTED_TARGETS = ("gptlab.", "lightning.", "torch.")


def check_targets(node, where: str = "") -> None:
    """Refuse a `_target_` outside TRUSTED_TARGETS anywhere in `node`, before building anything."""
    if isinstance(node, DictConfig):
        target = node.get("_target_")
        if target is not None and not str(target).startswith(TRUSTED_TARGETS):
            raise ConfigError(
                f"{where}{'.' if where else ''}_target_={target!r}: gptlab only builds classes from "
                f"{', '.join(t.rstrip('.') for t in TRUSTED_TARGETS)}. Use one of those, or add the "
                "package to gptlab.train.TRUSTED_TARGETS in your own fork if you trust it."
            )
        for key, value in node.items_ex(resolve=False):
            check_targets(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, ListConfig):
        for i, value in enumerate(node):
            check_targets(value, f"{where}[{i}]")


def build(node: DictConfig, **kwargs):
    """hydra.utils.instantiate, but a ConfigError from the target surfaces as itself."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise


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


def check_ckpt_path(ckpt_path: str | None) -> None:
    if ckpt_path and not Path(ckpt_path).is_file():
        raise ConfigError(f"ckpt_path: no checkpoint file at '{ckpt_path}'. Give the path of a .ckpt file.")


def build_loggers(cfg: DictConfig, resume_step: int | None) -> list:
    """The logger group's loggers. A resumed TensorBoard log drops what the stopped run logged
    after its checkpoint (purge_step), so each curve continues without duplicate steps."""
    loggers = []
    for node in cfg.logger.values():
        if "_target_" not in node:  # tuned by an experiment, removed by logger=none
            continue
        extra = {}
        if resume_step is not None and node.get("_target_", "").endswith("TensorBoardLogger"):
            extra["purge_step"] = resume_step
        loggers.append(build(node, **extra))
    return loggers


def train(cfg: DictConfig) -> float:
    """Train one model as `cfg` says; return its best validation loss."""
    route_lightning_logs()
    check_targets(cfg)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.tune_malloc:
        keep_freed_memory()
    # configuration checks first: cheap, and they must not wait for a download
    model_config = build(cfg.model)
    optim_config = build(cfg.optim)
    check_ckpt_path(cfg.ckpt_path)
    datamodule = build(cfg.data)

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_config.vocab_size = datamodule.vocab_size
    hparams = GPTModule.hparams_from(model_config, optim_config, datamodule.tokenizer)
    resume_step = None
    if cfg.ckpt_path:
        resume_step = check_checkpoint(cfg.ckpt_path, hparams["model"], hparams["tokenizer"])
    module = GPTModule(**hparams)

    output_dir = Path(cfg.paths.output_dir)
    stats, stop = RunStats(), GracefulStop(output_dir / "checkpoints")
    loggers = build_loggers(cfg, resume_step)
    # an experiment may tune a callback that `callbacks=none` removed: a node without _target_
    callbacks = [build(c) for c in cfg.callbacks.values() if "_target_" in c]
    if not loggers:  # nothing to log the learning rate to (logger=none)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    callbacks += [stats, stop, RngState(), DivergenceGuard()]
    trainer: L.Trainer = build(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=[AtomicCheckpointIO()]
    )
    try:
        return fit(cfg, trainer, module, datamodule, stats, stop)
    finally:
        finish_ddp_job()


def fit(cfg: DictConfig, trainer: L.Trainer, module: GPTModule, datamodule, stats: RunStats,
        stop: GracefulStop) -> float:
    """Fit, validate the final weights, and (rank 0) write metrics.json and the report."""
    output_dir = Path(cfg.paths.output_dir)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    except SIGTERMException:
        if trainer.is_global_zero:
            log.warning(
                "Stopped by %s after step %d; saved %s. Continue this run with:\n  gptlab-train resume=%s",
                stop.signal_name, trainer.global_step, stop.saved, output_dir,
            )
        sys.exit(130 if stop.signal_name == "Ctrl-C" else 143)
    if stats.last_val_step != trainer.global_step:  # the final weights get their own val loss
        trainer.validate(module, datamodule=datamodule, verbose=False)
    final_val_loss = float(trainer.callback_metrics.get("val/loss", math.nan))

    if trainer.is_global_zero:
        metrics = run_metrics(trainer, module, stats, final_val_loss)
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        log_results(trainer, cfg, metrics, output_dir)
        report(cfg, trainer, module, metrics, output_dir)
    return module.best_val_loss


def run_metrics(trainer: L.Trainer, module: GPTModule, stats: RunStats, final_val_loss: float) -> dict:
    best = module.best_val_loss if math.isfinite(module.best_val_loss) else final_val_loss
    device = trainer.strategy.root_device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return {
        "best_val_loss": best,
        "final_val_loss": final_val_loss,
        "best_val_perplexity": math.exp(best) if math.isfinite(best) else math.inf,
        "num_params": module.model.num_params()["total"],
        "steps": trainer.global_step,
        "tokens_seen": stats.tokens_seen,
        "wall_seconds": round(stats.wall_seconds, 3),
        "tokens_per_sec": round(stats.tokens_per_sec, 1),
        "device": f"{name} x{trainer.world_size}",
        "status": "ok",
    }


def report(cfg: DictConfig, trainer: L.Trainer, module: GPTModule, metrics: dict, output_dir: Path) -> None:
    """Tell the user what happened and where everything is."""
    m = metrics
    lines = [
        f"Done: {m['steps']} steps, {m['tokens_seen']:,} tokens in {m['wall_seconds']:.0f} s "
        f"({m['tokens_per_sec']:,.0f} tokens/s on {m['device']}).",
        f"Best val loss {m['best_val_loss']:.4f} (perplexity {m['best_val_perplexity']:.1f}), "
        f"final {m['final_val_loss']:.4f}.",
        f"Run directory: {output_dir}",
    ]
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.best_model_path:
        lines.append(f"Best checkpoint: {checkpoint.best_model_path}")
    if trainer.loggers:
        lines.append(f"TensorBoard: tensorboard --logdir {output_dir}")
    try:
        lines.append(f"Sample: {module.sample(cfg.sample_prompt, max_new_tokens=40)!r}")
    except ConfigError as e:
        lines.append(f"No sample: {e}")
    log.info("\n".join(lines))


def run_job(cfg: DictConfig) -> float:
    """The Hydra task: train, turning bad input into one clear paragraph and exit code 2.

    In a multirun a failed job is recorded in its metrics.json instead and the sweep goes on."""
    from gptlab.sweep import in_multirun, sweep_job

    if in_multirun():
        return sweep_job(train, cfg)
    return run_or_exit(train, cfg, log)


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="train")
def hydra_main(cfg: DictConfig) -> float:
    return run_job(cfg)


def main() -> None:
    """Console entry point `gptlab-train`; `resume=<run dir>` is turned into its overrides first."""
    try:
        sys.argv = resume_argv(sys.argv)
    except ConfigError as e:
        print(f"gptlab-train: {e}", file=sys.stderr)
        sys.exit(2)
    hydra_main()


if __name__ == "__main__":
    main()
