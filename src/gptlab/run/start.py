"""The start as one value (docs/architecture.md): what a start of gptlab-train is, decided here
alone, from the keys that say it (resume=, branch_from=, branch_step=, ckpt_path=, init_from=)
and a SLURM requeue. Before Hydra composes, `plan_argv` turns a resume or a branch into the
command line it replays (one merge rule, `replay`); the composed config then carries those keys
as the plan wrote them, and `plan_of` makes the Plan the task trains from out of them. A DDP
rank, a sweep's job and a requeued job compose or receive that same config: the same plan."""

import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.run.overrides import NOT_REPLAYED, as_override, override_key

FRESH = "fresh"
RESUME_RUN = "resume of a run"
RESUME_SWEEP = "resume of a sweep"
REQUEUE = "requeue"
BRANCH = "branch"
OWN_CHECKPOINT = "own checkpoint"
FOREIGN_CHECKPOINT = "foreign checkpoint"
INIT_FROM = "init_from"
CONTINUED = (RESUME_RUN, RESUME_SWEEP, REQUEUE)  # the run's own last.ckpt, restored whole

START_KEYS = ("resume", "branch_from", "branch_step", "ckpt_path", "init_from")
MULTIRUN = ("-m", "--multirun")
# the trunk's length: not a branch's, whose length its step decides (training/budget.py)
LENGTH_KEYS = ("flops_budget", "trainer.max_steps")
FOREIGN_TRUNK = (
    "A branch goes on with its trunk's whole training state, which gptlab takes from your own "
    "runs only; `gptlab-train ckpt_path=<its checkpoints/branch-step=N.ckpt>` trains on from "
    "its weights instead."
)


@dataclass(frozen=True)
class Branch:
    """A cooldown branch's trunk (resolved) and step: its length and its report, kept when the
    branch itself is resumed."""

    trunk: Path
    step: int


@dataclass(frozen=True)
class Plan:
    """What a start is: its `kind`, the run directory it runs in (`run_dir`), the run or sweep
    directory resume= continues (`resumed`), the owner of what it starts from, the checkpoint it
    starts from, a branch's trunk and step, init_from's folder, and whether it is a later start
    of its directory (`later`: its config saved in a folder of its own, .hydra/resume-<time>)."""

    kind: str
    run_dir: Path | None = None
    resumed: Path | None = None
    owner: ownership.Own | ownership.Foreign | None = None
    checkpoint: Path | None = None
    branch: Branch | None = None
    init_from: str | None = None
    later: bool = False


def replay(saved: list[str], given: list[str], not_replayed: tuple[str, ...]) -> list[str]:
    """The one merge rule of a start that replays another's overrides: the saved ones but the
    keys `not_replayed`, the command line's on top; each key once, the value given last."""
    kept = [o for o in saved if override_key(o) not in not_replayed]
    return list({override_key(o): o for o in [*kept, *given]}.values())


def sweep_overrides(sweep_dir: Path) -> list[str]:
    """The overrides the sweep was started with, from Hydra's multirun.yaml."""
    saved = reader.read_yaml(sweep_dir / directory.MULTIRUN)
    for key in ("hydra", "overrides", "task"):
        saved = saved.get(key) if isinstance(saved, dict) else None
    return [str(o) for o in saved] if isinstance(saved, list) else []


def resumed_plan(value: str, multirun: bool) -> Plan:
    """The plan of resume=`value`: an own run with a last.ckpt, or an own sweep; else why not."""
    run_dir = directory.where(value)
    if not run_dir.is_dir():
        raise ConfigError(
            f"resume={value}: the directory '{run_dir}' does not exist. Give the directory a "
            "run printed at its start (outputs/<date>/<time>) or a sweep's "
            "(outputs/multirun/<date>/<time>)."
        )
    found = ownership.own(run_dir, "resume")
    if found.kind == ownership.SWEEP and found.root == run_dir:
        return Plan(RESUME_SWEEP, resumed=run_dir, owner=found, later=True)
    if multirun:
        raise ConfigError("resume= of a run directory continues one run; drop -m/--multirun.")
    last = directory.last_checkpoint(run_dir)
    if not last.is_file():
        raise ConfigError(
            f"resume: '{run_dir}' holds no {last}: the run stopped before its first checkpoint "
            "(callbacks.last_checkpoint.every_n_train_steps). Start it again instead."
        )
    return Plan(RESUME_RUN, run_dir, run_dir, owner=found, checkpoint=last, later=True)


def plan_argv(argv: list[str]) -> list[str]:
    """The command line of the start `argv` asks for, before Hydra composes it: a resume's or a
    branch's recorded overrides replayed (`replay`), and where it runs; else `argv` as given."""
    args = argv[1:]
    given = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key in START_KEYS:
            given[key] = value
    multirun = [a for a in args if a in MULTIRUN][:1]
    flags = [a for a in args if a.startswith("-") and a not in MULTIRUN]
    plain = [a for a in args if not a.startswith("-")]
    if "resume" in given:
        plan = resumed_plan(given["resume"], bool(multirun))
        for key in ("branch_from", "ckpt_path", "init_from"):
            if key in given:
                raise ConfigError(
                    f"resume= and {key}= both name where the run starts (a resume starts from "
                    f"the run's own last checkpoint): drop {key}=."
                )
        if plan.kind == RESUME_SWEEP:
            saved = sweep_overrides(plan.resumed)
            where = ["-m", as_override("hydra.sweep.dir", str(plan.resumed))]
        else:
            saved = directory.latest_overrides(plan.resumed)
            where = [as_override("hydra.run.dir", str(plan.resumed))]
        new = [a for a in plain if not a.startswith("resume=")]
        replayed = replay(saved, new, NOT_REPLAYED)
        return [argv[0], *flags, *where, *replayed, as_override("resume", str(plan.resumed))]
    if "branch_from" not in given:
        if "branch_step" in given:
            raise ConfigError("branch_step= names a step of a trunk: give branch_from=<run dir>.")
        return argv
    if "ckpt_path" in given:
        raise ConfigError(
            "branch_from= and ckpt_path= both name where the run starts: give one of them."
        )
    trunk = ownership.own(
        directory.where(given["branch_from"]), "branch_from", way=FOREIGN_TRUNK
    ).root
    saved = directory.latest_overrides(trunk)
    return [argv[0], *flags, *multirun, *replay(saved, plain, (*LENGTH_KEYS, *NOT_REPLAYED))]


def resumed(cfg: DictConfig) -> Path | None:
    """The run or sweep directory resume= continues (plan_argv wrote it resolved), else None."""
    value = OmegaConf.select(cfg, "resume")
    return Path(str(value)) if value else None


def later_start(cfg: DictConfig) -> bool:
    """resume= or a SLURM requeue: a later start of a run directory that exists."""
    return resumed(cfg) is not None or directory.requeued()


def continues(cfg: DictConfig, run_dir: str | Path) -> bool:
    """A later start with a last.ckpt in `run_dir`: it continues the run that is there."""
    return later_start(cfg) and directory.last_checkpoint(run_dir).is_file()


def kept_steps(trunk: Path) -> list[int]:
    """The steps of the branch checkpoints a run kept."""
    pattern = re.compile(rf"{re.escape(directory.BRANCH)}(\d+){re.escape(directory.CKPT)}")
    folder = directory.checkpoint_dir(trunk)
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(m.group(1)) for m in map(pattern.fullmatch, names) if m)


def branch_checkpoint(branch_from: str, trunk: Path, step: int | None) -> Path:
    """The trunk's checkpoint that branch_from= and branch_step= name, or why there is none."""
    if step is None or step < 1:
        raise ConfigError(
            f"branch_from={branch_from}: give the step to branch from as branch_step=N, "
            f"one of the run's kept steps {kept_steps(trunk)} (its optim.branch_at)."
        )
    path = directory.branch_checkpoint(trunk, step)
    if not path.is_file():
        raise ConfigError(
            f"branch_step={step}: '{trunk}' kept no checkpoint at that step (it kept steps "
            f"{kept_steps(trunk)}; a run keeps them with optim.schedule=wsd "
            "optim.branch_at=[...]). Give one of those steps."
        )
    return path


def plan_of(cfg: DictConfig, run_dir: Path) -> Plan:
    """The plan of the start `cfg` composes, in its run directory `run_dir` (a sweep's job: its
    own): everything its start keys can get wrong, before any data."""
    resume = resumed(cfg)
    plan = resumed_plan(str(resume), multirun=False) if resume else Plan(REQUEUE)
    branch_from, step = cfg.get("branch_from"), cfg.get("branch_step")
    branch = Branch(directory.where(branch_from), step) if branch_from else None
    init_from = cfg.get("init_from")
    common = {
        "run_dir": run_dir,
        "resumed": plan.resumed,
        "branch": branch,
        "init_from": init_from,
        "later": later_start(cfg),
    }
    if continues(cfg, run_dir):  # its own (gptlab.run.place admitted it so)
        last = directory.last_checkpoint(run_dir)
        return Plan(
            plan.kind, owner=ownership.owner(directory.where(run_dir)), checkpoint=last, **common
        )
    ckpt_path = cfg.get("ckpt_path")
    if branch and ckpt_path:
        raise ConfigError(
            "branch_from= and ckpt_path= both name where the run starts: give one of them."
        )
    given = ckpt_path
    if branch:
        given = branch_checkpoint(branch_from, branch.trunk, step)
    if given and init_from:
        raise ConfigError(
            "init_from and ckpt_path (or branch_from) both name the weights to start from; "
            "give one of them."
        )
    if init_from:
        return Plan(INIT_FROM, **common)
    if not given:
        return Plan(FRESH, **common)
    from gptlab.run.checkpoints import find_checkpoint  # numpy: only in the task

    path = find_checkpoint(given, prefer=directory.LAST)
    found = ownership.owner(
        directory.where(path)
    )  # continued as it was, or anyone's weights read as data
    if branch and not found.own:
        raise ConfigError(f"branch_from: '{path}' is not in a run of yours. {FOREIGN_TRUNK}")
    kind = OWN_CHECKPOINT if found.own else FOREIGN_CHECKPOINT
    if branch:
        kind = BRANCH
    return Plan(kind, owner=found, checkpoint=path, **common)
