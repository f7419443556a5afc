"""The run directory: its layout, whether a start continues the run in it, and fresh runs kept
off other runs.

The one place that knows a run's file names (nanochat's checkpoint_manager is the shape): every
other module asks here. Whether a directory may be continued at all (own or foreign) is
gptlab.run.ownership's.

  <run dir>/
    manifest.json      what gptlab wrote here for this user, signed (gptlab.run.ownership)
    .hydra/            config.yaml, overrides.yaml, hydra.yaml; .hydra/resume-<time>-<random>/
                       for each later start
    checkpoints/       best.ckpt (lowest val/loss), last.ckpt (everything a resume needs)
    tensorboard/       the curves: one TensorBoard run (a sweep's job: tensorboard/<its settings>/)
    metrics.json       the results (written at the end of fit)
    train.log, config_tree.log, eval.json
"""

import os
import secrets
import shutil
import time
from pathlib import Path

from gptlab.errors import ConfigError

CHECKPOINTS = "checkpoints"
LAST = "last"  # checkpoint names without Lightning's .ckpt
BEST = "best"
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
# Folders gptlab writes into: a symlink there would take the writes out, so it is refused.
FOLDERS = (CHECKPOINTS, HYDRA, TENSORBOARD)
# A Hydra job of a SLURM job that was requeued: it continues its run like resume= does.
RESTART_COUNT = "SLURM_RESTART_COUNT"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def last_checkpoint(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / f"{LAST}{CKPT}"


def best_checkpoint(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / f"{BEST}{CKPT}"


def tensorboard_run(run_dir: str | Path) -> Path:
    """The folder of the run's TensorBoard run: tensorboard/, or the one in it that a sweep's job
    is named by (gptlab.sweep.jobs.tensorboard_version)."""
    folder = Path(run_dir) / TENSORBOARD
    named = (
        [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()]
        if folder.is_dir()
        else []
    )
    return sorted(named)[0] if named else folder


def metrics_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / METRICS


def saved_config(run_dir: str | Path, start: str = HYDRA) -> Path:
    return Path(run_dir) / start / SAVED_CONFIG


def saved_overrides(run_dir: str | Path, start: str = HYDRA) -> Path:
    return Path(run_dir) / start / SAVED_OVERRIDES


def later_start_subdir() -> str:
    """Where a later start of a run (a resume, a requeue, a sweep's resume) saves its config,
    beside the first start's: a new folder whose name cannot be guessed (no link planted under it
    waits there)."""
    return f"{HYDRA}/resume-{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(4)}"


def requeued() -> bool:
    """This process is a SLURM job that was requeued (preempted or out of time)."""
    return int(os.environ.get(RESTART_COUNT) or 0) > 0


def continues(run_dir: str | Path, resume) -> bool:
    """Does this start continue the run in `run_dir`: resume= (of the run, or of its sweep) or a
    SLURM requeue, and a last.ckpt to continue from."""
    return bool(resume or requeued()) and last_checkpoint(run_dir).is_file()


def holds_run(run_dir: str | Path) -> bool:
    """A run has trained here: a checkpoint or its results."""
    return (
        any(p.is_file() for p in (last_checkpoint(run_dir), best_checkpoint(run_dir)))
        or metrics_file(run_dir).is_file()
    )


def refuse_linked_folders(run_dir: str | Path) -> None:
    """A folder of the run that is a symlink would take the run's writes elsewhere."""
    for name in FOLDERS:
        if (Path(run_dir) / name).is_symlink():
            raise ConfigError(
                f"The run directory '{run_dir}' holds '{name}' as a symlink (to "
                f"'{os.readlink(Path(run_dir) / name)}'); gptlab writes there, so it would write "
                "outside the run. Replace the link by a folder, or use another directory."
            )


def secure(run_dir: str | Path) -> None:
    """Before a run writes into `run_dir`: refuse linked folders and remove the temporary files a
    kill during a write left behind (every file is written under a temporary name first)."""
    run_dir = Path(run_dir)
    refuse_linked_folders(run_dir)
    for folder in (run_dir, checkpoint_dir(run_dir)):
        for stale in folder.glob(".*.tmp"):
            stale.unlink()


def is_new_or_empty(place: Path) -> bool:
    """Nothing is there yet: no path, or an empty folder (not a link)."""
    if not place.exists() and not place.is_symlink():
        return True
    return place.is_dir() and not place.is_symlink() and not any(place.iterdir())


def refuse_fresh_run_over(run_dir: str | Path) -> None:
    """A fresh start into a directory that holds a run would replace its checkpoints and
    results: refuse it, naming the two ways on."""
    if holds_run(run_dir):
        raise ConfigError(
            f"The directory '{run_dir}' already holds a run (its checkpoints or metrics.json); "
            "a fresh start would replace them. Continue it with `gptlab-train "
            f"resume={run_dir}`, or start a new run in a new directory (drop hydra.run.dir, or "
            "give one that does not hold a run)."
        )


def is_stub(run_dir: Path) -> bool:
    """Nothing but what a start writes before its first step: its saved config (.hydra/), its
    log and its manifest."""
    hydra = run_dir / HYDRA
    if not run_dir.is_dir() or run_dir.is_symlink() or hydra.is_symlink():
        return False
    saved = sorted(p.name for p in hydra.iterdir()) if hydra.is_dir() else []
    others = [p for p in run_dir.iterdir() if p.name not in (HYDRA, MANIFEST)]
    logs = all(p.suffix == ".log" and p.is_file() and not p.is_symlink() for p in others)
    return logs and set(saved) <= set(HYDRA_FILES)


def remove_stub(run_dir: str | Path, stop: str | Path) -> None:
    """Remove a failed start's run directory when it is a stub (never one that holds a run), and
    the folders above it that are left empty, up to `stop` (./outputs)."""
    run_dir = Path(run_dir)
    if not is_stub(run_dir):
        return
    shutil.rmtree(run_dir)
    stop = Path(stop).resolve()
    for parent in run_dir.resolve().parents:
        if parent == stop or not parent.is_relative_to(stop) or any(parent.iterdir()):
            break
        parent.rmdir()
