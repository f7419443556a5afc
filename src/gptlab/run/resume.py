"""Continuing a run or a sweep where it stopped (resume=, a SLURM requeue), own directories
only, and where a start starts from."""

import logging
import os
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig

from gptlab import files
from gptlab.errors import ConfigError
from gptlab.process import rank
from gptlab.run import directory, ownership, place
from gptlab.run.branch import branch_checkpoint
from gptlab.run.checkpoints import Trained, find_checkpoint, read_trained
from gptlab.run.overrides import override_key
from gptlab.run.settings import replayable

log = logging.getLogger(__name__)


def own(run_dir: Path, sweep: bool) -> ownership.Manifest:
    """The manifest of the own run or sweep directory to continue, or why it is not continued."""
    try:
        return (ownership.check_sweep if sweep else ownership.check_run)(run_dir)
    except ownership.ForeignDirectory as e:
        why = f"is not a {'sweep' if sweep else 'run'} directory gptlab made here for you ({e})"
    if sweep:
        way = (
            "A foreign sweep cannot be resumed; continue one of its jobs in a new run directory "
            "of yours with `gptlab-train ckpt_path=<its job dir>`, or run the sweep afresh."
        )
    else:
        way = (
            "`gptlab-train ckpt_path=<that dir>` continues its training (weights, optimizer "
            "state, step) in a new run directory of yours."
        )
    raise ConfigError(f"resume: '{run_dir}' {why}, so it is read, never continued in place. {way}")


def newest_overrides(manifest: ownership.Manifest) -> list:
    """The overrides of the run's latest recorded start."""
    for start in reversed(manifest.starts):
        path = directory.saved_overrides(manifest.root, start)
        if f"{start}/{directory.SAVED_OVERRIDES}" in manifest.data["files"] and path.is_file():
            saved = files.read_yaml(path)
            return saved if isinstance(saved, list) else []
    return []


def is_sweep(place: Path) -> bool:
    manifest = ownership.own_manifest(place)
    kind = manifest.data.get("kind") if manifest else None
    return kind == ownership.SWEEP or (kind is None and (place / directory.MULTIRUN).is_file())


def own_run(run_dir: Path, argv: list[str]) -> ownership.Manifest:
    """The manifest of the run resume= continues, or the paragraph saying why not."""
    if any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError("resume= of a run directory continues one run; drop -m/--multirun.")
    if not directory.last_checkpoint(run_dir).is_file() and not directory.holds_run(run_dir):
        raise ConfigError(
            f"resume: '{run_dir}' holds no {directory.last_checkpoint(run_dir)}: the run stopped "
            "before its first checkpoint (callbacks.last_checkpoint.every_n_train_steps), or it "
            "is not a run directory. Start it again instead."
        )
    return own(run_dir, sweep=False)


def resume_argv(argv: list[str]) -> list[str]:
    """`gptlab-train resume=<dir> [overrides]` rewritten into the run or sweep continuing it."""
    requests = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("resume=")]
    if not requests:
        return argv
    run_dir = Path(requests[-1]).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(
            f"resume={requests[-1]}: the directory '{run_dir}' does not exist. Give the "
            "directory a run printed at its start (outputs/<date>/<time>) or a sweep's "
            "(outputs/multirun/<date>/<time>)."
        )
    if "${" in str(run_dir):
        raise ConfigError(
            f"resume={requests[-1]}: Hydra reads `${{` in its output directory's name as an "
            "interpolation, so no run can continue in this directory. Rename it (or copy it) "
            "to a name without `${`, then continue the copy with ckpt_path=."
        )
    flags = [a for a in argv[1:] if a.startswith("-") and a not in ("-m", "--multirun")]
    new = [a for a in argv[1:] if not a.startswith("-") and not a.startswith("resume=")]
    if is_sweep(run_dir):
        manifest = own(run_dir, sweep=True)
        recorded = manifest.data["settings"].get("overrides", [])
        saved = replayable(recorded, run_dir / ownership.MANIFEST, sweep=True)
        where = ["-m", f"hydra.sweep.dir={place.FROM_ENV}"]
    else:
        manifest = own_run(run_dir, argv)
        saved = replayable(newest_overrides(manifest), run_dir / directory.HYDRA)
        where = [f"hydra.run.dir={place.FROM_ENV}"]
    os.environ[place.OUTPUT_DIR] = str(run_dir)
    merged = {override_key(o): o for o in [*saved, *new]}
    return [argv[0], *flags, *where, *merged.values(), f"resume={place.FROM_ENV}"]


class Start(NamedTuple):
    """Where a run starts from: nothing; a checkpoint continued whole (the run's own last.ckpt)
    or read for its tensors (ckpt_path=, or a branch's trunk checkpoint: branch_from=), its
    settings checked and those tensors bounded; or a Hugging Face folder's weights (init_from:
    its architecture too, a new run's step 0)."""

    ckpt_path: str | None = None
    whole: bool = False
    trained: Trained | None = None  # the checkpoint's or the folder's: settings, tensors, step

    @property
    def step(self) -> int | None:
        return self.trained.step if self.ckpt_path else None

    @property
    def init(self) -> Trained | None:
        """init_from's folder: its architecture and weights start a new run."""
        return None if self.ckpt_path else self.trained


def starting_point(cfg: DictConfig, run_dir: Path) -> Start:
    """Everything a start's files can get wrong, before any data (its run directory claimed):
    the checkpoint it continues found and read, or the folder init_from reads."""
    given, whole = checkpoint_to_continue(cfg, run_dir)
    ckpt_path = str(find_checkpoint(given, prefer=directory.LAST)) if given else None
    trained = read_trained(ckpt_path, tensors=not whole) if ckpt_path else None
    if cfg.get("branch_from") and not whole and trained.step != cfg.branch_step:
        raise ConfigError(
            f"branch_step={cfg.branch_step}: '{ckpt_path}' holds step {trained.step}, not the "
            "step its name says: it was renamed or damaged. Give another branch_step."
        )
    if cfg.get("init_from") and not whole:  # a run continued whole has its own weights
        from gptlab.run.hf_folder import initial_weights

        if ckpt_path:  # ckpt_path= or branch_from=
            raise ConfigError(
                "init_from and ckpt_path (or branch_from) both name the weights to start from; "
                "give one of them."
            )
        trained = initial_weights(cfg.init_from, cfg.data)
    return Start(ckpt_path, whole, trained)


def checkpoint_to_continue(cfg: DictConfig, output_dir: Path) -> tuple[str | None, bool]:
    """(the checkpoint this start continues, whether whole): ckpt_path= for its tensors; the
    run's own last.ckpt whole when it continues in place; a branch's trunk checkpoint for its
    tensors; else a fresh start, not over a run."""
    if cfg.ckpt_path:  # a file, or a run directory's last.ckpt (else its best.ckpt)
        return cfg.ckpt_path, False
    if directory.continues(output_dir, cfg.resume):
        own(output_dir, sweep=False)
        last = directory.last_checkpoint(output_dir)
        log.info("Continuing from %s (%s)", last, "resume=" if cfg.resume else "SLURM requeue")
        return str(last), True
    if not cfg.resume and not directory.requeued() and rank() == 0:
        directory.refuse_fresh_run_over(output_dir)
    if cfg.get("branch_from"):  # a branch's first start: its trunk's checkpoint, tensors only
        return str(branch_checkpoint(cfg)), False
    return None, False
