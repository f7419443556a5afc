"""The summary of a sweep: summary.csv/.md/.png, with seed statistics per configuration."""

import csv
import logging
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gptlab.cli.app import Task
from gptlab.sweep.ablation import BASELINE, summary_extras
from gptlab.sweep.jobs import job_identity, number, read_json

log = logging.getLogger(__name__)
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
CONFIDENCE = 0.95  # of the intervals; Welch's test against the best runs at 1 - CONFIDENCE


def _order(value: Any) -> tuple:
    """A sort key: numbers first, by value (2 before 10), then the rest by text."""
    return (number(value) is None, number(value) or 0.0, str(value))


def collect(sweep_dir: Path) -> tuple[list[dict], list[str]]:
    """Every job (metrics.json, PARAMS, its overrides' values), best first, failed last; the swept knobs."""

    def select(
        cfg: DictConfig, key: str, default: Any = None
    ) -> Any:  # a value, not a config group
        value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        return default if value is None or OmegaConf.is_config(value) else value

    rows, keys = [], {}
    for path in sweep_dir.glob("**/.hydra/config.yaml"):
        job, cfg = path.parents[1], OmegaConf.load(path)
        overrides = job_identity(
            OmegaConf.load(job / ".hydra" / "overrides.yaml")
        )  # Hydra writes it beside
        metrics = read_json(job / "metrics.json") or {
            "status": "failed",
            "reason": "no metrics.json",
        }
        row = {
            "status": "ok",
            "reason": "",
            **metrics,
            "job": job.name,
            "overrides": " ".join(overrides),
            **{column: select(cfg, key) for column, key in PARAMS.items()},
        }
        for key, _, text in (o.lstrip("+~").partition("=") for o in overrides):
            row[key] = keys[key] = select(cfg, key, text)
        if row["status"] == "ok" and number(row.get("best_val_loss")) is None:
            row.update(
                status="failed", reason=f"diverged: best val loss {row.get('best_val_loss')}"
            )
        rows.append(row)
    rows.sort(key=lambda r: (r["status"] != "ok", _order(r.get("best_val_loss")), _order(r["job"])))
    return rows, [key for key in keys if len({repr(row.get(key)) for row in rows}) > 1]


def aggregate(rows: list[dict], knobs: list[str]) -> list[dict]:
    """One row per configuration (jobs that differ only in `seed`) by mean val loss: mean, std and Student-t
    interval (honest for few seeds) of its ok jobs' best val loss and bpb; Welch's t-test against the best."""
    from scipy import stats

    group, members = [k for k in knobs if k != "seed"], {}
    for row in rows:
        members.setdefault(
            " ".join(f"{k}={row.get(k)}" for k in group) or "(every job)", []
        ).append(row)
    configs = []
    for name, jobs in members.items():
        ok = [r for r in jobs if r["status"] == "ok"]
        config = {
            "config": name,
            **{k: jobs[0].get(k) for k in group},
            "n_seeds": len(ok),
            "n_failed": len(jobs) - len(ok),
            "num_params": ok[0].get("num_params") if ok else None,
            "seeds": " ".join(sorted((str(r.get("seed")) for r in jobs), key=_order)),
            "jobs": " ".join(sorted((r["job"] for r in jobs), key=_order)),
        }
        for metric in ("val_loss", "val_bpb"):
            values = [v for v in (number(r.get(f"best_{metric}")) for r in ok) if v is not None]
            n = len(values)
            mean = statistics.fmean(values) if n else None
            std = statistics.stdev(values) if n > 1 else None
            half = (
                float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
                if n > 1
                else None
            )
            shown = (
                "" if mean is None else f"{mean:.4f}" + ("" if half is None else f" ± {half:.4f}")
            )
            config.update(
                {
                    f"_{metric}": values,
                    f"{metric}_mean": mean,
                    f"{metric}_std": std,
                    f"{metric}_ci95": half,
                    f"{metric} ± ci95": shown,
                }
            )
        configs.append(config)
    configs.sort(key=lambda c: _order(c["val_loss_mean"]))
    for rank, config in enumerate(configs):
        a, b, p = config["_val_loss"], configs[0]["_val_loss"], None
        if rank and len(a) > 1 and len(b) > 1:  # with no spread at all, only equal means are alike
            same = statistics.pstdev(a) == statistics.pstdev(b) == 0
            p = (
                float(a[0] == b[0])
                if same
                else float(stats.ttest_ind(a, b, equal_var=False).pvalue)
            )
        verdict = (
            "best"
            if rank == 0
            else "untested (fewer than 2 seeds)"
            if p is None
            else "not distinguishable"
            if p >= 1 - CONFIDENCE
            else "worse"
        )
        config.update(p_vs_best=p, vs_best=verdict if config["val_loss_mean"] is not None else "")
    return configs


def write_table(
    path: Path, cols: list[str], rows: list[dict], shown: list[str] | None = None
) -> list[str]:
    """Write the rows' `cols` as CSV; return their `shown` columns (default: the same) as Markdown."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, cols, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = [shown or cols, ["---"] * len(shown or cols)]
    for row in rows:  # floats to 5 significant digits
        lines.append(
            [
                "" if v is None else f"{v:.5g}" if isinstance(v, float) else str(v)
                for v in map(row.get, shown or cols)
            ]
        )
    return ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in lines]


def write_plot(rows: list[dict], knobs: list[str], configs: list[dict] | None, path: Path) -> None:
    """Best val loss against the parameter count and each swept knob: ok jobs, configurations' 95% CIs."""
    from matplotlib.figure import Figure

    ok, means = [r for r in rows if r["status"] == "ok"], [c for c in configs or [] if c["n_seeds"]]
    panels = ["num_params", *[k for k in knobs if k != "seed"]]
    fig = Figure(figsize=(4 * len(panels), 3.6), layout="constrained")
    for ax, panel in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        xs = [item.get(panel) for item in ok + means]
        xs = (
            xs if all(number(x) is not None for x in xs) else [str(x) for x in xs]
        )  # else categories
        ax.scatter(
            xs[: len(ok)], [r["best_val_loss"] for r in ok], s=12, alpha=0.4 if means else 1.0
        )
        ax.errorbar(
            xs[len(ok) :],
            [c["val_loss_mean"] for c in means],
            yerr=[c["val_loss_ci95"] or 0 for c in means],
            fmt="o",
            capsize=3,
            color="C1",
        )
        ax.set(
            xlabel=panel,
            ylabel="best val loss",
            xscale="log" if panel == "num_params" else "linear",
        )
    fig.suptitle(f"{path.parent.name}: {len(ok)} ok jobs" + (", means ± 95% CI" if means else ""))
    fig.savefig(path, dpi=80)


def write_summary(
    sweep_dir: str | Path, target_val_loss: float | None = None, baseline: str = BASELINE
) -> tuple[list[dict], list[str]]:
    """Write summary.csv, .md, .png (and summary_configs.csv with `seed` swept); the jobs, the headline."""
    sweep_dir = Path(sweep_dir)
    rows, knobs = collect(sweep_dir)
    configs = aggregate(rows, knobs) if "seed" in knobs else None
    extra = summary_extras(rows, configs, sweep_dir, target_val_loss, baseline)
    ok = [r for r in rows if r["status"] == "ok"]
    head = [f"Sweep done: {len(rows)} jobs, {len(ok)} ok, {len(rows) - len(ok)} failed."]
    if ok:
        head.append(
            f"Best: job {ok[0]['job']} ({ok[0]['overrides'] or 'no overrides'}): val loss "
            f"{ok[0]['best_val_loss']:.4f}, {ok[0].get('num_params')} parameters."
        )
    if configs and configs[0]["vs_best"] == "best":
        best, ties = configs[0], sum(c["vs_best"] == "not distinguishable" for c in configs)
        head.append(
            f"Best configuration: {best['config']}: val loss {best['val_loss ± ci95']} over "
            f"{best['n_seeds']} seeds; {ties} of the other {len(configs) - 1} not distinguishable "
            f"from it by Welch's t-test. See {sweep_dir / 'summary_configs.csv'}."
        )
    lines = [f"# Sweep {sweep_dir}", "", *(f"- {line}" for line in head), "", *extra[2]]
    if configs is not None:
        stats = [
            f"{metric}_{stat}"
            for metric in ("val_loss", "val_bpb")
            for stat in ("mean", "std", "ci95")
        ]
        cols = [
            "config",
            *[k for k in knobs if k != "seed"],
            "num_params",
            "n_seeds",
            "n_failed",
            *stats,
            "p_vs_best",
            "vs_best",
            *extra[0],
            "seeds",
            "jobs",
        ]
        shown = [
            "config",
            "n_seeds",
            "n_failed",
            "val_loss ± ci95",
            "val_bpb ± ci95",
            "vs_best",
            "p_vs_best",
            "num_params",
        ]
        table = write_table(sweep_dir / "summary_configs.csv", cols, configs, shown)
        lines += ["## Configurations", "", *table, "", "## Jobs", ""]
    bpb = ["best_val_bpb"] if any(number(r.get("best_val_bpb")) is not None for r in rows) else []
    cols = [
        "job",
        "status",
        "best_val_loss",
        *bpb,
        "best_val_perplexity",
        *extra[1],
        "num_params",
        *PARAMS,
        *[k for k in knobs if k not in PARAMS.values()],
        "tokens_per_sec",
        "wall_seconds",
        "overrides",
        "reason",
    ]
    lines += write_table(sweep_dir / "summary.csv", cols, rows)
    (sweep_dir / "summary.md").write_text("\n".join(lines) + "\n")
    write_plot(rows, knobs, configs, sweep_dir / "summary.png")
    return rows, head


class SweepSummary(Callback):
    """At a multirun's end, the summary; exit 1 if a job failed (a callback's exception is only a warning)."""

    def __init__(self, target_val_loss: float | None = None, baseline: str = BASELINE):
        self.target_val_loss, self.baseline = target_val_loss, baseline  # see write_summary

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        Task.started = (
            True  # the jobs ran: an exit from here is the sweep's verdict (errors.main_or_exit)
        )
        sweep_dir = Path(config.hydra.sweep.dir)
        if (
            not sweep_dir.is_dir() or "trainer" not in config
        ):  # not gptlab-train (e.g. gptlab-eval -m)
            return
        rows, head = write_summary(sweep_dir, self.target_val_loss, self.baseline)
        print(*head, f"Summary: {sweep_dir / 'summary.md'} (also .csv, .png)", sep="\n", flush=True)
        if failed := [r for r in rows if r["status"] != "ok"]:
            jobs = "; ".join(
                f"job {r['job']} ({r['overrides']}): {r['reason'].rstrip('.')}" for r in failed
            )
            print(
                f"Sweep failed: {len(failed)} of {len(rows)} jobs failed: {jobs}. The other jobs finished; "
                f"see {sweep_dir / 'summary.md'}.",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(1)
