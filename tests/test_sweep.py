"""Sweeps end to end: real `gptlab-train -m` processes, failures recorded, one summary per sweep."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import (
    BIN,
    check,
    read_metrics,
    run_cli,
    run_main,
    scalars,
    sign_run,
    tensorboard_runs,
)
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from gptlab.config.schemas import register_configs
from gptlab.run import directory
from gptlab.sweep import jobs as sweep
from gptlab.sweep.jobs import failure_message, sweep_job
from gptlab.sweep.summary import aggregate, collect, write_summary

register_configs()  # the config schemas and resolvers that composing conf/train.yaml needs

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
    result = check(
        run_main(
            "-m",
            *FAST,
            "model.num_heads=1,2",
            "model.num_blocks=1,2",
            f"hydra.sweep.dir={sweep}",
            cwd=cwd,
        )
    )
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
        assert float(row["tokens_per_sec"]) == pytest.approx(m["tokens_per_sec"])
        assert float(row["wall_seconds"]) == pytest.approx(m["wall_seconds"])
        assert f"model.num_heads={row['num_heads']}" in row["overrides"]
        assert f"model.num_blocks={row['num_blocks']}" in row["overrides"]
        assert row["d_model"] == "32" and row["max_steps"] == "10"
    md = (sweep / "summary.md").read_text()
    assert md.count("| ok |") == 4 and "best_val_loss" in md
    assert (sweep / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Best: job {rows[0]['job']}" in result.stdout


def test_tensorboard_compares_every_job_with_real_hparams(grid):
    """One TensorBoard run a job, named by what the sweep varies; its HPARAMS in that run."""
    sweep, _ = grid
    assert tensorboard_runs(sweep) == [
        f"{i}/tensorboard/heads={h},blocks={b}"
        for i, (h, b) in enumerate([(1, 1), (1, 2), (2, 1), (2, 2)])
    ]
    for job in job_dirs(sweep):
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
        best = read_metrics(job)["best_val_loss"]
        run = directory.tensorboard_run(job)
        assert run.name == f"heads={cfg.model.num_heads},blocks={cfg.model.num_blocks}"
        assert scalars(run)["val_results/best_loss"][-1][1] == pytest.approx(best, rel=1e-5)
        acc = EventAccumulator(str(run))
        acc.Reload()
        content = acc.PluginTagToContent("hparams")
        session = plugin_data_pb2.HParamsPluginData.FromString(
            content["_hparams_/session_start_info"]
        )
        hparams = session.session_start_info.hparams
        assert hparams["model/num_heads"].number_value == cfg.model.num_heads
        assert hparams["model/num_blocks"].number_value == cfg.model.num_blocks


def test_hparams_tab_shows_the_swept_keys_first_and_a_trial_per_job(grid):
    """TensorBoard shows the first five columns of the experiment it reads (those that "differ"
    first, by name): the swept keys and the model's size; each job a trial named by its
    settings; train and val loss on one custom-scalars chart."""
    sweep, _ = grid
    trials = []
    for job in job_dirs(sweep):
        acc = EventAccumulator(str(directory.tensorboard_run(job)), size_guidance={"tensors": 0})
        acc.Reload()
        content = acc.PluginTagToContent("hparams")
        experiment = plugin_data_pb2.HParamsPluginData.FromString(
            content["_hparams_/experiment"]
        ).experiment
        names = [info.name for info in experiment.hparam_infos]
        assert names[:3] == ["model/num_heads", "model/num_blocks", "num_params"]
        assert [info.name for info in experiment.hparam_infos if info.differs] == names[:3]
        assert len(names) == len(set(names)) > 10  # every other knob, not shown by default
        metrics = [m.name.tag for m in experiment.metric_infos]
        assert metrics[0] == "val_results/best_loss"
        start = plugin_data_pb2.HParamsPluginData.FromString(
            content["_hparams_/session_start_info"]
        ).session_start_info
        assert set(start.hparams) == set(names)
        trials.append(start.group_name)
        [layout] = acc.Tensors("custom_scalars__config__")
        chart = layout_pb2.Layout.FromString(layout.tensor_proto.string_val[0]).category[0].chart[0]
        assert list(chart.multiline.tag) == ["^train/loss$", "^val/loss$"]
    assert trials == [
        "heads=1,blocks=1",
        "heads=1,blocks=2",
        "heads=2,blocks=1",
        "heads=2,blocks=2",
    ]


def test_sweep_report_script_regenerates_the_summary(grid):
    sweep, _ = grid
    before = (sweep / "summary.csv").read_text()
    for name in ("summary.csv", "summary.md", "summary.png"):
        (sweep / name).unlink()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sweep_report.py"), str(sweep)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert (sweep / "summary.csv").read_text() == before
    assert (sweep / "summary.md").is_file() and (sweep / "summary.png").is_file()
    assert "Sweep done: 4 jobs" in result.stdout  # the headline and paths, not summary.md
    assert f"Summary: {sweep / 'summary.md'}" in result.stdout and "| job |" not in result.stdout


def test_sweep_report_on_a_directory_without_jobs_fails_clearly(tmp_path, capsys):
    from scripts.sweep_report import main as sweep_report

    assert sweep_report([str(tmp_path)]) == 1
    assert "no sweep jobs here" in capsys.readouterr().err


def test_an_invalid_job_is_recorded_the_others_finish_and_the_sweep_exits_non_zero(tmp_path):
    """d_model 32 with 3 heads is invalid: the job fails, the sweep goes on, the exit code says so.
    Run by the joblib launcher, two jobs at a time, each with its share of the cores."""
    sweep = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *FAST,
        "model.d_model=32",
        "model.num_heads=2,3",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "Sweep failed: 1 of 2 jobs failed: job 1" in result.stderr
    good = read_metrics(sweep / "0")
    bad = read_metrics(sweep / "1")
    assert good["status"] == "ok" and (sweep / "0" / "checkpoints" / "best.ckpt").is_file()
    assert (
        bad["status"] == "failed" and "not divisible" in bad["reason"] and "\n" not in bad["reason"]
    )
    rows = summary_rows(sweep)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "failed")]
    assert "model.num_heads=3" in rows[1]["overrides"] and "not divisible" in rows[1]["reason"]
    md = (sweep / "summary.md").read_text()
    assert "| failed |" in md and "not divisible" in md
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"{threads} torch thread(s) for this job" in (sweep / "0" / "train.log").read_text()


def test_a_sweep_of_nothing_but_bad_input_exits_2_with_each_reason_once(tmp_path):
    """Every job fails on the same bad key: one reason, its jobs as a range, exit 2 as for a run."""
    sweep = tmp_path / "sweep"
    result = run_main(
        "-m",
        *FAST,
        "model.activation=tanh2",
        "seed=1,2,3",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    [message] = [line for line in result.stderr.splitlines() if line.startswith("Sweep failed")]
    assert message.startswith("Sweep failed: 3 of 3 jobs failed: jobs 0-2: model.activation=")
    assert message.count("tanh2") == 1
    assert "No job finished" in message
    assert all(read_metrics(sweep / str(job))["bad_input"] is True for job in range(3))


def test_the_failure_message_groups_jobs_by_reason(tmp_path):
    rows = [
        {"job": job, "status": "failed", "reason": "bad key.", "overrides": f"seed={job}"}
        for job in ("0", "1", "2", "5", "7", "8")
    ]
    rows.append({"job": "9", "status": "failed", "reason": "diverged", "overrides": "lr=9"})
    rows.append({"job": "4", "status": "failed", "reason": 5, "overrides": "lr=4"})  # planted
    rows.append({"job": "3", "status": "ok", "reason": "", "overrides": "seed=3"})
    message = failure_message(rows[:-1], rows, tmp_path)
    assert message == (
        "Sweep failed: 8 of 9 jobs failed: jobs 0-2, 5, 7-8: bad key; job 9 (lr=9): diverged; "
        f"job 4 (lr=4): 5. The other jobs finished; see {tmp_path / 'summary.md'}."
    )


def test_submitit_local_runs_two_jobs_and_reports(tmp_path):
    sweep = tmp_path / "sweep"
    result = check(
        run_cli(
            "-m",
            "hydra/launcher=submitit_local",
            *FAST,
            "model.num_blocks=1,2",
            f"hydra.sweep.dir={sweep}",
            cwd=tmp_path,
        )
    )
    rows = summary_rows(sweep)
    assert sorted(r["num_blocks"] for r in rows) == ["1", "2"] and {r["status"] for r in rows} == {
        "ok"
    }
    assert len(list((sweep / ".submitit").glob("*/*_log.out"))) == 2
    assert "Sweep done: 2 jobs, 2 ok" in result.stdout


def test_a_diverged_or_crashed_job_is_recorded_as_failed_and_returns_inf(tmp_path):
    cfg = OmegaConf.create({"num_threads": None, "paths": {"output_dir": str(tmp_path / "job")}})
    assert sweep_job(lambda c, plan: float("nan"), cfg) == math.inf
    assert read_metrics(tmp_path / "job")["reason"].startswith("diverged")

    def crash(c, plan):
        raise RuntimeError("out of memory\nsomewhere")

    assert sweep_job(crash, cfg) == math.inf
    m = read_metrics(tmp_path / "job")
    assert m["status"] == "failed" and m["reason"] == "RuntimeError: out of memory somewhere"
    assert sweep_job(lambda c, plan: 1.5, cfg) == 1.5


def composed_with_hydra(*overrides: str):
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_experiment_sweep_holds_the_grid():
    params = composed_with_hydra("experiment=sweep").hydra.sweeper.params
    grid = [str(v).split(",") for v in params.values()]
    assert set(params) == {"model.num_heads", "model.num_blocks", "model.d_model", "seed"}
    assert len(params["seed"].split(",")) == 3  # every configuration with 3 seeds
    assert len(list(itertools.product(*grid))) == 36
    for d_model, heads in itertools.product(
        params["model.d_model"].split(","), params["model.num_heads"].split(",")
    ):
        assert int(d_model) % int(heads) == 0


def test_slurm_launcher_composes_with_its_knobs():
    launcher = composed_with_hydra(
        "hydra/launcher=slurm", "hydra.launcher.partition=gpu"
    ).hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert launcher.gpus_per_node == launcher.tasks_per_node == 1
    assert launcher.submitit_folder.endswith("/.submitit/%j")


# ---------------------------------------------------------------------------------------------
# seeds as a sweep axis: one row per configuration, mean ± 95% CI, Welch's test against the best


@pytest.fixture(scope="module")
def seed_grid(tmp_path_factory):
    """heads x seeds: 2 configurations x 2 seeds, one process."""
    cwd = tmp_path_factory.mktemp("seeds")
    sweep_dir = cwd / "sweep"
    result = check(
        run_main(
            "-m", *FAST, "model.num_heads=2,4", "seed=1,2", f"hydra.sweep.dir={sweep_dir}", cwd=cwd
        )
    )
    return sweep_dir, result


def config_rows(sweep_dir: Path) -> list[dict]:
    with (sweep_dir / "summary_configs.csv").open() as f:
        return list(csv.DictReader(f))


def test_seed_sweep_writes_one_row_per_configuration_with_mean_and_ci(seed_grid):
    sweep_dir, result = seed_grid
    jobs = summary_rows(sweep_dir)
    assert len(jobs) == 4 and {r["seed"] for r in jobs} == {"1", "2"}  # summary.csv: one row a job
    configs = config_rows(sweep_dir)
    assert len(configs) == 2
    for column in (
        "n_seeds",
        "n_failed",
        "val_loss_mean",
        "val_loss_std",
        "val_loss_ci95",
        "val_bpb_mean",
        "val_bpb_ci95",
        "vs_best",
    ):
        assert column in configs[0]
    assert [float(c["val_loss_mean"]) for c in configs] == sorted(
        float(c["val_loss_mean"]) for c in configs
    )
    for config in configs:
        heads = config["model.num_heads"]
        metrics = [read_metrics(sweep_dir / j["job"]) for j in jobs if j["num_heads"] == heads]
        losses = [m["best_val_loss"] for m in metrics]
        assert config["n_seeds"] == "2" and config["n_failed"] == "0" and config["seeds"] == "1 2"
        assert float(config["val_loss_mean"]) == pytest.approx(sum(losses) / 2)
        std = abs(losses[0] - losses[1]) / math.sqrt(2)
        assert float(config["val_loss_std"]) == pytest.approx(std)
        assert float(config["val_loss_ci95"]) == pytest.approx(
            12.7062 * std / math.sqrt(2), rel=1e-4
        )
        bpbs = [m.get("best_val_bpb") for m in metrics]
        if all(b is not None for b in bpbs):  # runs of a gptlab that logs val/bpb
            assert float(config["val_bpb_mean"]) == pytest.approx(sum(bpbs) / 2)
            assert config["val_bpb_ci95"] != ""
    assert configs[0]["vs_best"] == "best"
    assert configs[1]["vs_best"] in ("not distinguishable", "worse")
    md = (sweep_dir / "summary.md").read_text()
    assert "## Configurations" in md and "±" in md and "Welch" in md and md.count("| ok |") == 4
    best = configs[0]
    assert f"{float(best['val_loss_mean']):.4f} ± {float(best['val_loss_ci95']):.4f}" in md
    assert (sweep_dir / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Best configuration: model.num_heads=" in result.stdout


def test_each_finished_job_records_its_overrides_in_metrics_json(seed_grid):
    sweep_dir, _ = seed_grid
    for job in job_dirs(sweep_dir):
        recorded = read_metrics(job)["overrides"]
        assert recorded == yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())


def configs_of(*losses: list[float]) -> list[dict]:
    """aggregate() over hand-made ok jobs, as their rows: configuration `model.x=i` has the best
    val losses losses[i]."""
    rows = [
        {"job": f"{i}-{seed}", "status": "ok", "model.x": i, "seed": seed, "best_val_loss": loss}
        for i, values in enumerate(losses)
        for seed, loss in enumerate(values)
    ]
    return [config.row() for config in aggregate(rows, ["model.x", "seed"])]


def test_mean_std_ci_and_welch_against_hand_computed_values():
    # [1, 2, 3, 4]: mean 2.5, s^2 = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, CI = 3.182 * s / 2
    (config,) = configs_of([1.0, 2.0, 3.0, 4.0])
    assert config["val_loss_mean"] == 2.5 and config["val_loss_std"] == pytest.approx(
        math.sqrt(5 / 3)
    )
    assert config["val_loss_ci95"] == pytest.approx(3.1824 * math.sqrt(5 / 3) / 2, rel=1e-4)
    (config,) = configs_of([4.2])
    assert (config["val_loss_mean"], config["val_loss_std"], config["val_loss_ci95"]) == (
        4.2,
        None,
        None,
    )
    # [1, 2, 3] vs [4, 5, 6]: both variances 1, t = -3 / sqrt(2/3) = -3.674, Welch df = 4;
    # with 4 df the two-sided tail is 1 - sqrt(x) (1 + (1 - x) / 2), x = t^2 / (t^2 + 4)
    t = 3 / math.sqrt(2 / 3)
    x = t * t / (t * t + 4)
    best, other = configs_of([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
    assert best["config"] == "model.x=1" and best["p_vs_best"] is None and best["vs_best"] == "best"
    assert other["p_vs_best"] == pytest.approx(1 - math.sqrt(x) * (1 + (1 - x) / 2))
    assert other["p_vs_best"] == pytest.approx(0.0213, abs=1e-4) and other["vs_best"] == "worse"
    other = configs_of([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])[1]
    assert other["p_vs_best"] == pytest.approx(1.0) and other["vs_best"] == "not distinguishable"
    other = configs_of([1.0], [1.0, 2.0])[1]
    assert other["p_vs_best"] is None and other["vs_best"] == "untested (fewer than 2 seeds)"
    assert configs_of([2.0, 2.0], [2.0, 2.0])[1]["p_vs_best"] == 1.0
    assert configs_of([2.0, 2.0], [3.0, 3.0])[1]["p_vs_best"] == 0.0


def fake_job(sweep_dir: Path, num: int, overrides: list[str], metrics: dict | None) -> None:
    job = sweep_dir / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    heads, seed = (int(o.split("=")[1]) for o in overrides)
    cfg = {"model": {"d_model": 32, "num_heads": heads}, "seed": seed}
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    if metrics is not None:
        (job / "metrics.json").write_text(
            json.dumps({"status": "ok", "num_params": 1000, **metrics})
        )


def test_aggregation_leaves_failed_jobs_out_counts_them_and_tolerates_missing_bpb(tmp_path):
    """Hand-made sweep: heads=2 with seeds 1-3 (seed 3 failed, no bpb: an older run); heads=4
    with seeds 1-3, far worse."""
    losses = {(2, 1): 3.0, (2, 2): 3.2, (4, 1): 5.0, (4, 2): 5.1, (4, 3): 5.2}
    num = 0
    for heads in (2, 4):
        for seed in (1, 2, 3):
            loss = losses.get((heads, seed))
            metrics = {"best_val_loss": loss} if loss else {"status": "failed", "reason": "boom"}
            if heads == 4:
                metrics["best_val_bpb"] = loss / 4
            fake_job(tmp_path, num, [f"model.num_heads={heads}", f"seed={seed}"], metrics)
            num += 1
    jobs = collect(tmp_path)
    assert jobs.knobs == ["model.num_heads", "seed"] and not jobs.horizons
    best, other = [config.row() for config in aggregate(jobs.rows, jobs.knobs)]
    assert best["config"] == "model.num_heads=2" and best["n_seeds"] == 2 and best["n_failed"] == 1
    assert best["val_loss_mean"] == pytest.approx(3.1)
    assert best["val_loss_std"] == pytest.approx(math.sqrt(0.02))
    assert best["val_loss_ci95"] == pytest.approx(
        12.7062 * math.sqrt(0.02) / math.sqrt(2), rel=1e-4
    )
    assert best["val_bpb_mean"] is None and best["val_bpb_ci95"] is None
    assert other["n_seeds"] == 3 and other["val_loss_mean"] == pytest.approx(5.1)
    assert other["val_bpb_mean"] == pytest.approx(5.1 / 4) and other[
        "val_bpb_std"
    ] == pytest.approx(0.025)
    assert other["val_loss_ci95"] == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)
    assert best["vs_best"] == "best" and other["vs_best"] == "worse" and other["p_vs_best"] < 0.05
    write_summary(tmp_path)
    configs = config_rows(tmp_path)
    assert [c["n_failed"] for c in configs] == ["1", "0"] and configs[0]["val_bpb_mean"] == ""
    md = (tmp_path / "summary.md").read_text()
    assert "3.1000 ± 1.2706" in md and "| worse |" in md
    assert "best_val_bpb" in summary_rows(tmp_path)[0]  # some jobs have it: the column is there


def test_a_sweep_without_a_seed_axis_writes_no_configuration_table(grid):
    sweep_dir, _ = grid
    assert not (sweep_dir / "summary_configs.csv").exists()
    assert "## Configurations" not in (sweep_dir / "summary.md").read_text()


# ---------------------------------------------------------------------------------------------
# continuing a sweep: finished jobs are kept as they are


def test_a_continued_sweep_keeps_a_finished_job_without_training_it(tmp_path, monkeypatch):
    job = tmp_path / "0"
    job.mkdir()
    sign_run(tmp_path, "sweep")  # the user's own sweep, continued
    overrides = ["debug=fast", "seed=1"]
    metrics = {"status": "ok", "best_val_loss": 4.5, "overrides": overrides}
    (job / "metrics.json").write_text(json.dumps(metrics))
    before = (job / "metrics.json").read_bytes()
    cfg = OmegaConf.create(
        {"num_threads": None, "resume": str(tmp_path), "paths": {"output_dir": str(job)}}
    )
    trained = []

    def train(c, plan):
        trained.append(plan)  # the job's start: its own, in the sweep it continues
        return 3.0

    # relaunched with resume=<sweep dir> added: the same job
    monkeypatch.setattr(sweep, "job_overrides", lambda: [*overrides, f"resume='{tmp_path}'"])
    assert sweep_job(train, cfg) == 4.5 and not trained
    assert (job / "metrics.json").read_bytes() == before
    # another job in that directory (the overrides differ): trained
    monkeypatch.setattr(
        sweep, "job_overrides", lambda: ["debug=fast", "seed=2", f"resume='{tmp_path}'"]
    )
    assert sweep_job(train, cfg) == 3.0 and len(trained) == 1
    assert (trained[0].kind, trained[0].resumed, trained[0].run_dir) == ("fresh", tmp_path, job)
    # not a continuation: always trained
    cfg.resume = None
    monkeypatch.setattr(sweep, "job_overrides", lambda: overrides)
    assert sweep_job(train, cfg) == 3.0 and len(trained) == 2


def test_a_continued_sweep_retrains_failed_stopped_and_unrecorded_jobs(tmp_path, caplog):
    job = tmp_path / "0"
    job.mkdir()
    cases = [
        {"status": "failed", "best_val_loss": 4.0, "overrides": ["a=1"]},  # failed or stopped
        {"status": "ok", "best_val_loss": 4.0},  # an older gptlab: no overrides recorded
        {"status": "ok", "best_val_loss": None, "overrides": ["a=1"]},  # no finite loss
        {"status": "ok", "best_val_loss": 4.0, "overrides": ["a=2"]},
    ]  # another job
    caplog.set_level("INFO", logger="gptlab.sweep.jobs")
    for metrics in cases:
        (job / "metrics.json").write_text(json.dumps(metrics))
        caplog.clear()
        assert sweep.finished_result(job, ["a=1"]) is None and "Job 0 runs" in caplog.text
    assert sweep.finished_result(tmp_path / "missing", ["a=1"]) is None
    finished = {"status": "ok", "best_val_loss": 4.0, "overrides": ["a=1"]}
    (job / "metrics.json").write_text(json.dumps(finished))
    assert sweep.finished_result(job, ["a=1", "resume=x"]) == 4.0 and "Kept job 0" in caplog.text


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the sweep ended before {what}"
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def test_a_sweep_stopped_by_sigterm_continues_with_resume_and_keeps_finished_jobs(tmp_path):
    """3 jobs; Ctrl-C once the first has finished and the second trains; `resume=<sweep dir>`
    then finishes the sweep: 3 jobs ok, the first one kept as it was."""
    sweep_dir = tmp_path / "sweep"
    args = [
        "-m",
        "debug=fast",
        "trainer.max_steps=60",
        "seed=1,2,3",
        f"hydra.sweep.dir={sweep_dir}",
        f"paths.cache_dir={tmp_path / 'cache'}",  # where a job caches is not what it trains
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "first.log", "w") as log_file:  # a file: a full pipe would block the sweep
        proc = subprocess.Popen(
            [str(BIN / "gptlab-train"), *args],
            cwd=tmp_path,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        first = sweep_dir / "0" / "metrics.json"
        wait_until(
            lambda: first.is_file() and json.loads(first.read_text()).get("overrides"),
            proc,
            "job 0 finished",
        )
        wait_until(
            lambda: (sweep_dir / "1" / "checkpoints" / "best.ckpt").is_file(), proc, "job 1 trained"
        )
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.wait(timeout=120)
    assert proc.returncode == 130  # stopped by Ctrl-C
    # the command that continues the whole sweep, not its one job
    assert f"gptlab-train resume={sweep_dir}\n" in (tmp_path / "first.log").read_text()
    assert not (sweep_dir / "2").exists()
    assert (
        read_metrics(sweep_dir / "1")["status"] == "failed"
    )  # stopped (or killed before it trained)
    kept = first.read_bytes(), first.stat().st_mtime_ns

    result = check(run_main(f"resume={sweep_dir}", cwd=tmp_path))
    assert [read_metrics(sweep_dir / str(i))["status"] for i in range(3)] == ["ok"] * 3
    assert (first.read_bytes(), first.stat().st_mtime_ns) == kept
    assert "Kept job 0" in result.stderr
    assert read_metrics(sweep_dir / "1")["steps"] == 60
    # the continued job is still one TensorBoard run, under the name its first start gave it
    assert [p.name for p in (sweep_dir / "1" / "tensorboard").iterdir()] == ["seed=2"]
    assert "Sweep done: 3 jobs, 3 ok, 0 failed." in result.stdout
    assert len(summary_rows(sweep_dir)) == 3
