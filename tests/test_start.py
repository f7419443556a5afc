"""The start as one value (gptlab.run.start): each kind of start planned from a command line,
the command line it replays, and the plan the task makes from the config Hydra composes of it.
Run and sweep directories made by hand and signed as the user's own: no training."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import sign_run
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.run import start as plans
from gptlab.run.start import Branch, plan_argv, plan_of


@pytest.fixture(autouse=True)
def not_requeued(monkeypatch):
    monkeypatch.delenv(directory.RESTART_COUNT, raising=False)


def composed(argv: list[str]) -> OmegaConf:
    """The start keys of the config Hydra composes from `argv` (its parser reads each value)."""
    given = [a for a in argv[1:] if not a.startswith("-")]
    values = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(given)}
    return OmegaConf.create({key: values.get(key) for key in plans.START_KEYS})


def a_run(place: Path, overrides: list[str], *checkpoints: str) -> Path:
    """A run directory of the user's own: its saved overrides and (empty) checkpoints."""
    (place / ".hydra").mkdir(parents=True)
    (place / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(overrides))
    directory.checkpoint_dir(place).mkdir()
    for name in checkpoints:
        (directory.checkpoint_dir(place) / name).write_bytes(b"")
    return sign_run(place).resolve()


def planned(argv: list[str], run_dir: Path) -> plans.Plan:
    return plan_of(composed(plan_argv(argv)), run_dir)


def test_a_fresh_start_keeps_its_command_line(tmp_path):
    argv = ["gptlab-train", "--multirun", "seed=1,2"]
    assert plan_argv(argv) == argv
    plan = plan_of(OmegaConf.create(dict.fromkeys(plans.START_KEYS)), tmp_path)
    assert plan == plans.Plan(plans.FRESH, run_dir=tmp_path)


def test_a_resumed_run_replays_its_overrides_and_continues_its_last_checkpoint(tmp_path):
    run = a_run(tmp_path / "run", ["seed=1", "ckpt_path=/x", "optim.lr=0.1"], "last.ckpt")
    argv = plan_argv(["gptlab-train", "-c", f"resume={tmp_path}/run", "seed=2"])
    assert argv == [
        "gptlab-train",
        "-c",
        f"hydra.run.dir='{run}'",
        "seed=2",
        "optim.lr=0.1",
        f"resume='{run}'",
    ]
    plan = plan_of(composed(argv), run)
    assert (plan.kind, plan.resumed, plan.checkpoint) == (
        plans.RESUME_RUN,
        run,
        directory.last_checkpoint(run),
    )
    assert plan.later and plan.owner == ownership.Own(run, ownership.RUN)


def test_a_resumed_sweep_continues_the_jobs_that_checkpointed(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    saved = {"hydra": {"overrides": {"task": ["seed=1,2", "ckpt_path=/x"]}}}
    (sweep / directory.MULTIRUN).write_text(OmegaConf.to_yaml(saved))
    sweep = sign_run(sweep, ownership.SWEEP).resolve()
    argv = plan_argv(["gptlab-train", f"resume={sweep}"])
    assert argv == [
        "gptlab-train",
        "-m",
        f"hydra.sweep.dir='{sweep}'",
        "seed=1,2",
        f"resume='{sweep}'",
    ]
    cfg = composed([a for a in argv if a != "seed=1,2"])  # a job: its own seed
    directory.checkpoint_dir(sweep / "0").mkdir(parents=True)
    directory.last_checkpoint(sweep / "0").write_bytes(b"")
    assert plan_of(cfg, sweep / "0").kind == plans.RESUME_SWEEP
    unstarted = plan_of(cfg, sweep / "1")  # a job that never saved: its own start, still resumed
    assert (unstarted.kind, unstarted.resumed, unstarted.later) == (plans.FRESH, sweep, True)


def test_a_requeued_job_continues_its_last_checkpoint(tmp_path, monkeypatch):
    run = a_run(tmp_path / "run", [], "last.ckpt")
    monkeypatch.setenv(directory.RESTART_COUNT, "1")
    plan = planned(["gptlab-train", "seed=1"], run)
    assert (plan.kind, plan.checkpoint, plan.later) == (
        plans.REQUEUE,
        directory.last_checkpoint(run),
        True,
    )


def test_a_branch_replays_its_trunk_but_its_length_and_starts_at_its_step(tmp_path):
    overrides = ["optim.schedule=wsd", "trainer.max_steps=90", "flops_budget=1e9", "ckpt_path=/x"]
    trunk = a_run(tmp_path / "trunk", overrides, "branch-step=30.ckpt")
    argv = plan_argv(["gptlab-train", f"branch_from={tmp_path}/trunk", "branch_step=30"])
    assert argv[1:] == ["optim.schedule=wsd", f"branch_from={tmp_path}/trunk", "branch_step=30"]
    plan = plan_of(composed(argv), tmp_path / "new")
    assert (plan.kind, plan.branch) == (plans.BRANCH, Branch(trunk, 30))
    assert plan.checkpoint == directory.branch_checkpoint(trunk, 30) and not plan.later


def test_a_checkpoint_is_own_or_foreign_by_its_manifest_and_init_from_is_a_folder(tmp_path):
    own = a_run(tmp_path / "own", [], "last.ckpt")
    plan = planned(["gptlab-train", f"ckpt_path={own}"], tmp_path / "new")
    assert (plan.kind, plan.checkpoint) == (plans.OWN_CHECKPOINT, directory.last_checkpoint(own))
    (own / directory.MANIFEST).unlink()
    plan = planned(["gptlab-train", f"ckpt_path={own}"], tmp_path / "new")
    assert plan.kind == plans.FOREIGN_CHECKPOINT and "no manifest.json" in plan.owner.why
    plan = planned(["gptlab-train", f"init_from={tmp_path}"], tmp_path / "new")
    assert (plan.kind, plan.init_from, plan.checkpoint) == (plans.INIT_FROM, str(tmp_path), None)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["resume={run}", "ckpt_path={run}"], "drop ckpt_path="),
        (["resume={run}", "-m"], "drop -m/--multirun"),
        (["resume={run}/nowhere"], "does not exist"),
        (["branch_from={run}", "branch_step=3", "ckpt_path={run}"], "give one of them"),
        (["branch_step=3"], "give branch_from=<run dir>"),
    ],
)
def test_contradicting_start_keys_are_refused_before_hydra(tmp_path, args, needle):
    run = a_run(tmp_path / "run", [], "last.ckpt")
    with pytest.raises(ConfigError, match=needle):
        plan_argv(["gptlab-train", *(a.format(run=run) for a in args)])
