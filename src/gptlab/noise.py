"""What Lightning says that tells a gptlab user nothing, by its exact text: warnings ignored in
every process (spawned DDP ranks import gptlab too), log messages gptlab.run.logs leaves out."""

import logging
import re
import warnings

KNOWN_WARNINGS = (
    # Lightning on torch 2.13: a deprecation inside Lightning's own code
    r".*isinstance\(treespec, LeafSpec\)",
    # a run outside SLURM on a host that has SLURM installed (SLURM runs go through srun)
    r"The `srun` command is available",
    # gptlab sums val and test losses across ranks itself before logging them (GPTModule.summed):
    # val/loss, a mixture's val/<source>/loss, and its values at the best, best/val/<source>/loss
    r"It is recommended to use `self\.log\('(best/)?(val|test)/[A-Za-z0-9_/-]+', \.\.\., "
    r"sync_dist=True\)` "
    r"when logging on epoch level in distributed setting",
)
KNOWN_MESSAGES = (
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


def ignore_known_warnings() -> None:
    for pattern in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)


def not_noise(record: logging.LogRecord) -> bool:
    """A log filter: Lightning's known messages (KNOWN_MESSAGES) are dropped."""
    message = record.getMessage()
    return not any(pattern.match(message) for pattern in KNOWN_MESSAGES)
