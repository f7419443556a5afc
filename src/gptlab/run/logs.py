"""Where a run's messages go: Lightning's loggers through Hydra's handlers (so they reach the
run's train.log too), warnings only from other DDP ranks, and Lightning's known noise left out."""

import logging
import re
import warnings
from pathlib import Path

from lightning.fabric.utilities.rank_zero import rank_zero_only

from gptlab.noise import ignore_known_warnings

# Lightning's messages that tell a gptlab user nothing, by their exact text
NOISE = (
    # adverts for Lightning's cloud services (litlogger, litmodels)
    re.compile(
        r"💡 Tip: For seamless cloud (logging and experiment tracking|uploads and versioning)"
    ),
    # gptlab's callbacks group configures the model summary on purpose
    re.compile(
        r"Trainer already configured with model summary callbacks: \[.*\]\. "
        r"Skipping setting a default `ModelSummary` callback\.\Z"
    ),
    # a limit that is the default (gptlab-eval passes the run's own)
    re.compile(
        r"`Trainer\(limit_(train|val|test|predict)_batches=1(\.0)?\)` was configured so "
        r"(1 batch|100% of the batches)( per epoch)? will be used\.+\Z"
    ),
)


def not_noise(record: logging.LogRecord) -> bool:
    """Lightning's known noise (NOISE) is dropped."""
    message = record.getMessage()
    return not any(pattern.match(message) for pattern in NOISE)


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
    rank_zero.addFilter(not_noise)  # added once, however many jobs a multirun runs here
    ignore_known_warnings()  # again: Hydra or a test may have reset the filters since import


def own_checkpoint_dir(path: str | Path) -> None:
    """No warning from Lightning's ModelCheckpoint that the run's own checkpoints/ "exists and is
    not empty" (a resume's, a requeue's): a fresh start over another run's is refused before."""
    text = f"Checkpoint directory {path} exists and is not empty."
    warnings.filterwarnings("ignore", message=re.escape(text) + r"\Z")
