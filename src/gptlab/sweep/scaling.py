"""Scaling laws from a sweep: each finished job a point (N, D, C, L) read from its metrics.json,
each configuration (jobs alike but in size, budget and seed) fitted by Chinchilla's approaches 2
and 3, checked on its largest budget held out and compared with the first along the frontier.
The method: docs/scaling.md."""

import math
import re

from gptlab.sweep import isoflop, parametric, stats
from gptlab.sweep.stats import group_configurations, number, percentile_interval, sort_key

# the knobs that vary a model's size, its budget or its seed: the rest of the swept knobs makes
# a configuration (e.g. +ablation)
SIZE_KEYS = ("model.d_model", "model.num_blocks", "model.num_heads", "model.ffn_mult")
# a cooldown branch (branch_from=, branch_step=) is a point of its trunk's configuration
BRANCH_KEYS = ("branch_from", "branch_step")
NOT_CONFIGURATION = (*SIZE_KEYS, "flops_budget", "trainer.max_steps", "seed", *BRANCH_KEYS)
METRICS = ("best_val_loss", "final_val_loss", "test_loss")
# a downstream task's bits per byte of its gold continuations (the in-loop callback's, in
# metrics.json: gptlab.training.downstream_callback), or their mean over the tasks: a loss too
DOWNSTREAM_BPB = re.compile(r"downstream/(?:[A-Za-z0-9_.-]+/)?bpb")
REPEATED_EPOCHS = 4  # past it, repeated tokens are worth clearly less (Muennighoff et al. 2023)
POINTS_PER_PARAMETER = 2  # an identified fit's least (docs/scaling.md)
DECADE = 10.0  # a bootstrap interval whose ends lie further apart pins nothing down


def fitted_metric(name: str) -> str:
    """`name` if a fit can take it as its L (METRICS, or a task's bits per byte,
    downstream/<task>/bpb); ValueError naming what can."""
    if name in METRICS or DOWNSTREAM_BPB.fullmatch(name):
        return name
    raise ValueError(
        f"{name!r} is no loss to fit: give one of {', '.join(METRICS)}, or a task's bits per byte "
        "as the downstream callback writes it to metrics.json: downstream/<task>/bpb (or "
        "downstream/bpb, their mean over the tasks). Accuracies rise with compute: no loss."
    )


class TooFewPoints(Exception):
    """A sweep (or a configuration) without the budgets and sizes a fit needs: what is missing."""


def job_point(row: dict, metric: str) -> dict | None:
    """A finished job's (N, D, C, L) and epochs; None when one is missing or not positive."""
    n, d = number(row.get("scaling_params")), number(row.get("tokens_seen"))
    flops, loss = number(row.get("flops_per_token")), number(row.get(metric))
    if row.get("status") != "ok" or None in (n, d, flops, loss) or min(n, d, flops, loss) <= 0:
        return None
    epochs = number(row.get("epochs"))
    return {"job": row["job"], "N": n, "D": d, "C": flops * d, "L": loss, "epochs": epochs}


def spent_flops(rows: list[dict]) -> dict:
    """The training FLOPs a sweep's finished jobs spent, each trunk once (a branch adds its own
    steps: branch_train_flops), and what its points would cost as separate runs (train_flops)."""
    ok = [row for row in rows if row.get("status") == "ok"]
    branches = [row for row in ok if row.get("branched_from")]
    own = [row.get("branch_train_flops" if row in branches else "train_flops") for row in ok]
    alone = [row.get("train_flops") for row in ok]
    spent = sum(number(x) or 0.0 for x in own)
    separate = sum(number(x) or 0.0 for x in alone)
    return {"spent": spent, "as_separate_runs": separate, "branches": len(branches)}


def configurations(rows: list[dict], knobs: list[str], first: str | None) -> dict[str, list]:
    """The jobs by configuration, in job order; `first` (the baseline) leads when present."""
    ordered = sorted(rows, key=lambda r: sort_key(r["job"]))
    groups = group_configurations(ordered, [k for k in knobs if k not in NOT_CONFIGURATION])
    return {name: groups[name] for name in sorted(groups, key=lambda name: name != first)}


def usable_points(name: str, points: list[dict], metric: str) -> list[str]:
    """Notes on the budgets approach 2 leaves out; TooFewPoints below MIN_BUDGETS of MIN_SIZES."""
    groups = isoflop.by_budget(points)
    kept = {b: g for b, g in groups.items() if isoflop.sizes(g) >= isoflop.MIN_SIZES}
    found = "; ".join(f"{b:.3g} FLOPs: {isoflop.sizes(g)} sizes" for b, g in groups.items())
    found = found or f"no finished job with scaling_params, tokens_seen, flops_per_token, {metric}"
    if len(kept) < isoflop.MIN_BUDGETS:
        raise TooFewPoints(
            f"{name}: {len(kept)} budget(s) with at least {isoflop.MIN_SIZES} model sizes "
            f"({found}); a scaling fit needs at least {isoflop.MIN_BUDGETS} budgets of at least "
            f"{isoflop.MIN_SIZES} sizes each. Sweep more budgets (flops_budget=1e12,3e12,...) "
            "or more sizes (model.d_model=32,64,128,...)."
        )
    return [
        f"budget {b:.3g} FLOPs: {isoflop.sizes(g)} size(s), fewer than {isoflop.MIN_SIZES}: "
        "left out of approach 2, in approach 3"
        for b, g in groups.items()
        if b not in kept
    ]


def interval_faults(fit: dict, keys: tuple) -> list[str]:
    """Too few draws, or intervals among `keys` pinning nothing: of zero width or over a decade."""
    draws, least = fit["draws_used"], stats.MIN_DRAWS
    faults = []
    if draws < least:
        faults.append(f"{draws} of {stats.DRAWS} bootstrap draws fitted (needs {least})")
    for key in keys:
        ci = fit["ci95"][key]
        if ci is None:
            continue  # too few draws, said above
        if math.isclose(*ci, rel_tol=1e-9, abs_tol=1e-12):
            faults.append(f"{key}'s interval has zero width")
        elif ci[0] <= 0 or ci[1] > DECADE * ci[0]:
            faults.append(f"{key}'s interval [{ci[0]:.3g}, {ci[1]:.3g}] spans over a decade")
    return faults


def budgets_where(optima: list[dict], what: str) -> list[str]:
    if not optima:
        return []
    return [f"{what} at C = " + ", ".join(f"{o['C']:.2g}" for o in optima)]


def approach2_faults(fit: dict, points: list[dict]) -> list[str]:
    """Why approach 2 is not identified (docs/scaling.md); [] when it is."""
    need = POINTS_PER_PARAMETER * 3  # a parabola's parameters
    few = [o for o in fit["optima"] if o["sizes"] < need]
    faults = budgets_where(few, f"fewer than {need} sizes for a parabola's 3 parameters")
    edges = [o for o in fit["optima"] if o["edge"]]
    faults += budgets_where(edges, "the optimum at an edge of the sizes")
    return faults + interval_faults(fit, ("a", "b"))


def approach3_faults(law: dict, points: list[dict]) -> list[str]:
    """Why approach 3 is not identified (docs/scaling.md); [] when it is."""
    need = POINTS_PER_PARAMETER * len(parametric.NAMES)
    faults = []
    if len(points) < need:
        faults.append(f"{len(points)} points for 5 parameters (needs {need})")
    faults += [f"{name} at its bound ({law[name]:.3g})" for name in parametric.at_bounds(law)]
    outside = []
    for budget, group in isoflop.by_budget(points).items():
        best = parametric.frontier(law, budget)
        sizes = sorted({p["N"] for p in group})
        if best and len(sizes) >= isoflop.MIN_SIZES and not sizes[0] <= best["N"] <= sizes[-1]:
            outside.append({"C": budget})
    faults += budgets_where(outside, "the frontier's N_opt outside the sizes tried")
    return faults + interval_faults(law, ("alpha", "beta", "a"))


def holdout(points: list[dict]) -> dict | None:
    """Both approaches refitted without the largest budget, against its best job's loss and its
    own N_opt; None with fewer than MIN_BUDGETS + 1 budgets."""
    groups = isoflop.by_budget(points)
    if len(groups) <= isoflop.MIN_BUDGETS:
        return None
    largest = max(groups)
    rest = [p for p in points if p["budget"] != largest]
    best = min(groups[largest], key=lambda p: p["L"])
    law = parametric.fit_law(rest)
    if law is None:
        return None
    predicted = parametric.law_loss(law, best["N"], best["D"])
    result = {"budget": largest, "job": best["job"], "N": best["N"], "D": best["D"]}
    result.update(predicted=predicted, measured=best["L"])
    result["relative_error"] = (predicted - best["L"]) / best["L"]
    refit = isoflop.fit_approach2(rest)
    measured = isoflop.budget_optimum(largest, groups[largest])
    if refit is not None and measured is not None:
        guess, n_opt = isoflop.n_opt(refit, largest), measured["N_opt"]
        two = {"predicted_N_opt": guess, "measured_N_opt": n_opt}
        result["approach2"] = {**two, "relative_error": (guess - n_opt) / n_opt}
    return result


def fit_configuration(name: str, points: list[dict], metric: str) -> dict:
    """One configuration's judged fits (approach 3 on every point; past usable_points both always
    fit: 6 distinct points at least), held-out budget and repeated-data count, or TooFewPoints."""
    notes = usable_points(name, points, metric)
    fit = {"approach2": isoflop.approach2(points), "approach3": parametric.approach3(points)}
    for key, faults in (("approach2", approach2_faults), ("approach3", approach3_faults)):
        fit[key]["why_not"] = faults(fit[key], points)
        fit[key]["identified"] = not fit[key]["why_not"]
    for point in points:
        point["repeated"] = (point["epochs"] or 0) > REPEATED_EPOCHS
    fit.update(holdout=holdout(points), points=points, notes=notes)
    fit["repeated_data_points"] = sum(p["repeated"] for p in points)
    return fit


def frontier_gap(first: dict, other: dict) -> list[dict]:
    """Per budget both share: other's L_opt and its gap to first, with an interval from the two
    bootstraps' draws taken pairwise."""
    rows = []
    mine = {o["C"]: o for o in other["approach2"]["optima"]}
    for base in first["approach2"]["optima"]:
        budget = base["C"]
        if budget not in mine:
            continue
        draws = zip(other["approach2"]["_draws"], first["approach2"]["_draws"], strict=False)
        gaps = [at(o, budget) - at(f, budget) for o, f in draws]
        row = {"C": budget, "L_opt": mine[budget]["L_opt"]}
        row["L_opt_ci95"] = mine[budget].get("L_opt_ci95")
        row["gap"] = mine[budget]["L_opt"] - base["L_opt"]
        row["gap_ci95"] = None if other is first else percentile_interval(gaps)
        rows.append(row)
    return rows


def at(fit: dict, budget: float) -> float:
    """A fit's L_opt at one budget (nan where that draw found no optimum there)."""
    return next((o["L_opt"] for o in fit["optima"] if o["C"] == budget), math.nan)


def fit_sweep(rows: list[dict], knobs: list[str], metric: str, first: str | None = None) -> dict:
    """Every configuration's fit (or its TooFewPoints message under `errors`), compared with the
    first; TooFewPoints when none can be fitted. BLAS on one thread: its threads make L-BFGS-B on
    5 parameters many times slower on a busy machine (25x measured beside other work, 2 cores)."""
    import scipy.optimize  # noqa: F401 - loaded first: a limit reaches the libraries loaded
    from threadpoolctl import threadpool_limits

    fits, errors = {}, {}
    groups = {
        name: [p for p in (job_point(row, metric) for row in jobs) if p is not None]
        for name, jobs in configurations(rows, knobs, first).items()
    }
    isoflop.assign_budgets([p for points in groups.values() for p in points])  # shared budgets
    for name, points in groups.items():
        try:
            with threadpool_limits(limits=1, user_api="blas"):
                fits[name] = fit_configuration(name, points, metric)
        except TooFewPoints as e:
            errors[name] = str(e)
    if not fits:
        raise TooFewPoints(" ".join(errors.values()))
    result = {"metric": metric, "configurations": fits, "errors": errors}
    result["flops"] = spent_flops(rows)
    if len(fits) > 1:
        for fit in fits.values():
            fit["vs_first"] = frontier_gap(next(iter(fits.values())), fit)
    return result


def public(node):
    """A fit as scaling.json holds it: without the bootstrap draws (keys starting with _)."""
    if isinstance(node, dict):
        return {k: public(v) for k, v in node.items() if not str(k).startswith("_")}
    if isinstance(node, list):
        return [public(v) for v in node]
    return node


def as_json(result: dict) -> dict:
    """One configuration at the top level, several under `configurations.<name>`."""
    fits = public(result["configurations"])
    head = {"metric": result["metric"], "errors": result["errors"], "flops": result["flops"]}
    if len(fits) == 1 and not result["errors"]:
        [(name, fit)] = fits.items()
        return {**head, "configuration": name, **fit}
    return {**head, "first_configuration": next(iter(fits)), "configurations": fits}
