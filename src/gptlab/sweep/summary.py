"""The summary of a sweep: summary.csv/.md/.png, with seed statistics per configuration, and the
Hydra callback that writes it at a multirun's end."""

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gptlab import reader
from gptlab.exits import BAD_INPUT, FAILED
from gptlab.run import directory, ownership
from gptlab.run.overrides import split_override
from gptlab.run.place import PLACE
from gptlab.sweep import downstream, tables
from gptlab.sweep.ablation import BASELINE, leading_sections
from gptlab.sweep.jobs import failure_message, job_identity
from gptlab.sweep.ladder_report import ladder_section
from gptlab.sweep.mixture import (
    epochs_note,
    job_mixture_columns,
    mixture_section,
    shown_estimates,
    source_cells,
    statistics_of,
)
from gptlab.sweep.mutransfer import mutransfer_section
from gptlab.sweep.plots import summary_figure
from gptlab.sweep.scaling import TooFewPoints
from gptlab.sweep.scaling_report import scaling_section
from gptlab.sweep.search import search_summary
from gptlab.sweep.stats import group_configurations, number, sort_key
from gptlab.sweep.tables import (
    PARAMS,
    Configuration,
    aggregate,
    config_columns,
    job_columns,
    write_table,
)
from gptlab.sweep.transfer import transfer_section


def saved_value(cfg: Any, key: str, default: Any = None) -> Any:
    """A literal value at a dotted key of a saved config (data, never resolved), else `default`."""
    value = cfg
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, (int, float, bool)):
        return value
    if isinstance(value, str) and "${" not in value:  # an interpolation is not its value
        return value
    return default


@dataclass
class Job:
    """A job as read: its row of summary.csv, its overrides' keys, and why it is a smoke test
    (short_horizon; None for a real run)."""

    row: dict
    keys: list[str]
    horizon: str | None


@dataclass
class Jobs:
    """A sweep's jobs: their rows (best first, failed last), the swept knobs (keys whose value
    differs) and, by job, why it is a smoke test (jobs that are not have no entry)."""

    rows: list[dict]
    knobs: list[str]
    horizons: dict[str, str] = field(default_factory=dict)


def read_job(job: Path) -> Job:
    """A job's row of summary.csv (failed without a metrics.json or a finite best val loss), its
    overrides' keys, and whether it is a smoke test."""
    cfg = reader.read_yaml(directory.saved_config(job))  # data: never resolved
    overrides = reader.read_yaml(directory.saved_overrides(job))
    overrides = job_identity(overrides if isinstance(overrides, list) else [])
    failed = {"status": "failed", "reason": f"no {directory.METRICS}"}
    metrics = reader.read_json(directory.metrics_file(job))
    metrics = metrics if isinstance(metrics, dict) else failed
    settings = metrics.get("settings") if isinstance(metrics.get("settings"), dict) else {}
    row = {
        "status": "ok",
        "reason": "",
        **metrics,
        "job": job.name,
        "overrides": " ".join(overrides),
        # the saved value, else (an interpolation: model.depth's rules) the run's own
        **{
            column: saved_value(cfg, key, saved_value(settings, column))
            for column, key in PARAMS.items()
        },
    }
    if number(metrics.get("max_steps")) is not None:  # a FLOP budget's steps, not the config's
        row["max_steps"] = metrics["max_steps"]
    pairs = [split_override(override) for override in overrides]
    row.update({key: saved_value(cfg, key, text) for key, text in pairs})
    row.update(source_cells(metrics))  # a mixture's: each source's values and share
    horizon = short_horizon(cfg, overrides, row["max_steps"])  # for the headline
    if row["status"] == "ok" and number(row.get("best_val_loss")) is None:
        reason = f"diverged: best val loss {row.get('best_val_loss')}"
        row.update(status="failed", reason=reason)
    return Job(row, [key for key, _ in pairs], horizon)


def short_horizon(cfg: Any, overrides: list[str], max_steps: Any = None) -> str | None:
    """Why a job is a smoke test, whose verdicts say little about a real run's (docs/sweeps.md):
    debug=, or its steps (`max_steps`, else the config's) within twice its warmup; else None."""
    debug = [value for key, value in map(split_override, overrides) if key == "debug"]
    if debug:
        return f"debug={debug[-1]}"
    steps = number(max_steps if max_steps is not None else saved_value(cfg, "trainer.max_steps"))
    warmup = number(saved_value(cfg, "optim.warmup_steps"))
    if steps and warmup and steps <= 2 * warmup:
        return f"{steps:.0f} steps for a {warmup:.0f}-step warmup"
    return None


def collect(sweep_dir: Path) -> Jobs:
    """Every job, best first, failed last; the swept knobs (keys whose value differs)."""
    rows = []
    keys = {}  # every override key, in the order first seen
    horizons = {}
    for folder in ownership.job_dirs(sweep_dir):
        if not directory.saved_config(folder).is_file():
            continue
        job = read_job(folder)
        rows.append(job.row)
        keys.update(dict.fromkeys(job.keys))
        if job.horizon:
            horizons[job.row["job"]] = job.horizon
    rows.sort(
        key=lambda r: (r["status"] != "ok", sort_key(r.get("best_val_loss")), sort_key(r["job"]))
    )
    knobs = [key for key in keys if len({repr(row.get(key)) for row in rows}) > 1]
    return Jobs(rows, knobs, horizons)


def smoke_test_note(rows: list[dict], horizons: dict[str, str]) -> list[str]:
    """The headline's warning when some of the sweep's jobs are smoke tests (short_horizon)."""
    reasons = [horizons[row["job"]] for row in rows if horizons.get(row["job"])]
    if not reasons:
        return []
    kinds = ", ".join(dict.fromkeys(reasons))
    return [
        f"A smoke test, not a finding: {len(reasons)} of {len(rows)} jobs are debug runs or "
        f"spend half their steps or more in warmup ({kinds}). Their verdicts show only that the "
        "sweep runs; compare configurations on full runs (no debug=, trainer.max_steps well "
        "beyond optim.warmup_steps)."
    ]


def headline(
    rows: list[dict],
    configs: list[Configuration] | None,
    sweep_dir: Path,
    horizons: dict[str, str] | None = None,
) -> list[str]:
    """What the sweep found, in a few lines (`horizons`: the smoke tests', see Jobs)."""
    ok = [r for r in rows if r["status"] == "ok"]
    pruned = len([r for r in rows if r["status"] == "pruned"])  # by an Optuna search's pruner
    counts = f"{len(rows)} jobs, {len(ok)} ok, "
    if pruned:
        counts += f"{pruned} pruned, "
    head = [f"Sweep done: {counts}{len(rows) - len(ok) - pruned} failed."]
    head += smoke_test_note(rows, horizons or {})
    head += epochs_note(rows)  # a mixture's: whether any job repeats a source
    if ok:
        head.append(
            f"Best: job {ok[0]['job']} ({ok[0]['overrides'] or 'no overrides'}): val loss "
            f"{ok[0]['best_val_loss']:.4f}, {ok[0].get('num_params') or 0:,} parameters."
        )
    if configs and configs[0].vs_best == "best":
        best, others = configs[0], Counter(c.vs_best for c in configs[1:])
        verdicts = ", ".join(f"{n} {kind}" for kind, n in others.items())
        if len(configs) == 2:
            verdicts = f"the other configuration: {configs[1].vs_best}"
        head.append(
            f"Best configuration: {best.name}: val loss {best.stats['val_loss'].estimate()} over "
            f"{best.n_seeds} seeds. Against it by Welch's t-test, "
            f"{verdicts or 'no other configuration'}. See {sweep_dir / 'summary_configs.csv'}."
        )
    return head


def write_summary(
    sweep_dir: str | Path,
    target_val_loss: float | None = None,
    baseline: str = BASELINE,
    out: str | Path | None = None,
    scaling: bool = False,
    metric: str = "best_val_loss",
) -> tuple[list[dict], list[str]]:
    """Write summary.csv, .md, .png (summary_configs.csv with `seed` swept; scaling.*: see
    scaling_section) of the jobs in `sweep_dir`, read as data, into `out`; the jobs, the headline.
    TooFewPoints, once summary.md is written, when `scaling` is True and nothing can be fitted."""
    sweep_dir = Path(sweep_dir)
    out = Path(out or sweep_dir)
    PLACE.make_dir(out)
    jobs = collect(sweep_dir)
    rows, knobs = jobs.rows, jobs.knobs
    for row in rows:
        row.update(downstream.marks([row]))
    configs = configurations(rows, knobs) if "seed" in knobs else None
    leading = leading_sections(rows, configs, out, target_val_loss, baseline)
    # μTransfer's verdict (experiment=mutransfer), else where optim.lr and a size are swept, μP's
    leading += mutransfer_section(rows, sweep_dir) or transfer_section(rows, knobs, out)
    leading += mixture_section(rows, out)  # a mixture's weights swept: mixture.png
    ladder_head, ladder_lines = ladder_section(rows, out)  # model.depth's rungs: ladder.png
    leading += ladder_lines
    head = headline(rows, configs, out, jobs.horizons)
    smoke = smoke_test_note(rows, jobs.horizons)
    fit, missing = scaling_section(rows, knobs, (sweep_dir, out), scaling, metric, baseline, smoke)
    if fit:
        head.append(fit)
    if ladder_head:
        head.append(ladder_head)
    lines = [f"# Sweep {sweep_dir}", "", *(f"- {line}" for line in head), "", *leading]
    lines += table_sections(rows, knobs, configs, out)
    figure = summary_figure(rows, knobs, configs, out.name)
    PLACE.save_figure(figure, out / "summary.png", dpi=80)
    lines += search_summary(sweep_dir, out / "summary.png")  # an Optuna search's study and plots
    PLACE.write_text(out / "summary.md", "\n".join(lines) + "\n")
    if missing:
        raise TooFewPoints(missing)
    return rows, head


def configurations(rows: list[dict], knobs: list[str]) -> list:
    """The configurations of a sweep of seeds, with the statistics of a mixture's per-source
    columns and of the downstream scores where jobs have them, and their marks at chance."""
    extra = [*statistics_of(rows), *downstream.score_keys(rows)]
    configs = aggregate(rows, knobs, extra)
    groups = group_configurations(rows, knobs)
    for config in configs:
        config.marks = downstream.marks(groups[config.name])
    return configs


def table_sections(rows: list[dict], knobs: list[str], configs, out: Path) -> list[str]:
    """summary.md's tables (configurations, downstream tasks, jobs), written beside it as
    summary_configs.csv and summary.csv."""
    lines = []
    if configs is not None:
        cells = [config.row() for config in configs]
        stats = [f"{m}_{s}" for m in statistics_of(rows) for s in ("mean", "std", "ci95")]
        columns = config_columns(knobs, cells, [*stats, *downstream.config_columns(rows)])
        shown = [*tables.CONFIG_SHOWN, *shown_estimates(rows)]
        table = write_table(out / "summary_configs.csv", columns, cells, shown)
        lines += ["## Configurations", "", *table, ""]
    scored = downstream.downstream_section(rows, knobs)
    lines += scored
    if configs is not None or scored:
        lines += ["## Jobs", ""]
    mixed = job_mixture_columns(rows)  # a mixture's per source: in summary.md's table too
    columns = job_columns(rows, knobs, [*mixed, *downstream.job_columns(rows)])
    shown = job_columns(rows, knobs, mixed)  # the downstream scores: their own table, above
    return lines + write_table(out / "summary.csv", columns, rows, shown)


class SweepSummary(Callback):
    """At a multirun's end, the summary; exit 1 if a job failed, 2 if every job failed on bad input
    (a callback's exception would only be a warning)."""

    def __init__(self, target_val_loss: float | None = None, baseline: str = BASELINE):
        self.target_val_loss = target_val_loss  # see write_summary
        self.baseline = baseline

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir() or "trainer" not in config:  # not gptlab-train (gptlab-eval -m)
            return
        rows, head = write_summary(sweep_dir, self.target_val_loss, self.baseline)
        print(*head, f"Summary: {sweep_dir / 'summary.md'} (also .csv, .png)", sep="\n", flush=True)
        failed = [r for r in rows if r["status"] not in ("ok", "pruned")]
        if failed:
            print(failure_message(failed, rows, sweep_dir), file=sys.stderr, flush=True)
            bad_input = len(failed) == len(rows) and all(r.get("bad_input") is True for r in failed)
            sys.exit(BAD_INPUT if bad_input else FAILED)
