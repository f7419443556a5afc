"""The one place that knows a run directory's file names (its layout: docs/training.md), whether
this process is a requeued SLURM job, and the run or sweep directory a path lies in."""

import os
import secrets
import time
from pathlib import Path
from typing import Any

from gptlab import reader

CHECKPOINTS = "checkpoints"
LAST = "last"  # checkpoint names without Lightning's .ckpt
BEST = "best"
BRANCH = "branch-step="
CKPT = ".ckpt"
HYDRA = ".hydra"
METRICS = "metrics.json"
# the settings metrics.json holds as its run had them (model.depth derives some: the saved
# config.yaml holds the interpolations), by their column in a sweep's summary.csv
SETTINGS = {
    "d_model": "model.d_model",
    "num_heads": "model.num_heads",
    "num_blocks": "model.num_blocks",
    "dropout": "model.dropout",
    "lr": "optim.lr",
    "batch_size": "data.batch_size",
    "context_length": "data.context_length",
    "max_steps": "trainer.max_steps",
}
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


def saved_config(run_dir: str | Path) -> Path:
    return Path(run_dir) / HYDRA / SAVED_CONFIG


def saved_overrides(run_dir: str | Path) -> Path:
    return Path(run_dir) / HYDRA / SAVED_OVERRIDES


def later_start_subdir() -> str:
    """A later start's config folder, a name that cannot be guessed (no link waits there)."""
    return f"{HYDRA}/resume-{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(4)}"


def requeued() -> bool:
    """This process is a SLURM job that was requeued (preempted or out of time)."""
    return int(os.environ.get(RESTART_COUNT) or 0) > 0


def where(path: str | Path) -> Path:
    """Where `path` lies, the user's ~ expanded and every link on the way followed: the one
    spelling of a place that gptlab compares, checks and keeps."""
    return Path(os.path.realpath(Path(path).expanduser()))


def enclosing_run(path: str | Path) -> Path | None:
    """The run or sweep directory `path` lies in (itself included) where it resolves, or None."""
    place = where(path)
    for folder in (place, *place.parents):
        if any(os.path.lexists(folder / mark) for mark in MARKS):
            return folder
    return None


def manifests(place: Path, parent: bool = True) -> list[tuple[Path, Any]]:
    """The manifest.json files that decide who owns `place` (and its `parent`), read as (folder,
    data): the nearest at or above `place`, and where that is `place`'s own, the next above."""
    found = []
    for folder in (place, *place.parents):
        if os.path.lexists(folder / MANIFEST):
            found.append((folder, reader.read_json(folder / MANIFEST)))
            if folder != place or not parent:
                break
    return found


def saved_by_latest_start(run_dir: Path, name: str) -> Any:
    """A file Hydra saved at the run's latest start that saved it (.hydra/, then each later
    start's .hydra/resume-<time>-<random>/), read as data; None if none did."""
    folder = Path(run_dir) / HYDRA
    starts = [folder, *sorted(p for p in folder.glob("resume-*") if p.is_dir())]
    for start in reversed(starts):
        saved = reader.read_yaml(start / name)
        if saved is not None:
            return saved
    return None


def latest_overrides(run_dir: Path) -> list:
    """The overrides of the run's latest start: what resume= and a branch replay."""
    saved = saved_by_latest_start(run_dir, SAVED_OVERRIDES)
    return [str(o) for o in saved] if isinstance(saved, list) else []
