"""gptlab-eval: a checkpoint's exact val loss, equal to what its run logged; other texts; early
stopping.

One real debug-sized run with early stopping serves every test: a constant, high learning rate
and patience 1 stop it at its first validation without improvement, so its best.ckpt and its
final weights (last.ckpt) differ and each has its own logged val loss to match.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from helpers import check, own_copy, read_metrics, run_main, umask
from hydra import compose, initialize_config_module

import gptlab.cli.eval as gptlab_eval
from gptlab.errors import ConfigError

MAX_STEPS = 100
RUN = (
    "debug=fast",
    "callbacks=early_stopping",
    "callbacks.early_stopping.patience=1",
    "optim.lr=0.2",  # noisy enough that some validation before step 100 does not improve
    "optim.schedule=constant",
    f"trainer.max_steps={MAX_STEPS}",
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("eval")
    check(run_main(*RUN, "hydra.run.dir=run", cwd=cwd))
    return cwd / "run"


def evaluate(tmp_path: Path, *overrides: str) -> dict:
    """gptlab-eval in this process (the CLI's own task function), writing into tmp_path."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("eval", overrides=[*overrides, f"output_dir={tmp_path / 'out'}"])
    return gptlab_eval.evaluate(cfg)


def printed(stdout: str, label: str) -> float:
    line = next(line for line in stdout.splitlines() if line.startswith(label))
    return float(line.split(":", 1)[1].split()[0])


def test_early_stopping_ends_training_at_the_first_validation_without_improvement(run_dir):
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok" and metrics["steps"] < MAX_STEPS
    assert "Signaling Trainer to stop" in (run_dir / "train.log").read_text()
    # patience 1: the final validation did not improve on the best one
    assert metrics["final_val_loss"] >= metrics["best_val_loss"]


def test_gptlab_eval_prints_the_best_val_loss_the_run_logged_for_best_ckpt(run_dir):
    with umask(0o022):
        result = check(run_main(f"ckpt_path={run_dir}", cwd=run_dir.parent, tool="gptlab-eval"))
    assert (run_dir / "eval.json").stat().st_mode & 0o777 == 0o644  # a colleague reads it too
    for noise in ("litlogger", "LeafSpec", "was configured so", "`srun` command"):
        assert noise not in result.stderr  # Lightning's known noise
    metrics = read_metrics(run_dir)
    loss = printed(result.stdout, "val loss:")
    assert loss == pytest.approx(metrics["best_val_loss"], abs=1e-3)
    assert printed(result.stdout, "perplexity:") == pytest.approx(math.exp(loss), rel=1e-4)
    assert printed(result.stdout, "bpb:") == pytest.approx(metrics["best_val_bpb"], abs=1e-3)
    assert "The run logged best_val_loss" in result.stdout
    entries = json.loads((run_dir / "eval.json").read_text())  # beside the run, one entry per check
    record = next(r for r in entries.values() if r["checkpoint"].endswith("best.ckpt"))
    assert record["val_loss"] == pytest.approx(loss, abs=1e-6)


def test_last_ckpt_gives_the_final_val_loss(run_dir, tmp_path):
    metrics = read_metrics(run_dir)
    record = evaluate(tmp_path, f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}")
    assert record["step"] == metrics["steps"]
    assert record["val_loss"] == pytest.approx(metrics["final_val_loss"], abs=1e-3)
    assert record["val_bpb"] == pytest.approx(metrics["final_val_bpb"], abs=1e-3)


def test_the_corpus_given_as_another_text_gives_the_same_windows(run_dir, corpus_path, tmp_path):
    """The run's own corpus as another text (tokenized with the checkpoint's tokenizer, split as
    training splits it): the same windows, the same loss."""
    record = evaluate(
        tmp_path,
        f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
        f"data.path={corpus_path}",
        "data.val_fraction=0.1",
    )
    full = evaluate(
        tmp_path, f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", "data.batch_size=8"
    )
    assert record["val_loss"] == pytest.approx(full["val_loss"], abs=1e-5)


def test_a_held_out_text_is_evaluated_whole(run_dir, corpus_text, tmp_path):
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("".join(corpus_text.splitlines(keepends=True)[:12]))
    record = evaluate(tmp_path, f"ckpt_path={run_dir}", f"data.path={held_out}")
    assert record["val_fraction"] == 1.0 and record["corpus"] == str(held_out)
    assert math.isfinite(record["val_loss"]) and record["val_bpb"] > 0


def test_a_checkpoint_outside_its_run_dir_reads_windows_of_its_own_context_length(
    run_dir, corpus_path, tmp_path
):
    alone = tmp_path / "alone.ckpt"
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", alone)
    record = evaluate(tmp_path, f"ckpt_path={alone}", f"data.path={corpus_path}")
    assert record["context_length"] == 32 and math.isfinite(
        record["val_loss"]
    )  # debug=fast's, not 64
    with pytest.raises(ConfigError, match="at most 32 tokens"):
        evaluate(
            tmp_path, f"ckpt_path={alone}", f"data.path={corpus_path}", "data.context_length=64"
        )


def test_a_run_dir_that_cannot_be_written_leaves_the_result_in_the_output_dir(run_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval.json"))
    (copy / "eval.json").mkdir()  # writing it fails as a read-only mount would (root ignores chmod)
    result = check(run_main(f"ckpt_path={copy}", cwd=tmp_path, tool="gptlab-eval"))
    written = Path(result.stdout.split("Written: ")[1].strip())
    assert written.parent.parent.parent.name == "eval" and json.loads(written.read_text())
    assert not list(copy.glob(".*.tmp"))  # the failed write left nothing in the run


def test_bad_input_is_one_paragraph_and_exit_code_2(run_dir, tmp_path):
    alien = tmp_path / "alien.txt"
    alien.write_text("Zyzzyva quokkas juggle at dawn\n" * 20)
    fifo, zero = tmp_path / "fifo.ckpt", tmp_path / "zero.ckpt"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    zero.symlink_to("/dev/zero")  # reading it would never end
    for args, needle in (
        (["ckpt_path=/no/such/run"], "'/no/such/run' does not exist"),
        ([f"ckpt_path={run_dir}", f"data.path={alien}"], "data.compact_vocab=false"),
        ([f"ckpt_path={run_dir}", "device=tpu"], "device='tpu'"),
        # gptlab-train's group: another text is data.path alone
        (
            [f"ckpt_path={run_dir}", "data=text_file"],
            "Give its data keys alone instead, e.g. `data.path=",
        ),
        ([f"ckpt_path={fifo}"], f"'{fifo}' is not a regular file"),
        ([f"ckpt_path={zero}"], f"'{zero}' is not a regular file"),
    ):
        result = run_main(*args, cwd=tmp_path, tool="gptlab-eval")
        assert result.returncode == 2 and needle in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "+data" not in result.stderr


def test_a_corrupt_eval_json_is_refused_before_the_evaluation_and_kept(finished, tmp_path):
    finished_run = own_copy(finished, tmp_path / "run")
    corrupt = finished_run / "eval.json"
    corrupt.write_text('{"best.ckpt": {"val_loss": 4.2')  # cut off mid-write
    before = corrupt.read_bytes()
    out = tmp_path / "out"
    args = [f"ckpt_path={finished_run}", f"hydra.run.dir={out}"]
    result = run_main(*args, cwd=tmp_path, tool="gptlab-eval")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"'{corrupt}' is not gptlab-eval's JSON record" in result.stderr
    assert "Move it away" in result.stderr and "Traceback" not in result.stderr
    assert "val loss" not in result.stdout  # refused before the evaluation
    assert corrupt.read_bytes() == before
    assert not (out / "eval.json").exists()
    corrupt.unlink()  # the fix the message gives works
    check(run_main(*args, cwd=tmp_path, tool="gptlab-eval"))
    assert any(label.startswith("best.ckpt on") for label in json.loads(corrupt.read_text()))
