"""Resuming, kills, divergence and bad input: real processes, real signals, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers import BIN, check, read_metrics, run_cli, scalars

# A tiny model that takes a few seconds: long enough to interrupt, deterministic on CPU.
TINY = ["debug=fast", "trainer.max_steps=120", "trainer.val_check_interval=40",
        "trainer.deterministic=true", "callbacks.periodic_checkpoint.every_n_train_steps=5"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def start(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "gptlab-train"), *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"run ended before {path} appeared: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("whole")
    check(run_cli(*TINY, "hydra.run.dir=run", cwd=cwd))
    return cwd / "run"


def test_sigterm_then_resume_matches_an_uninterrupted_run(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    proc = start(*TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    wait_for(run_dir / "checkpoints" / "last.ckpt", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert f"gptlab-train resume={run_dir}" in err
    stopped_at = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < stopped_at < 120

    check(run_cli(f"resume={run_dir}", cwd=tmp_path))
    whole = weights(uninterrupted / "checkpoints" / "last.ckpt")
    resumed = weights(run_dir / "checkpoints" / "last.ckpt")
    assert whole.keys() == resumed.keys()
    assert max((whole[k] - resumed[k]).abs().max().item() for k in whole) <= 1e-6
    assert read_metrics(run_dir)["steps"] == read_metrics(uninterrupted)["steps"] == 120
    assert read_metrics(run_dir)["tokens_seen"] == read_metrics(uninterrupted)["tokens_seen"]

    curve = scalars(run_dir / "tensorboard")["train/loss"]
    steps = [step for step, _ in curve]
    assert len(steps) == len(set(steps)) == 120, "one curve, no duplicate steps"
    # the original config is kept; the resume saved its own next to it
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert list((run_dir / ".hydra").glob("resume-*/overrides.yaml"))


def test_resume_applies_new_overrides_on_top(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    proc = start(*TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    wait_for(run_dir / "checkpoints" / "last.ckpt", proc)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: same graceful stop
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    check(run_cli(f"resume={run_dir}", "trainer.max_steps=150", cwd=tmp_path))
    assert read_metrics(run_dir)["steps"] == 150


def test_sigkill_right_after_a_checkpoint_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(*TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    wait_for(run_dir / "checkpoints" / "last.ckpt", proc)
    proc.kill()
    proc.communicate()
    torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)  # intact
    check(run_cli(f"resume={run_dir}", cwd=tmp_path))
    assert read_metrics(run_dir)["steps"] == 120


def test_sigkill_while_a_checkpoint_is_written_keeps_the_previous_one(tmp_path):
    """A large checkpoint, killed mid-write: the old file is untouched and still loads."""
    target = tmp_path / "last.ckpt"
    torch.save({"step": 1}, target)
    script = textwrap.dedent(f"""
        import torch
        from gptlab.resilience import AtomicCheckpointIO
        AtomicCheckpointIO().save_checkpoint({{"step": 2, "w": torch.ones(400_000_000, dtype=torch.uint8)}},
                                              {str(target)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=ENV)
    tmp = tmp_path / ".last.ckpt.tmp"
    wait_for(tmp, proc, timeout=60)
    proc.kill()
    proc.wait()
    assert torch.load(target, weights_only=True) == {"step": 1}


def test_nan_loss_stops_with_a_clear_message(tmp_path):
    result = run_cli("debug=fast", "optim.lr=1e30", "optim.warmup_steps=0", "trainer.gradient_clip_val=null",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2
    assert "diverged" in result.stderr and "optim.lr" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, uninterrupted) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.txt").write_text("")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 8)
    good = uninterrupted / "checkpoints" / "last.ckpt"
    raw = good.read_bytes()
    (d / "truncated.ckpt").write_bytes(raw[: len(raw) // 2])
    (d / "garbage.ckpt").write_bytes(os.urandom(4096))
    (d / "no_ckpt_run" / ".hydra").mkdir(parents=True)
    (d / "no_ckpt_run" / ".hydra" / "overrides.yaml").write_text("- debug=fast\n")
    return {"dir": d, "good": good}


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["model.num_blocks=0"], "model.num_blocks=0"),
        (["model.d_model=-8"], "model.d_model=-8"),
        (["data.context_length=100000"], "data.context_length=100000"),
        (["data=text_file", "data.path={dir}/missing.txt"], "missing.txt"),
        (["data=text_file", "data.path={dir}/empty.txt"], "empty.txt"),
        (["data=text_file", "data.path={dir}/binary.bin"], "binary.bin"),
        (["data.encoding=no_such_encoding"], "data.encoding"),
        (["ckpt_path={dir}/nowhere.ckpt"], "nowhere.ckpt"),
        (["ckpt_path={dir}/truncated.ckpt"], "truncated.ckpt"),
        (["ckpt_path={dir}/garbage.ckpt"], "garbage.ckpt"),
        (["ckpt_path={good}", "model.d_model=64"], "model.d_model"),
        (["resume={dir}/no_ckpt_run"], "no_ckpt_run"),
        (["callbacks.text_sample._target_=os.system"], "callbacks.text_sample._target_"),
    ],
)
def test_bad_input_fails_clearly_before_training(tmp_path, bad_files, overrides, needle):
    good_bytes = bad_files["good"].read_bytes()
    args = [o.format(dir=bad_files["dir"], good=bad_files["good"]) for o in overrides]
    result = run_cli("debug=fast", *args, "hydra.run.dir=run", cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert needle.format(dir=bad_files["dir"]) in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "run").rglob("*.ckpt"))
    assert bad_files["good"].read_bytes() == good_bytes  # nothing overwritten
