"""A run's length and its tokens per optimizer step over every rank: known before the Trainer
is built, so it is built once with its max_steps."""

import logging
from dataclasses import replace
from typing import NamedTuple

from omegaconf import DictConfig

from gptlab.errors import ConfigError
from gptlab.run.start import Branch
from gptlab.training.optim_config import (
    OptimConfig,
    branch_length,
    branch_steps,
    check_schedule,
)

log = logging.getLogger("gptlab.train")


def world_size(trainer: DictConfig) -> int:
    """The processes a Trainer of these settings trains on, counted as Lightning counts them."""
    from lightning.pytorch.accelerators import AcceleratorRegistry, CUDAAccelerator, MPSAccelerator

    name = str(trainer.get("accelerator") or "auto")
    if name in ("auto", "gpu"):
        gpu = "cuda" if CUDAAccelerator.is_available() else "mps"
        name = gpu if CUDAAccelerator.is_available() or MPSAccelerator.is_available() else "cpu"
    accelerator = AcceleratorRegistry.get(name)
    devices = trainer.get("devices", "auto")
    if devices in ("auto", -1, "-1"):
        count = accelerator.auto_device_count()
    else:
        count = len(accelerator.get_parallel_devices(accelerator.parse_devices(devices)))
    return count * int(trainer.get("num_nodes") or 1)


def tokens_per_step(cfg: DictConfig, ranks: int) -> int:
    accumulated = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    return cfg.data.batch_size * cfg.data.context_length * accumulated * ranks


def steps_for_budget(budget: float, flops: int, tokens: int) -> int:
    steps = round(budget / (flops * tokens)) if budget > 0 else 0
    if steps < 1:
        raise ConfigError(
            f"flops_budget={budget:g}: one optimizer step of this model already costs "
            f"{flops * tokens:.3g} FLOPs ({flops:,} per token x {tokens:,} tokens a step over "
            "every rank), so the budget buys no step. Raise flops_budget to at least "
            f"{flops * tokens:.3g} (one step), or make the model or the batch smaller "
            "(model.d_model, model.num_blocks, data.batch_size)."
        )
    return steps


class Length(NamedTuple):
    max_steps: int
    tokens_per_step: int  # over every rank
    ranks: int  # the processes it was counted for
    branch_steps: tuple[int, ...]  # where a wsd run keeps checkpoints for its branches


def run_length(
    cfg: DictConfig,
    flops_per_token: int,
    optim: OptimConfig,
    branch: Branch | None = None,
    derived_for: int | None = None,
) -> Length:
    """trainer.max_steps, or the steps flops_budget buys, or a branch's (its plan's step: the wsd
    run whose cooldown starts there), said when they differ; `optim`'s schedule checked, and the
    processes model.depth derived the batch for (`derived_for`) against Lightning's count."""
    ranks = world_size(cfg.trainer)
    if derived_for not in (None, ranks):
        raise ConfigError(
            f"model.depth: its rules split the batch over {derived_for} process(es) "
            f"(trainer.devices x trainer.num_nodes), but this Trainer runs {ranks} (devices=auto "
            f"on a machine with GPUs, say). Give trainer.devices={ranks} (or the count you mean) "
            "so the batch, steps and learning rate are derived for it."
        )
    tokens = tokens_per_step(cfg, ranks)
    steps, why = cfg.trainer.max_steps, None
    if cfg.flops_budget is not None:
        steps = steps_for_budget(cfg.flops_budget, flops_per_token, tokens)
        why = f"flops_budget={cfg.flops_budget:g}"
    if branch:  # a branch's length wins: its trunk's schedule, cooled from there
        steps, why = branch_length(optim, branch.step), f"branch_step={branch.step}"
        optim = replace(optim, branch_at=[])  # a branch keeps no branches of its own
    if why and cfg.trainer.max_steps not in (-1, steps):
        log.info(
            f"{why} decides the run's length: {steps} steps (not "
            f"trainer.max_steps={cfg.trainer.max_steps})"
        )
    check_schedule(optim, steps)
    return Length(steps, tokens, ranks, tuple(branch_steps(optim, steps)))
