"""What every command-line tool shares: the exit-code protocol (gptlab.exits) around Hydra, and
the device it runs on."""

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from gptlab.cli.compose import check_command_line, output_place
from gptlab.errors import ConfigError
from gptlab.exits import BAD_INPUT
from gptlab.run import place
from gptlab.run.ownership import RUN, SWEEP


def run_task(task: Callable[[DictConfig], Any], cfg: DictConfig, log: logging.Logger) -> Any:
    """A tool's Hydra task; a ConfigError ends it with exit code 2, its start's stub removed."""
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        if os.environ.get(place.OUTPUT_DIR):
            place.undo(os.environ[place.OUTPUT_DIR])
        sys.exit(BAD_INPUT)


def run_hydra_app(hydra_main: Callable[[], object], tool: str) -> None:
    """Run a `@hydra.main` function once its command line is checked (gptlab.cli.compose) and its
    output directory made (gptlab.run.place): a mistake ends before Hydra runs, exit code 2."""
    try:
        composed = check_command_line(tool, sys.argv)
        if composed is not None and not composed[0].get("resume"):
            cfg, multirun = composed  # resume= found its directory own already
            where, key = output_place(cfg, multirun)
            kind = None if tool != "gptlab-train" else SWEEP if multirun else RUN
            sys.argv = [*sys.argv, place.prepare(where, key, kind)]
    except ConfigError as e:
        print(f"{tool}: {e}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    hydra_main()


def resolve_device(device: str) -> str:
    """auto -> cuda when available, else cpu. The name is checked before torch is imported."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device={device!r}: choose one of auto, cpu, cuda.")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device=cuda: torch sees no CUDA device here. Use device=cpu or device=auto."
        )
    return "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"


def check_accelerator(accelerator: str | None) -> None:
    """trainer=gpu (or ddp) where torch sees no GPU: trainer=cpu named, before any data work."""
    if str(accelerator) not in ("gpu", "cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={accelerator} (trainer=gpu, trainer=ddp): torch "
            f"{torch.__version__} sees no CUDA GPU here. Train on the CPU with trainer=cpu "
            "(trainer=ddp_cpu: two CPU processes), or trainer=default, which takes a GPU "
            "where there is one."
        )
