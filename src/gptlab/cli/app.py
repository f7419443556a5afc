"""What every command-line tool shares: a Hydra task whose bad input ends in one paragraph and
exit code 2, and the device it runs on."""

import logging
import sys
from collections.abc import Callable

from gptlab.errors import ConfigError


class Task:
    started = False  # set once Hydra hands a composed config to a task


def run_or_exit(task, cfg, log: logging.Logger):
    """Run a tool's Hydra task; a ConfigError ends it with its paragraph and exit code 2."""
    Task.started = True
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(2)


def main_or_exit(hydra_main: Callable[[], object], tool: str) -> None:
    """Run a `@hydra.main` function. A config Hydra cannot compose (unknown key or option, wrong type)
    exits 1 before any task starts, reported without a traceback; gptlab makes that exit code 2."""
    try:
        hydra_main()
    except SystemExit as e:
        if e.code == 1 and not Task.started:
            print(
                f"{tool}: the configuration above cannot be composed; `{tool} --help` lists the groups, "
                "options and keys.",
                file=sys.stderr,
            )
            sys.exit(2)
        raise


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
