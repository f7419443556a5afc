"""scaling.png: for each configuration the IsoFLOP curves with their parabolas, N_opt against C,
and the loss against C with the fitted law extrapolated one decade past the largest budget;
with several configurations, a last row puts their frontiers side by side."""

from pathlib import Path

import numpy as np

from gptlab import files
from gptlab.sweep import isoflop, parametric
from gptlab.sweep.scaling import REPEATED_EPOCHS

EXTRAPOLATE = 10.0  # one decade past the largest budget
LEGEND = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "fontsize": 8, "frameon": False}


def compute_range(fit: dict) -> tuple[np.ndarray, np.ndarray]:
    """C from half the smallest budget to the largest, and from there one decade further."""
    budgets = sorted({p["budget"] for p in fit["points"]})
    inside = np.geomspace(budgets[0] / 2, budgets[-1], 40)
    return inside, np.geomspace(budgets[-1], budgets[-1] * EXTRAPOLATE, 20)


def on_frontier(law: dict | None, cs, key: str) -> list[float] | None:
    """The law's compute-optimal `key` (N or L) at each C; None without a law or a minimum."""
    if not law or parametric.frontier(law, cs[0]) is None:
        return None
    return [parametric.frontier(law, c)[key] for c in cs]


def optima(fit: dict) -> list[dict]:
    return (fit["approach2"] or {}).get("optima", [])


def jobs_scatter(ax, points: list[dict], x: str, color: str, fill=None, **style) -> None:
    """The jobs' losses against `x`: filled (`fill`, else `color`), hollow past REPEATED_EPOCHS."""
    for repeated in (False, True):
        part = [p for p in points if p["repeated"] == repeated]
        if part:
            xs, ys = [p[x] for p in part], [p["L"] for p in part]
            face = "none" if repeated else fill or color
            ax.scatter(xs, ys, facecolors=face, edgecolors=color, **style)
            style.pop("label", None)  # one legend entry for both


def isoflop_panel(ax, fit: dict) -> None:
    """L against N, one colour a budget: its jobs, its parabola, its optimum (a star)."""
    found = {o["C"]: o for o in optima(fit)}
    for i, (budget, group) in enumerate(isoflop.by_budget(fit["points"]).items()):
        color = f"C{i % 10}"
        jobs_scatter(ax, group, "N", color, s=18, label=f"C = {budget:.2g}")
        optimum = found.get(budget)
        if optimum and optimum["parabola"]:
            xs = np.linspace(*np.log([min(p["N"] for p in group), max(p["N"] for p in group)]), 50)
            ax.plot(np.exp(xs), np.polyval(optimum["parabola"], xs), color=color, lw=1)
        if optimum:
            ax.scatter([optimum["N_opt"]], [optimum["L_opt"]], marker="*", s=90, color=color)
    if any(p["repeated"] for p in fit["points"]):
        past = f"past {REPEATED_EPOCHS} epochs"
        ax.scatter([], [], s=18, facecolors="none", edgecolors="grey", label=past)
    ax.set(xscale="log", xlabel="N (scaling_params)", ylabel="loss", title="IsoFLOP curves")
    ax.legend(ncol=3, **LEGEND)


def n_opt_panel(ax, fit: dict) -> None:
    """The budgets' optima (x: at an edge of the sizes) and both approaches' N_opt(C)."""
    inside, beyond = compute_range(fit)
    two, law = fit["approach2"], fit["approach3"]
    for optimum in optima(fit):
        marker = "x" if optimum["edge"] else "o"
        ax.scatter([optimum["C"]], [optimum["N_opt"]], marker=marker, color="C0", zorder=3)
    if two:
        label = f"approach 2: a = {two['a']:.2f}"
        ax.plot(inside, isoflop.n_opt(two, inside), color="C0", label=label)
        ax.plot(beyond, isoflop.n_opt(two, beyond), color="C0", ls="--")
    cs = np.concatenate([inside, beyond])
    if ns := on_frontier(law, cs, "N"):
        ax.plot(cs, ns, color="C3", ls=":", label=f"approach 3: a = {law['a']:.2f}")
    ax.axvline(inside[-1], color="grey", lw=0.6)
    ax.set(xscale="log", yscale="log", xlabel="C (FLOPs)", ylabel="N_opt", title="Optimal size")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(ncol=2, **LEGEND)


def loss_panel(ax, fit: dict) -> None:
    """Every job's loss (grey), each budget's optimum with its interval, the law's frontier
    (dashed beyond the largest budget) and the held-out prediction."""
    inside, beyond = compute_range(fit)
    jobs_scatter(ax, fit["points"], "C", "grey", s=10, lw=0.6, fill="lightgrey")
    for optimum in optima(fit):
        lo, hi = optimum.get("L_opt_ci95") or [optimum["L_opt"]] * 2
        err = [[optimum["L_opt"] - lo], [hi - optimum["L_opt"]]]
        ax.errorbar(optimum["C"], optimum["L_opt"], yerr=err, fmt="o", color="C3", ms=4, capsize=2)
    lines = {"approach 3: frontier": (inside, "-"), "extrapolated": (beyond, "--")}
    for label, (cs, dashes) in lines.items():
        if losses := on_frontier(fit["approach3"], cs, "L"):
            ax.plot(cs, losses, color="C3", ls=dashes, label=label)
    held = fit["holdout"]
    if held:
        label = f"held out: predicted ({held['relative_error']:+.1%})"
        ax.scatter(held["budget"], held["predicted"], marker="x", color="k", zorder=4, label=label)
    ax.axvline(inside[-1], color="grey", lw=0.6)
    ax.set(xscale="log", xlabel="C (FLOPs)", ylabel="loss", title="Loss against compute")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(ncol=2, **LEGEND)


def comparison_panel(ax, fits: dict) -> None:
    """Each configuration's frontier: its budgets' optima and its approach-3 law."""
    for i, (name, fit) in enumerate(fits.items()):
        color = f"C{i % 10}"
        ax.scatter(
            [o["C"] for o in optima(fit)], [o["L_opt"] for o in optima(fit)], color=color, s=16
        )
        cs = np.concatenate(compute_range(fit))
        if losses := on_frontier(fit["approach3"], cs, "L"):
            ax.plot(cs, losses, color=color, label=name.removeprefix("ablation="))
    title = "Configurations along the compute-optimal frontier"
    ax.set(xscale="log", xlabel="C (FLOPs)", ylabel="loss at the optimum", title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


def write_scaling_plot(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fits = result["configurations"]
    rows = len(fits) + (len(fits) > 1)
    fig = Figure(figsize=(15, 4.6 * rows), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(rows, 1))
    for subfig, (name, fit) in zip(subfigs, fits.items(), strict=False):
        isoflop_ax, n_ax, loss_ax = subfig.subplots(1, 3)
        isoflop_panel(isoflop_ax, fit)
        n_opt_panel(n_ax, fit)
        loss_panel(loss_ax, fit)
        subfig.suptitle(f"{name}: {len(fit['points'])} jobs, L = {result['metric']}", fontsize=11)
    if len(fits) > 1:
        comparison_panel(subfigs[-1].subplots(1, 1), fits)
    files.save_figure(fig, path, dpi=80)
