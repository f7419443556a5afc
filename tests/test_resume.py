"""Resuming, kills, divergence and bad input: real processes, real signals, real files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import BIN, check, read_metrics, run_cli, run_main, scalars, tensorboard_runs
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from gptlab.run import directory

# A tiny model that takes a few seconds: long enough to interrupt, deterministic on CPU, with
# dropout so that a resume must also restore the random state.
TINY = [
    "debug=fast",
    "trainer.max_steps=120",
    "trainer.val_check_interval=40",
    "model.dropout=0.1",
    "trainer.deterministic=true",
    "callbacks.last_checkpoint.every_n_train_steps=5",
]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def start(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "gptlab-train"), *args],
        cwd=cwd,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, (
            f"run ended before {path} appeared: {proc.communicate()[1][-3000:]}"
        )
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("whole")
    check(run_main(*TINY, "hydra.run.dir=run", cwd=cwd))
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

    check(run_main(f"resume={run_dir}", cwd=tmp_path))
    whole = weights(uninterrupted / "checkpoints" / "last.ckpt")
    resumed = weights(run_dir / "checkpoints" / "last.ckpt")
    assert whole.keys() == resumed.keys()
    assert max((whole[k] - resumed[k]).abs().max().item() for k in whole) <= 1e-6
    assert read_metrics(run_dir)["steps"] == read_metrics(uninterrupted)["steps"] == 120
    assert read_metrics(run_dir)["tokens_seen"] == read_metrics(uninterrupted)["tokens_seen"]
    # tokens/s counts the tokens of the seconds it counts: the resumed run's, like the whole
    # run's, in metrics.json (2x: the two ran on the same machine, under the same load) and in
    # TensorBoard's first rate after the resume (not the steps before it over one step's time:
    # stopped_at + 1 times a step's rate)
    rate = read_metrics(run_dir)["tokens_per_sec"] / read_metrics(uninterrupted)["tokens_per_sec"]
    assert 0.5 < rate < 2
    first = dict(scalars(run_dir / "tensorboard")["vitals/tokens_per_sec"])[stopped_at]
    whole = sorted(v for _, v in scalars(uninterrupted / "tensorboard")["vitals/tokens_per_sec"])
    assert first < 3 * whole[len(whole) // 2]

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
    every = "callbacks.progress_bar.line_every_n_steps=10"
    result = check(run_main(f"resume={run_dir}", "trainer.max_steps=150", every, cwd=tmp_path))
    assert read_metrics(run_dir)["steps"] == 150
    # stdout is no terminal: progress lines, counting to the total from where the run stopped,
    # with the time left (not Lightning's `100/?`), and no bar
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert lines and all(line.split(" (")[0].endswith("/150") for line in lines)
    assert all(" elapsed, 0:" in line and " left, " in line for line in lines[:-1])
    assert lines[-1].startswith("step 150/150 (100%), ") and "Training" not in result.stdout
    # and nothing from Lightning about the run's own checkpoints/ being there, or its noise
    assert "exists and is not empty" not in result.stderr
    assert "Trainer already configured with model summary" not in result.stderr
    # TensorBoard's HPARAMS tab shows the latest start's hyperparameters, not the first one's:
    # the run's own, in its one HPARAMS event file (TensorBoard keeps the first it reads)
    # one TensorBoard run, named by the first start's overrides (not a second for max_steps)
    name = "debug=fast,max_steps=120,val_check_interval=40,dropout=0.1,deterministic=true,"
    assert tensorboard_runs(run_dir) == [f"tensorboard/{name}every_n_train_steps=5"]
    run = directory.tensorboard_run(run_dir)
    assert len(list(run.glob("*tfevents*.hparams"))) == 1
    acc = EventAccumulator(str(run))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    session = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert session.hparams["trainer/max_steps"].number_value == 150


def step_of(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"]


def kill_at_save(proc: subprocess.Popen, last: Path, kill_at: int) -> int:
    """kill -9 `proc` the moment its last.ckpt reaches a save at `kill_at` or later; its step."""
    wait_for(last, proc)
    seen = last.stat().st_mtime_ns
    deadline = time.monotonic() + 120
    while step_of(last) < kill_at:
        while last.stat().st_mtime_ns == seen:  # the next save (an atomic rename)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"no save at step {kill_at} within 120 s"
            time.sleep(0.001)
        seen = last.stat().st_mtime_ns
    proc.kill()
    proc.communicate()
    return step_of(last)


@pytest.mark.parametrize("kill_at", [20, 45])
def test_sigkill_at_a_periodic_save_then_resume_is_exact(tmp_path, uninterrupted, kill_at):
    """kill -9 the moment last.ckpt reaches a periodic save (at a validation step, or between
    validations), resume=, and end where the uninterrupted run ends: weights, step, tokens."""
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    stopped_at = kill_at_save(start(*TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path), last, kill_at)
    assert kill_at <= stopped_at < 120 and not (run_dir / "metrics.json").exists()

    check(run_main(f"resume={run_dir}", cwd=tmp_path))
    whole, resumed = weights(uninterrupted / "checkpoints" / "last.ckpt"), weights(last)
    assert max((whole[k] - resumed[k]).abs().max().item() for k in whole) <= 1e-6
    for key in ("steps", "tokens_seen", "best_val_loss", "final_val_loss"):
        assert read_metrics(run_dir)[key] == read_metrics(uninterrupted)[key], key
    steps = [step for step, _ in scalars(run_dir / "tensorboard")["train/loss"]]
    assert steps == list(range(min(steps), min(steps) + 120)), "every step once, in order"


def test_sigkill_while_a_checkpoint_is_written_keeps_the_previous_one(tmp_path):
    """A large checkpoint, killed mid-write: the old file is untouched and still loads."""
    target = tmp_path / "last.ckpt"
    torch.save({"step": 1}, target)
    script = textwrap.dedent(f"""
        import torch
        from gptlab.training.checkpoint_io import RunCheckpointIO
        big = {{"step": 2, "w": torch.ones(400_000_000, dtype=torch.uint8)}}
        RunCheckpointIO({str(tmp_path)!r}).save_checkpoint(big, {str(target)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=ENV)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".last.ckpt.*.tmp")):  # its temporary file, being written
        assert proc.poll() is None and time.monotonic() < deadline, "no temporary file appeared"
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert torch.load(target, weights_only=True) == {"step": 1}


def test_nan_loss_stops_with_a_clear_message(tmp_path):
    result = run_main(
        "debug=fast",
        "optim.lr=1e30",
        "optim.warmup_steps=0",
        "trainer.gradient_clip_val=null",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
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
        (["ckpt_path={good}", "model.d_model=64"], "add its settings (model.d_model=32)"),
        (["data.path={dir}/empty.txt"], "give data=text_file data.path=<file>"),
        (["resume={dir}/no_ckpt_run"], "no_ckpt_run"),
        (["resume={dir}/nope"], "does not exist"),
    ],
)
def test_bad_input_fails_clearly_before_training(tmp_path, bad_files, overrides, needle):
    good_bytes = bad_files["good"].read_bytes()
    args = [o.format(dir=bad_files["dir"], good=bad_files["good"]) for o in overrides]
    result = run_main("debug=fast", *args, "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert needle.format(dir=bad_files["dir"]) in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "run").rglob("*.ckpt"))
    assert bad_files["good"].read_bytes() == good_bytes  # nothing overwritten


def test_a_planted_run_directory_runs_nothing(tmp_path, uninterrupted):
    """resume= of a directory someone handed over, overrides planted that could run code: refused
    whole, before anything is composed (it is not the user's own: gptlab.run.ownership)."""
    planted = [
        "debug=fast",
        "trainer.max_steps=125",
        "+hydra.callbacks.evil._target_=builtins.print",
        "+hydra.callbacks.evil.end=PWNED-HYDRA",
        "+callbacks.evil._target_=builtins.print",
        "trainer.profiler={_target_:builtins.print,end:PWNED-TRAINER}",
    ]
    handed = tmp_path / "handed"
    shutil.copytree(uninterrupted, handed)
    (handed / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(planted))
    refused = run_cli(f"resume={handed}", cwd=tmp_path)
    assert refused.returncode == 2 and "ckpt_path=" in refused.stderr
    assert "PWNED" not in refused.stdout + refused.stderr
