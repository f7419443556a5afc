"""Statistics over a sweep's seeds, one small function each: the Student-t interval (honest for
few seeds), Welch's t-test and its verdict; the bootstrap of the scaling-law fits' intervals; a
downstream accuracy's interval over its items (Wilson's) and whether chance lies within it."""

import math
import statistics
from typing import Any

CONFIDENCE = 0.95  # of the intervals; Welch's test tells means apart at p < 1 - CONFIDENCE
DRAWS = 200  # bootstrap draws of each scaling fit
MIN_DRAWS = DRAWS // 2  # fitted draws an interval needs (the rest: degenerate resamples)


def number(value: Any) -> float | None:
    """`value` as a finite float, else None (a metrics file is data: text, nan, a bool)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and not isinstance(value, bool) else None


def sort_key(value: Any) -> tuple:
    """Numbers first, by value (2 before 10), then the rest by text."""
    return (number(value) is None, number(value) or 0.0, str(value))


def group_configurations(rows: list[dict], knobs: list[str]) -> dict[str, list[dict]]:
    """Jobs alike in every knob but `seed`, named "key=value ..." by the knobs they set ("(every
    job)" when only the seed is swept), in the order first seen."""
    group = [key for key in knobs if key != "seed"]
    members = {}
    for row in rows:
        name = " ".join(f"{k}={row[k]}" for k in group if row.get(k) is not None) or "(every job)"
        members.setdefault(name, []).append(row)
    return members


def job_values(jobs: list[dict], key: str) -> list[float]:
    values = [number(job.get(key)) for job in jobs if job["status"] == "ok"]
    return [value for value in values if value is not None]


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """The mean and the sample standard deviation (n - 1); None where there are too few values."""
    mean = statistics.fmean(values) if values else None
    std = statistics.stdev(values) if len(values) > 1 else None
    return mean, std


def ci_half_width(values: list[float], confidence: float = CONFIDENCE) -> float | None:
    """Half the width of the Student-t interval of the mean; None below two values."""
    from scipy import stats

    if len(values) < 2:
        return None
    return float(stats.sem(values) * stats.t.ppf(0.5 + confidence / 2, len(values) - 1))


def welch(a: list[float], b: list[float]) -> tuple:
    """Welch's t-test of mean(a) - mean(b): the difference, its interval's half-width and the
    two-sided p (None below two values a side); with no spread only equal means are alike."""
    from scipy import stats

    delta = statistics.fmean(a) - statistics.fmean(b) if a and b else None
    if len(a) < 2 or len(b) < 2:
        return delta, None, None
    if statistics.variance(a) + statistics.variance(b) == 0:
        alike = 1.0 if a[0] == b[0] else 0.0  # the p of equal means, else of different ones
        return delta, 0.0, alike
    test = stats.ttest_ind(a, b, equal_var=False)
    low, high = test.confidence_interval(CONFIDENCE)
    return delta, float(high - low) / 2, float(test.pvalue)


def verdict(delta: float, p: float | None, confidence: float = CONFIDENCE) -> str:
    """A difference in loss (< 0: better) by Welch's p: one the test cannot see is no evidence."""
    if p is None:
        return "untested (fewer than 2 seeds)"
    if p >= 1 - confidence:
        return "not distinguishable"
    return "better" if delta < 0 else "worse"


def wilson_interval(
    fraction: float, n: int, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Wilson's score interval of a proportion measured on `n` items (an accuracy over a task's
    items: honest near 0 and 1, where the normal one leaves [0, 1]); None without items."""
    from scipy import stats

    if n < 1:
        return None
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    centre = (fraction + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(fraction * (1 - fraction) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def at_chance(chance: float, seeds: list[float], n_items: int | None) -> bool:
    """Whether an accuracy (its values over seeds, measured on `n_items` items each) cannot be
    told from `chance`: chance lies within the Student-t interval of the seeds' mean (two seeds
    or more: how much training varies) or within Wilson's interval of that mean over the items
    (how much the items drawn vary: the seeds share them)."""
    mean, _ = mean_std(seeds)
    if mean is None:
        return False
    half = ci_half_width(seeds)
    if half is not None and abs(mean - chance) <= half:
        return True
    interval = wilson_interval(mean, n_items or 0)
    return interval is not None and interval[0] <= chance <= interval[1]


def bootstrap(statistic, items: list, strata: list | None = None) -> list:
    """`statistic` of DRAWS resamples of `items` drawn with replacement within each stratum (one
    key per item), reproducibly; draws where it is None (too few points) are left out."""
    import numpy as np

    rng = np.random.default_rng(0)
    members = {}
    for i, key in enumerate(strata or [0] * len(items)):
        members.setdefault(key, []).append(i)
    results = []
    for _ in range(DRAWS):
        picks = [i for group in members.values() for i in rng.choice(group, size=len(group))]
        result = statistic([items[i] for i in picks])
        if result is not None:
            results.append(result)
    return results


def percentile_interval(values: list[float], confidence: float = CONFIDENCE) -> list[float] | None:
    """The central `confidence` interval [lo, hi] of bootstrap values; None below MIN_DRAWS."""
    import numpy as np

    finite = [v for v in values if number(v) is not None]
    if len(finite) < MIN_DRAWS:
        return None
    tail = 50 * (1 - confidence)
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return [float(lo), float(hi)]
