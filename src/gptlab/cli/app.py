"""What every command-line tool shares: the exit-code protocol, and the device it runs on.

Bad input ends in one paragraph and exit code 2. Hydra ends a command line it cannot compose
(unknown key or option, wrong type) with exit code 1, before any task starts; `run_hydra_app`
turns that 1 into 2, but only while no task has started. Once Hydra has handed a composed config
to a task, every exit code is the task's own (1: a sweep's job failed, 130/143: stopped), so
whatever starts a task calls `mark_task_started()`, the flag's only writer: `run_task` (each
tool's task), `gptlab.sweep.jobs.sweep_job` (a job of a multirun) and
`gptlab.sweep.summary.SweepSummary` (a sweep's verdict)."""

import logging
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from gptlab.errors import ConfigError

task_started = False  # see above; set by mark_task_started() only


def mark_task_started() -> None:
    """Hydra composed the config and a task runs: its exit codes are its own from here on."""
    global task_started
    task_started = True


def run_task(task: Callable[[DictConfig], Any], cfg: DictConfig, log: logging.Logger) -> Any:
    """Run a tool's Hydra task; a ConfigError ends it with its paragraph and exit code 2."""
    mark_task_started()
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(2)


def run_hydra_app(hydra_main: Callable[[], object], tool: str) -> None:
    """Run a `@hydra.main` function; Hydra's exit 1 for a config it cannot compose becomes exit 2
    with a pointer to `--help` (Hydra has printed the error, without a traceback)."""
    try:
        hydra_main()
    except SystemExit as e:
        if e.code == 1 and not task_started:
            print(
                f"{tool}: the configuration above cannot be composed; `{tool} --help` lists the "
                "groups, options and keys.",
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
