"""Lightning's warnings that tell a gptlab user nothing, ignored by their exact text in every
process that imports gptlab. The spawned ranks of DDP are new interpreters that never run a
run's log set-up (gptlab.run.logs), but they import gptlab when they unpickle the trainer, so
this is where their filters come from too."""

import warnings

KNOWN_WARNINGS = (
    # Lightning on torch 2.13: a deprecation inside Lightning's own code
    r".*isinstance\(treespec, LeafSpec\)",
    # a run outside SLURM on a host that has SLURM installed (SLURM runs go through srun)
    r"The `srun` command is available",
    # gptlab sums val and test losses across ranks itself before logging them (exact_means)
    r"It is recommended to use `self\.log\('(val|test)/[a-z_]+', \.\.\., sync_dist=True\)` "
    r"when logging on epoch level in distributed setting",
)


def ignore_known_warnings() -> None:
    for pattern in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
