"""Cooldown branches (docs/training.md): a branch starts from a wsd run's kept stable-phase
checkpoint, in a new run directory: the trunk, a run of the user's own, gives its latest
recorded overrides (but its length) and that checkpoint's whole training state."""

import re
from pathlib import Path

from omegaconf import DictConfig

from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.run.directory import latest_overrides
from gptlab.run.overrides import NOT_REPLAYED, override_key

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
    saved = latest_overrides(root)
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
