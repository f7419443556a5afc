"""Quality per second in a sweep: how long each job and configuration took to reach a val loss,
and val loss against wall time and training FLOPs, from each job's `val_curve` [step, wall
seconds since the run's start, val loss]."""

from pathlib import Path
from statistics import fmean

from gptlab.run.overrides import short_label
from gptlab.run.place import PLACE
from gptlab.sweep.stats import number
from gptlab.sweep.tables import Configuration

LINE_STYLES = ("-", "--", ":")


def add_time_to_loss(
    rows: list[dict], configs: list[Configuration] | None, target: float | None
) -> float:
    """`time_to_val_loss` of every ok job and configuration (None if a seed never got there), to
    `target` or else a loss every job reached; returns the target (nan without curves)."""
    ok = [row for row in rows if row["status"] == "ok" and row.get("val_curve")]
    if target is None:
        target = max((min(p[2] for p in row["val_curve"]) for row in ok), default=float("nan"))
    times = {}
    for row in ok:
        row["time_to_val_loss"] = next((p[1] for p in row["val_curve"] if p[2] <= target), None)
        times[row["job"]] = row["time_to_val_loss"]
    for config in configs or []:
        seconds = [times.get(job) for job in config.jobs.split() if job in times]
        config.time_to_val_loss = None  # unless every seed got there
        if seconds and None not in seconds:
            config.time_to_val_loss = fmean(seconds)
    return target


def mean_curve(jobs: list[dict]) -> list[tuple[float, float, float]]:
    """(wall seconds, training FLOPs, val loss) at each step every job validated, averaged over
    the jobs (seeds)."""
    steps = set.intersection(*({point[0] for point in job["val_curve"]} for job in jobs))
    points = []
    for step in sorted(steps):
        at = [next(p for p in job["val_curve"] if p[0] == step) for job in jobs]
        flops = [job["flops_per_token"] * step * job["tokens_per_step"] for job in jobs]
        points.append((fmean(p[1] for p in at), fmean(flops), fmean(p[2] for p in at)))
    return points


def curve_groups(rows: list[dict], configs: list[Configuration] | None) -> dict[str, list[dict]]:
    """One line per configuration (its seeds), or per job when no seed was swept."""
    numbers = ("flops_per_token", "tokens_per_step")
    drawn = [r for r in rows if r.get("val_curve") and None not in map(number, map(r.get, numbers))]
    ok = {row["job"]: row for row in drawn if row["status"] == "ok"}
    if not configs:
        return {job_label(row, list(ok.values())): [row] for row in ok.values()}
    groups = {}
    for config in configs:
        jobs = [ok[job] for job in config.jobs.split() if job in ok]
        if jobs:
            groups[config_label(config.name)] = jobs
    return groups


def config_label(name: str) -> str:
    """A configuration's name ("model.num_heads=2 model.num_blocks=4") as "heads=2, blocks=4"."""
    parts = name.split()
    return short_label(parts, sep=", ") if all("=" in part for part in parts) else name


def job_label(row: dict, rows: list[dict]) -> str:
    """A job by the overrides that set it apart ("heads=2, blocks=4"), else by its number."""
    mine = str(row.get("overrides", "")).split()
    shared = set.intersection(*(set(str(o.get("overrides", "")).split()) for o in rows))
    own = [o for o in mine if o not in shared]
    return short_label(own, sep=", ") if own else f"job {row['job']}"


def write_curves(rows: list[dict], configs: list[Configuration] | None, path: Path) -> bool:
    """summary_curves.png, titled by the sweep directory's name; False (no file) without curves."""
    groups = curve_groups(rows, configs)
    if groups:
        PLACE.save_figure(curves_figure(groups, bool(configs), path.parent.name), path, dpi=80)
    return bool(groups)


def curves_figure(groups: dict[str, list[dict]], seeds: bool, title: str):
    """Val loss against wall time and against training FLOPs, a line per group (curve_groups)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.5, 4.2), layout="constrained")
    by_time, by_flops = fig.subplots(1, 2)
    for i, (name, jobs) in enumerate(groups.items()):
        points = mean_curve(jobs)
        style = {"label": name.removeprefix("ablation="), "marker": ".", "color": f"C{i % 10}"}
        style["linestyle"] = LINE_STYLES[i // 10 % len(LINE_STYLES)]  # 10 colours, then dashes
        by_time.plot([p[0] for p in points], [p[2] for p in points], **style)
        by_flops.plot([p[1] for p in points], [p[2] for p in points], **style)
    by_time.set(xlabel="wall seconds since the run's start", ylabel="val loss")
    by_flops.set(xlabel="training FLOPs", ylabel="val loss", xscale="log")
    handles, labels = by_flops.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside right upper")  # beside the data
    lines = "one line per configuration, the mean over its seeds" if seeds else "one line a job"
    fig.suptitle(f"{title}: val loss per second and per FLOP ({lines})")
    return fig
