"""The one place that knows a run directory's file names (its layout: docs/training.md), whether
a start continues the run in it, and fresh runs kept off other runs."""

import os
import secrets
import time
from pathlib import Path

from gptlab.errors import ConfigError

CHECKPOINTS = "checkpoints"
LAST = "last"  # checkpoint names without Lightning's .ckpt
BEST = "best"
BRANCH = "branch-step="
CKPT = ".ckpt"
HYDRA = ".hydra"
METRICS = "metrics.json"
EVAL = "eval.json"
TRAIN_LOG = "train.log"
CONFIG_TREE = "config_tree.log"
SAVED_CONFIG = "config.yaml"
SAVED_OVERRIDES = "overrides.yaml"
MULTIRUN = "multirun.yaml"
MANIFEST = "manifest.json"
TENSORBOARD = "tensorboard"
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
# What marks a folder as a run or sweep directory of gptlab (or of any Hydra app)
MARKS = (MANIFEST, HYDRA, MULTIRUN)
# A Hydra job of a SLURM job that was requeued: it continues its run like resume= does.
RESTART_COUNT = "SLURM_RESTART_COUNT"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def last_checkpoint(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / f"{LAST}{CKPT}"


def best_checkpoint(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / f"{BEST}{CKPT}"


def branch_checkpoint(run_dir: str | Path, step: int) -> Path:
    """A wsd run's kept stable-phase checkpoint at `step` (optim.branch_at), for its branches."""
    return checkpoint_dir(run_dir) / f"{BRANCH}{step}{CKPT}"


def tensorboard_run(run_dir: str | Path) -> Path:
    """tensorboard/, or the folder in it a sweep's job is named by (tensorboard_version)."""
    folder = Path(run_dir) / TENSORBOARD
    if not folder.is_dir():
        return folder
    named = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    return named[0] if named else folder


def metrics_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / METRICS


def saved_config(run_dir: str | Path, start: str = HYDRA) -> Path:
    return Path(run_dir) / start / SAVED_CONFIG


def saved_overrides(run_dir: str | Path, start: str = HYDRA) -> Path:
    return Path(run_dir) / start / SAVED_OVERRIDES


def later_start_subdir() -> str:
    """A later start's config folder, a name that cannot be guessed (no link waits there)."""
    return f"{HYDRA}/resume-{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(4)}"


def requeued() -> bool:
    """This process is a SLURM job that was requeued (preempted or out of time)."""
    return int(os.environ.get(RESTART_COUNT) or 0) > 0


def continues(run_dir: str | Path, resume) -> bool:
    """resume= (of the run or its sweep) or a SLURM requeue, and a last.ckpt to continue from."""
    return bool(resume or requeued()) and last_checkpoint(run_dir).is_file()


def holds_run(run_dir: str | Path) -> bool:
    results = (last_checkpoint(run_dir), best_checkpoint(run_dir), metrics_file(run_dir))
    return any(p.is_file() for p in results)


def enclosing_run(path: str | Path) -> Path | None:
    """The run or sweep directory `path` lies in (itself included) where it resolves, or None."""
    place = Path(os.path.realpath(path))
    for folder in (place, *place.parents):
        if any(os.path.lexists(folder / mark) for mark in MARKS):
            return folder
    return None


def is_new_or_empty(place: Path) -> bool:
    """Nothing is there yet: no path, or an empty folder (not a link)."""
    if not place.exists() and not place.is_symlink():
        return True
    return place.is_dir() and not place.is_symlink() and not any(place.iterdir())


def refuse_fresh_run_over(run_dir: str | Path) -> None:
    """A fresh start would replace a run's checkpoints and results: refused, with the ways on."""
    if holds_run(run_dir):
        raise ConfigError(
            f"The directory '{run_dir}' already holds a run (its checkpoints or metrics.json); "
            "a fresh start would replace them. Continue it with `gptlab-train "
            f"resume={run_dir}`, or start a new run in a new directory (drop hydra.run.dir, or "
            "give one that does not hold a run)."
        )


def is_stub(run_dir: Path) -> bool:
    """Nothing but what a start writes before its first step (configs, logs, manifest; no link)."""
    if not run_dir.is_dir() or run_dir.is_symlink():
        return False
    hydra = run_dir / HYDRA
    saved = list(hydra.iterdir()) if hydra.is_dir() and not hydra.is_symlink() else []
    others = [p for p in run_dir.iterdir() if p.name not in (HYDRA, MANIFEST)]
    logs = all(p.suffix == ".log" and p.is_file() and not p.is_symlink() for p in others)
    return logs and {p.name for p in saved} <= set(HYDRA_FILES) and not hydra.is_symlink()
