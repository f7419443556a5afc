"""gptlab's own callbacks of a training run, made once, in the order Lightning calls them (the
end of the run, RunReport, last); the config's own come from its callbacks group."""

from pathlib import Path

import lightning as L
from omegaconf import OmegaConf

from gptlab.run.logs import SpawnedRank
from gptlab.training.callbacks import (
    BranchCheckpoints,
    DivergenceGuard,
    FinalValidation,
    GracefulStop,
    RngState,
    ValidationStep,
)
from gptlab.training.report import RunReport
from gptlab.training.run_stats import RunStats
from gptlab.training.trackers import StepLoggedBeforeSave


def run_callbacks(
    cfg, run_dir: Path, module, length, overrides: list[str], swept: list[str]
) -> list[L.Callback]:
    """gptlab's own callbacks of a run, in the order Lightning calls them: the run's end
    (RunReport, told its job's overrides and those its sweep varies) last."""
    branches = BranchCheckpoints(length.branch_steps, str(run_dir))
    stats = RunStats(length.tokens_per_step, module.model.flops_per_token())
    return [
        SpawnedRank(run_dir),
        stats,
        StepLoggedBeforeSave(),
        ValidationStep(),
        FinalValidation(),
        GracefulStop(),
        RngState(),
        DivergenceGuard(),
        branches,
        RunReport(OmegaConf.to_container(cfg), str(run_dir), stats, overrides, swept),
    ]
