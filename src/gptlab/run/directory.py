"""The run directory: its layout, whether a start continues the run in it, and safe writes into it.

The one place that knows a run's file names (nanochat's checkpoint_manager is the shape): every
other module asks here. A run directory may come from someone else (a colleague's, a download),
so a write never follows a symlink out of it, and a fresh run never lands on top of another.

  <run dir>/
    .hydra/            config.yaml, overrides.yaml, hydra.yaml; resume-<time>/ for each resume
    checkpoints/       best.ckpt (lowest val/loss), last.ckpt (everything a resume needs)
    tensorboard/       the curves
    metrics.json       the results (written at the end of fit)
    train.log, config_tree.log, eval.json
"""

import logging
import os
import tempfile
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
# What gptlab writes or appends to: a symlink there is replaced by a file of the run's own.
WRITTEN = (METRICS, EVAL, TRAIN_LOG, CONFIG_TREE)
# Folders gptlab writes into: a symlink there would take the writes out, so it is refused.
FOLDERS = (CHECKPOINTS, HYDRA, "tensorboard")
# A Hydra job of a SLURM job that was requeued: it continues its run like resume= does.
RESTART_COUNT = "SLURM_RESTART_COUNT"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def last_checkpoint(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / f"{LAST}{CKPT}"


def best_checkpoint(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / f"{BEST}{CKPT}"


def metrics_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / METRICS


def saved_config(run_dir: str | Path) -> Path:
    return Path(run_dir) / HYDRA / SAVED_CONFIG


def saved_overrides(run_dir: str | Path) -> list[Path]:
    """The overrides files of every start of the run: the first, then each resume's."""
    hydra_dir = Path(run_dir) / HYDRA
    return [hydra_dir / SAVED_OVERRIDES, *hydra_dir.glob(f"resume-*/{SAVED_OVERRIDES}")]


def resume_subdir(stamp: str) -> str:
    """Where a resumed start keeps its config, beside the first start's."""
    return f"{HYDRA}/resume-{stamp}"


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


def staging_path(path: str | Path) -> Path:
    """The temporary file a checkpoint is written to before its atomic rename."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def write_text(path: str | Path, text: str) -> None:
    """Write a file of the run atomically, never through a symlink: a fresh file in the same
    folder renamed over the name (a link there is replaced, its target left as it was)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written stays behind
        raise


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
    """Before a run writes into `run_dir`: refuse linked folders, replace linked files by the
    run's own (a log handler already open on one is pointed at the new file) and remove the
    temporary files a kill during a checkpoint save left behind."""
    run_dir = Path(run_dir)
    refuse_linked_folders(run_dir)
    for name in WRITTEN:
        path = run_dir / name
        if path.is_symlink():
            path.unlink()
            reopen_logs(path)
    for stale in checkpoint_dir(run_dir).glob(".*.tmp"):
        stale.unlink()


def reopen_logs(path: Path) -> None:
    """Point the log handlers writing to `path` (Hydra's train.log) at a new file there."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename) == path:
            old = handler.setStream(open(path, "a"))  # noqa: SIM115 - the handler closes it
            if old is not None:
                old.close()


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
