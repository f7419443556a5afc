"""A FLOP budget decides a run's length (`flops_budget`): the number of optimizer steps whose
training FLOPs, flops_per_token x the tokens of every rank, come closest to it. What a run of a
budget reports for a scaling-law fit joins metrics.json (see `budget_metrics`)."""

import logging

import lightning as L

from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.training.module import flops_per_token, scaling_params

log = logging.getLogger("gptlab.train")


def tokens_per_step(trainer: L.Trainer, datamodule) -> int:
    """The tokens of one optimizer step over every rank: batch x context x accumulated batches x
    world size."""
    per_batch = datamodule.batch_size * datamodule.context_length
    return per_batch * trainer.accumulate_grad_batches * trainer.world_size


def steps_for_budget(budget: float, flops: int, tokens: int) -> int:
    """round(budget / (flops per token x tokens per step)); a budget too small for one step, or
    not positive, is bad input."""
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


def apply_budget(trainer: L.Trainer, budget: float, model: GPTConfig, datamodule) -> int:
    """Set the trainer's max_steps from the budget (the model's vocab_size and the trainer's world
    size known); the schedule follows it (trainer.estimated_stepping_batches). Returns the
    steps."""
    steps = steps_for_budget(budget, flops_per_token(model), tokens_per_step(trainer, datamodule))
    if trainer.max_steps not in (-1, steps):
        log.info(
            "flops_budget=%g decides the run's length: %d steps (not trainer.max_steps=%d)",
            budget,
            steps,
            trainer.max_steps,
        )
    trainer.fit_loop.epoch_loop.max_steps = steps  # what trainer.max_steps reads
    return steps


def unique_train_tokens(datamodule) -> int:
    """How many tokens the train split holds: the denominator of `epochs`."""
    return len(datamodule.train_tokens)


def budget_metrics(cfg: dict, trainer: L.Trainer, pl_module, tokens: int) -> dict:
    """What a scaling-law fit reads from metrics.json: the budget (None without one), the
    training FLOPs, the parameters whose FLOPs grow with tokens (the blocks' matrices and the
    head: no embeddings, norms or biases) and the passes over the train split."""
    unique = unique_train_tokens(trainer.datamodule) if trainer.datamodule is not None else 0
    return {
        "flops_budget": cfg.get("flops_budget"),
        "train_flops": flops_per_token(pl_module.config) * tokens,
        "scaling_params": scaling_params(pl_module.config),
        "epochs": tokens / unique if unique else None,
    }
