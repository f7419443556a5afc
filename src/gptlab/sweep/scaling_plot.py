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


def isoflop_panel(ax, fit: dict) -> None:
    """L against N, one colour a budget: its jobs (hollow: past 4 epochs), its parabola, its
    optimum (a star)."""
    optima = {o["C"]: o for o in (fit["approach2"] or {}).get("optima", [])}
    for i, (budget, group) in enumerate(isoflop.by_budget(fit["points"]).items()):
        color = f"C{i % 10}"
        label = f"C = {budget:.2g}"
        for repeated in (False, True):
            part = [p for p in group if p["repeated"] == repeated]
            face = "none" if repeated else color
            xs, ys = [p["N"] for p in part], [p["L"] for p in part]
            ax.scatter(
                xs, ys, s=18, facecolors=face, edgecolors=color, label=label if part else None
            )
            label = label if not part else None  # one entry a budget
        optimum = optima.get(budget)
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
    if two:
        for optimum in two["optima"]:
            marker = "x" if optimum["edge"] else "o"
            ax.scatter([optimum["C"]], [optimum["N_opt"]], marker=marker, color="C0", zorder=3)
        label = f"approach 2: a = {two['a']:.2f}"
        ax.plot(inside, isoflop.n_opt(two, inside), color="C0", label=label)
        ax.plot(beyond, isoflop.n_opt(two, beyond), color="C0", ls="--")
    if law and law["a"] is not None and parametric.frontier(law, inside[0]):
        cs = np.concatenate([inside, beyond])
        ns = [parametric.frontier(law, c)["N"] for c in cs]
        ax.plot(cs, ns, color="C3", ls=":", label=f"approach 3: a = {law['a']:.2f}")
    ax.axvline(inside[-1], color="grey", lw=0.6)
    ax.set(xscale="log", yscale="log", xlabel="C (FLOPs)", ylabel="N_opt", title="Optimal size")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(ncol=2, **LEGEND)


def loss_panel(ax, fit: dict, color: str = "C3", label: str = "approach 3") -> None:
    """Every job's loss (grey), each budget's optimum with its interval, the law's frontier
    (dashed beyond the largest budget) and the held-out prediction."""
    inside, beyond = compute_range(fit)
    points = fit["points"]
    for repeated in (False, True):
        part = [p for p in points if p["repeated"] == repeated]
        face = "none" if repeated else "lightgrey"
        ax.scatter(
            [p["C"] for p in part],
            [p["L"] for p in part],
            s=10,
            facecolors=face,
            edgecolors="grey",
            lw=0.6,
        )
    for optimum in (fit["approach2"] or {}).get("optima", []):
        ci = optimum.get("L_opt_ci95") or [optimum["L_opt"]] * 2
        err = [[optimum["L_opt"] - ci[0]], [ci[1] - optimum["L_opt"]]]
        ax.errorbar(
            [optimum["C"]], [optimum["L_opt"]], yerr=err, fmt="o", color=color, ms=4, capsize=2
        )
    law = fit["approach3"]
    if law and parametric.frontier(law, inside[0]):
        ax.plot(
            inside,
            [parametric.frontier(law, c)["L"] for c in inside],
            color=color,
            label=f"{label}: frontier",
        )
        ax.plot(
            beyond,
            [parametric.frontier(law, c)["L"] for c in beyond],
            color=color,
            ls="--",
            label="extrapolated",
        )
    held = fit["holdout"]
    if held:
        ax.scatter(
            [held["budget"]],
            [held["predicted"]],
            marker="x",
            color="k",
            zorder=4,
            label=f"held out: predicted ({held['relative_error']:+.1%})",
        )
    ax.axvline(inside[-1], color="grey", lw=0.6)
    ax.set(xscale="log", xlabel="C (FLOPs)", ylabel="loss", title="Loss against compute")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(ncol=2, **LEGEND)


def comparison_panel(ax, fits: dict) -> None:
    """Each configuration's frontier: its budgets' optima and its approach-3 law."""
    for i, (name, fit) in enumerate(fits.items()):
        color = f"C{i % 10}"
        inside, beyond = compute_range(fit)
        optima = (fit["approach2"] or {}).get("optima", [])
        ax.scatter([o["C"] for o in optima], [o["L_opt"] for o in optima], color=color, s=16)
        law = fit["approach3"]
        if law and parametric.frontier(law, inside[0]):
            cs = np.concatenate([inside, beyond])
            ax.plot(
                cs,
                [parametric.frontier(law, c)["L"] for c in cs],
                color=color,
                label=name.removeprefix("ablation="),
            )
    ax.set(
        xscale="log",
        xlabel="C (FLOPs)",
        ylabel="loss at the optimum",
        title="Configurations along the compute-optimal frontier",
    )
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
