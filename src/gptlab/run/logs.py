"""Where a run's messages go: Lightning's loggers through Hydra's handlers (so they reach the
run's train.log too), warnings only from other DDP ranks, and Lightning's known noise left out."""

import logging
import warnings

from lightning.fabric.utilities.rank_zero import rank_zero_only


def not_an_advert(record: logging.LogRecord) -> bool:
    """Lightning's rank-zero advert for litlogger is dropped."""
    return "litlogger" not in record.getMessage()


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
    rank_zero.addFilter(not_an_advert)  # added once, however many jobs a multirun runs here
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r"The `srun` command is available")  # a local run
