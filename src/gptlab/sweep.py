"""Sweeps: keep a multirun going past failed jobs, and sum it up in one table and one plot.

In a multirun (`gptlab-train -m ...`) each job runs through `sweep_job`: a job that fails (bad
config, an error, a diverged loss) is written down in its `metrics.json` as
`"status": "failed"` with a one-line `"reason"`, and returns +inf so the sweep, Optuna included,
goes on. At the end the Hydra callback `SweepSummary` writes `summary.csv`, `summary.md` and
`summary.png` into the sweep directory and makes the command exit non-zero if any job failed.
`scripts/sweep_report.py <sweep_dir>` writes the same files on demand.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf

from gptlab.errors import ConfigError

log = logging.getLogger(__name__)

# Always in the table, whether swept or not: (column, config key).
PARAMS = [
    ("d_model", "model.d_model"),
    ("num_heads", "model.num_heads"),
    ("num_blocks", "model.num_blocks"),
    ("dropout", "model.dropout"),
    ("lr", "optim.lr"),
    ("batch_size", "data.batch_size"),
    ("context_length", "data.context_length"),
    ("max_steps", "trainer.max_steps"),
]
RESULTS = ["best_val_loss", "best_val_perplexity", "num_params", "tokens_per_sec", "wall_seconds"]


# ---------------------------------------------------------------------------------------------
# one job of a sweep


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def job_threads(cfg: DictConfig) -> int | None:
    """Torch threads for one job of a joblib sweep: the cores shared out between the parallel jobs.

    None when `num_threads` is set (it wins) or the launcher runs one job at a time."""
    if cfg.get("num_threads") or not HydraConfig.initialized():
        return None
    launcher = HydraConfig.get().launcher
    if "joblib" not in str(launcher.get("_target_", "")):
        return None
    cores = len(os.sched_getaffinity(0))
    n_jobs = int(launcher.get("n_jobs") or -1)
    if n_jobs < 0:  # joblib's convention: -1 all cores, -2 all but one, ...
        n_jobs = max(1, cores + 1 + n_jobs)
    return max(1, cores // n_jobs)


def one_line(error: BaseException) -> str:
    """The error as one line: ConfigError's own paragraph, or 'Type: message' for the rest."""
    if isinstance(error, SystemExit):
        text = f"exited with code {error.code}"
    elif isinstance(error, ConfigError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    text = " ".join(text.split())
    return text if len(text) <= 500 else text[:497] + "..."


def record_failure(output_dir: Path, reason: str) -> None:
    """Mark the job failed in its metrics.json, keeping whatever metrics it had written."""
    path = output_dir / "metrics.json"
    metrics: dict[str, Any] = {}
    if path.is_file():
        try:
            metrics = json.loads(path.read_text())
        except (OSError, ValueError):
            metrics = {}
    metrics.update(status="failed", reason=reason)
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2) + "\n")


def sweep_job(train: Callable[[DictConfig], float], cfg: DictConfig) -> float:
    """Run `train(cfg)` as one job of a sweep: never raise, never return nan.

    A failure (an exception, gptlab's exit on a bad config, a non-finite val loss) is written to
    the job's metrics.json and logged; the job then returns +inf, which every sweeper takes as
    'worst' (Optuna crashes on nan) and the sweep goes on. A stop (SIGTERM, Ctrl-C) is written
    down too, but stops the whole sweep."""
    output_dir = Path(cfg.paths.output_dir)
    threads = job_threads(cfg)
    if threads:
        import torch

        torch.set_num_threads(threads)
        log.info("%d torch thread(s) for this job (cores shared between the launcher's jobs)", threads)
    try:
        value = float(train(cfg))
    except SystemExit as e:
        if e.code != 2:  # stopped by SIGTERM / Ctrl-C (143 / 130): record it, then stop the sweep
            record_failure(output_dir, f"stopped (exit code {e.code})")
            raise
        reason = one_line(e.__context__ or e)  # exit code 2: gptlab's bad-config exit
        log.error("Job failed: %s", reason)
        record_failure(output_dir, reason)
        return math.inf
    except Exception as e:
        reason = one_line(e)
        if isinstance(e, ConfigError):
            log.error("Job failed: %s", reason)
        else:
            log.exception("Job failed: %s", reason)
        record_failure(output_dir, reason)
        return math.inf
    if not math.isfinite(value):
        reason = f"diverged: no finite validation loss (best {value})"
        log.error("Job failed: %s", reason)
        record_failure(output_dir, reason)
        return math.inf
    return value


# ---------------------------------------------------------------------------------------------
# the summary of a sweep directory


def _scalar(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def read_job(job_dir: Path) -> dict[str, Any]:
    """One row: the job's overrides, its parameters from .hydra/config.yaml, its metrics.json."""
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    overrides = [str(o) for o in OmegaConf.load(overrides_file)] if overrides_file.is_file() else []
    cfg = OmegaConf.load(job_dir / ".hydra" / "config.yaml")
    row: dict[str, Any] = {"job": job_dir.name, "overrides": " ".join(overrides)}
    for column, key in PARAMS:
        row[column] = _scalar(OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False))
    knobs = {}
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        selected = _scalar(OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False))
        knobs[key] = selected if selected is not None else value
    row["_knobs"] = knobs
    metrics_path = job_dir / "metrics.json"
    metrics: dict[str, Any] = {}
    if metrics_path.is_file():
        try:
            metrics = json.loads(metrics_path.read_text())
        except ValueError as e:
            metrics = {"status": "failed", "reason": f"unreadable metrics.json: {e}"}
    else:
        metrics = {"status": "failed", "reason": "no metrics.json: the job did not finish"}
    for key in RESULTS:
        row[key] = metrics.get(key)
    row["status"] = metrics.get("status", "ok")
    row["reason"] = metrics.get("reason", "")
    if row["status"] == "ok" and _number(row["best_val_loss"]) is None:
        row["status"], row["reason"] = "failed", f"diverged: best val loss {row['best_val_loss']}"
    return row


def job_dirs(sweep_dir: Path) -> list[Path]:
    dirs = [p.parent.parent for p in sweep_dir.glob("**/.hydra/config.yaml")
            if not any(part.startswith(".") for part in p.parent.parent.relative_to(sweep_dir).parts)]

    def order(path: Path):
        name = str(path.relative_to(sweep_dir))
        return (0, int(name), name) if name.isdigit() else (1, 0, name)

    return sorted(dirs, key=order)


def swept_knobs(rows: list[dict]) -> list[str]:
    """Override keys whose value differs between jobs, in the order they first appear."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row["_knobs"] if k not in keys]
    return [k for k in keys if len({repr(r["_knobs"].get(k)) for r in rows}) > 1]


def collect(sweep_dir: Path) -> tuple[list[dict], list[str]]:
    """Every job of the sweep (sorted by best val loss, failed ones last) and the swept knobs."""
    rows = [read_job(d) for d in job_dirs(sweep_dir)]
    knobs = swept_knobs(rows)
    for row in rows:
        known = {key for _, key in PARAMS}
        for knob in knobs:
            if knob not in known:
                row[knob] = row["_knobs"].get(knob)
    rows.sort(key=lambda r: (r["status"] != "ok", _number(r["best_val_loss"]) or math.inf))
    return rows, knobs


def columns(knobs: list[str]) -> list[str]:
    extra = [k for k in knobs if k not in {key for _, key in PARAMS}]
    return (["job", "status", "best_val_loss", "best_val_perplexity", "num_params"]
            + [c for c, _ in PARAMS] + extra + ["tokens_per_sec", "wall_seconds", "overrides", "reason"])


def _fmt(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in ("best_val_loss",) and _number(value) is not None:
        return f"{value:.4f}"
    if column in ("best_val_perplexity", "tokens_per_sec", "wall_seconds") and _number(value) is not None:
        return f"{value:,.1f}"
    if column == "num_params" and _number(value) is not None:
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|")


def write_csv(rows: list[dict], cols: list[str], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(cols)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row.get(c) for c in cols])


def write_markdown(rows: list[dict], cols: list[str], sweep_dir: Path, path: Path) -> None:
    failed = sum(r["status"] != "ok" for r in rows)
    lines = [f"# Sweep {sweep_dir}", "",
             f"{len(rows)} jobs, {len(rows) - failed} ok, {failed} failed; sorted by best val loss.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(c, row.get(c)) for c in cols) + " |")
    path.write_text("\n".join(lines) + "\n")


def write_plot(rows: list[dict], knobs: list[str], sweep_dir: Path, path: Path) -> None:
    """Best val loss against parameter count, and against each swept knob (ok jobs only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def human(x, _pos=None) -> str:
        for unit, scale in (("M", 1e6), ("k", 1e3)):
            if abs(x) >= scale:
                return f"{x / scale:g}{unit}"
        return f"{x:g}"

    ok = [r for r in rows if r["status"] == "ok" and _number(r["best_val_loss"]) is not None]
    panels = ["num_params"] + [k for k in knobs if k != "num_params"]
    ncols = 2 if len(panels) in (2, 4) else min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    losses = [r["best_val_loss"] for r in ok]

    def colour_knob(panel: str) -> str | None:
        """The swept knob with the fewest values (not the panel's own), to colour the points by."""
        counts = {k: len({str(r["_knobs"].get(k)) for r in ok}) for k in knobs if k != panel}
        counts = {k: n for k, n in counts.items() if 1 < n <= 6}
        return min(counts, key=lambda k: (counts[k], knobs.index(k))) if counts else None

    for ax, panel in zip(axes.flat, panels, strict=False):
        values = [r.get("num_params") if panel == "num_params" else r["_knobs"].get(panel) for r in ok]
        numbers = [_number(v) for v in values]
        if numbers and all(n is not None for n in numbers):
            xs = numbers
            if min(xs) > 0 and max(xs) / min(xs) >= 10:
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())
            if panel == "num_params":
                ax.xaxis.set_major_formatter(FuncFormatter(human))
        else:  # a categorical knob: one tick per value
            labels = sorted({str(v) for v in values})
            xs = [labels.index(str(v)) for v in values]
            ax.set_xticks(range(len(labels)), labels)
        colour = colour_knob(panel)
        if colour:
            groups = sorted({str(r["_knobs"].get(colour)) for r in ok},
                            key=lambda v: (_number(v) is None, _number(v) or 0, v))
            for i, group in enumerate(groups):
                picked = [(x, loss) for x, loss, r in zip(xs, losses, ok, strict=True)
                          if str(r["_knobs"].get(colour)) == group]
                ax.scatter(*zip(*picked, strict=True), s=28, alpha=0.75, color=f"C{i % 10}",
                           label=f"{colour.split('.')[-1]}={group}")
            ax.legend(fontsize=7, loc="best")
        else:
            ax.scatter(xs, losses, s=28, alpha=0.75)
        distinct = sorted(set(xs))
        if panel != "num_params" and 1 < len(distinct) < len(xs) and len(distinct) <= 12:
            # a grid knob (values repeat): the best loss at each value
            best = [min(loss for x, loss in zip(xs, losses, strict=True) if x == d) for d in distinct]
            ax.plot(distinct, best, "-", color="0.4", alpha=0.7, zorder=0)
            if all(float(d).is_integer() for d in distinct) and ax.get_xscale() == "linear":
                ax.set_xticks(distinct)
        ax.set_xlabel("parameters" if panel == "num_params" else panel)
        ax.set_ylabel("best val loss")
        ax.grid(True, alpha=0.3)
    failed = len(rows) - len(ok)
    fig.suptitle(f"{sweep_dir.name}: {len(ok)} jobs" + (f" ({failed} failed, not shown)" if failed else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_summary(sweep_dir: str | Path) -> list[dict]:
    """Write summary.csv, summary.md and summary.png into `sweep_dir`; return the rows."""
    sweep_dir = Path(sweep_dir)
    rows, knobs = collect(sweep_dir)
    cols = columns(knobs)
    write_csv(rows, cols, sweep_dir / "summary.csv")
    write_markdown(rows, cols, sweep_dir, sweep_dir / "summary.md")
    write_plot(rows, knobs, sweep_dir, sweep_dir / "summary.png")
    return rows


def describe(rows: list[dict], sweep_dir: Path) -> str:
    """What the sweep gave, for the terminal: the best job, the failures, where the files are."""
    ok = [r for r in rows if r["status"] == "ok"]
    lines = [f"Sweep done: {len(rows)} jobs, {len(ok)} ok, {len(rows) - len(ok)} failed."]
    if ok:
        best = ok[0]
        lines.append(f"Best: job {best['job']} ({best['overrides'] or 'no overrides'}): val loss "
                     f"{best['best_val_loss']:.4f}, perplexity {best['best_val_perplexity']:.1f}, "
                     f"{_fmt('num_params', best['num_params'])} parameters.")
    optuna = sweep_dir / "optimization_results.yaml"
    if optuna.is_file():
        result = OmegaConf.load(optuna)
        if "best_params" in result:
            params = " ".join(f"{k}={v}" for k, v in result.best_params.items())
            lines.append(f"Optuna best trial: value {result.best_value} with {params} ({optuna}).")
    lines += [f"Summary: {sweep_dir / 'summary.md'} (also summary.csv, summary.png)",
              f"TensorBoard: tensorboard --logdir {sweep_dir}"]
    return "\n".join(lines)


class SweepSummary(Callback):
    """Hydra callback: at the end of a multirun, write the summary; exit 1 if any job failed.

    Hydra turns an exception raised by a callback into a warning, so a failed sweep ends with
    one paragraph on stderr and SystemExit(1), after every job ran and the summary is written."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = write_summary(sweep_dir)
        print(describe(rows, sweep_dir), flush=True)
        failed = [r for r in rows if r["status"] != "ok"]
        if failed:
            jobs = "; ".join(f"job {r['job']} ({r['overrides']}): {r['reason'].rstrip('.')}" for r in failed)
            print(f"Sweep failed: {len(failed)} of {len(rows)} jobs failed: {jobs}. The other jobs "
                  f"finished; see {sweep_dir / 'summary.md'}.", file=sys.stderr, flush=True)
            sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    """scripts/sweep_report.py: (re)write the summary files of finished sweep directories."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", nargs="+", type=Path, help="a multirun directory (holding 0/, 1/, ...)")
    args = parser.parse_args(argv)
    status = 0
    for sweep_dir in args.sweep_dir:
        if not job_dirs(sweep_dir):
            print(f"{sweep_dir}: no sweep jobs here (no */.hydra/config.yaml)", file=sys.stderr)
            status = 1
            continue
        rows = write_summary(sweep_dir)
        print(describe(rows, sweep_dir))
        print((sweep_dir / "summary.md").read_text())
    return status
