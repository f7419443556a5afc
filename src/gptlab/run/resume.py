"""Where a start starts from: a run or sweep of the user's own continued (resume=, a SLURM
requeue), an own checkpoint that Lightning restores whole, anyone else's weights, or a Hugging
Face folder's (docs/security.md). A cooldown branch (docs/training.md) starts from a wsd run's
kept stable-phase checkpoint, in a new run directory: the trunk, a run of the user's own, gives
its latest recorded overrides (but its length) and that checkpoint's whole training state."""

import logging
import os
import re
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.run.checkpoints import Trained, find_checkpoint, read_trained
from gptlab.run.overrides import NOT_REPLAYED, as_override, override_key

log = logging.getLogger(__name__)

# the trunk's length: not a branch's, whose length its step decides (training/budget.py)
LENGTH_KEYS = ("flops_budget", "trainer.max_steps")
FOREIGN_TRUNK = (
    "A branch goes on with its trunk's whole training state, which gptlab takes from your own "
    "runs only; `gptlab-train ckpt_path=<its checkpoints/branch-step=N.ckpt>` trains on from "
    "its weights instead."
)


def branch_argv(argv: list[str]) -> list[str]:
    """`gptlab-train branch_from=<trunk> branch_step=N [overrides]`: the trunk's recorded
    overrides first (but its length), the command line's on top (resume= replays the branch's)."""
    args = argv[1:]
    requests = [a.split("=", 1)[1] for a in args if a.startswith("branch_from=")]
    if any(a.startswith("resume=") for a in args):
        return argv
    if not requests:
        if any(a.startswith("branch_step=") for a in args):
            raise ConfigError("branch_step= names a step of a trunk: give branch_from=<run dir>.")
        return argv
    if any(a.startswith("ckpt_path=") for a in args):
        raise ConfigError(
            "branch_from= and ckpt_path= both name where the run starts: give one of them."
        )
    root, _ = ownership.own(Path(requests[-1]).expanduser(), "branch_from", way=FOREIGN_TRUNK)
    saved = directory.latest_overrides(root)
    trunk = [o for o in saved if override_key(o) not in (*LENGTH_KEYS, *NOT_REPLAYED)]
    flags = [a for a in args if a.startswith("-")]
    merged = {override_key(o): o for o in [*trunk, *args] if o not in flags}
    return [argv[0], *flags, *merged.values()]


def kept_steps(trunk: Path) -> list[int]:
    """The steps of the branch checkpoints a run kept."""
    pattern = re.compile(rf"{re.escape(directory.BRANCH)}(\d+){re.escape(directory.CKPT)}")
    folder = directory.checkpoint_dir(trunk)
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(m.group(1)) for m in map(pattern.fullmatch, names) if m)


def branch_checkpoint(cfg: DictConfig) -> Path:
    """The trunk's checkpoint that branch_from= and branch_step= name, or why there is none."""
    trunk = Path(cfg.branch_from).expanduser().resolve()
    if cfg.branch_step is None or cfg.branch_step < 1:
        raise ConfigError(
            f"branch_from={cfg.branch_from}: give the step to branch from as branch_step=N, "
            f"one of the run's kept steps {kept_steps(trunk)} (its optim.branch_at)."
        )
    path = directory.branch_checkpoint(trunk, cfg.branch_step)
    if not path.is_file():
        raise ConfigError(
            f"branch_step={cfg.branch_step}: '{trunk}' kept no checkpoint at that step (it "
            f"kept steps {kept_steps(trunk)}; a run keeps them with optim.schedule=wsd "
            "optim.branch_at=[...]). Give one of those steps."
        )
    return path


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
        saved = directory.latest_overrides(run_dir)
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
    # continued as it was (an own run's), or anyone's weights read as data
    whole = not isinstance(ownership.owner(Path(os.path.realpath(path))), str)
    if branch and not whole:
        raise ConfigError(f"branch_from: '{path}' is not in a run of yours. {FOREIGN_TRUNK}")
    trained = read_trained(path, tensors=not whole)
    if branch and trained.step != cfg.branch_step:
        raise ConfigError(
            f"branch_step={cfg.branch_step}: '{path}' holds step {trained.step}, not the "
            "step its name says: it was renamed or damaged. Give another branch_step."
        )
    return Start(str(path), whole, trained)
