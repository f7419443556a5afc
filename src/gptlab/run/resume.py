"""Where a start starts from: a run or sweep of the user's own continued (resume=, a SLURM
requeue), an own checkpoint that Lightning restores whole, anyone else's weights, or a Hugging
Face folder's (docs/security.md)."""

import logging
import os
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.run.branch import FOREIGN_TRUNK, branch_checkpoint
from gptlab.run.checkpoints import Trained, find_checkpoint, read_trained
from gptlab.run.directory import latest_overrides
from gptlab.run.overrides import NOT_REPLAYED, as_override, override_key

log = logging.getLogger(__name__)


def sweep_overrides(sweep_dir: Path) -> list:
    """The overrides the sweep was started with, from Hydra's multirun.yaml."""
    saved = reader.read_yaml(sweep_dir / directory.MULTIRUN)
    for key in ("hydra", "overrides", "task"):
        saved = saved.get(key) if isinstance(saved, dict) else None
    return [str(o) for o in saved] if isinstance(saved, list) else []


def resume_argv(argv: list[str]) -> list[str]:
    """`gptlab-train resume=<dir> [overrides]` rewritten into the run or sweep continuing it: an
    own directory's recorded overrides (the latest start's), the command line's on top."""
    requests = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("resume=")]
    if not requests:
        return argv
    run_dir = Path(os.path.realpath(Path(requests[-1]).expanduser()))
    if not run_dir.is_dir():
        raise ConfigError(
            f"resume={requests[-1]}: the directory '{run_dir}' does not exist. Give the "
            "directory a run printed at its start (outputs/<date>/<time>) or a sweep's "
            "(outputs/multirun/<date>/<time>)."
        )
    root, kind = ownership.own(run_dir, "resume")
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if kind == ownership.SWEEP and root == run_dir:
        saved = sweep_overrides(run_dir)
        where = ["-m", as_override("hydra.sweep.dir", str(run_dir))]
    elif multirun:
        raise ConfigError("resume= of a run directory continues one run; drop -m/--multirun.")
    elif not directory.last_checkpoint(run_dir).is_file():
        raise ConfigError(
            f"resume: '{run_dir}' holds no {directory.last_checkpoint(run_dir)}: the run stopped "
            "before its first checkpoint (callbacks.last_checkpoint.every_n_train_steps). Start "
            "it again instead."
        )
    else:
        saved = latest_overrides(run_dir)
        where = [as_override("hydra.run.dir", str(run_dir))]
    flags = [a for a in argv[1:] if a.startswith("-") and a not in ("-m", "--multirun")]
    new = [a for a in argv[1:] if not a.startswith("-") and not a.startswith("resume=")]
    merged = {override_key(o): o for o in [*saved, *new]}
    kept = [o for key, o in merged.items() if key not in NOT_REPLAYED]
    return [argv[0], *flags, *where, *kept, as_override("resume", str(run_dir))]


class Start(NamedTuple):
    """Where a run starts from. `whole`: an own checkpoint, `ckpt_path`, that Lightning restores
    whole (trainer.fit(ckpt_path=...): the run's own last.ckpt, or another own run's, which goes
    on in this one). Else `trained`'s weights start a new run at step 0: a checkpoint of anyone
    else's (ckpt_path=), or a Hugging Face folder's (init_from=, its architecture too)."""

    ckpt_path: str | None = None
    whole: bool = False
    trained: Trained | None = None  # the checkpoint's or the folder's: settings (weights)

    @property
    def step(self) -> int | None:
        """The step Lightning restores (a resumed TensorBoard log drops what came after it)."""
        return self.trained.step if self.whole else None

    @property
    def source(self) -> str:
        """What its weights come from, as an error names it."""
        return f"ckpt_path: '{self.ckpt_path}'" if self.ckpt_path else "init_from"

    @property
    def init(self) -> Trained | None:
        """A folder's or a foreign checkpoint's weights, loaded into a new run's model."""
        return None if self.whole else self.trained


def is_own(path: Path) -> bool:
    return not isinstance(ownership.owner(Path(os.path.realpath(path))), str)


def starting_point(cfg: DictConfig, run_dir: Path) -> Start:
    """Everything a start's files can get wrong, before any data: the checkpoint it continues
    found and read, or the folder init_from reads."""
    if directory.continues(run_dir, cfg.resume):  # its own (gptlab.run.place checked it)
        last = directory.last_checkpoint(run_dir)
        log.info("Continuing from %s", last)
        return Start(str(last), True, read_trained(last, tensors=False))
    branch = cfg.get("branch_from")
    given = cfg.ckpt_path or (str(branch_checkpoint(cfg)) if branch else None)
    if given and cfg.get("init_from"):
        raise ConfigError(
            "init_from and ckpt_path (or branch_from) both name the weights to start from; "
            "give one of them."
        )
    if cfg.get("init_from"):
        from gptlab.run.hf_folder import read_folder

        log.info("Starting from the weights of init_from=%s", cfg.init_from)
        return Start(trained=read_folder(cfg.init_from, cfg.data))
    if given is None:
        return Start()
    path = find_checkpoint(given, prefer=directory.LAST)
    whole = is_own(path)  # continued as it was, or anyone's weights read as data
    if branch and not whole:
        raise ConfigError(f"branch_from: '{path}' is not in a run of yours. {FOREIGN_TRUNK}")
    trained = read_trained(path, tensors=not whole)
    if branch and trained.step != cfg.branch_step:
        raise ConfigError(
            f"branch_step={cfg.branch_step}: '{path}' holds step {trained.step}, not the "
            "step its name says: it was renamed or damaged. Give another branch_step."
        )
    return Start(str(path), whole, trained)
