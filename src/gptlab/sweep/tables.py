"""The tables of a sweep's reports: the columns of summary.csv and summary_configs.csv, and the
one way every table shows a value (cell, format_estimate) and is written as Markdown."""

import csv
from pathlib import Path

from gptlab.run.place import PLACE
from gptlab.sweep.stats import ci_half_width, mean_std, number

PARAMS = {
    "d_model": "model.d_model",
    "num_heads": "model.num_heads",
    "num_blocks": "model.num_blocks",
    "dropout": "model.dropout",
    "lr": "optim.lr",
    "batch_size": "data.batch_size",
    "context_length": "data.context_length",
    "max_steps": "trainer.max_steps",
}  # always in summary.csv
# where there are any: the test split's, the deltas against a baseline (gptlab.sweep.ablation), the
# time to a val loss (gptlab.sweep.curves)
JOB_EXTRA = ["test_loss", "test_bpb", "time_to_val_loss"]
DELTAS = [
    "delta_vs_baseline_mean",
    "delta_vs_baseline_ci95",
    "p_vs_baseline",
    "verdict_vs_baseline",
]
CONFIG_EXTRA = [
    *(f"test_loss_{stat}" for stat in ("mean", "std", "ci95")),
    *(f"{split}{column}" for split in ("", "test_") for column in DELTAS),
    "time_to_val_loss",
]
# the columns of summary.md's configuration table
CONFIG_SHOWN = [
    "config",
    "n_seeds",
    "n_failed",
    "val_loss ± ci95",
    "val_bpb ± ci95",
    "vs_best",
    "p_vs_best",
    "num_params",
]


def cell(value, spec: str = ".5g") -> str:
    if value is None:
        return ""
    return f"{value:{spec}}" if isinstance(value, float) else str(value)


def format_estimate(value: float | None, error=None, spec: str = ".4f") -> str:
    """A value with its half-width ("4.1234 ± 0.0123") or its interval ("4.1234 [4.1011, 4.1502]");
    '' without a value."""
    if value is None:
        return ""
    if isinstance(error, (list, tuple)):
        return f"{value:{spec}} [{error[0]:{spec}}, {error[1]:{spec}}]"
    half = "" if error is None else f" ± {error:{spec.lstrip('+')}}"  # a width has no sign
    return f"{value:{spec}}{half}"


def markdown_table(header: list[str], rows: list[list], spec: str = ".5g") -> list[str]:
    """A Markdown table's lines: the header, its rule, a line per row of cells (`|` escaped)."""
    lines = [header, ["---"] * len(header), *rows]
    cells = [[cell(c, spec).replace("|", "\\|") for c in line] for line in lines]
    return ["| " + " | ".join(line) + " |" for line in cells]


def write_table(
    path: Path, cols: list[str], rows: list[dict], shown: list[str] | None = None
) -> list[str]:
    """Write the rows' `cols` as CSV; return their `shown` ones (default: all) as Markdown."""
    with PLACE.atomic(path) as f:
        writer = csv.DictWriter(f, cols, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    shown = shown or cols
    return markdown_table(shown, [[row.get(col) for col in shown] for row in rows])


def metric_columns(metric: str, values: list[float]) -> dict:
    """A metric's columns over a configuration's seeds, "mean ± ci95" for the Markdown, and
    `_<metric>`, the values for Welch's test (not written)."""
    mean, std = mean_std(values)
    half = ci_half_width(values)
    return {
        f"_{metric}": values,
        f"{metric}_mean": mean,
        f"{metric}_std": std,
        f"{metric}_ci95": half,
        f"{metric} ± ci95": format_estimate(mean, half),
    }


def present(columns: list[str], rows: list[dict]) -> list[str]:
    return [column for column in columns if any(row.get(column) is not None for row in rows)]


def config_columns(knobs: list[str], configs: list[dict]) -> list[str]:
    """The columns of summary_configs.csv; CONFIG_EXTRA where a configuration has them."""
    stats = [f"{m}_{stat}" for m in ("val_loss", "val_bpb") for stat in ("mean", "std", "ci95")]
    head = ["config", *[k for k in knobs if k != "seed"], "num_params", "n_seeds", "n_failed"]
    return [*head, *stats, "p_vs_best", "vs_best", *present(CONFIG_EXTRA, configs), "seeds", "jobs"]


def job_columns(rows: list[dict], knobs: list[str]) -> list[str]:
    """The columns of summary.csv; best_val_bpb and JOB_EXTRA where jobs have them."""
    bpb = ["best_val_bpb"] if any(number(r.get("best_val_bpb")) is not None for r in rows) else []
    head = [
        "job",
        "status",
        "best_val_loss",
        *bpb,
        "best_val_perplexity",
        *present(JOB_EXTRA, rows),
    ]
    knob_columns = [k for k in knobs if k not in PARAMS.values()]
    tail = ["tokens_per_sec", "wall_seconds", "overrides", "reason"]
    return [*head, "num_params", *PARAMS, *knob_columns, *tail]
