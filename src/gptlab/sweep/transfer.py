"""Learning-rate transfer (μP, docs/model.md): in a sweep over optim.lr and a size (d_model or
num_blocks), the best rate at each size with a 95% interval, and whether it moved. The best rate
is the vertex of a parabola through the mean val loss of the best grid rate and its neighbours in
log lr; its interval, the bootstrap of that vertex with the seeds resampled at each rate."""

import math
import statistics
from pathlib import Path

import numpy as np

from gptlab.run.place import PLACE
from gptlab.sweep.stats import bootstrap, number, percentile_interval, sort_key
from gptlab.sweep.tables import format_estimate, markdown_table

LR = "optim.lr"
EDGE = "at the edge: the optimum may lie beyond"
SIZES = ("model.d_model", "model.num_blocks")  # the first one swept is the size


def mean_losses(jobs: list[dict]) -> dict[float, float]:
    """Mean best val loss at each rate, rates ascending."""
    by_lr = {}
    for job in jobs:
        by_lr.setdefault(number(job[LR]), []).append(job["best_val_loss"])
    return {lr: statistics.fmean(by_lr[lr]) for lr in sorted(by_lr)}


def best_rate(jobs: list[dict]) -> float | None:
    """The parabola's vertex in log lr (kept within the grid), the grid's best where it opens
    downward; None below three rates."""
    means = mean_losses(jobs)
    if len(means) < 3:
        return None
    lrs, losses = np.log10(list(means)), np.array(list(means.values()))
    i = min(max(int(np.argmin(losses)), 1), len(lrs) - 2)  # the best and its neighbours
    a, b, _ = np.polyfit(lrs[i - 1 : i + 2], losses[i - 1 : i + 2], 2)
    if a <= 0:
        return float(10 ** lrs[np.argmin(losses)])
    return float(10 ** np.clip(-b / (2 * a), lrs[0], lrs[-1]))


def at_edge(jobs: list[dict]) -> bool:
    """Whether the best grid rate is the grid's lowest or highest: no minimum is bracketed."""
    means = list(mean_losses(jobs).values())
    return means.index(min(means)) in (0, len(means) - 1)


def curves(rows: list[dict], knobs: list[str]) -> tuple[str, dict]:
    """The size knob and the ok jobs by panel (the other knobs' values) and size."""
    size = next(key for key in SIZES if key in knobs)
    others = [key for key in knobs if key not in (LR, size, "seed")]
    found = {}
    for row in rows:
        if row["status"] == "ok" and number(row.get(LR)) is not None:
            panel = " ".join(f"{key}={row.get(key)}" for key in others) or "(every job)"
            found.setdefault(panel, {}).setdefault(row.get(size), []).append(row)
    return size, found


def transfer_section(rows: list[dict], knobs: list[str], out: Path) -> list[str]:
    """summary.md's lines and summary_transfer.png, where optim.lr and a size are swept."""
    if LR not in knobs or not any(key in knobs for key in SIZES):
        return []
    size, found = curves(rows, knobs)
    table, moves = [], []
    for panel, by_size in found.items():
        best = {}
        for value in sorted(by_size, key=sort_key):
            jobs = by_size[value]
            best[value] = best_rate(jobs)
            strata = [number(job[LR]) for job in jobs]
            seeded = min(strata.count(lr) for lr in strata) > 1  # one seed: no interval
            interval = percentile_interval(bootstrap(best_rate, jobs, strata)) if seeded else None
            grid = min(mean_losses(jobs).items(), key=lambda item: item[1])
            estimate = format_estimate(best[value], interval, ".3g") if best[value] else ""
            if at_edge(jobs):  # no transfer ratio is taken from it
                estimate, best[value] = f"{estimate} ({EDGE})", None
            row = [panel, value, len(jobs), f"{grid[0]:g}", f"{grid[1]:.4f}", estimate]
            table.append(row)
        rates = [(value, rate) for value, rate in best.items() if rate]
        if len(rates) > 1:
            (small, first), (large, last) = rates[0], rates[-1]
            moves.append(
                f"- {panel}: best lr {first:.3g} at {size}={small}, {last:.3g} at "
                f"{size}={large}: x{last / first:.2f} ({math.log2(last / first):+.2f} octaves)."
            )
    PLACE.save_figure(transfer_figure(found, size), out / "summary_transfer.png", dpi=80)
    header = ["configuration", size, "jobs", "best lr (grid)", "its val loss", "best lr [95%]"]
    return [
        "## Learning-rate transfer",
        "",
        "The best rate at each size: the vertex of a parabola in log lr through the best grid "
        "rate's mean val loss and its neighbours', with a 95% bootstrap interval (seeds "
        "resampled at each rate). An optimum at the grid's edge is marked and left out of the "
        "ratios.",
        "",
        *markdown_table(header, table),
        "",
        *moves,
        "",
        "![val loss against learning rate at each size](summary_transfer.png)",
        "",
    ]


def transfer_figure(found: dict, size: str):
    """A panel per configuration: mean val loss against lr, a line per size, the best rate ×."""
    from matplotlib.figure import Figure  # when a figure is drawn: every run loads this module

    fig = Figure(figsize=(5.5 * len(found), 4.5), layout="constrained")
    axes = fig.subplots(1, len(found), sharey=True, squeeze=False)[0]
    for ax, (panel, by_size) in zip(axes, found.items(), strict=True):
        for value in sorted(by_size, key=sort_key):
            means = mean_losses(by_size[value])
            edge = " (optimum at the edge)" if at_edge(by_size[value]) else ""
            (line,) = ax.plot(list(means), list(means.values()), marker="o", label=f"{value}{edge}")
            rate = best_rate(by_size[value])
            if rate and not edge:
                ax.axvline(rate, color=line.get_color(), linestyle=":", linewidth=1)
        ax.set(xscale="log", xlabel="optim.lr (peak)", ylabel="best val loss (mean over seeds)")
        ax.set_title(panel, fontsize=10)
        ax.legend(title=size, fontsize=8)
    return fig
