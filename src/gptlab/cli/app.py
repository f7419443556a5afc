"""What every command-line tool shares: the exit-code protocol (gptlab.exits) around Hydra, and
the device it runs on.

Bad input ends in one paragraph and exit code 2. A command line Hydra could not compose never
reaches Hydra (gptlab.cli.compose composes it first), so any exit 1 is the task's own."""

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from gptlab.cli.compose import check_command_line
from gptlab.errors import ConfigError
from gptlab.exits import BAD_INPUT


def run_task(task: Callable[[DictConfig], Any], cfg: DictConfig, log: logging.Logger) -> Any:
    """Run a tool's Hydra task; a ConfigError ends it with its paragraph and exit code 2, and the
    run directory this start made is removed when nothing but its config and log is in it."""
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        remove_failed_start(cfg)
        sys.exit(BAD_INPUT)


def remove_failed_start(cfg: DictConfig) -> None:
    """The stub a fresh start leaves when it fails (never a continued run's directory)."""
    from hydra.core.hydra_config import HydraConfig

    from gptlab.run import directory

    if not HydraConfig.initialized() or cfg.get("resume") or directory.requeued():
        return
    runtime = HydraConfig.get().runtime
    directory.remove_stub(runtime.output_dir, Path(runtime.cwd) / "outputs")


def run_hydra_app(hydra_main: Callable[[], object], tool: str) -> None:
    """Run a `@hydra.main` function once its command line composes and what Hydra builds itself
    is checked (gptlab.cli.compose): a mistake ends before Hydra runs (no run directory is made)
    in one paragraph and exit code 2."""
    try:
        check_command_line(tool, sys.argv)
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
