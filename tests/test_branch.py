"""optim.schedule=wsd and its cooldown branches end to end: the trunk keeps its stable-phase
checkpoints, a branch trains only the cooldown in a new run directory, and both resume exactly
after kill -9 (real processes, real files, TensorBoard's own record of the learning rate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import check, read_metrics, run_main, scalars
from test_resume import TINY, kill_at_save, start, weights

from gptlab.run import directory
from gptlab.training.optim_config import OptimConfig, lr_factor

WSD = [*TINY, "optim.schedule=wsd", "optim.branch_at=[0.25,0.5,0.75]"]  # 120 steps, warmup 5
KEPT = [30, 60, 90]  # the cooldown starts at step 96
OPTIM = OptimConfig(schedule="wsd", warmup_steps=5, branch_at=[0.25, 0.5, 0.75])


def learning_rates(run_dir: Path) -> list[float]:
    """The learning rate of each update, in step order, as the run's TensorBoard logged it."""
    return [lr for _, lr in scalars(run_dir / "tensorboard")["vitals/lr/matrices"]]


def assert_same_run(a: Path, b: Path) -> None:
    wa, wb = weights(a / "checkpoints" / "last.ckpt"), weights(b / "checkpoints" / "last.ckpt")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6
    for key in ("steps", "tokens_seen", "best_val_loss", "final_val_loss", "train_flops"):
        assert read_metrics(a)[key] == read_metrics(b)[key], key
    assert learning_rates(a) == pytest.approx(learning_rates(b), rel=1e-6)


@pytest.fixture(scope="module")
def trunk(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("trunk")
    check(run_main(*WSD, "hydra.run.dir=run", cwd=cwd))
    return cwd / "run"


@pytest.fixture(scope="module")
def branch(trunk, tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("branch")
    check(run_main(f"branch_from={trunk}", "branch_step=90", "hydra.run.dir=run", cwd=cwd))
    return cwd / "run"


def test_the_trunk_follows_wsd_and_keeps_its_branch_checkpoints(trunk):
    expected = [3e-3 * lr_factor(step, OPTIM, 120) for step in range(120)]
    assert learning_rates(trunk) == pytest.approx(expected, rel=1e-6)
    kept = sorted(p.name for p in (trunk / "checkpoints").glob("branch-step=*.ckpt"))
    assert kept == [f"branch-step={s}.ckpt" for s in KEPT]  # not removed as last or top-k
    for step in KEPT:
        saved = torch.load(trunk / f"checkpoints/branch-step={step}.ckpt", weights_only=True)
        assert saved["global_step"] == step and saved["optimizer_states"]
    assert "branched_from" not in read_metrics(trunk)


def test_a_branch_trains_the_cooldown_only_in_a_new_run_directory(trunk, branch):
    """From step 90: the wsd run whose cooldown starts at 90 is 112 steps long (22 = 0.2 x 112),
    so the branch trains steps 90..111 from the trunk's tensors, at the trunk's settings."""
    metrics = read_metrics(branch)
    assert metrics["branched_from"] == {"run_dir": str(trunk.resolve()), "step": 90}
    assert metrics["steps"] == metrics["max_steps"] == 112
    per_step = metrics["flops_per_token"] * metrics["tokens_per_step"]
    assert metrics["branch_train_flops"] == 22 * per_step  # its own, the trunk counted apart
    assert metrics["train_flops"] == 112 * per_step  # the trunk's share up to step 90 too
    assert metrics["tokens_seen"] == read_metrics(trunk)["tokens_per_step"] * 112
    # its tokens/s: its own 22 steps over its own seconds (112 steps over them would be 5x)
    assert 0.5 < metrics["tokens_per_sec"] / read_metrics(trunk)["tokens_per_sec"] < 2
    done = next(
        line for line in (branch / "train.log").read_text().splitlines() if "Done: " in line
    )
    own = 22 * metrics["tokens_per_step"]  # its last line: its own tokens, as its seconds are
    assert f"Done: 112 steps (22 of them this branch's, from step 90), {own:,} tokens in " in done
    expected = [3e-3 * lr_factor(step, OPTIM, 112) for step in range(90, 112)]
    assert learning_rates(branch) == pytest.approx(expected, rel=1e-6)
    assert expected[0] == pytest.approx(3e-3) and expected[-1] < 3e-3 * 0.2
    assert not list((branch / "checkpoints").glob("branch-step=*"))  # no branches of its own
    assert "debug=fast" in (branch / ".hydra" / "overrides.yaml").read_text()  # the trunk's
    # TensorBoard tells it from its trunk: its run is named by its overrides, the branch's too
    names = [directory.tensorboard_run(run).name for run in (trunk, branch)]
    assert names[0].startswith("debug=fast,") and "branch_from=" not in names[0]
    assert names[1].startswith("debug=fast,") and names[1].endswith(",branch_step=90")
    assert f"branch_from={trunk.name}," in names[1]  # a path by its last part


def test_wsd_resumes_exactly_after_kill_9(trunk, tmp_path):
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    stopped = kill_at_save(start(*WSD, f"hydra.run.dir={run_dir}", cwd=tmp_path), last, 65)
    assert 65 <= stopped < 120 and not (run_dir / "metrics.json").exists()
    check(run_main(f"resume={run_dir}", cwd=tmp_path))
    assert_same_run(trunk, run_dir)
    for step in KEPT:  # kept before the kill or after the resume: the same tensors
        name = f"checkpoints/branch-step={step}.ckpt"
        kept, whole = weights(run_dir / name), weights(trunk / name)
        assert max((kept[k] - whole[k]).abs().max().item() for k in whole) <= 1e-6


def test_a_branch_resumes_exactly_after_kill_9(trunk, branch, tmp_path):
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = start(f"branch_from={trunk}", "branch_step=90", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    stopped = kill_at_save(proc, last, 95)
    assert 95 <= stopped < 112 and not (run_dir / "metrics.json").exists()
    check(run_main(f"resume={run_dir}", cwd=tmp_path))
    assert_same_run(branch, run_dir)
    assert read_metrics(run_dir)["branched_from"] == read_metrics(branch)["branched_from"]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["optim.branch_at=[0.5]"], "optim.schedule=wsd"),
        (["optim.schedule=wsd", "optim.branch_at=[0.9]"], "optim.branch_at=[0.9]"),
        (["optim.schedule=wsd", "optim.cooldown_shape=cos"], "optim.cooldown_shape='cos'"),
        (["optim.schedule=wsd", "optim.warmup_steps=29"], "optim.warmup_steps=29"),
        (["branch_from={trunk}", "branch_step=45"], "kept steps [30, 60, 90]"),
        (["branch_from={trunk}"], "branch_step=N"),
        (["branch_from={trunk}", "branch_step=30", "ckpt_path={trunk}"], "branch_from= and"),
        (["branch_step=30"], "give branch_from=<run dir>"),
    ],
)
def test_bad_wsd_or_branch_input_fails_clearly(trunk, tmp_path, overrides, needle):
    args = [o.format(trunk=trunk) for o in overrides]
    result = run_main("debug=fast", *args, "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "run").rglob("*.ckpt"))
