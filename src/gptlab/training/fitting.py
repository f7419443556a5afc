"""trainer.fit as a run calls it, and what the run reached: a stop (SIGTERM, Ctrl-C) ends the
process with its exit code and the command that continues it."""

import contextlib
import logging
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tqdm.contrib.logging import logging_redirect_tqdm

from gptlab.exits import code_of_signal
from gptlab.process import sigterm_passes
from gptlab.run.place import PLACE, sweep_dir
from gptlab.training.callbacks import GracefulStop

log = logging.getLogger("gptlab.train")


def fit(trainer: L.Trainer, module, datamodule, start, run_dir: Path) -> float:
    """trainer.fit, from the own checkpoint `start` names (Lightning restores it whole), its
    progress bars beside the log lines; then the best validation loss."""
    console = logging_redirect_tqdm() if trainer.is_global_zero else contextlib.nullcontext()
    ckpt_path = start.ckpt_path if start.whole else None
    PLACE.commit()  # training begins: what the run makes is its result
    try:
        with console, sigterm_passes():  # Lightning's graceful stop takes SIGTERM
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:
        stop = next(c for c in trainer.callbacks if isinstance(c, GracefulStop))
        if trainer.is_global_zero:
            where = sweep_dir() or run_dir  # a sweep's job continues with its sweep
            log.warning(
                f"Stopped by {stop.signal_name} after step {trainer.global_step}; saved its last "
                f"checkpoint. Continue with:\n  gptlab-train resume={where}"
            )
        sys.exit(code_of_signal(stop.signal_name))
    return best_val_loss(trainer, module)


def best_val_loss(trainer: L.Trainer, module) -> float:
    """The module's best val loss, which a spawned DDP rank hands back as val/best_loss (none
    when resumed after the last step: then the module's own, from its checkpoint)."""
    best = trainer.callback_metrics.get("val/best_loss")
    return float(module.best_val_loss if best is None else best)
