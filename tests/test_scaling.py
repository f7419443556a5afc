"""Scaling laws: a FLOP budget sets a run's length (under DDP: tests/test_ddp.py); Chinchilla's
approaches 2 and 3 recover a known law from jobs written by hand; a real mini IsoFLOP sweep end to
end."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import check, read_metrics, run_main
from hydra import compose, initialize_config_module
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from gptlab.config.schemas import register_configs
from gptlab.data.datamodule import GPTDataModule
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.sweep import isoflop, parametric, scaling, scaling_plot
from gptlab.sweep.scaling import fit_sweep
from gptlab.sweep.summary import collect
from gptlab.training.budget import run_length, steps_for_budget, tokens_per_step, world_size
from gptlab.training.optim_config import OptimConfig, branch_length, branch_steps, check_schedule

register_configs()  # the config schemas and resolvers that composing conf/train.yaml needs

ROOT = Path(__file__).resolve().parents[1]
# a known law (Chinchilla-like exponents) and an IsoFLOP grid around its optimum at each budget
LAW = {"E": 1.8, "A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28}
BUDGETS = (1e15, 3e15, 1e16, 3e16, 1e17)
SPREAD = np.linspace(-1.2, 1.2, 7)  # log N around each budget's optimum: 0.3x to 3.3x
NOISE = 0.003  # multiplicative, on the loss


def write_job(sweep: Path, job: int, overrides: list[str], metrics: dict) -> None:
    """A finished job as a sweep leaves it: its saved config and overrides, its metrics.json."""
    folder = sweep / str(job)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": 1}))
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "metrics.json").write_text(json.dumps({"status": "ok", **metrics}))


def law_sweep(
    sweep: Path, budgets=BUDGETS, spread=SPREAD, seed: int = 0, jitter: float = 0.0, extra=()
) -> None:
    """Jobs whose loss follows LAW times lognormal noise; C = 6ND (flops_per_token = 6N), each
    job's C off its budget by up to `jitter` (a fraction, uniform) as a rounding of steps moves it;
    `extra` overrides in every job."""
    rng = np.random.default_rng(seed)
    job = 0
    for budget in budgets:
        optimum = parametric.frontier(LAW, budget)
        for shift in spread:
            n = optimum["N"] * math.exp(shift)
            d = budget * (1 + rng.uniform(-jitter, jitter)) / 6 / n
            loss = parametric.law_loss(LAW, n, d) * math.exp(rng.normal(0, NOISE))
            metrics = {"scaling_params": n, "num_params": 2 * n, "tokens_seen": d}
            metrics["flops_per_token"] = 6 * n
            metrics.update(best_val_loss=loss, epochs=d / 1e12)
            write_job(sweep, job, [f"model.d_model={job}", *extra], metrics)
            job += 1


def report(sweep: Path, cwd: Path, monkeypatch, *flags: str) -> tuple[int, Path]:
    """scripts/sweep_report.py on a sweep made by hand (foreign: its report goes under cwd)."""
    from scripts.sweep_report import main as sweep_report

    monkeypatch.chdir(cwd)
    status = sweep_report([str(sweep), *flags])
    [out] = (cwd / "outputs" / "sweep_report").glob("*/*")
    return status, out


def test_the_fits_recover_a_known_law_from_jittered_budgets_identified_with_intervals(
    tmp_path, monkeypatch
):
    """Each job's C up to 5% off its budget (a budget's jobs span up to 10.5%: one budget still),
    and a budget of 2 sizes below the grid that approach 3 takes and approach 2 leaves out."""
    law_sweep(tmp_path / "sweep", jitter=0.05)
    law_sweep(tmp_path / "small", budgets=(3e14,), spread=(0.0, 0.6))
    for job in range(2):
        (tmp_path / "small" / str(job)).rename(tmp_path / "sweep" / str(100 + job))
    status, out = report(tmp_path / "sweep", tmp_path, monkeypatch, "--scaling")
    assert status == 0
    fit = json.loads((out / "scaling.json").read_text())
    three = fit["approach3"]
    for name, tolerance in (("alpha", 0.05), ("beta", 0.05), ("E", 0.3)):
        assert abs(three[name] - LAW[name]) < tolerance, (name, three[name])
        lo, hi = three["ci95"][name]
        assert lo <= LAW[name] <= hi, (name, lo, hi)
    a = LAW["beta"] / (LAW["alpha"] + LAW["beta"])  # the allocation the law implies
    assert abs(fit["approach2"]["a"] - a) < 0.1 and abs(three["a"] - a) < 0.05
    lo, hi = fit["approach2"]["ci95"]["a"]
    assert lo < fit["approach2"]["a"] < hi
    assert abs(fit["approach2"]["a"] + fit["approach2"]["b"] - 1) < 0.05  # C = 6ND
    assert [o["C"] for o in fit["approach2"]["optima"]] == pytest.approx(BUDGETS, rel=0.05)
    assert three["identified"] and fit["approach2"]["identified"], (three, fit["approach2"])
    assert three["why_not"] == fit["approach2"]["why_not"] == []
    held = fit["holdout"]
    assert held["budget"] == pytest.approx(BUDGETS[-1], rel=0.05)
    assert abs(held["relative_error"]) < 0.02
    assert held["relative_error"] == pytest.approx(held["predicted"] / held["measured"] - 1)
    assert len(fit["points"]) == len(BUDGETS) * len(SPREAD) + 2  # approach 3's
    assert fit["notes"] == [
        "budget 3e+14 FLOPs: 2 size(s), fewer than 3: left out of approach 2, in approach 3"
    ]
    assert fit["repeated_data_points"] == 0  # epochs tiny here
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    text = (out / "scaling.md").read_text()
    assert (
        "Approach 3" in text and "not identified" not in text and text.count("**Identified.**") == 2
    )
    assert f"a = {round(fit['approach2']['a'], 2):.2f} (approach 2)" in text.splitlines()[2]


def test_a_fit_that_is_not_identified_says_why_in_its_headline_and_is_not_extrapolated(tmp_path):
    """The README's small example in shape: 2 budgets x 3 sizes of debug runs, by gptlab-report."""
    law_sweep(
        tmp_path / "sweep", budgets=(1e15, 2e15), spread=(-1.0, 0.0, 1.0), extra=["debug=fast"]
    )
    result = check(
        run_main(str(tmp_path / "sweep"), "--scaling", cwd=tmp_path, tool="gptlab-report")
    )
    [out] = (tmp_path / "outputs" / "sweep_report").glob("*/*")
    head = (out / "scaling.md").read_text().splitlines()[2:4]
    assert "approach 2 not identified (fewer than 6 sizes for a parabola's 3 parameters" in head[0]
    assert "approach 3 not identified (6 points for 5 parameters (needs 10)" in head[0]
    assert "bootstrap draws fitted (needs 100)" in head[0] and "A smoke test" in head[1]
    assert head[0].removeprefix("- ") in result.stdout and "| job |" not in result.stdout
    fit = json.loads((out / "scaling.json").read_text())
    assert not fit["approach2"]["identified"] and fit["approach2"]["ci95"]["a"] is None
    assert fit["approach3"]["draws_used"] < 100 and not fit["approach3"]["identified"]


def test_too_few_budgets_or_sizes_name_what_is_missing_and_the_summary_stands(
    tmp_path, monkeypatch
):
    law_sweep(tmp_path / "sweep", budgets=(1e15, 1e16), spread=(-1.0, 0.0, 1.0))
    (tmp_path / "sweep" / "5" / "metrics.json").unlink()  # 1e16 keeps 2 sizes
    status, out = report(tmp_path / "sweep", tmp_path, monkeypatch, "--scaling")
    assert status == 2
    message = (out / "scaling.md").read_text()
    assert "1 budget(s) with at least 3 model sizes" in message
    assert "1e+16 FLOPs: 2 sizes" in message and "flops_budget=" in message
    assert "Sweep done: 6 jobs, 5 ok, 1 failed" in (out / "summary.md").read_text()
    assert not (out / "scaling.json").exists()


def test_a_fit_not_identified_is_drawn_without_extrapolation_one_identified_with_it(tmp_path):
    """Both from the smallest budget, not below it. And a budget's optimum whose bootstrap
    interval does not hold it draws (no negative yerr)."""
    law_sweep(tmp_path, budgets=(1e15, 2e15), spread=(-1.0, 0.0, 1.0))
    jobs = collect(tmp_path)
    fit = fit_sweep(jobs.rows, jobs.knobs, "best_val_loss")["configurations"]["(every job)"]
    optimum = fit["approach2"]["optima"][0]
    optimum["L_opt_ci95"] = [optimum["L_opt"] + 0.1, optimum["L_opt"] + 0.2]
    smallest, largest = (
        min(p["budget"] for p in fit["points"]),
        max(p["budget"] for p in fit["points"]),
    )
    for identified, reach in ((False, 1.0), (True, scaling_plot.EXTRAPOLATE)):
        fit["approach2"]["identified"] = fit["approach3"]["identified"] = identified
        fig = Figure()
        axes = fig.subplots(1, 3)
        for ax, panel in zip(axes, scaling_plot.PANELS, strict=True):
            panel(ax, fit)
        for ax in axes[1:]:
            drawn = max(max(line.get_xdata()) for line in ax.lines)
            assert drawn == pytest.approx(largest * reach), (identified, ax.get_title())
            first = min(min(line.get_xdata()) for line in ax.lines)  # not below the budgets
            assert first == pytest.approx(smallest), (identified, ax.get_title())
        assert len(fig.axes) == 4 and axes[0].get_legend() is None  # budgets: a colour scale
    labels = [t.get_text() for t in axes[2].get_legend().get_texts()]
    a = f"{fit['approach3']['a']:.2f}"
    assert labels == [f"approach 3: a = {a}, frontier", "extrapolated"], labels


def test_intervals_that_pin_nothing_down_and_parameters_at_a_bound_are_named():
    fit = {"draws_used": 150, "ci95": {"a": [0.5, 0.5], "b": [0.01, 0.5], "c": [-0.1, 0.2]}}
    fit["ci95"]["d"] = [0.3, 0.6]
    assert scaling.interval_faults(fit, ("a", "b", "c", "d")) == [
        "a's interval has zero width",
        "b's interval [0.01, 0.5] spans over a decade",
        "c's interval [-0.1, 0.2] spans over a decade",
    ]
    fit.update(draws_used=5, ci95={"a": None})
    assert scaling.interval_faults(fit, ("a",)) == ["5 of 200 bootstrap draws fitted (needs 100)"]
    law = {**LAW, "E": math.exp(parametric.BOUNDS[2][0]), "beta": parametric.BOUNDS[4][1]}
    assert parametric.at_bounds(law) == ["E", "beta"] and parametric.at_bounds(LAW) == []


def test_jobs_within_ten_percent_of_compute_share_a_budget():
    """Clusters of log C: a new budget where C jumps by more than 10% from one job to the next, so
    jobs 5% either side of a budget (10.3% apart) share it."""
    points = [{"C": c} for c in (1.0, 1.09, 1.05, 1.5, 1.6, 1.64, 2.85, 3.15, 3.0)]
    budgets = isoflop.assign_budgets(points)
    assert len(budgets) == 3
    assert budgets[0] == pytest.approx((1.0 * 1.05 * 1.09) ** (1 / 3))
    assert len({p["budget"] for p in points[:3]}) == 1 and points[3]["budget"] == budgets[1]
    assert {p["budget"] for p in points[6:]} == {budgets[2]} and isoflop.assign_budgets([]) == []


@pytest.mark.parametrize(
    "toggles",
    [{}, {"activation": "swiglu", "tie_weights": True}, {"positional": "learned", "bias": False}],
)
def test_scaling_params_are_the_blocks_matrices_and_the_head(toggles):
    config = GPTConfig(vocab_size=97, context_length=16, d_model=32, num_heads=4, **toggles)
    model = GPT(config)
    matrices = [p for p in model.blocks.parameters() if p.dim() == 2]
    assert model.scaling_params() == sum(p.numel() for p in matrices) + model.head.weight.numel()
    assert 0 < model.scaling_params() < model.num_params()["total"]
    attention = 12 * config.num_blocks * config.context_length * config.d_model
    assert model.flops_per_token() == 6 * model.scaling_params() + attention


def test_a_budget_sets_max_steps_before_the_trainer_and_too_small_a_budget_is_refused():
    """The steps a budget buys over every rank's tokens (accumulated batches included), known
    from the settings alone: the Trainer is then built once with them."""
    cfg = OmegaConf.create(
        {
            "flops_budget": None,
            "data": {"batch_size": 8, "context_length": 32},
            "trainer": {"accelerator": "cpu", "devices": 2, "max_steps": 1200},
        }
    )
    cfg.trainer.accumulate_grad_batches = 2
    assert world_size(cfg.trainer) == 2 and tokens_per_step(cfg, 2) == 8 * 32 * 2 * 2
    per_step = 1000 * 8 * 32 * 2 * 2  # 1000 FLOPs a token
    assert run_length(cfg, 1000, OptimConfig()) == (
        1200,
        8 * 32 * 2 * 2,
        2,
        (),
    )  # no budget: trainer.max_steps
    cfg.flops_budget = 10.4 * per_step
    assert run_length(cfg, 1000, OptimConfig()).max_steps == 10
    with pytest.raises(ConfigError, match=r"flops_budget=.*buys no step"):
        steps_for_budget(0.4 * per_step, 1000, 8 * 32 * 2 * 2)


def test_gptlab_train_refuses_a_budget_below_one_step_with_exit_2(tmp_path):
    result = run_main("debug=fast", "flops_budget=1e6", "logger=none", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "flops_budget=1e+06" in result.stderr and "Raise flops_budget" in result.stderr


def test_experiment_scaling_is_an_isoflop_grid_that_composes_with_an_ablation():
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=["experiment=scaling"], return_hydra_config=True)
        rope = compose("train", overrides=["experiment=scaling", "+ablation=rope"])
    params = cfg.hydra.sweeper.params
    budgets = [float(b) for b in str(params.flops_budget).split(",")]
    widths = [int(d) for d in str(params["model.d_model"]).split(",")]
    assert len(budgets) >= 3 and len(widths) >= 5
    sizes = []
    for d_model in widths:
        model = {**cfg.model, "d_model": d_model, "vocab_size": 3771}  # the compact vocabulary
        config = GPTConfig(**{k: v for k, v in model.items() if k != "_target_"})
        assert config.head_size % 2 == 0  # valid for RoPE too
        sizes.append(GPT(config).scaling_params())
    assert max(sizes) / min(sizes) >= 10
    assert rope.model.positional == "rope" and rope.optim == cfg.optim


# ---------------------------------------------------------------------------------------------
# a real IsoFLOP sweep: 3 sizes x 2 budgets x 2 configurations (the at a quarter of its
# budgets: 12 jobs of 11 to 101 steps; under DDP: tests/test_ddp.py)


@pytest.fixture(scope="module")
def isoflop_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("isoflop")
    grid = ("model.d_model=16,32,64", "flops_budget=5e9,1e10", "+ablation=baseline,rope")
    quiet = ("callbacks=none", "logger=none", "trainer.val_check_interval=50")
    result = check(run_main("-m", "debug=fast", *grid, *quiet, "hydra.sweep.dir=sweep", cwd=cwd))
    return cwd, cwd / "sweep", result


def test_every_job_of_a_budget_spends_it_and_reports_what_a_fit_reads(isoflop_sweep, corpus_path):
    cwd, sweep, _ = isoflop_sweep
    jobs = sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert len(jobs) == 12
    data = GPTDataModule(path=str(corpus_path), cache_dir=str(cwd / "data" / "cache"))
    data.setup("fit")  # the sweep's token cache
    for job in jobs:
        m = read_metrics(job)
        assert m["train_flops"] == m["flops_per_token"] * m["tokens_seen"]
        assert abs(m["train_flops"] / m["flops_budget"] - 1) < 0.05
        assert 0 < m["scaling_params"] < m["num_params"]
        assert m["epochs"] == pytest.approx(m["tokens_seen"] / len(data.splits["train"]), 1e-3)
    with open(sweep / "summary.csv", newline="") as f:  # the budget's steps, not the config's
        rows = {row["job"]: row for row in csv.DictReader(f)}
    for job in jobs:
        m = read_metrics(job)
        assert m["max_steps"] == m["steps"] and rows[job.name]["max_steps"] == str(m["steps"])


def test_the_sweep_writes_its_scaling_fit_for_both_configurations(isoflop_sweep):
    _, sweep, result = isoflop_sweep
    assert "Scaling laws (scaling.md, scaling.json, scaling.png)" in result.stdout
    fit = json.loads((sweep / "scaling.json").read_text())
    assert set(fit["configurations"]) == {"ablation=baseline", "ablation=rope"}
    assert fit["first_configuration"] == "ablation=baseline"
    for configuration in fit["configurations"].values():
        assert {"a", "b", "ci95"} <= set(configuration["approach2"])
        assert set(parametric.NAMES) <= set(configuration["approach3"])
        assert set(configuration["approach3"]["ci95"]) >= set(parametric.NAMES)
        assert len(configuration["points"]) == 6 and configuration["holdout"] is None
    baseline, rope = fit["configurations"].values()
    budgets = [o["C"] for o in baseline["approach2"]["optima"]]
    assert [row["C"] for row in rope["vs_first"]] == budgets == pytest.approx([5e9, 1e10], 0.05)
    gap = rope["vs_first"][0]
    assert gap["gap"] == pytest.approx(gap["L_opt"] - baseline["approach2"]["optima"][0]["L_opt"])
    assert (
        "## Configurations along the compute-optimal frontier" in (sweep / "scaling.md").read_text()
    )
    assert (sweep / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert "Scaling laws" in (sweep / "summary.md").read_text()


def test_cooldown_branches_are_points_of_their_trunks_configuration_counted_once(
    tmp_path, monkeypatch
):
    """One wsd trunk a size at the largest budget (a sweep), its branches at the three below (runs
    beside it, as scripts/scaling_branches.sh lays them out): one configuration of 36 points over
    4 budgets, and the FLOPs spent count each trunk once and a branch's own cooldown (20% of C)."""
    budgets = (1e15, 2e15, 4e15, 8e15)
    middle = parametric.frontier(LAW, 2.8e15)["N"]
    rng = np.random.default_rng(0)
    for size, shift in enumerate(np.linspace(-1.6, 1.6, 9)):
        n = middle * math.exp(shift)
        for budget in reversed(budgets):
            d = budget / 6 / n
            loss = parametric.law_loss(LAW, n, d) * math.exp(rng.normal(0, NOISE))
            metrics = {"scaling_params": n, "tokens_seen": d, "flops_per_token": 6 * n}
            metrics.update(train_flops=budget, best_val_loss=loss, epochs=0.0)
            overrides = [f"model.d_model={size}"]
            trunk, step = tmp_path / "sweep" / "trunks" / str(size), round(budget / 1e13)
            if budget == budgets[-1]:  # the trunks' sweep, its branches' runs beside it
                write_job(trunk.parent, size, overrides, metrics)
                continue
            metrics.update(branch_train_flops=0.2 * budget)
            metrics["branched_from"] = {"run_dir": str(trunk), "step": step}
            overrides += [f"branch_from={trunk}", f"branch_step={step}"]
            write_job(tmp_path / "sweep" / "branches", f"{size}-{step}", overrides, metrics)
    for mark in ("multirun.yaml", "manifest.json"):  # a sweep inside is a folder of jobs
        (tmp_path / "sweep" / "trunks" / mark).write_text("{}")
    status, out = report(tmp_path / "sweep", tmp_path, monkeypatch, "--scaling")
    assert status == 0
    fit = json.loads((out / "scaling.json").read_text())
    assert "configurations" not in fit and len(fit["points"]) == 36  # one configuration
    assert [o["C"] for o in fit["approach2"]["optima"]] == pytest.approx(budgets)
    spent = 9 * (8e15 + 0.2 * (1e15 + 2e15 + 4e15))
    assert fit["flops"] == pytest.approx(
        {"spent": spent, "as_separate_runs": 9 * 15e15, "branches": 27}
    )
    text = (out / "scaling.md").read_text()
    assert "27 of them cooldown branches, each trunk counted once: 63% of the 1.35e+17" in text


def test_experiment_scaling_branches_lands_its_branches_on_the_grids_budgets():
    """Each width's trunk spends the grid's largest budget; the branches from its kept steps
    spend the three smaller ones (within the 10% a budget spans), at 63% of the grid's FLOPs."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        grid = compose("train", overrides=["experiment=scaling"], return_hydra_config=True)
        cfg = compose("train", overrides=["experiment=scaling_branches"], return_hydra_config=True)
    budgets = sorted(float(b) for b in str(grid.hydra.sweeper.params.flops_budget).split(","))
    assert float(cfg.hydra.sweeper.params.flops_budget) == budgets[-1]
    assert cfg.hydra.sweeper.params["model.d_model"] == grid.hydra.sweeper.params["model.d_model"]
    optim = OptimConfig(**{k: v for k, v in cfg.optim.items() if k != "_target_"})
    tokens = tokens_per_step(cfg, 1)
    spent, full = 0.0, 0.0
    for d_model in str(cfg.hydra.sweeper.params["model.d_model"]).split(","):
        model = {**cfg.model, "d_model": int(d_model), "vocab_size": 3771}
        flops = GPT(GPTConfig(**{k: v for k, v in model.items() if k != "_target_"}))
        per_step = flops.flops_per_token() * tokens
        trunk = steps_for_budget(budgets[-1], flops.flops_per_token(), tokens)
        check_schedule(optim, trunk)
        kept = branch_steps(optim, trunk)
        lengths = [branch_length(optim, step) for step in kept]
        for length, budget in zip(lengths, budgets, strict=False):
            assert length * per_step == pytest.approx(budget, rel=0.1), (d_model, length)
        cooldowns = sum(length - step for length, step in zip(lengths, kept, strict=True))
        spent += per_step * (trunk + cooldowns)
        full += sum(
            per_step * steps_for_budget(b, flops.flops_per_token(), tokens) for b in budgets
        )
    assert spent / full == pytest.approx(0.63, abs=0.02)


def test_a_flat_loss_identifies_no_exponent_and_prints_none(tmp_path, monkeypatch):
    """Every job of the grid at the same loss: no size is better at any budget, so there is no
    exponent; scaling.md says "not identified" where a number (a = -6.31e-16) would read as one."""
    law_sweep(tmp_path / "sweep")  # the grid's sizes and tokens
    for path in (tmp_path / "sweep").glob("*/metrics.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "best_val_loss": 3.0}))
    _, out = report(tmp_path / "sweep", tmp_path, monkeypatch, "--scaling")
    fit = json.loads((out / "scaling.json").read_text())
    assert not fit["approach2"]["identified"] and not fit["approach3"]["identified"]
    text = (out / "scaling.md").read_text()
    assert "with a = not identified; D_opt ∝ C^b with b = not identified" in text
    table = text.split("| parameter | fit (95% CI) |")[1].split("\n\n")[0].splitlines()[2:]
    assert table and all(row.endswith("| not identified |") for row in table), table
