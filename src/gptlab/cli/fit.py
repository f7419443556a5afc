"""gptlab-train's task: one run, built in the order data flows, each part once from the config
resolved once, nothing patched after it is built (docs/architecture.md); every input is checked
before the corpus is touched."""

import logging

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from gptlab.cli.app import check_accelerator, check_logins
from gptlab.cli.build import build, build_module, build_trainer, build_writers
from gptlab.config.knob import provenance
from gptlab.config.resolve import resolved
from gptlab.run.logs import route_lightning_logs
from gptlab.run.resume import starting_point
from gptlab.run.screen import print_first_screen
from gptlab.run.start import Plan
from gptlab.sweep.jobs import job_overrides, swept_overrides
from gptlab.training.budget import run_length
from gptlab.training.fitting import fit
from gptlab.training.report import run_callbacks
from gptlab.training.run_stats import RunStats

log = logging.getLogger("gptlab.train")


def train(cfg: DictConfig, plan: Plan) -> float:
    """Train one model as `cfg` says, from where `plan` starts it (gptlab.run.start: its caller,
    the job, planned the start); return its best validation loss."""
    # this machine, the config resolved once, what the start's checkpoint or folder holds and
    # what the config builds: all checked before any download
    route_lightning_logs()
    check_accelerator(cfg.trainer.get("accelerator"))
    check_logins(cfg.logger)
    knob = provenance(cfg)  # what model.depth derived and what was given: read unresolved
    rules, knob_lines = knob.record(), knob.screen_lines()
    cfg = resolved(cfg)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    run_dir = plan.run_dir  # made and checked before Hydra wrote (run/admission.py)
    start = starting_point(plan, cfg.data)
    writers = build_writers(cfg, run_dir, start)  # the config's loggers and callbacks, checked
    model, optim, datamodule = (build(cfg[group], group) for group in ("model", "optim", "data"))

    # the data: the corpus tokenized once and split; the vocabulary known
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule.prepare_data()
    datamodule.setup("fit")

    # the model, its settings final (init_from: the folder's architecture), built once
    module = build_module(model, optim, datamodule.tokenizer, datamodule.batch_size, start)

    # the run's length, then the Trainer built once with it
    flops = module.model.flops_per_token()
    length = run_length(cfg, flops, module.optim, plan.branch, derived_for=knob.ranks)
    cfg = OmegaConf.merge(cfg, {"trainer": {"max_steps": length.max_steps}})  # as shown
    stats = RunStats(length.tokens_per_step, flops)
    callbacks = run_callbacks(
        cfg, run_dir, stats, length, job_overrides(), swept_overrides(), plan.branch, rules
    )
    trainer = build_trainer(cfg, run_dir, length, writers, callbacks)
    if trainer.is_global_zero:
        print_first_screen(cfg, module.model, run_dir, datamodule, trainer, knob_lines)

    return fit(trainer, module, datamodule, start, run_dir)
