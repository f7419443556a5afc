"""A loss per source of a mixture, everywhere a loss is shown: the validation line, TensorBoard,
metrics.json, gptlab-eval (equal to what training logged), a sweep's summary.csv, summary.md and
mixture.png; a single-source run's names as they always were."""

import csv
import json
import re
from pathlib import Path

import pytest
import yaml
from helpers import check, read_metrics, run_main, scalars

from gptlab.sweep.summary import write_summary

SOURCES = ["book", "shakespeare"]
T_975_1 = 12.7062  # Student's t, 97.5th percentile, 1 degree of freedom: two seeds' interval


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory) -> Path:
    """experiment-sized two_books, tiny: 20 steps, val and test 2% of each source (so the sources
    score different numbers of tokens and micro differs from macro), val/loss the macro average."""
    cwd = tmp_path_factory.mktemp("mixed")
    args = [
        "debug=fast",
        "data=two_books",
        "data.val_average=macro",
        "data.val_fraction=0.02",
        "data.test_fraction=0.02",
        "data.val_tokens=null",
        "data.test_tokens=null",
        "trainer.max_steps=20",
        "trainer.limit_val_batches=1.0",
    ]
    result = check(run_main(*args, "hydra.run.dir=run", cwd=cwd))
    (cwd / "stdout.txt").write_text(result.stdout)
    return cwd / "run"


def test_metrics_json_holds_each_source_and_both_averages(mixed_run):
    m = read_metrics(mixed_run)
    assert m["val_average"] == "macro" and list(m["sources"]) == SOURCES
    book, shakespeare = (m["sources"][name] for name in SOURCES)
    micro, macro = m["averages"]["micro"], m["averages"]["macro"]
    for key in ("best_val_loss", "best_val_bpb", "final_val_loss", "test_loss", "test_bpb"):
        assert macro[key] == pytest.approx((book[key] + shakespeare[key]) / 2, rel=1e-6)
        low, high = sorted([book[key], shakespeare[key]])
        assert low < micro[key] < high and micro[key] != pytest.approx(macro[key], rel=1e-6)
    # val/loss, best.ckpt and best_val_loss follow data.val_average
    assert m["best_val_loss"] == pytest.approx(macro["best_val_loss"], rel=1e-6)
    assert m["test_loss"] == pytest.approx(macro["test_loss"], rel=1e-6)
    assert m["best_val_bpb"] == pytest.approx(macro["best_val_bpb"], rel=1e-6)
    # proportional weights: each source's share of the train tokens, the epochs the steps took
    assert book["share"] + shakespeare["share"] == pytest.approx(1.0)
    assert 0.15 < book["share"] < 0.25  # the book is a fifth of the two books' tokens
    tokens = m["tokens_seen"]
    assert book["epochs"] == book["planned_epochs"] > 0  # it trained all its steps
    assert book["epochs"] / shakespeare["epochs"] == pytest.approx(1.0, rel=0.05)
    assert m["epochs"] == max(book["epochs"], shakespeare["epochs"]) < tokens


def test_tensorboard_and_the_validation_line_show_each_source(mixed_run):
    m = read_metrics(mixed_run)
    tags = scalars(mixed_run / "tensorboard")
    assert not [tag for tag in tags if "dataloader_idx" in tag]
    for name in [*SOURCES, "micro", "macro"]:
        table = m["sources"].get(name) or m["averages"][name]
        for metric in ("loss", "bpb"):
            curve = tags[f"val/{name}/{metric}"]
            assert [step for step, _ in curve] == [10, 20]
            assert curve[-1][1] == pytest.approx(table[f"final_val_{metric}"], rel=1e-6)
    assert tags["val/loss"][-1][1] == pytest.approx(tags["val/macro/loss"][-1][1])
    log = (mixed_run / "train.log").read_text()
    book = m["sources"]["book"]["final_val_loss"]
    assert f"[book {book:.4f}, shakespeare " in log


def test_gptlab_eval_gives_each_source_the_value_training_logged(mixed_run, tmp_path):
    m = read_metrics(mixed_run)
    best = mixed_run / "checkpoints" / "best.ckpt"
    for split, key in (("val", "best_val_loss"), ("test", "test_loss")):
        out = check(
            run_main(f"ckpt_path={best}", f"split={split}", cwd=tmp_path, tool="gptlab-eval")
        )
        assert f"{split} loss above: the macro average" in out.stdout
        results = json.loads((mixed_run / "eval.json").read_text())
        [result] = [
            r for label, r in results.items() if (split == "test") == label.endswith("split")
        ]
        assert result[f"{split}_loss"] == pytest.approx(m[key], abs=1e-4)
        for name in SOURCES:
            logged = m["sources"][name][key]
            assert result["sources"][name][f"{split}_loss"] == pytest.approx(logged, abs=1e-4)
            assert f"{name:<13}{result['sources'][name][f'{split}_loss']:>10.6f}" in out.stdout
        for name in ("micro", "macro"):
            logged = m["averages"][name][key]
            assert result["averages"][name][f"{split}_loss"] == pytest.approx(logged, abs=1e-4)


def test_a_single_source_run_logs_exactly_its_names(finished):
    m = read_metrics(finished)
    assert "sources" not in m and "averages" not in m and "val_average" not in m
    tags = {tag for tag in scalars(finished / "tensorboard") if tag.startswith("val/")}
    assert tags == {"val/loss", "val/perplexity", "val/bpb"}
    lines = [
        line for line in (finished / "train.log").read_text().splitlines() if ", val loss" in line
    ]
    assert lines and all(re.search(r"val loss \d+\.\d{4}, val bpb", line) for line in lines)


def mix_job(sweep: Path, num: int, weight: float, seed: int, metrics: dict) -> None:
    """A finished job of a sweep over data.weights.book, by hand: its overrides, config, metrics."""
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    overrides = [f"data.weights.book={weight}", f"seed={seed}"]
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    cfg = {"data": {"weights": {"book": weight, "shakespeare": 1 - weight}}, "seed": seed}
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (job / "metrics.json").write_text(json.dumps({"status": "ok", "num_params": 1000, **metrics}))


def source_loss(share: float, seed: int, spread: float) -> float:
    """A source's loss by its share: 6 nats alone, 2 nats less when it is all of the mix."""
    return 6.0 - 2.0 * share + spread * (seed - 1.5)


def test_a_mixture_sweep_has_columns_intervals_a_figure_and_an_epochs_line(tmp_path):
    """Book weights 0.25, 0.5, 0.75, seeds 1 and 2 (book's seeds 0.1 apart, shakespeare's 0.2);
    one job (0.75, seed 2) trains 1.2 epochs of shakespeare."""
    num = 0
    for weight in (0.25, 0.5, 0.75):
        for seed in (1, 2):
            shares = {"book": weight, "shakespeare": 1 - weight}
            spreads = {"book": 0.1, "shakespeare": 0.2}
            sources = {
                name: {
                    "best_val_loss": source_loss(shares[name], seed, spreads[name]),
                    "share": shares[name],
                    "epochs": 1.2 if (num == 5 and name == "shakespeare") else 0.4,
                }
                for name in SOURCES
            }
            losses = [s["best_val_loss"] for s in sources.values()]
            micro = {"best_val_loss": sum(losses) / 2}
            metrics = {"best_val_loss": micro["best_val_loss"], "sources": sources}
            mix_job(tmp_path, num, weight, seed, {**metrics, "averages": {"micro": micro}})
            num += 1
    rows, head = write_summary(tmp_path)
    assert any(
        line.startswith("Repeated data: 1 of 6 ok jobs") and "job 5 (1.20 of shakespeare)" in line
        for line in head
    )
    with open(tmp_path / "summary.csv") as f:
        jobs = {row["job"]: row for row in csv.DictReader(f)}
    assert float(jobs["0"]["book_val_loss"]) == pytest.approx(source_loss(0.25, 1, 0.1))
    assert float(jobs["0"]["shakespeare_share"]) == pytest.approx(0.75)
    with open(tmp_path / "summary_configs.csv") as f:
        configs = {row["config"]: row for row in csv.DictReader(f)}
    quarter = configs["data.weights.book=0.25"]
    assert float(quarter["book_val_loss_mean"]) == pytest.approx(5.5)
    assert float(quarter["book_val_loss_ci95"]) == pytest.approx(T_975_1 * 0.05, rel=1e-4)
    assert float(quarter["shakespeare_val_loss_ci95"]) == pytest.approx(T_975_1 * 0.1, rel=1e-4)
    summary = (tmp_path / "summary.md").read_text()
    assert "book_val_loss ± ci95" in summary and "![mixture](mixture.png)" in summary
    # the mixture table: each source at each share, 6 - 2 x share
    assert f"| shakespeare | 0.25 | 5.5000 ± {T_975_1 * 0.1:.4f} | 2 |" in summary
    assert f"| book | 0.75 | 4.5000 ± {T_975_1 * 0.05:.4f} | 2 |" in summary
    assert (tmp_path / "mixture.png").stat().st_size > 1000


def test_a_sweep_under_one_epoch_of_every_source_says_so(tmp_path):
    for num, seed in enumerate((1, 2)):
        epochs = {"book": 0.3 + 0.1 * num, "shakespeare": 0.4 + 0.1 * num}
        sources = {
            name: {"best_val_loss": 5.0, "share": 0.5, "epochs": epochs[name]} for name in SOURCES
        }
        mix_job(tmp_path, num, 0.5, seed, {"best_val_loss": 5.0, "sources": sources})
    _, head = write_summary(tmp_path)
    assert (
        "Under one epoch: each of the 2 ok jobs trained on less than one epoch of every source "
        "(the most: 0.50 epochs of shakespeare)."
    ) in head
