"""A model ladder (experiment=ladder, docs/training.md "One knob"): the rungs of model.depth, each
trained with the settings its depth derives. Each loss (the val loss of each source; each
downstream task's bits per byte, where the jobs scored them) is fitted against the training
compute C on every rung but the largest, which is held out and predicted: the prediction's error,
with a 95% interval from resampling each rung's seeds, says whether the rules hold here."""

import math
import statistics

from gptlab.sweep import isoflop
from gptlab.sweep.downstream import PREFIX, task_names
from gptlab.sweep.mixture import mixture_names
from gptlab.sweep.scaling import REPEATED_EPOCHS
from gptlab.sweep.stats import bootstrap, ci_half_width, number, percentile_interval

SCANNED = ("optim.lr", "data.batch_size")  # a scan of the rules: one of these given (ladder_scan)
MIN_GRID = 3  # values a scan needs to bracket an optimum
MIN_FIT_RUNGS = 3  # a power law's two parameters and one rung to spare
SATURATING_RUNGS = 4  # from here the fit has an irreducible loss E as well (OLMo's ladder)


def rung_of(row: dict) -> int | None:
    """A finished job's depth (its metrics.json's), None for a job of no ladder."""
    depth = number(row.get("depth")) if row.get("status") == "ok" else None
    return None if depth is None else int(depth)


def is_ladder(rows: list[dict]) -> bool:
    """Jobs of two depths at least that are no scan's."""
    return len({rung_of(row) for row in ladder_jobs(rows)} - {None}) >= 2


def given_keys(row: dict) -> list[str]:
    rules = row.get("depth_rules")
    rules = rules if isinstance(rules, dict) else {}
    return [
        key
        for key, rule in rules.items()
        if isinstance(rule, dict) and rule.get("derived") is False
    ]


def scan_groups(rows: list[dict]) -> dict[tuple[int, str], list[dict]]:
    """The jobs of each scan, by (depth, key): at one depth, MIN_GRID values at least of one
    SCANNED key given alone (the depth deriving the rest)."""
    groups = {}
    for row in rows:
        depth, given = rung_of(row), given_keys(row)
        if depth is not None and len(given) == 1 and given[0] in SCANNED:
            groups.setdefault((depth, given[0]), []).append(row)
    values = {
        where: {number(row["depth_rules"][where[1]].get("value")) for row in jobs}
        for where, jobs in groups.items()
    }
    return {where: jobs for where, jobs in groups.items() if len(values[where]) >= MIN_GRID}


def ladder_jobs(rows: list[dict]) -> list[dict]:
    """The rungs' jobs: those with a depth that are no scan's (gptlab.sweep.ladder_scan)."""
    scanned = {id(row) for jobs in scan_groups(rows).values() for row in jobs}
    return [row for row in rows if rung_of(row) is not None and id(row) not in scanned]


def losses(rows: list[dict]) -> dict[str, str]:
    """What the ladder fits, by label: each source's val loss (the val loss of a single source),
    then each downstream task's bits per byte."""
    sources = [name for name in mixture_names(rows) if f"{name}_val_loss" in rows[0]]
    sources = [s for s in sources if s not in ("micro", "macro")]
    fitted = {f"{s} val loss": f"{s}_val_loss" for s in sources} or {"val loss": "best_val_loss"}
    for task in task_names(rows):
        fitted[f"{task} bpb"] = f"{PREFIX}{task}/bpb"
    return fitted


def epochs_of(row: dict, column: str) -> float | None:
    """The epochs behind a loss: its source's (`<source>_val_loss`: `<source>_epochs`), else the
    job's (the most of any source's, under a mixture)."""
    source = column.removesuffix("_val_loss")
    own = number(row.get(f"{source}_epochs")) if source != column else None
    return own if own is not None else number(row.get("epochs"))


def points(rows: list[dict], column: str) -> list[dict]:
    """(depth, C, L, epochs) of each rung's job with a value of `column`."""
    found = []
    for row in rows:
        c, value = number(row.get("train_flops")), number(row.get(column))
        if c and value is not None and c > 0 and value > 0:
            epochs = epochs_of(row, column)
            found.append({"depth": rung_of(row), "C": c, "L": value, "epochs": epochs})
    return found


def fit(pts: list[dict]) -> dict | None:
    """L(C) = A C^-alpha (+ E from SATURATING_RUNGS rungs on); None below MIN_FIT_RUNGS rungs."""
    rungs = {p["depth"] for p in pts}
    if len(rungs) < MIN_FIT_RUNGS:
        return None
    cs, ls = [p["C"] for p in pts], [p["L"] for p in pts]
    slope, coefficient = isoflop.power_law(cs, ls)
    law = {"form": "L = A C^-alpha", "A": coefficient, "alpha": -slope, "E": 0.0}
    if len(rungs) >= SATURATING_RUNGS:
        law = saturating(cs, ls, law)
    return law


def saturating(cs: list[float], ls: list[float], start: dict) -> dict:
    """L = E + A C^-alpha by least squares from the power law's start, E in [0, min L); the power
    law where that fit fails."""
    import numpy as np
    from scipy.optimize import curve_fit

    def model(c, e, log_a, alpha):
        return e + np.exp(log_a - alpha * np.log(c))

    p0 = [0.0, math.log(start["A"]), max(start["alpha"], 1e-3)]
    bounds = ([0.0, -50.0, 0.0], [min(ls) * (1 - 1e-6), 50.0, 3.0])
    try:
        (e, log_a, alpha), _ = curve_fit(model, np.array(cs), np.array(ls), p0=p0, bounds=bounds)
    except (RuntimeError, ValueError):
        return start
    return {"form": "L = E + A C^-alpha", "A": math.exp(log_a), "alpha": alpha, "E": e}


def predict(law: dict, c: float) -> float:
    return law["E"] + law["A"] * c ** -law["alpha"]


def rung_means(pts: list[dict]) -> dict[int, dict]:
    """Each rung's mean C, mean L, its seeds' values and its epochs."""
    by = {}
    for p in pts:
        by.setdefault(p["depth"], []).append(p)
    return {
        depth: {
            "C": statistics.fmean(p["C"] for p in group),
            "L": statistics.fmean(p["L"] for p in group),
            "seeds": [p["L"] for p in group],
            "epochs": max((p["epochs"] or 0.0) for p in group),
        }
        for depth, group in sorted(by.items())
    }


def holdout(pts: list[dict]) -> dict | None:
    """The largest rung held out: the fit of the others, its prediction there, the error against
    the rung's mean, and the error's 95% interval (error_interval); None where the others are
    too few to fit."""
    largest = max(p["depth"] for p in pts)
    rest = [p for p in pts if p["depth"] != largest]
    law = fit(rest)
    if law is None:
        return None
    held = rung_means(pts)[largest]
    predicted = predict(law, held["C"])

    def prediction(sample: list[dict]) -> float | None:
        refit = fit(sample)
        return None if refit is None else predict(refit, held["C"])

    draws = bootstrap(prediction, rest, [p["depth"] for p in rest])
    return {
        "depth": largest,
        "C": held["C"],
        "predicted": predicted,
        "measured": held["L"],
        "error": predicted - held["L"],
        "relative_error": (predicted - held["L"]) / held["L"],
        "error_ci95": error_interval(predicted - held["L"], draws, held["seeds"]),
        "fit": law,
    }


def error_interval(error: float, draws: list[float], seeds: list[float]) -> list[float] | None:
    """error ± the two halves in quadrature: the prediction's (the bootstrap of the smaller
    rungs, each rung's seeds resampled) and the measured mean's (Student's t over the held-out
    rung's seeds, honest for two seeds where a bootstrap is not); None with one seed."""
    interval, measured = percentile_interval(draws), ci_half_width(seeds)
    if interval is None or measured is None:
        return None
    half = math.hypot((interval[1] - interval[0]) / 2, measured)
    return [error - half, error + half]


def breaks(means: dict[int, dict]) -> list[str]:
    """Where the ladder itself breaks the rules' premise, in words: a rung no better than the one
    below it, a rung that repeated its data past REPEATED_EPOCHS."""
    found = []
    depths = list(means)
    for lower, upper in zip(depths, depths[1:], strict=False):
        if means[upper]["L"] >= means[lower]["L"]:
            found.append(
                f"rung {upper} is no better than rung {lower} ({means[upper]['L']:.4f} vs "
                f"{means[lower]['L']:.4f}): more compute did not lower the loss"
            )
    repeated = [d for d, m in means.items() if m["epochs"] > REPEATED_EPOCHS]
    if repeated:
        worst = max(means[d]["epochs"] for d in repeated)
        found.append(
            f"rung{'s' if len(repeated) > 1 else ''} {', '.join(map(str, repeated))} repeated "
            f"the data up to {worst:.1f} times (past {REPEATED_EPOCHS}, repeated tokens are "
            "worth clearly less): the budget outgrew the corpus"
        )
    return found


def within(held: dict) -> bool:
    """Whether the held-out rung's error is within its 95% interval of 0 (within 2% of the
    measured loss where there is no interval: one seed)."""
    interval = held["error_ci95"]
    if interval is None:
        return abs(held["relative_error"]) <= 0.02
    return interval[0] <= 0 <= interval[1]


def verdict(label: str, held: dict | None, means: dict[int, dict]) -> str:
    """The verdict in words: whether the held-out rung's loss was predicted, and why not."""
    if held is None:
        return (
            f"{label}: too few rungs to hold one out ({len(means)}; a prediction needs "
            f"{MIN_FIT_RUNGS + 1}: model.depth=1,2,3,4)."
        )
    interval = held["error_ci95"]
    said = (
        f"rung {held['depth']} predicted {held['predicted']:.4f}, measured "
        f"{held['measured']:.4f}: error {held['error']:+.4f} ({held['relative_error']:+.1%})"
    )
    if interval is None:
        said += ", no interval (one seed: within 2% counts as predicted)"
    else:
        said += f", 95% interval [{interval[0]:+.4f}, {interval[1]:+.4f}]"
    holds = within(held)
    reasons = breaks(means)
    if holds and not reasons:
        return f"{label}: the rules hold here: {said}."
    if holds:
        return f"{label}: the prediction holds ({said}), but {'; '.join(reasons)}."
    worse = "worse" if held["error"] < 0 else "better"
    why = "; ".join(reasons) or (
        f"rung {held['depth']} is {abs(held['error']):.4f} nats {worse} than the smaller rungs' "
        "law says"
    )
    return f"{label}: the rules break here: {said}; {why}."
