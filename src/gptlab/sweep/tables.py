"""The tables of a sweep's reports: the columns of summary.csv and summary_configs.csv, the
configurations (typed rows: a sweep's jobs alike but for the seed, with their statistics), and the
one way every table shows a value (cell, format_estimate) and is written as Markdown."""

import csv
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.run import directory
from gptlab.run.place import PLACE
from gptlab.sweep.stats import (
    ci_half_width,
    group_configurations,
    job_values,
    mean_std,
    number,
    sort_key,
    verdict,
    welch,
)

PARAMS = directory.SETTINGS  # always in summary.csv
# where there are any: the test split's, the deltas against a baseline (gptlab.sweep.ablation), the
# time to a val loss (gptlab.sweep.curves)
JOB_EXTRA = ["test_loss", "test_bpb", "time_to_val_loss"]
# the metrics compared with a baseline (gptlab.sweep.ablation), by their columns' prefix
DELTA_METRICS = {"": "val_loss", "test_": "test_loss"}
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
# a configuration's statistics over its seeds: column prefix, the key of its jobs' metrics
CONFIG_METRICS = {"val_loss": "best_val_loss", "val_bpb": "best_val_bpb", "test_loss": "test_loss"}
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


@dataclass
class Seeds:
    """A metric over a configuration's seeds: the values (Welch's test takes them), their mean,
    sample standard deviation and the half-width of the mean's 95% interval."""

    values: list[float]
    mean: float | None = None
    std: float | None = None
    ci95: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> "Seeds":
        mean, std = mean_std(values)
        return cls(values, mean, std, ci_half_width(values))

    def estimate(self) -> str:
        """ "mean ± ci95", the Markdown's cell ('' without a value)."""
        return format_estimate(self.mean, self.ci95)


@dataclass
class Delta:
    """A configuration against the baseline on one metric: the difference of the means, the
    half-width of its Welch interval, the p-value and the verdict ("baseline" for itself)."""

    mean: float
    ci95: float | None
    p: float | None
    verdict: str


@dataclass
class Configuration:
    """A configuration's row of summary_configs.csv: the jobs alike in every knob but the seed."""

    name: str
    knobs: dict  # its value of each swept key but seed
    n_seeds: int  # its ok jobs
    n_failed: int
    num_params: int | None
    seeds: str
    jobs: str
    stats: dict[str, Seeds]  # by metric: val_loss, val_bpb, test_loss
    p_vs_best: float | None = None
    vs_best: str = ""
    deltas: dict[str, Delta] = field(default_factory=dict)  # by metric, against the baseline
    time_to_val_loss: float | None = None  # its seeds' mean (gptlab.sweep.curves)
    marks: dict[str, bool] = field(default_factory=dict)  # its scores at chance (sweep.downstream)

    def value(self, key: str):
        """A knob's value, or the parameter count: what a plot's panel places it by."""
        if key == "num_params":
            return self.num_params
        return self.knobs.get(key)

    def row(self) -> dict:
        """Its cells by column: summary_configs.csv's and the Markdown's ("val_loss ± ci95")."""
        row = {
            "config": self.name,
            **self.knobs,
            "n_seeds": self.n_seeds,
            "n_failed": self.n_failed,
            "num_params": self.num_params,
            "seeds": self.seeds,
            "jobs": self.jobs,
            "p_vs_best": self.p_vs_best,
            "vs_best": self.vs_best,
            "time_to_val_loss": self.time_to_val_loss,
            **self.marks,
        }
        for metric, seeds in self.stats.items():
            row[f"{metric}_mean"] = seeds.mean
            row[f"{metric}_std"] = seeds.std
            row[f"{metric}_ci95"] = seeds.ci95
            row[f"{metric} ± ci95"] = seeds.estimate()
        for prefix, metric in DELTA_METRICS.items():
            delta = self.deltas.get(metric)
            if delta is None:
                continue
            cells = (delta.mean, delta.ci95, delta.p, delta.verdict)
            row.update(zip([prefix + column for column in DELTAS], cells, strict=True))
            row[f"{prefix}delta ± ci95"] = format_estimate(delta.mean, delta.ci95, "+.4f")
        return row


def configuration(
    name: str, jobs: list[dict], knobs: list[str], scores: list[str] = ()
) -> Configuration:
    """A configuration: its knobs, seeds and jobs, and the statistics of its ok jobs (of
    CONFIG_METRICS, and of `scores`: metrics.json's or summary.csv's keys, e.g. a mixture's
    per source, the downstream tasks')."""
    ok = [job for job in jobs if job["status"] == "ok"]
    num_params = None
    if ok:
        num_params = ok[0].get("num_params")
    return Configuration(
        name=name,
        knobs={key: jobs[0].get(key) for key in knobs if key != "seed"},
        n_seeds=len(ok),
        n_failed=len(jobs) - len(ok),
        num_params=num_params,
        seeds=" ".join(sorted((str(job.get("seed")) for job in jobs), key=sort_key)),
        jobs=" ".join(sorted((job["job"] for job in jobs), key=sort_key)),
        stats={
            **{metric: Seeds.of(job_values(jobs, key)) for metric, key in CONFIG_METRICS.items()},
            **{key: Seeds.of(job_values(jobs, key)) for key in scores},
        },
    )


def aggregate(rows: list[dict], knobs: list[str], scores: list[str] = ()) -> list[Configuration]:
    """One per configuration, best mean val loss first, each against the best by Welch (with
    the statistics of `scores` too: see configuration)."""
    groups = group_configurations(rows, knobs)
    configs = [configuration(name, jobs, knobs, scores) for name, jobs in groups.items()]
    configs.sort(key=lambda c: sort_key(c.stats["val_loss"].mean))
    best = configs[0].stats["val_loss"].values
    if best:
        configs[0].vs_best = "best"
    for config in configs[1:]:
        delta, _, p = welch(config.stats["val_loss"].values, best)
        config.p_vs_best = p
        if delta is not None:
            config.vs_best = verdict(delta, p)
    return configs


def present(columns: list[str], rows: list[dict]) -> list[str]:
    return [column for column in columns if any(row.get(column) is not None for row in rows)]


def config_columns(knobs: list[str], rows: list[dict], extra: list[str] = ()) -> list[str]:
    """The columns of summary_configs.csv; CONFIG_EXTRA where a configuration has them, then
    `extra` (statistics of a mixture's and the downstream scores: gptlab.sweep.mixture,
    gptlab.sweep.downstream) where one has them."""
    stats = [f"{m}_{stat}" for m in ("val_loss", "val_bpb") for stat in ("mean", "std", "ci95")]
    head = ["config", *[k for k in knobs if k != "seed"], "num_params", "n_seeds", "n_failed"]
    tail = [*present(CONFIG_EXTRA, rows), *present(extra, rows), "seeds", "jobs"]
    return [*head, *stats, "p_vs_best", "vs_best", *tail]


def job_columns(rows: list[dict], knobs: list[str], extra: list[str] = ()) -> list[str]:
    """The columns of summary.csv; best_val_bpb and JOB_EXTRA where jobs have them, then `extra`
    (a mixture's per source, the downstream scores: gptlab.sweep.mixture, .downstream)."""
    bpb = ["best_val_bpb"] if any(number(r.get("best_val_bpb")) is not None for r in rows) else []
    head = [
        "job",
        "status",
        "best_val_loss",
        *bpb,
        "best_val_perplexity",
        *present(JOB_EXTRA, rows),
        *extra,
    ]
    knob_columns = [k for k in knobs if k not in PARAMS.values()]
    tail = ["tokens_per_sec", "wall_seconds", "overrides", "reason"]
    return [*head, "num_params", *PARAMS, *knob_columns, *tail]
