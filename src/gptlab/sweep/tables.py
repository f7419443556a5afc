"""The tables of a sweep's summary: which columns summary.csv and summary_configs.csv hold, and
one writer for the CSV and its Markdown view."""

import csv
from pathlib import Path

from gptlab import files
from gptlab.sweep.stats import number

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


def write_table(
    path: Path, cols: list[str], rows: list[dict], shown: list[str] | None = None
) -> list[str]:
    """Write the rows' `cols` as CSV; return their `shown` columns (default: the same) as
    Markdown."""
    with files.atomic(path) as f:
        writer = csv.DictWriter(f, cols, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    shown = shown or cols
    return markdown_table(shown, [[table_cell(row.get(col)) for col in shown] for row in rows])


def table_cell(value) -> str:
    """A value as the Markdown view shows it: floats to 5 significant digits, None as nothing."""
    if value is None:
        return ""
    return f"{value:.5g}" if isinstance(value, float) else str(value)


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """The lines of a Markdown table: a heading, its rule, a line per row (a `|` escaped)."""
    lines = [header, ["---"] * len(header), *rows]
    return ["| " + " | ".join(str(c).replace("|", "\\|") for c in line) + " |" for line in lines]


def config_columns(knobs: list[str], extra: list[str]) -> list[str]:
    """The columns of summary_configs.csv (`extra`: the test, baseline and time-to-loss ones)."""
    stats = [
        f"{metric}_{stat}" for metric in ("val_loss", "val_bpb") for stat in ("mean", "std", "ci95")
    ]
    return [
        "config",
        *[k for k in knobs if k != "seed"],
        "num_params",
        "n_seeds",
        "n_failed",
        *stats,
        "p_vs_best",
        "vs_best",
        *extra,
        "seeds",
        "jobs",
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


def job_columns(rows: list[dict], knobs: list[str], extra: list[str]) -> list[str]:
    """The columns of summary.csv; best_val_bpb where a job recorded it (older runs did not);
    `extra`: test loss and time to a val loss, where jobs have them."""
    bpb = ["best_val_bpb"] if any(number(r.get("best_val_bpb")) is not None for r in rows) else []
    return [
        "job",
        "status",
        "best_val_loss",
        *bpb,
        "best_val_perplexity",
        *extra,
        "num_params",
        *PARAMS,
        *[k for k in knobs if k not in PARAMS.values()],
        "tokens_per_sec",
        "wall_seconds",
        "overrides",
        "reason",
    ]
