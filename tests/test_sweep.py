"""Sweeps end to end: real `gptlab-train -m` processes, failures recorded, one summary per sweep."""

from __future__ import annotations

import csv
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import check, read_metrics, run_cli, scalars
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import gptlab.train  # noqa: F401 - registers the config schemas and resolvers
from gptlab.sweep import sweep_job

ROOT = Path(__file__).resolve().parents[1]
FAST = ("debug=fast", "trainer.max_steps=10")


def summary_rows(sweep_dir: Path) -> list[dict]:
    with (sweep_dir / "summary.csv").open() as f:
        return list(csv.DictReader(f))


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A real 2 x 2 multirun (heads x depth), one process, shared by the checks below."""
    cwd = tmp_path_factory.mktemp("grid")
    sweep = cwd / "sweep"
    result = check(run_cli("-m", *FAST, "model.num_heads=1,2", "model.num_blocks=1,2",
                           f"hydra.sweep.dir={sweep}", cwd=cwd))
    return sweep, result


def test_grid_runs_every_job_in_its_own_directory(grid):
    sweep, result = grid
    jobs = job_dirs(sweep)
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    combos = set()
    for job in jobs:
        m = read_metrics(job)
        assert m["status"] == "ok" and m["steps"] == 10 and math.isfinite(m["best_val_loss"])
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
        combos.add((cfg.model.num_heads, cfg.model.num_blocks))
        assert (job / "checkpoints" / "best.ckpt").is_file()
    assert combos == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert "Sweep done: 4 jobs, 4 ok, 0 failed." in result.stdout


def test_summary_has_one_row_a_job_sorted_by_val_loss(grid):
    sweep, result = grid
    rows = summary_rows(sweep)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    losses = [float(r["best_val_loss"]) for r in rows]
    assert losses == sorted(losses)
    for row in rows:
        m = read_metrics(sweep / row["job"])
        assert float(row["best_val_loss"]) == pytest.approx(m["best_val_loss"])
        assert int(row["num_params"]) == m["num_params"]
        assert float(row["tokens_per_sec"]) > 0 and float(row["wall_seconds"]) > 0
        assert f"model.num_heads={row['num_heads']}" in row["overrides"]
        assert f"model.num_blocks={row['num_blocks']}" in row["overrides"]
        assert row["d_model"] == "32" and row["max_steps"] == "10"
    md = (sweep / "summary.md").read_text()
    assert md.count("| ok |") == 4 and "best_val_loss" in md
    assert (sweep / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Best: job {rows[0]['job']}" in result.stdout


def test_tensorboard_compares_every_job_with_real_hparams(grid):
    sweep, _ = grid
    for job in job_dirs(sweep):
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
        best = read_metrics(job)["best_val_loss"]
        assert scalars(job / "tensorboard")["hparams/best_val_loss"][-1][1] == pytest.approx(best, rel=1e-5)
        acc = EventAccumulator(str(job / "tensorboard"))
        acc.Reload()
        content = acc.PluginTagToContent("hparams")
        session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        hparams = session.session_start_info.hparams
        assert hparams["model/num_heads"].number_value == cfg.model.num_heads
        assert hparams["model/num_blocks"].number_value == cfg.model.num_blocks


def test_sweep_report_script_regenerates_the_summary(grid):
    sweep, _ = grid
    before = (sweep / "summary.csv").read_text()
    for name in ("summary.csv", "summary.md", "summary.png"):
        (sweep / name).unlink()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep_report.py"), str(sweep)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert (sweep / "summary.csv").read_text() == before
    assert (sweep / "summary.md").is_file() and (sweep / "summary.png").is_file()
    assert "Sweep done: 4 jobs" in result.stdout


def test_sweep_report_on_a_directory_without_jobs_fails_clearly(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep_report.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "no sweep jobs here" in result.stderr


def test_an_invalid_job_is_recorded_the_others_finish_and_the_sweep_exits_non_zero(tmp_path):
    """d_model 32 with 3 heads is invalid: the job fails, the sweep goes on, the exit code says so.
    Run by the joblib launcher, two jobs at a time, each with its share of the cores."""
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *FAST, "model.d_model=32", "model.num_heads=2,3", "hydra/launcher=joblib",
                     "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "Sweep failed: 1 of 2 jobs failed: job 1" in result.stderr
    good, bad = read_metrics(sweep / "0"), read_metrics(sweep / "1")
    assert good["status"] == "ok" and (sweep / "0" / "checkpoints" / "best.ckpt").is_file()
    assert bad["status"] == "failed" and "not divisible" in bad["reason"] and "\n" not in bad["reason"]
    rows = summary_rows(sweep)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "failed")]
    assert "model.num_heads=3" in rows[1]["overrides"] and "not divisible" in rows[1]["reason"]
    md = (sweep / "summary.md").read_text()
    assert "| failed |" in md and "not divisible" in md
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"{threads} torch thread(s) for this job" in (sweep / "0" / "train.log").read_text()


def test_optuna_search_finds_and_prints_the_best_trial(tmp_path):
    sweep = tmp_path / "optuna"
    result = check(run_cli("-m", "hparams_search=optuna", *FAST, "hydra.sweeper.n_trials=3",
                           f"hydra.sweep.dir={sweep}", cwd=tmp_path))
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    losses = [read_metrics(j)["best_val_loss"] for j in job_dirs(sweep)]
    assert len(losses) == 3
    assert best["best_value"] == pytest.approx(min(losses))
    assert set(best["best_params"]) == {"optim.lr", "model.d_model", "model.num_blocks", "model.num_heads",
                                        "model.dropout"}
    assert "Optuna best trial: value" in result.stdout
    assert len(summary_rows(sweep)) == 3


def test_submitit_local_runs_two_jobs_and_reports(tmp_path):
    sweep = tmp_path / "sweep"
    result = check(run_cli("-m", "hydra/launcher=submitit_local", *FAST, "model.num_blocks=1,2",
                           f"hydra.sweep.dir={sweep}", cwd=tmp_path))
    rows = summary_rows(sweep)
    assert sorted(r["num_blocks"] for r in rows) == ["1", "2"] and {r["status"] for r in rows} == {"ok"}
    assert len(list((sweep / ".submitit").glob("*/*_log.out"))) == 2
    assert "Sweep done: 2 jobs, 2 ok" in result.stdout


def test_a_diverged_or_crashed_job_is_recorded_as_failed_and_returns_inf(tmp_path):
    cfg = OmegaConf.create({"num_threads": None, "paths": {"output_dir": str(tmp_path / "job")}})
    assert sweep_job(lambda c: float("nan"), cfg) == math.inf
    assert read_metrics(tmp_path / "job")["reason"].startswith("diverged")

    def crash(c):
        raise RuntimeError("out of memory\nsomewhere")

    assert sweep_job(crash, cfg) == math.inf
    m = read_metrics(tmp_path / "job")
    assert m["status"] == "failed" and m["reason"] == "RuntimeError: out of memory somewhere"
    assert sweep_job(lambda c: 1.5, cfg) == 1.5


def composed_with_hydra(*overrides: str):
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_experiment_sweep_holds_the_grid():
    params = composed_with_hydra("experiment=sweep").hydra.sweeper.params
    grid = [str(v).split(",") for v in params.values()]
    assert set(params) == {"model.num_heads", "model.num_blocks", "model.d_model"}
    assert len(list(itertools.product(*grid))) == 18
    for d_model, heads in itertools.product(params["model.d_model"].split(","),
                                            params["model.num_heads"].split(",")):
        assert int(d_model) % int(heads) == 0


def test_slurm_launcher_composes_with_its_knobs():
    launcher = composed_with_hydra("hydra/launcher=slurm", "hydra.launcher.partition=gpu").hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert launcher.gpus_per_node == launcher.tasks_per_node == 1
    assert launcher.submitit_folder.endswith("/.submitit/%j")
