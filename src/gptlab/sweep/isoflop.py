"""Chinchilla's approach 2 on an IsoFLOP grid: a parabola of L in log N (and in log D) per compute
budget, its vertex the budget's optimum; N_opt ∝ C^a and D_opt ∝ C^b fitted through the optima.
The method: docs/scaling.md."""

import math

import numpy as np

from gptlab.sweep.stats import bootstrap, percentile_interval

TOLERANCE = 0.1  # a new budget starts where C jumps by more than 10% (docs/scaling.md)
MIN_SIZES = 3  # a parabola needs three model sizes
MIN_BUDGETS = 2  # a line through the optima needs two budgets


def assign_budgets(points: list[dict]) -> list[float]:
    """Give each point its `budget`: log C split where C jumps by over TOLERANCE to the next job (a
    rounding keeps a job in its budget), each at its geometric mean; the budgets, smallest first."""
    if not points:
        return []
    ordered = sorted(points, key=lambda p: p["C"])
    logs = np.log([p["C"] for p in ordered])
    jumps = np.flatnonzero(np.diff(logs) > math.log1p(TOLERANCE)) + 1
    budgets = []
    for group in np.split(np.arange(len(ordered)), jumps):
        budgets.append(math.exp(logs[group].mean()))
        for i in group:
            ordered[i]["budget"] = budgets[-1]
    return budgets


def by_budget(points: list[dict]) -> dict[float, list[dict]]:
    groups = {}
    for point in points:
        groups.setdefault(point["budget"], []).append(point)
    return dict(sorted(groups.items()))


def sizes(group: list[dict]) -> int:
    return len({p["N"] for p in group})


def vertex(group: list[dict], key: str) -> tuple[float, float, list[float] | None]:
    """The optimum of L against log `key` (N or D): the parabola's vertex where it opens upward
    within the values tried, else the best job's value (no coefficients)."""
    xs = np.log([p[key] for p in group])
    losses = np.array([p["L"] for p in group])
    coefficients = np.polyfit(xs, losses, 2)
    if coefficients[0] > 0:
        x = -coefficients[1] / (2 * coefficients[0])
        if xs.min() <= x <= xs.max():
            return math.exp(x), float(np.polyval(coefficients, x)), coefficients.tolist()
    best = group[int(np.argmin(losses))]
    return best[key], best["L"], None


def budget_optimum(budget: float, group: list[dict]) -> dict | None:
    """N_opt, D_opt and L_opt at one budget; `edge` where the sizes do not bracket a minimum."""
    if sizes(group) < MIN_SIZES:
        return None
    n_opt, loss, parabola = vertex(group, "N")
    d_opt, _, d_parabola = vertex(group, "D")
    return {
        "C": budget,
        "N_opt": n_opt,
        "D_opt": d_opt,
        "L_opt": loss,
        "parabola": parabola,  # L = p0 (log N)^2 + p1 log N + p2; None at an edge
        "edge": parabola is None or d_parabola is None,
        "sizes": sizes(group),
    }


def power_law(cs: list[float], values: list[float]) -> tuple[float, float]:
    """The exponent and the coefficient k of values = k C^exponent, least squares in log-log."""
    slope, intercept = np.polyfit(np.log(cs), np.log(values), 1)
    return float(slope), math.exp(intercept)


def fit_approach2(points: list[dict]) -> dict | None:
    """a, b and their coefficients through the optima; None below MIN_BUDGETS of them."""
    optima = [budget_optimum(b, group) for b, group in by_budget(points).items()]
    optima = [o for o in optima if o is not None]
    if len(optima) < MIN_BUDGETS:
        return None
    cs = [o["C"] for o in optima]
    a, n_coef = power_law(cs, [o["N_opt"] for o in optima])
    b, d_coef = power_law(cs, [o["D_opt"] for o in optima])
    return {"a": a, "b": b, "n_coefficient": n_coef, "d_coefficient": d_coef, "optima": optima}


def approach2(points: list[dict]) -> dict | None:
    """fit_approach2 with bootstrap intervals (within each budget); `_draws`: the draws' fits."""
    fit = fit_approach2(points)
    if fit is None:
        return None
    fits = bootstrap(fit_approach2, points, [p["budget"] for p in points])
    fit["ci95"] = {key: percentile_interval([f[key] for f in fits]) for key in ("a", "b")}
    for optimum in fit["optima"]:
        values = [o["L_opt"] for f in fits for o in f["optima"] if o["C"] == optimum["C"]]
        optimum["L_opt_ci95"] = percentile_interval(values)
    fit.update(draws_used=len(fits), _draws=fits)
    return fit


def n_opt(fit: dict, compute: float) -> float:
    return fit["n_coefficient"] * compute ** fit["a"]
