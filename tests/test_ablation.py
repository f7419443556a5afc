"""experiment=ablation end to end, and the deltas against its baseline.

One real sweep through the console script's entry point (helpers.run_main: the basic launcher
runs its jobs in its process), 2 configurations x 2 seeds x 10 steps with the experiment's test
split, serves the end-to-end tests: every job's metrics.json holds its test loss and val curve,
summary_configs.csv the deltas against the baseline with their verdicts, and gptlab-eval
split=test gives back a job's test loss. The Welch statistics behind the verdicts:
tests/test_stats.py."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import pytest
from helpers import check, read_metrics, run_main

from gptlab.sweep.ablation import add_deltas
from gptlab.sweep.curves import add_time_to_loss, mean_curve
from gptlab.sweep.tables import CONFIG_METRICS, Configuration, Delta, Seeds

SWEEP = (
    "-m",
    "experiment=ablation",
    "debug=fast",
    "trainer.max_steps=10",
    "trainer.val_check_interval=5",
    "+ablation=baseline,less_dropout",
    "seed=1,2",
    "logger=none",
    "hydra.sweep.dir=sweep",
)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("ablation")
    check(run_main(*SWEEP, cwd=cwd))  # four jobs, one after the other
    return cwd / "sweep"


def configs_csv(sweep_dir: Path) -> dict[str, dict]:
    with (sweep_dir / "summary_configs.csv").open() as f:
        return {row["config"]: row for row in csv.DictReader(f)}


def test_every_job_reports_its_test_loss_and_val_curve(sweep_dir):
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "metrics.json").is_file())
    assert len(jobs) == 4
    for job in jobs:
        metrics = read_metrics(job)
        assert metrics["status"] == "ok"
        assert math.isfinite(metrics["test_loss"]) and math.isfinite(metrics["test_bpb"])
        assert metrics["test_loss"] != metrics["best_val_loss"]  # another split
        curve = metrics["val_curve"]
        assert [point[0] for point in curve] == [5, 10]  # [step, wall seconds, val loss]
        assert 0 < curve[0][1] < curve[1][1] <= metrics["wall_seconds"]
        assert min(point[2] for point in curve) == pytest.approx(metrics["best_val_loss"])


def test_summary_has_deltas_and_verdicts_against_the_baseline(sweep_dir):
    configs = configs_csv(sweep_dir)
    assert set(configs) == {"ablation=baseline", "ablation=less_dropout"}
    jobs = [read_metrics(p) for p in sweep_dir.iterdir() if (p / "metrics.json").is_file()]

    def values(name: str, key: str) -> list[float]:
        return [m[key] for m in jobs if f"+ablation={name}" in m["overrides"]]

    other = configs["ablation=less_dropout"]
    base = configs["ablation=baseline"]
    for prefix, key in (("", "best_val_loss"), ("test_", "test_loss")):
        expected = statistics.fmean(values("less_dropout", key)) - statistics.fmean(
            values("baseline", key)
        )
        assert float(other[f"{prefix}delta_vs_baseline_mean"]) == pytest.approx(expected)
        assert float(other[f"{prefix}delta_vs_baseline_ci95"]) > 0
        verdicts = ("better", "not distinguishable", "worse")
        assert other[f"{prefix}verdict_vs_baseline"] in verdicts
        assert base[f"{prefix}verdict_vs_baseline"] == "baseline"
    summary = (sweep_dir / "summary.md").read_text()
    # the deltas lead, before the usual tables
    assert summary.index("## Against the baseline") < summary.index("## Configurations")
    for figure in ("summary_deltas.png", "summary_curves.png"):
        assert (sweep_dir / figure).stat().st_size > 1000 and figure in summary
    assert float(other["time_to_val_loss"]) > 0


def test_gptlab_eval_split_test_gives_the_runs_test_loss(sweep_dir):
    job = sweep_dir / "0"
    result = check(
        run_main(f"ckpt_path={job}", "split=test", cwd=sweep_dir.parent, tool="gptlab-eval")
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("test loss:"))
    assert float(line.split(":")[1].split()[0]) == pytest.approx(
        read_metrics(job)["test_loss"], abs=1e-5
    )
    assert "The run logged test_loss" in result.stdout


def test_add_deltas_needs_a_baseline():
    stats = {metric: Seeds.of([1.0, 2.0]) for metric in CONFIG_METRICS}
    configs = [Configuration("ablation=rope", {}, 2, 0, None, "1 2", "0 1", stats)]
    assert add_deltas(configs) is None
    assert not configs[0].deltas and "delta_vs_baseline_mean" not in configs[0].row()
    base = Configuration("ablation=baseline", {}, 2, 0, None, "1 2", "2 3", dict(stats))
    base.stats["test_loss"] = Seeds.of([])  # no test split: no test delta
    assert add_deltas([*configs, base]) is base
    assert base.deltas == {"val_loss": Delta(0.0, None, None, "baseline")}
    assert configs[0].deltas["val_loss"].verdict == "not distinguishable"


def test_time_to_loss_and_mean_curve():
    rows = [
        {
            "job": str(i),
            "status": "ok",
            "steps": 20,
            "tokens_seen": 20 * 512,
            "tokens_per_step": 512,
            "flops_per_token": 1000,
            "val_curve": [[10, 1.0 + i, 5.0 - i], [20, 2.0 + i, 4.0 - i]],
        }
        for i in range(2)
    ]
    stats = {metric: Seeds.of([]) for metric in CONFIG_METRICS}
    configs = [Configuration("a", {}, 2, 0, None, "1 2", "0 1", stats)]
    assert add_time_to_loss(rows, configs, 4.5) == 4.5
    assert [row["time_to_val_loss"] for row in rows] == [2.0, 2.0]  # job 1 at its first point
    assert configs[0].time_to_val_loss == 2.0
    assert add_time_to_loss(rows, configs, 3.5) == 3.5
    assert rows[0]["time_to_val_loss"] is None and configs[0].time_to_val_loss is None
    # without a target: the highest best loss of the jobs, which every job reached
    assert add_time_to_loss(rows, configs, None) == 4.0
    assert mean_curve(rows) == [(1.5, 1000 * 10 * 512, 4.5), (2.5, 1000 * 20 * 512, 3.5)]
