"""scaling.png: per configuration the IsoFLOP curves, N_opt and the loss against C (a fit identified
extrapolated a decade); with several configurations, their frontiers side by side."""

from pathlib import Path

import numpy as np

from gptlab.run.place import PLACE
from gptlab.sweep import isoflop, parametric
from gptlab.sweep.scaling import REPEATED_EPOCHS

EXTRAPOLATE = 10.0  # one decade past the largest budget
LEGEND = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "fontsize": 8, "frameon": False}


def compute_range(fit: dict) -> tuple[np.ndarray, np.ndarray]:
    """C over the budgets (from the smallest to the largest: a fit says nothing below them), and
    from the largest one decade further (drawn only for a fit identified)."""
    budgets = sorted({p["budget"] for p in fit["points"]})
    inside = np.geomspace(budgets[0], budgets[-1], 40)
    return inside, np.geomspace(budgets[-1], budgets[-1] * EXTRAPOLATE, 20)


def reach(fit: dict, approach: str) -> np.ndarray:
    """Where an approach's line is drawn: one decade past the largest budget when identified."""
    inside, beyond = compute_range(fit)
    return np.concatenate([inside, beyond]) if fit[approach]["identified"] else inside


def on_frontier(law: dict, cs, key: str) -> list[float] | None:
    """The law's compute-optimal `key` (N or L) at each C; None for a law without a minimum."""
    if parametric.frontier(law, cs[0]) is None:
        return None
    return [parametric.frontier(law, c)[key] for c in cs]


def jobs_scatter(ax, points: list[dict], x: str, color: str, fill=None, **style) -> None:
    """The jobs' losses against `x`: filled (`fill`, else `color`), hollow past REPEATED_EPOCHS."""
    for repeated in (False, True):
        part = [p for p in points if p["repeated"] == repeated]
        if part:
            xs, ys = [p[x] for p in part], [p["L"] for p in part]
            face = "none" if repeated else fill or color
            ax.scatter(xs, ys, facecolors=face, edgecolors=color, **style)


def isoflop_panel(ax, fit: dict) -> None:
    """L against N, coloured by budget on a log scale: jobs, parabolas, optima (stars)."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, LogNorm

    found = {o["C"]: o for o in fit["approach2"]["optima"]}
    groups = isoflop.by_budget(fit["points"])
    dark = ListedColormap(colormaps["viridis"](np.linspace(0, 0.85, 256)))  # no pale yellow
    scale = ScalarMappable(LogNorm(min(groups), max(groups)), dark)
    for budget, group in groups.items():
        color = scale.to_rgba(budget)
        jobs_scatter(ax, group, "N", color, s=18)
        optimum = found.get(budget)
        if optimum and optimum["parabola"]:
            xs = np.linspace(*np.log([min(p["N"] for p in group), max(p["N"] for p in group)]), 50)
            ax.plot(np.exp(xs), np.polyval(optimum["parabola"], xs), color=color, lw=1)
        if optimum:
            ax.scatter([optimum["N_opt"]], [optimum["L_opt"]], marker="*", s=90, color=color)
    ax.figure.colorbar(scale, ax=ax, label="budget C (FLOPs)")
    if any(p["repeated"] for p in fit["points"]):
        past = f"past {REPEATED_EPOCHS} epochs"
        ax.scatter([], [], s=18, facecolors="none", edgecolors="grey", label=past)
        ax.legend(**LEGEND)
    ax.set(xscale="log", xlabel="N (scaling_params)", ylabel="loss", title="IsoFLOP curves")


def n_opt_panel(ax, fit: dict) -> None:
    """The budgets' optima (x: at an edge), both approaches' N_opt(C) (dashed: extrapolated)."""
    inside, beyond = compute_range(fit)
    two, law = fit["approach2"], fit["approach3"]
    for optimum in two["optima"]:
        marker = "x" if optimum["edge"] else "o"
        ax.scatter([optimum["C"]], [optimum["N_opt"]], marker=marker, color="C0", zorder=3)
    ax.plot(inside, isoflop.n_opt(two, inside), color="C0", label=label(two, "approach 2"))
    if two["identified"]:
        ax.plot(beyond, isoflop.n_opt(two, beyond), color="C0", ls="--")
    cs = reach(fit, "approach3")
    if ns := on_frontier(law, cs, "N"):
        ax.plot(cs, ns, color="C3", ls=":", label=label(law, "approach 3"))
    ax.set(xscale="log", yscale="log", xlabel="C (FLOPs)", ylabel="N_opt", title="Optimal size")
    ax.legend(ncol=2, **LEGEND)


def label(fit: dict, approach: str) -> str:
    return f"{approach}: a = {fit['a']:.2f}" if fit["identified"] else f"{approach}: not identified"


def loss_panel(ax, fit: dict) -> None:
    """Every job's loss (grey), each budget's optimum with its interval, the law's frontier
    (dashed beyond the largest budget when identified) and the held-out prediction."""
    inside, beyond = compute_range(fit)
    jobs_scatter(ax, fit["points"], "C", "grey", s=10, lw=0.6, fill="lightgrey")
    for optimum in fit["approach2"]["optima"]:
        lo, hi = optimum.get("L_opt_ci95") or [optimum["L_opt"]] * 2
        err = [[max(optimum["L_opt"] - lo, 0)], [max(hi - optimum["L_opt"], 0)]]  # an interval
        ax.errorbar(optimum["C"], optimum["L_opt"], yerr=err, fmt="o", color="C3", ms=4, capsize=2)
    law = fit["approach3"]
    if losses := on_frontier(law, inside, "L"):
        ax.plot(inside, losses, color="C3", label=label(law, "approach 3") + ", frontier")
    if law["identified"]:
        losses = on_frontier(law, beyond, "L")
        if losses:
            ax.plot(beyond, losses, color="C3", ls="--", label="extrapolated")
    if held := fit["holdout"]:
        text = f"held out: predicted ({held['relative_error']:+.1%})"
        ax.scatter(held["budget"], held["predicted"], marker="x", color="k", zorder=4, label=text)
    ax.set(xscale="log", xlabel="C (FLOPs)", ylabel="loss", title="Loss against compute")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(ncol=2, **LEGEND)


def comparison_panel(ax, fits: dict) -> None:
    """Each configuration's frontier: its budgets' optima and its approach-3 law."""
    for i, (name, fit) in enumerate(fits.items()):
        color, optima = f"C{i % 10}", fit["approach2"]["optima"]
        ax.scatter([o["C"] for o in optima], [o["L_opt"] for o in optima], color=color, s=16)
        cs = reach(fit, "approach3")
        if losses := on_frontier(fit["approach3"], cs, "L"):
            ax.plot(cs, losses, color=color, label=name.removeprefix("ablation="))
    title = "Configurations along the compute-optimal frontier"
    ax.set(xscale="log", xlabel="C (FLOPs)", ylabel="loss at the optimum", title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


PANELS = (isoflop_panel, n_opt_panel, loss_panel)  # a configuration's row


def write_scaling_plot(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fits = result["configurations"]
    rows = len(fits)
    if len(fits) > 1:
        rows += 1  # the configurations together
    fig = Figure(figsize=(15, 4.6 * rows), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(rows, 1))
    for subfig, (name, fit) in zip(subfigs, fits.items(), strict=False):
        for ax, panel in zip(subfig.subplots(1, 3), PANELS, strict=True):
            panel(ax, fit)
        subfig.suptitle(f"{name}: {len(fit['points'])} jobs, L = {result['metric']}", fontsize=11)
    if len(fits) > 1:
        comparison_panel(subfigs[-1].subplots(1, 1), fits)
    PLACE.save_figure(fig, path, dpi=80)
