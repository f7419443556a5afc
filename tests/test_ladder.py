"""experiment=ladder's report (gptlab.sweep.ladder*), on sweeps written by hand whose answers are
known: a ladder on a power law is predicted on its held-out rung, one whose top rung stalls is
said to break, each source and each task's bpb gets its own fit; a scan's best against the
derived value, with a best at the scan's edge judged no optimum. And the experiment itself, run."""

import csv
import json
import math
from pathlib import Path

import matplotlib.image
import pytest
import yaml
from helpers import check, run_main
from omegaconf import OmegaConf

from gptlab.sweep import ladder, ladder_scan
from gptlab.sweep.summary import write_summary

DEPTHS = (1, 2, 3, 4)


def compute(depth: int) -> float:
    return 1e10 * 8**depth


def law(c: float) -> float:
    """The synthetic ladder's truth: L = 40 C^-0.1."""
    return 40.0 * c**-0.1


def job(sweep: Path, num: int, overrides: list[str], metrics: dict) -> None:
    """A finished job written by hand: its overrides, a config of interpolations (as a depth's
    run saves it), its metrics.json."""
    folder = sweep / str(num)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    cfg = {"model": {"d_model": "${gptlab.depth:model.d_model}"}}
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (folder / "metrics.json").write_text(json.dumps({"status": "ok", "num_params": 1, **metrics}))


def rung_metrics(depth: int, seed: int, loss: float, epochs: float = 0.5, **extra) -> dict:
    settings = {"d_model": 32 * depth, "num_heads": depth, "batch_size": 4 * depth}
    return {
        "depth": depth,
        "depth_rules": {"optim.lr": {"value": 3e-3, "rule": 3e-3, "derived": True}},
        "settings": settings,
        "train_flops": compute(depth),
        "best_val_loss": loss,
        "epochs": epochs,
        "seed": seed,
        **extra,
    }


def write_ladder(sweep: Path, loss_of, epochs: float = 0.5, extra=None) -> None:
    num = 0
    for seed in (1, 2):
        for depth in DEPTHS:
            noise = 0.004 * (seed - 1.5)  # the seeds 0.004 nats apart
            loss = loss_of(depth) + noise
            more = extra(depth, seed) if extra else {}
            metrics = rung_metrics(depth, seed, loss, epochs, **more)
            job(sweep, num, [f"seed={seed}", f"model.depth={depth}"], metrics)
            num += 1


def test_a_ladder_on_a_power_law_is_predicted_on_its_held_out_rung(tmp_path):
    write_ladder(tmp_path, lambda depth: law(compute(depth)))
    write_summary(tmp_path)
    report = json.loads((tmp_path / "ladder.json").read_text())
    held = report["losses"]["val loss"]["holdout"]
    assert held["depth"] == 4 and held["predicted"] == pytest.approx(law(compute(4)), abs=0.01)
    assert held["error_ci95"][0] <= 0 <= held["error_ci95"][1]
    assert held["fit"]["alpha"] == pytest.approx(0.1, abs=0.01)
    assert report["losses"]["val loss"]["verdict"].startswith("val loss: the rules hold here")
    summary = (tmp_path / "summary.md").read_text()
    assert "## Ladder" in summary and "![ladder](ladder.png)" in summary
    assert "| 3 | 2 | 96 | 3 | 12 |" in summary  # the rung's settings, from its metrics.json
    image = matplotlib.image.imread(tmp_path / "ladder.png")
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_a_ladder_whose_top_rung_stalls_breaks_and_says_where(tmp_path):
    """Rung 4 no better than rung 3, the top rungs past 4 epochs: the rules break, in words."""
    stalled = {1: law(compute(1)), 2: law(compute(2)), 3: law(compute(3)), 4: law(compute(3))}
    write_ladder(tmp_path, stalled.get, epochs=6.0)
    write_summary(tmp_path)
    verdict = json.loads((tmp_path / "ladder.json").read_text())["losses"]["val loss"]["verdict"]
    assert "the rules break here" in verdict
    assert "rung 4 is no better than rung 3" in verdict
    assert "repeated the data up to 6.0 times" in verdict


def test_each_source_and_each_tasks_bpb_is_fitted_on_its_own(tmp_path):
    """Two sources on different laws, a task's bpb on a third: three fits, three verdicts, each
    source's repetition its own."""

    def more(depth, seed):
        c = compute(depth)
        sources = {  # the book repeated 6 times on rung 4, Shakespeare never
            "book": {"best_val_loss": law(c) + 0.004 * (seed - 1.5), "epochs": depth * 1.5},
            "shakespeare": {"best_val_loss": 2 * law(c) + 0.004 * (seed - 1.5), "epochs": 0.5},
        }
        return {"sources": sources, "downstream/piqa/bpb": 3.0 * c**-0.05}

    write_ladder(tmp_path, lambda depth: law(compute(depth)), extra=more)
    write_summary(tmp_path)
    losses = json.loads((tmp_path / "ladder.json").read_text())["losses"]
    assert list(losses) == ["book val loss", "shakespeare val loss", "piqa bpb"]
    assert losses["piqa bpb"]["holdout"]["fit"]["alpha"] == pytest.approx(0.05, abs=1e-6)
    assert losses["shakespeare val loss"]["holdout"]["predicted"] == pytest.approx(
        2 * law(compute(4)), abs=0.02
    )
    assert "repeated the data up to 6.0 times" in losses["book val loss"]["verdict"]
    assert "repeated" not in losses["shakespeare val loss"]["verdict"]


def test_three_rungs_are_too_few_to_hold_one_out():
    rows = [
        {"status": "ok", **rung_metrics(d, s, law(compute(d)) + 0.01 * s)}
        for d in (1, 2, 3)
        for s in (1, 2)
    ]
    pts = ladder.points(rows, "best_val_loss")
    assert ladder.holdout(pts) is None
    assert "too few rungs" in ladder.verdict("val loss", None, ladder.rung_means(pts))


def scan_job(depth: int, key: str, value: float, rule: float, loss: float) -> dict:
    rules = {key: {"value": value, "rule": rule, "derived": False}}
    return {"status": "ok", "depth": depth, "depth_rules": rules, "best_val_loss": loss}


@pytest.mark.parametrize(
    ("best", "rule", "holds", "said"),
    [
        (3e-3, 3.46e-3, True, "holds"),  # derived 0.25 grid steps from the best
        (3e-3, 1.5e-2, False, "a factor 4.75 above the best: the rule fails here"),
        (1e-2, 3e-3, False, "at the scan's edge, no optimum"),
    ],
)
def test_a_scan_judges_the_derived_value_against_its_best(best, rule, holds, said):
    grid = [1e-3, 1.78e-3, 3.16e-3, 5.62e-3, 1e-2]
    rows = [
        scan_job(3, "optim.lr", lr, rule, 4.0 + (math.log10(lr) - math.log10(best)) ** 2)
        for lr in grid
    ]
    rows.append(scan_job(3, "optim.lr", 3e-3, rule, 0.0) | {"depth_rules": {}})  # no scan
    [scan] = ladder_scan.scans(rows)
    assert scan["grid"] == grid and scan["holds"] is holds
    assert scan["best"] == min(grid, key=lambda v: abs(math.log(v / best)))
    assert said in ladder_scan.reading(scan)


def test_the_ladder_experiment_runs_and_reports_per_source(tmp_path):
    """experiment=ladder on two_books, its rungs shrunk to seconds (tokens_per_param=0.025: 1 to
    19 steps) and one seed: every rung trains with its derived settings, and the report holds a
    fit and a verdict per source, ladder.png beside it."""
    result = check(
        run_main(
            "-m",
            "experiment=ladder",
            "data=two_books",
            "seed=1",
            "tokens_per_param=0.025",
            "trainer.val_check_interval=1000",
            "trainer.limit_val_batches=2",
            "callbacks=none",
            "logger=none",
            "hydra.sweep.dir=sweep",
            cwd=tmp_path,
        )
    )
    sweep = tmp_path / "sweep"
    report = json.loads((sweep / "ladder.json").read_text())
    assert list(report["losses"]) == ["book val loss", "shakespeare val loss"]
    for result_ in report["losses"].values():
        assert result_["holdout"]["depth"] == 4 and result_["verdict"]
    steps = [json.loads((sweep / str(n) / "metrics.json").read_text())["steps"] for n in range(4)]
    assert steps == [1, 5, 8, 19]
    config = OmegaConf.load(sweep / "3" / ".hydra" / "config.yaml")
    assert OmegaConf.to_container(config.model)["d_model"] == "${gptlab.depth:model.d_model}"
    assert "Ladder: the rung 4 held out" in result.stdout
    assert (sweep / "ladder.png").stat().st_size > 1000


def test_a_ladder_with_a_value_given_to_every_rung_is_still_a_ladder():
    """optim.lr=1e-3 given to every rung is no scan (one value a depth): the rungs are fitted;
    five rates at one depth are a scan, not a rung."""
    given = {"optim.lr": {"value": 1e-3, "rule": 3e-3, "derived": False}}
    rows = [
        {"status": "ok", **rung_metrics(d, s, law(compute(d))), "depth_rules": given}
        for d in DEPTHS
        for s in (1, 2)
    ]
    assert ladder.is_ladder(rows) and len(ladder.ladder_jobs(rows)) == 8
    scan = [scan_job(2, "optim.lr", lr, 3e-3, 4.0) for lr in (1e-3, 3e-3, 1e-2)]
    assert not ladder.is_ladder(scan) and not ladder_scan.scans(rows)
    assert [s["grid"] for s in ladder_scan.scans(scan)] == [[1e-3, 3e-3, 1e-2]]


def test_a_mixtures_columns_appear_once_in_the_jobs_table(tmp_path):
    """Each source's columns once in summary.csv and summary.md's jobs table (a merge had given
    them twice)."""

    def more(depth, seed):
        return {"sources": {"book": {"best_val_loss": 4.0, "epochs": 0.5, "share": 1.0}}}

    write_ladder(tmp_path, lambda depth: law(compute(depth)), extra=more)
    write_summary(tmp_path)
    header = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    assert header.count("book_val_loss") == 1 and header.count("book_share") == 1
    jobs = [
        line for line in (tmp_path / "summary.md").read_text().splitlines() if "| job |" in line
    ]
    assert jobs and all(line.count("| book_val_loss |") == 1 for line in jobs)


def test_a_crafted_metrics_file_is_read_as_data(tmp_path):
    """A sweep's metrics.json is anyone's file: a rule without its fields, settings that are
    nested maps, a depth of text: the report is written, those values left out, nothing raised."""
    write_ladder(tmp_path, lambda depth: law(compute(depth)))
    crafted = tmp_path / "0" / "metrics.json"
    metrics = json.loads(crafted.read_text())
    metrics.update(
        depth_rules={"optim.lr": {}, "data.batch_size": [1]},
        settings={"d_model": {"${oc.env:HOME}": 1}, "lr": [3e-3]},
    )
    crafted.write_text(json.dumps(metrics))
    (tmp_path / "1" / "metrics.json").write_text(
        json.dumps({**rung_metrics(2, 1, 5.0), "depth": "two", "status": "ok"})
    )
    write_summary(tmp_path)
    with open(tmp_path / "summary.csv") as f:
        jobs = {row["job"]: row for row in csv.DictReader(f)}
    assert jobs["0"]["d_model"] == "" and jobs["0"]["lr"] == ""
    assert json.loads((tmp_path / "ladder.json").read_text())["losses"]["val loss"]["holdout"]
