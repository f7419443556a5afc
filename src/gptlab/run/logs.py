"""Where a run's messages go: Lightning's through Hydra's handlers (into train.log), only
warnings from other ranks, known noise left out; a log of their own for spawned DDP ranks."""

import logging
import re
import sys
import warnings
from pathlib import Path

import lightning as L

from gptlab.noise import ignore_known_warnings, not_noise
from gptlab.process import rank
from gptlab.run import directory
from gptlab.run.place import PLACE


def route_lightning_logs() -> None:
    """Lightning installs its own stderr handlers when imported before Hydra sets up logging;
    send its messages through Hydra's handlers instead, so they also reach the run's log file."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    if rank() > 0:  # a DDP rank other than 0: only warnings reach the shared log
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.WARNING)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero.addFilter(not_noise)  # added once, however many jobs a multirun runs here
    ignore_known_warnings()  # again: Hydra or a test may have reset the filters since import


def own_checkpoint_dir(path: str | Path) -> None:
    """No warning from Lightning's ModelCheckpoint that the run's own checkpoints/ "exists and is
    not empty" (a resume's, a requeue's): a fresh start over another run's is refused before."""
    text = f"Checkpoint directory {path} exists and is not empty."
    warnings.filterwarnings("ignore", message=re.escape(text) + r"\Z")


class SpawnedRank(L.Callback):
    """A DDP process Lightning spawned has no Hydra logging, and no places of its own: the run
    directory its parent admitted; train.log and stderr for rank 0's (its validation lines and
    the report), as Hydra formats them."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)

    def setup(self, trainer, pl_module, stage: str) -> None:
        PLACE.enter(self.run_dir)
        if trainer.is_global_zero and not logging.getLogger().handlers:
            logging.basicConfig(
                format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",
                level=logging.INFO,
                handlers=[
                    logging.FileHandler(self.run_dir / directory.TRAIN_LOG),
                    logging.StreamHandler(sys.stderr),
                ],
            )
