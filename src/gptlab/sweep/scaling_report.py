"""scaling.json, scaling.md and scaling.png of a sweep (gptlab.sweep.scaling fits them); with too
few points, scaling.md says what is missing and the rest of the sweep's summary stands."""

import logging
from pathlib import Path

import numpy as np

from gptlab import files
from gptlab.sweep import isoflop, parametric
from gptlab.sweep.scaling import REPEATED_EPOCHS, TooFewPoints, as_json, fit_sweep
from gptlab.sweep.stats import number
from gptlab.sweep.tables import format_estimate, markdown_table

log = logging.getLogger(__name__)
EXTRAPOLATE = 10.0  # one decade past the largest budget
LEGEND = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "fontsize": 8, "frameon": False}


def approach2_lines(fit: dict | None) -> list[str]:
    if fit is None:
        return ["Approach 2: no budget with a loss minimum to fit.", ""]
    rows = [
        [
            f"{o['C']:.3g}",
            o["sizes"],
            f"{o['N_opt']:,.0f}",
            f"{o['D_opt']:,.0f}",
            format_estimate(o["L_opt"], o.get("L_opt_ci95")),
            "edge: the best job (no minimum among these sizes)" if o["edge"] else "",
        ]
        for o in fit["optima"]
    ]
    return [
        "### Approach 2: a parabola per IsoFLOP budget",
        "",
        f"N_opt ∝ C^a with a = {format_estimate(fit['a'], fit['ci95']['a'], '.3g')}; "
        f"D_opt ∝ C^b with b = {format_estimate(fit['b'], fit['ci95']['b'], '.3g')} "
        f"(95% bootstrap over jobs within each budget, {fit['draws_used']} draws).",
        "",
        *markdown_table(
            ["budget C (FLOPs)", "sizes", "N_opt", "D_opt", "L_opt (95% CI)", ""], rows
        ),
        "",
    ]


def approach3_lines(law: dict | None) -> list[str]:
    if law is None:
        return ["Approach 3: fewer than 5 distinct (N, D) points to fit.", ""]
    rows = [
        [name, format_estimate(law[name], law["ci95"][name], ".4g")]
        for name in ("E", "A", "alpha", "B", "beta", "a")
        if law[name] is not None
    ]
    return [
        "### Approach 3: L(N, D) = E + A / N^alpha + B / D^beta",
        "",
        "Huber loss (delta 1e-3) on log L, L-BFGS from a grid of starts (Besiroglu et al. "
        f"2024); 95% bootstrap intervals over jobs ({law['draws_used']} draws). "
        "a = beta / (alpha + beta): the allocation it implies, N_opt ∝ C^a.",
        "",
        *markdown_table(["parameter", "fit (95% CI)"], rows),
        "",
    ]


def holdout_lines(held: dict | None) -> list[str]:
    if held is None:
        return ["Held out: needs at least 3 budgets (2 left to refit on).", ""]
    lines = [
        "### The largest budget held out",
        "",
        f"Refitted without budget {held['budget']:.3g} FLOPs, approach 3 predicts its best job "
        f"(job {held['job']}: N {held['N']:,.0f}, D {held['D']:,.0f}) at loss "
        f"{held['predicted']:.4f}; measured {held['measured']:.4f}: relative error "
        f"{held['relative_error']:+.2%}.",
    ]
    if "approach2" in held:
        two = held["approach2"]
        lines.append(
            f"Approach 2 refitted predicts N_opt {two['predicted_N_opt']:,.0f} there; the "
            f"budget's own parabola puts it at {two['measured_N_opt']:,.0f} "
            f"({two['relative_error']:+.1%})."
        )
    return [*lines, ""]


def repeated_lines(fit: dict) -> list[str]:
    repeated, total = fit["repeated_data_points"], len(fit["points"])
    most = max((p["epochs"] or 0 for p in fit["points"]), default=0)
    if not repeated:
        return [f"No job trained past {REPEATED_EPOCHS} epochs of the train split.", ""]
    return [
        f"**Repeated data:** {repeated} of {total} jobs trained past {REPEATED_EPOCHS} epochs of "
        f"the train split (the most: {most:.1f}). Repeated tokens are worth less than fresh "
        "ones (Muennighoff et al. 2023: up to about 4 epochs nearly as good as new data, then "
        "quickly less), so D here counts tokens that are not all new: the data term B / D^beta "
        "and b describe this corpus's repeated regime (a data term that flattens fast, a large "
        "beta, so a larger a than Chinchilla's 0.5: compute goes to size), and the law "
        "extrapolated to more compute overstates what more "
        "tokens of this corpus buy. These jobs are hollow markers in the plot.",
        "",
    ]


def configuration_lines(name: str, fit: dict) -> list[str]:
    return [
        f"## {name}",
        "",
        *repeated_lines(fit),
        *(f"- {note}" for note in fit["notes"]),
        *([""] if fit["notes"] else []),
        *approach2_lines(fit["approach2"]),
        *approach3_lines(fit["approach3"]),
        *holdout_lines(fit["holdout"]),
    ]


def comparison_lines(fits: dict) -> list[str]:
    compared = {name: fit for name, fit in fits.items() if "vs_first" in fit}
    if len(compared) < 2:
        return []
    first = next(iter(compared))
    rows = []
    for name, fit in compared.items():
        for row in fit["vs_first"]:
            gap = "" if name == first else format_estimate(row["gap"], row["gap_ci95"], "+.4f")
            shown = format_estimate(row["L_opt"], row["L_opt_ci95"])
            rows.append([f"{row['C']:.3g}", name, shown, gap])
    rows.sort(key=lambda r: float(r[0]))
    return [
        "## Configurations along the compute-optimal frontier",
        "",
        f"Each configuration's loss at its own optimum per budget (approach 2's parabola), with "
        f"its 95% bootstrap interval, and the gap to {first} (< 0: better).",
        "",
        *markdown_table(
            ["budget C (FLOPs)", "configuration", "L_opt (95% CI)", f"gap to {first}"], rows
        ),
        "",
    ]


def report_lines(result: dict, sweep_dir: Path) -> list[str]:
    fits = result["configurations"]
    lines = [
        f"# Scaling laws: {sweep_dir}",
        "",
        f"L = {result['metric']}, N = scaling_params (the blocks' matrices and the head), D = "
        "tokens_seen, C = flops_per_token x tokens_seen; jobs within 10% in C share a budget.",
        "",
        "![IsoFLOP curves, N_opt and the loss against compute](scaling.png)",
        "",
        *(f"- Not fitted: {message}" for message in result["errors"].values()),
        *([""] if result["errors"] else []),
        *comparison_lines(fits),
    ]
    for name, fit in fits.items():
        lines += configuration_lines(name, fit)
    return lines


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


def write_scaling(
    rows: list[dict], knobs: list[str], sweep_dir: Path, out: Path, metric: str, first: str | None
) -> str:
    """scaling.json, .md, .png in `out`; the headline's line. TooFewPoints, once scaling.md
    holds its message alone, when nothing can be fitted."""
    try:
        result = fit_sweep(rows, knobs, metric, first=first)
    except TooFewPoints as e:
        files.write_text(
            out / "scaling.md", f"# Scaling laws: {sweep_dir}\n\nNo scaling fit: {e}\n"
        )
        raise
    files.write_json(out / "scaling.json", as_json(result))
    files.write_text(out / "scaling.md", "\n".join(report_lines(result, sweep_dir)) + "\n")
    write_scaling_plot(result, out / "scaling.png")
    heads = []
    for name, fit in result["configurations"].items():
        law, two = fit["approach3"], fit["approach2"]
        parts = [] if two is None else [f"a = {round(two['a'], 2) + 0.0:.2f} (approach 2)"]
        if law is not None and law["a"] is not None:
            parts.append(f"{round(law['a'], 2) + 0.0:.2f} (approach 3)")  # + 0.0: no "-0.00"
        heads.append(f"{name}: N_opt ∝ C^a, " + ", ".join(parts))
    return "Scaling laws (scaling.md, scaling.json, scaling.png): " + "; ".join(heads) + "."


def scaling_section(
    rows: list[dict],
    knobs: list[str],
    sweep_dir: Path,
    out: Path,
    requested: bool,
    metric: str,
    first: str | None,
) -> tuple[str | None, str | None]:
    """scaling.* when `requested` or a job set flops_budget: the headline's line and, when
    requested and there were too few points, what is missing (raised once summary.md is written)."""
    budgeted = any(number(row.get("flops_budget")) is not None for row in rows)
    if not requested and not budgeted:
        return None, None
    try:
        return write_scaling(rows, knobs, sweep_dir, out, metric, first), None
    except TooFewPoints as e:
        log.warning("No scaling fit: %s", e)
        return f"No scaling fit: {e}", str(e) if requested else None
    except Exception as e:  # a sweep's own summary must not be lost to its fit
        if requested:
            raise
        log.exception("The scaling fit failed")
        return f"No scaling fit: it failed ({type(e).__name__}: {e}).", None
