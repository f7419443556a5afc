"""gptlab-train's task: one run, built in the order data flows, nothing patched after it is
built (docs/architecture.md); every input is checked before the corpus is touched."""

import logging
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from gptlab.cli.app import check_accelerator
from gptlab.cli.trainer import build_trainer
from gptlab.config.trust import build, checked
from gptlab.model.config import GPTConfig
from gptlab.run import place
from gptlab.run.logs import route_lightning_logs
from gptlab.run.resume import starting_point
from gptlab.run.screen import print_first_screen
from gptlab.training.budget import run_length
from gptlab.training.fitting import fit
from gptlab.training.module import build_module

log = logging.getLogger("gptlab.train")


def train(cfg: DictConfig) -> float:
    """Train one model as `cfg` says; return its best validation loss."""
    # the checked config (built first: cheap) and where this run starts from, before any download
    route_lightning_logs()
    check_accelerator(cfg.trainer.get("accelerator"))  # this machine's, before anything is built
    cfg = checked(cfg)  # resolved once and checked: what is built below
    model, optim, datamodule = (build(cfg[group], group) for group in ("model", "optim", "data"))
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    place.check_data_places(cfg.data.data_dir, cfg.data.cache_dir)
    run_dir = Path(cfg.paths.output_dir)
    place.claim(run_dir)  # this start recorded in its directory before it writes there
    start = starting_point(cfg, run_dir)
    if start.init:  # init_from: the folder's architecture, the run's own training settings
        model = replace(model, **{k: start.init.model[k] for k in GPTConfig.architecture()})

    # the data: the corpus tokenized once and split; the vocabulary known
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule.prepare_data()
    datamodule.setup("fit")

    # the model, its settings final
    module = build_module(model, optim, datamodule.tokenizer, datamodule.batch_size, start)
    if start.init:
        module.load_state_dict(start.init.weights)
        log.info("Starting from the weights of init_from=%s", cfg.init_from)

    # the run's length, then the Trainer built once with it
    length = run_length(cfg, module.model.flops_per_token(), module.optim)
    cfg = OmegaConf.merge(cfg, {"trainer": {"max_steps": length.max_steps}})  # as shown
    trainer = build_trainer(cfg, run_dir, module, start, length)
    if trainer.is_global_zero:
        print_first_screen(cfg, module.model, run_dir, datamodule)

    return fit(trainer, module, datamodule, start.ckpt_path, run_dir)
