"""gptlab-train's task: one run, built in the order data flows, nothing patched after it is
built (docs/architecture.md); every input is checked before the corpus is touched."""

import logging

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from gptlab.cli.app import check_accelerator, check_logins
from gptlab.cli.trainer import build_trainer
from gptlab.config.build import build, resolved
from gptlab.run.logs import route_lightning_logs
from gptlab.run.place import PLACE
from gptlab.run.resume import starting_point
from gptlab.run.screen import print_first_screen
from gptlab.training.budget import run_length
from gptlab.training.fitting import fit
from gptlab.training.module import build_module

log = logging.getLogger("gptlab.train")


def train(cfg: DictConfig) -> float:
    """Train one model as `cfg` says; return its best validation loss."""
    # this machine, the config resolved once and what it builds, where the run writes, and where
    # it starts from: all checked before any download
    route_lightning_logs()
    check_accelerator(cfg.trainer.get("accelerator"))
    check_logins(cfg.logger)
    cfg = resolved(cfg)
    model, optim, datamodule = (build(cfg[group], group) for group in ("model", "optim", "data"))
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    run_dir = PLACE.check_config(OmegaConf.to_container(cfg))
    start = starting_point(cfg, run_dir)

    # the data: the corpus tokenized once and split; the vocabulary known
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule.prepare_data()
    datamodule.setup("fit")

    # the model, its settings final (init_from: the folder's architecture), built once
    module = build_module(model, optim, datamodule.tokenizer, datamodule.batch_size, start)

    # the run's length, then the Trainer built once with it
    length = run_length(cfg, module.model.flops_per_token(), module.optim)
    cfg = OmegaConf.merge(cfg, {"trainer": {"max_steps": length.max_steps}})  # as shown
    trainer = build_trainer(cfg, run_dir, module, start, length)
    if trainer.is_global_zero:
        print_first_screen(cfg, module.model, run_dir, datamodule)

    return fit(trainer, module, datamodule, start, run_dir)
