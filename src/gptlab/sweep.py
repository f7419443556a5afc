"""Sweeps: keep a multirun going past failed jobs, and sum it up in one table and one plot.

In a multirun (`gptlab-train -m ...`) each job runs through `sweep_job`: a job that fails (bad
config, an error, a diverged loss) is written down in its `metrics.json` as
`"status": "failed"` with a one-line `"reason"`, and returns +inf so the sweep, Optuna included,
goes on. A finished job's metrics.json records its overrides, so a sweep continued with
`gptlab-train resume=<sweep dir>` keeps it as it is instead of training it again.

At the end the Hydra callback `SweepSummary` writes `summary.csv` (one row a job), `summary.md`
and `summary.png` into the sweep directory and makes the command exit non-zero if any job
failed. When the sweep varies `seed`, the jobs that differ only in seed form a configuration:
`summary_configs.csv` holds one row each (mean, standard deviation and 95% Student-t interval of
the best val loss and bpb over its seeds, Welch's t-test against the best mean), summary.md shows
`mean ± ci95` and summary.png error bars. `scripts/sweep_report.py <sweep_dir>` writes the same
files on demand.
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

from gptlab.errors import ConfigError, Task
from gptlab.resume import override_key

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
# From metrics.json; bits per byte only in runs of gptlab versions that log val/bpb.
RESULTS = ["best_val_loss", "best_val_bpb", "final_val_loss", "final_val_bpb", "best_val_perplexity",
           "num_params", "tokens_per_sec", "wall_seconds"]


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


# Overrides that say how a job was launched, not what it computes: a job re-launched by
# `gptlab-train resume=<sweep dir>` is the same job with or without them.
LAUNCH_KEYS = ("resume", "ckpt_path")


def job_identity(overrides: list[str]) -> list[str]:
    """What makes two launches the same job: their overrides minus LAUNCH_KEYS, in any order."""
    return sorted(str(o) for o in overrides if override_key(o) not in LAUNCH_KEYS)


def job_overrides() -> list[str]:
    """The task overrides of the running Hydra job (`model.num_heads=2 seed=1 ...`)."""
    if not HydraConfig.initialized():
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def finished_result(output_dir: Path, overrides: list[str]) -> tuple[float | None, str]:
    """(best val loss, '') of a job that already finished with these same overrides, else
    (None, why not). Only metrics.json is trusted: Hydra rewrites the job's .hydra/ before the
    task runs, so the overrides a finished job ran with are the ones its metrics.json records."""
    path = output_dir / "metrics.json"
    if not path.is_file():
        return None, "no metrics.json yet"
    metrics = _read_json(path)
    if metrics is None:
        return None, "its metrics.json is unreadable"
    if metrics.get("status") != "ok":
        return None, f"its metrics.json says status {metrics.get('status')!r}"
    best = _number(metrics.get("best_val_loss"))
    if best is None:
        return None, f"its metrics.json holds no finite best_val_loss ({metrics.get('best_val_loss')!r})"
    recorded = metrics.get("overrides")
    if not isinstance(recorded, list):
        return None, "its metrics.json does not record the job's overrides (written by an older gptlab)"
    if job_identity(recorded) != job_identity(overrides):
        return None, (f"its metrics.json records other overrides ({' '.join(job_identity(recorded))}) "
                      f"than this launch ({' '.join(job_identity(overrides))})")
    return best, ""


def record_failure(output_dir: Path, reason: str, overrides: list[str] | None = None) -> None:
    """Mark the job failed in its metrics.json, keeping whatever metrics it had written."""
    path = output_dir / "metrics.json"
    metrics: dict[str, Any] = (_read_json(path) or {}) if path.is_file() else {}
    metrics.update(status="failed", reason=reason)
    if overrides:
        metrics["overrides"] = overrides
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2) + "\n")


def sweep_job(train: Callable[[DictConfig], float], cfg: DictConfig) -> float:
    """Run `train(cfg)` as one job of a sweep: never raise, never return nan.

    A failure (an exception, gptlab's exit on a bad config, a non-finite val loss) is written to
    the job's metrics.json and logged; the job then returns +inf, which every sweeper takes as
    'worst' (Optuna crashes on nan) and the sweep goes on. A stop (SIGTERM, Ctrl-C) is written
    down too, but stops the whole sweep.

    A sweep continued with `gptlab-train resume=<sweep dir>` (`cfg.resume` set) keeps each job
    that already finished with the same overrides: its best val loss is returned without
    training and its files are left as they are. The others train (continuing from their
    last.ckpt when they have one)."""
    Task.started = True  # a task runs: its exit codes are its own (gptlab.errors.main_or_exit)
    output_dir = Path(cfg.paths.output_dir)
    overrides = job_overrides()
    if cfg.get("resume"):
        best, why = finished_result(output_dir, overrides)
        if best is not None:
            log.info("Kept job %s: it finished before with the same overrides (best val loss %.4f); "
                     "not trained again, its metrics.json left as it is", output_dir.name, best)
            return best
        log.info("Job %s runs: %s", output_dir.name, why)
    threads = job_threads(cfg)
    if threads:
        import torch

        torch.set_num_threads(threads)
        log.info("%d torch thread(s) for this job (cores shared between the launcher's jobs)", threads)
    try:
        value = float(train(cfg))
    except SystemExit as e:
        if e.code != 2:  # stopped by SIGTERM / Ctrl-C (143 / 130): record it, then stop the sweep
            record_failure(output_dir, f"stopped (exit code {e.code})", overrides)
            raise
        reason = one_line(e.__context__ or e)  # exit code 2: gptlab's bad-config exit
        log.error("Job failed: %s", reason)
        record_failure(output_dir, reason, overrides)
        return math.inf
    except Exception as e:
        reason = one_line(e)
        if isinstance(e, ConfigError):
            log.error("Job failed: %s", reason)
        else:
            log.exception("Job failed: %s", reason)
        record_failure(output_dir, reason, overrides)
        return math.inf
    if not math.isfinite(value):
        reason = f"diverged: no finite validation loss (best {value})"
        log.error("Job failed: %s", reason)
        record_failure(output_dir, reason, overrides)
        return math.inf
    return value


# ---------------------------------------------------------------------------------------------
# statistics over seeds (scipy's Student t)

CONFIDENCE = 0.95  # of the intervals; the Welch test against the best runs at 1 - CONFIDENCE


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """The mean and the sample standard deviation (n - 1); None where there are too few values."""
    n = len(values)
    if n == 0:
        return None, None
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def ci_half_width(values: list[float], confidence: float = CONFIDENCE) -> float | None:
    """Half the width of the Student-t confidence interval of the mean: t(1-a/2, n-1) * s / sqrt(n)."""
    from scipy import stats

    _, std = mean_std(values)
    if std is None:
        return None
    return float(stats.t.ppf(0.5 + confidence / 2.0, len(values) - 1)) * std / math.sqrt(len(values))


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value of Welch's t-test (unequal variances) for equal means of a and b;
    None when either has fewer than 2 values."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    if mean_std(a)[1] == mean_std(b)[1] == 0.0:  # no spread at all: only equal means are alike
        return 1.0 if mean_std(a)[0] == mean_std(b)[0] else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


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
    overrides = [o for o in overrides if override_key(o) not in LAUNCH_KEYS]  # resume=: not a knob
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
        row[key] = metrics.get(key)  # None when an older run did not write it (best_val_bpb)
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


def _sort_value(value: Any) -> tuple:
    number = _number(value)
    return (number is None, number or 0.0, str(value))


def aggregate(rows: list[dict], knobs: list[str]) -> list[dict]:
    """One row per configuration (the jobs that differ only in `seed`), sorted by mean val loss.

    val_loss_* are over each ok job's best val loss, val_bpb_* over its best_val_bpb (where the
    job recorded one); failed jobs are left out of both and counted in n_failed. vs_best compares
    each configuration with the best mean by Welch's two-sided t-test at 1 - CONFIDENCE."""
    group_knobs = [k for k in knobs if k != "seed"]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(repr(row["_knobs"].get(k)) for k in group_knobs), []).append(row)
    configs = []
    for members in groups.values():
        ok = [r for r in members if r["status"] == "ok" and _number(r["best_val_loss"]) is not None]
        losses = [_number(r["best_val_loss"]) for r in ok]
        bpbs = [b for b in (_number(r.get("best_val_bpb")) for r in ok) if b is not None]
        knob_values = {k: members[0]["_knobs"].get(k) for k in group_knobs}
        loss_mean, loss_std = mean_std(losses)
        bpb_mean, bpb_std = mean_std(bpbs)
        configs.append({
            "config": " ".join(f"{k}={_fmt('', v)}" for k, v in knob_values.items()) or "(every job)",
            **{k: v for k, v in knob_values.items()},
            "_knobs": knob_values,
            "num_params": next((r["num_params"] for r in ok if r.get("num_params") is not None), None),
            "n_seeds": len(ok),
            "n_failed": len(members) - len(ok),
            "val_loss_mean": loss_mean, "val_loss_std": loss_std, "val_loss_ci95": ci_half_width(losses),
            "val_bpb_mean": bpb_mean, "val_bpb_std": bpb_std, "val_bpb_ci95": ci_half_width(bpbs),
            "seeds": " ".join(str(r["_knobs"].get("seed", "")) for r in sorted(
                members, key=lambda r: _sort_value(r["_knobs"].get("seed")))),
            "jobs": " ".join(r["job"] for r in sorted(members, key=lambda r: _sort_value(r["job"]))),
            "_losses": losses,
        })
    configs.sort(key=lambda c: (c["val_loss_mean"] is None, c["val_loss_mean"] or 0.0))
    best = configs[0] if configs and configs[0]["val_loss_mean"] is not None else None
    for config in configs:
        if best is None or config["val_loss_mean"] is None:
            config["p_vs_best"], config["vs_best"] = None, ""
        elif config is best:
            config["p_vs_best"], config["vs_best"] = None, "best"
        else:
            p = welch_p(config["_losses"], best["_losses"])
            config["p_vs_best"] = p
            config["vs_best"] = ("untested (fewer than 2 seeds)" if p is None
                                 else "not distinguishable" if p >= 1.0 - CONFIDENCE else "worse")
    return configs


def seed_is_swept(knobs: list[str]) -> bool:
    return "seed" in knobs


def columns(knobs: list[str], rows: list[dict] | None = None) -> list[str]:
    extra = [k for k in knobs if k not in {key for _, key in PARAMS}]
    bpb = ["best_val_bpb"] if rows and any(_number(r.get("best_val_bpb")) is not None for r in rows) else []
    return (["job", "status", "best_val_loss", *bpb, "best_val_perplexity", "num_params"]
            + [c for c, _ in PARAMS] + extra + ["tokens_per_sec", "wall_seconds", "overrides", "reason"])


def config_columns(knobs: list[str]) -> list[str]:
    return (["config", *[k for k in knobs if k != "seed"], "num_params", "n_seeds", "n_failed",
             "val_loss_mean", "val_loss_std", "val_loss_ci95", "val_bpb_mean", "val_bpb_std", "val_bpb_ci95",
             "p_vs_best", "vs_best", "seeds", "jobs"])


def _fmt(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in ("best_val_loss", "best_val_bpb") and _number(value) is not None:
        return f"{value:.4f}"
    if column in ("best_val_perplexity", "tokens_per_sec", "wall_seconds") and _number(value) is not None:
        return f"{value:,.1f}"
    if column == "num_params" and _number(value) is not None:
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|")


def _pm(mean: float | None, half: float | None, digits: int = 4) -> str:
    """'mean ± half-width', or the mean alone when there is no interval (one seed)."""
    if mean is None:
        return ""
    return f"{mean:.{digits}f} ± {half:.{digits}f}" if half is not None else f"{mean:.{digits}f}"


def write_csv(rows: list[dict], cols: list[str], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(cols)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row.get(c) for c in cols])


def config_table(configs: list[dict], knobs: list[str]) -> list[str]:
    """The Markdown of the configurations: mean ± CI, and which are not told apart from the best."""
    level = f"{1 - CONFIDENCE:g}"
    seeds = sorted({s for c in configs for s in c["seeds"].split()}, key=_sort_value)
    has_bpb = any(c["val_bpb_mean"] is not None for c in configs)
    lines = [
        "## Configurations", "",
        f"{len(configs)} configurations x seeds {', '.join(seeds)}, sorted by mean. val loss (and val bpb): "
        f"each ok job's best, mean over seeds ± half the {CONFIDENCE:.0%} Student-t interval of the mean. "
        f"*≈ best*: Welch's t-test cannot tell it from the best at the {level} level (p ≥ {level}), which is "
        "no evidence that they are equal: few seeds see only large differences, and the best was "
        "picked from these same runs.", "",
        "| rank | configuration | seeds | failed | val loss (mean ± ci95) | "
        + ("val bpb (mean ± ci95) | " if has_bpb else "") + "vs best | Welch p | parameters |",
        "|" + "---|" * (8 + has_bpb),
    ]
    marks = {"best": "**best**", "not distinguishable": "≈ best", "worse": "worse"}
    for rank, c in enumerate(configs, 1):
        cells = [str(rank), _fmt("", c["config"]), str(c["n_seeds"]), str(c["n_failed"] or ""),
                 _pm(c["val_loss_mean"], c["val_loss_ci95"])]
        if has_bpb:
            cells.append(_pm(c["val_bpb_mean"], c["val_bpb_ci95"]))
        p = "" if c["p_vs_best"] is None else f"{c['p_vs_best']:.3g}"
        cells += [marks.get(c["vs_best"], c["vs_best"]), p, _fmt("num_params", c["num_params"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def write_markdown(rows: list[dict], cols: list[str], sweep_dir: Path, path: Path,
                   configs: list[dict] | None = None, knobs: list[str] | None = None) -> None:
    failed = sum(r["status"] != "ok" for r in rows)
    lines = [f"# Sweep {sweep_dir}", "",
             f"{len(rows)} jobs, {len(rows) - failed} ok, {failed} failed.", ""]
    if configs is not None:
        lines += config_table(configs, knobs or [])
        lines += ["## Jobs", ""]
    lines += ["One row per job, sorted by best val loss, failed jobs last.", "",
              "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(c, row.get(c)) for c in cols) + " |")
    path.write_text("\n".join(lines) + "\n")


def write_plot(rows: list[dict], knobs: list[str], sweep_dir: Path, path: Path,
               configs: list[dict] | None = None) -> None:
    """Best val loss against the parameter count and against each swept knob (ok jobs only).
    With seeds swept, each configuration is its mean with the 95% interval as an error bar, its
    jobs faint dots beside it; `seed` gets no panel of its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and _number(r["best_val_loss"]) is not None]
    panels = ["num_params"] + [k for k in knobs if k not in ("num_params", "seed")]
    points = ([(c, c["val_loss_mean"], c["val_loss_ci95"]) for c in configs if c["val_loss_mean"] is not None]
              if configs is not None else [(r, r["best_val_loss"], None) for r in ok])
    ncols = min(3, len(panels))
    fig, axes = plt.subplots(math.ceil(len(panels) / ncols), ncols, figsize=(4.2 * ncols,
                             3.3 * math.ceil(len(panels) / ncols)), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        def x_of(item, panel=panel):
            return item.get("num_params") if panel == "num_params" else item["_knobs"].get(panel)

        labels = sorted({str(x_of(item)) for item, _, _ in points}, key=_sort_value)
        numeric = all(_number(label) is not None for label in labels)

        def position(item, numeric=numeric, labels=labels):
            return _number(x_of(item)) if numeric else labels.index(str(x_of(item)))

        if configs is not None:
            ax.scatter([position(r) for r in ok], [r["best_val_loss"] for r in ok], s=10, alpha=0.3)
        ax.errorbar([position(item) for item, _, _ in points], [y for _, y, _ in points],
                    yerr=[e or 0.0 for _, _, e in points], fmt="o", ms=5, capsize=3)
        if not numeric:
            ax.set_xticks(range(len(labels)), labels)
        elif panel == "num_params":
            ax.set_xscale("log")
        ax.set_xlabel("parameters" if panel == "num_params" else panel)
        ax.set_ylabel("best val loss" + (f" (mean ± {CONFIDENCE:.0%} CI)" if configs is not None else ""))
        ax.grid(True, alpha=0.3)
    failed = len(rows) - len(ok)
    fig.suptitle(f"{sweep_dir.name}: {len(ok)} jobs" + (f" ({failed} failed, not shown)" if failed else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_summary(sweep_dir: str | Path) -> list[dict]:
    """Write summary.csv, summary.md and summary.png into `sweep_dir` (and summary_configs.csv,
    one row per configuration, when the sweep varies `seed`); return the job rows."""
    sweep_dir = Path(sweep_dir)
    rows, knobs = collect(sweep_dir)
    cols = columns(knobs, rows)
    configs = aggregate(rows, knobs) if seed_is_swept(knobs) else None
    write_csv(rows, cols, sweep_dir / "summary.csv")
    if configs is not None:
        write_csv(configs, config_columns(knobs), sweep_dir / "summary_configs.csv")
    write_markdown(rows, cols, sweep_dir, sweep_dir / "summary.md", configs, knobs)
    write_plot(rows, knobs, sweep_dir, sweep_dir / "summary.png", configs)
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
    knobs = swept_knobs(rows)
    if seed_is_swept(knobs):
        configs = aggregate(rows, knobs)
        if configs and configs[0]["vs_best"] == "best":
            top = configs[0]
            ties = [c for c in configs if c["vs_best"] == "not distinguishable"]
            loss = _pm(top["val_loss_mean"], top["val_loss_ci95"])
            lines.append(
                f"Best configuration: {top['config']}: val loss {loss} "
                f"(mean ± {CONFIDENCE:.0%} CI over {top['n_seeds']} seeds); {len(ties)} of the other "
                f"{len(configs) - 1} not distinguishable from it (Welch's t-test, p ≥ {1 - CONFIDENCE:g}). "
                f"See {sweep_dir / 'summary_configs.csv'}.")
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
        # the jobs ran (maybe in other processes: joblib, submitit): an exit from here is the
        # sweep's verdict, not a config that could not be composed (gptlab.errors.main_or_exit)
        Task.started = True
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir() or "trainer" not in config:  # not gptlab-train (e.g. gptlab-eval -m)
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
