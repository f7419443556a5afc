"""The sweep statistics (gptlab.sweep.stats), each function against values computed here by hand:
closed forms of Student's t for 1 and 2 degrees of freedom, and Simpson's rule over its density
for the rest. scipy (which gptlab uses) only cross-checks."""

import math

import pytest
from scipy import stats as scipy_stats

from gptlab.sweep.stats import (
    ci_half_width,
    group_configurations,
    job_values,
    mean_std,
    sort_key,
    verdict,
    welch,
)


def welch_p(a: list[float], b: list[float]) -> float | None:
    return welch(a, b)[2]


def t_density(x: float, df: float) -> float:
    """Student's t density, from its formula."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm) * (1 + x * x / df) ** (-(df + 1) / 2)


def two_sided_p(t: float, df: float, steps: int = 20_000) -> float:
    """P(|T| >= |t|) = 1 - 2 * (integral of the density from 0 to |t|), by Simpson's rule."""
    h = abs(t) / steps
    inner = sum((4 if i % 2 else 2) * t_density(i * h, df) for i in range(1, steps))
    integral = h / 3 * (t_density(0.0, df) + inner + t_density(abs(t), df))
    return 1 - 2 * integral


def test_the_hand_made_t_distribution_agrees_with_scipy():
    """The reference the other tests use, checked once against an independent implementation."""
    for t, df in [(2.0, 1), (1.3, 2.5), (4.04, 4.96)]:
        assert two_sided_p(t, df) == pytest.approx(2 * scipy_stats.t.sf(t, df), rel=1e-7)


def test_mean_std_of_no_one_and_several_values():
    assert mean_std([]) == (None, None)
    assert mean_std([3.0]) == (3.0, None)
    mean, std = mean_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    # squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, over n - 1 = 3
    assert std == pytest.approx(math.sqrt(5 / 3), rel=1e-12)


def test_ci_half_width_needs_two_values():
    assert ci_half_width([]) is None
    assert ci_half_width([7.0]) is None


def test_ci_half_width_with_one_degree_of_freedom():
    """n = 2: t(0.975, 1) = tan(0.475 pi) (Cauchy), s = sqrt(2) for [4, 6], so the half-width is
    t * sqrt(2) / sqrt(2) = t."""
    assert ci_half_width([4.0, 6.0]) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-9)
    assert ci_half_width([4.0, 6.0]) == pytest.approx(12.7062047, rel=1e-7)  # the tables' value


def test_ci_half_width_with_two_degrees_of_freedom():
    """n = 3: t/sqrt(2 + t^2) = 0.95 gives t(0.975, 2) = sqrt(2 * 0.95^2 / (1 - 0.95^2));
    [1, 2, 4] has mean 7/3 and variance (16/9 + 1/9 + 25/9) / 2 = 7/3."""
    t = math.sqrt(2 * 0.95**2 / (1 - 0.95**2))
    assert t == pytest.approx(4.3026527, rel=1e-7)  # the tables' value
    expected = t * math.sqrt(7 / 3) / math.sqrt(3)
    assert ci_half_width([1.0, 2.0, 4.0]) == pytest.approx(expected, rel=1e-9)


def test_ci_half_width_at_another_confidence():
    """90 %, n = 2: t(0.95, 1) = tan(0.45 pi)."""
    assert ci_half_width([4.0, 6.0], confidence=0.9) == pytest.approx(
        math.tan(0.45 * math.pi), rel=1e-9
    )


def test_welch_p_needs_two_values_on_each_side():
    assert welch_p([1.0], [1.0, 2.0]) is None
    assert welch_p([1.0, 2.0], []) is None


def test_welch_p_with_two_degrees_of_freedom():
    """[0, 2] against [3, 5]: variances 2 and 2, se^2 = 2/2 + 2/2 = 2, t = -3/sqrt(2), Welch's
    df = 2^2 / (1^2/1 + 1^2/1) = 2; for df 2 the two-sided p is 1 - |t|/sqrt(2 + t^2)."""
    t = 3 / math.sqrt(2)
    expected = 1 - t / math.sqrt(2 + t * t)
    assert expected == pytest.approx(0.1679497, rel=1e-6)
    assert welch_p([0.0, 2.0], [3.0, 5.0]) == pytest.approx(expected, rel=1e-9)
    assert welch_p([3.0, 5.0], [0.0, 2.0]) == pytest.approx(expected, rel=1e-9)  # two-sided


def test_welch_p_with_one_side_without_spread():
    """[1, 1] against [2, 3]: se^2 = 0 + 0.5/2 = 0.25, t = -1.5/0.5 = -3, df = 0.25^2 / (0.25^2/1)
    = 1 (Cauchy): p = 1 - 2 atan(3) / pi."""
    expected = 1 - 2 * math.atan(3) / math.pi
    assert welch_p([1.0, 1.0], [2.0, 3.0]) == pytest.approx(expected, rel=1e-9)


def test_welch_p_with_unequal_variances_and_sizes():
    """[1, 2, 3, 4] against [5, 6, 7]: variances 5/3 and 1; se^2 = 5/12 + 1/3 = 3/4;
    t = -3.5 / sqrt(3/4); df = (3/4)^2 / ((5/12)^2/3 + (1/3)^2/2)."""
    se2 = 5 / 12 + 1 / 3
    t = 3.5 / math.sqrt(se2)
    df = se2**2 / ((5 / 12) ** 2 / 3 + (1 / 3) ** 2 / 2)
    assert df == pytest.approx(4.959, abs=1e-3)
    expected = two_sided_p(t, df)
    assert welch_p([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0]) == pytest.approx(expected, rel=1e-6)


def test_welch_p_without_any_spread_only_equal_means_are_alike():
    assert welch_p([2.0, 2.0], [2.0, 2.0, 2.0]) == 1.0
    assert welch_p([2.0, 2.0], [2.5, 2.5]) == 0.0


def test_verdict_of_a_difference_in_loss():
    """Against the best (tests/test_sweep.py: the best itself is "best") or a baseline."""
    assert verdict(0.1, None) == "untested (fewer than 2 seeds)"
    assert verdict(0.1, 1 - 0.95) == "not distinguishable"  # p >= 1 - confidence
    assert verdict(-0.1, 0.7) == "not distinguishable"
    assert verdict(0.1, 0.0499) == "worse" and verdict(-0.1, 0.0499) == "better"
    assert verdict(0.1, 0.08, confidence=0.9) == "worse"


def test_welch_matches_the_textbook_formula():
    """a = 1, 2, 3 and b = 4, 5, 6: variance 1 each, se = sqrt(2/3), Welch df = 4,
    t(0.975, 4) = 2.7764, t statistic -3 / se = -3.674, two-sided p = 0.0213."""
    delta, half, p = welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert delta == -3.0
    assert half == pytest.approx(2.7764 * math.sqrt(2 / 3), rel=1e-4)
    assert p == pytest.approx(0.0213, abs=5e-4)
    assert verdict(delta, p) == "better" and verdict(-delta, p) == "worse"
    assert verdict(0.01, 0.4) == "not distinguishable"
    assert welch([1.0, 1.0], [1.0, 1.0]) == (0.0, 0.0, 1.0)  # no spread, equal: alike
    assert welch([1.0, 1.0], [2.0, 2.0]) == (-1.0, 0.0, 0.0)  # no spread, different: told apart
    assert welch([1.0], [2.0, 3.0]) == (-1.5, None, None) and welch([], [1.0])[0] is None


def test_the_interval_excludes_zero_exactly_when_welch_tells_them_apart():
    base = [4.30, 4.32, 4.29]
    for shift in (0.0, 0.01, 0.02, 0.04, 0.08):
        delta, half, p = welch([v - shift for v in base[::-1]] + [4.31 - shift], base)
        assert (abs(delta) > half) == (p < 0.05)


def test_jobs_grouped_by_every_knob_but_the_seed_in_the_order_first_seen():
    rows = [
        {"job": "0", "model.x": 2, "lr": 0.1, "seed": 1},
        {"job": "1", "model.x": 1, "lr": 0.1, "seed": 1},
        {"job": "2", "model.x": 2, "lr": 0.1, "seed": 2},
        {"job": "3", "model.x": 1, "lr": 0.2, "seed": 2},
    ]
    groups = group_configurations(rows, ["model.x", "lr", "seed"])
    assert list(groups) == ["model.x=2 lr=0.1", "model.x=1 lr=0.1", "model.x=1 lr=0.2"]
    assert [[row["job"] for row in jobs] for jobs in groups.values()] == [["0", "2"], ["1"], ["3"]]


def test_a_sweep_of_seeds_alone_is_one_configuration():
    rows = [{"job": "0", "seed": 1}, {"job": "1", "seed": 2}]
    assert group_configurations(rows, ["seed"]) == {"(every job)": rows}


def test_job_values_are_the_finite_results_of_ok_jobs():
    jobs = [
        {"status": "ok", "best_val_loss": 4.5, "best_val_bpb": 1.25},
        {"status": "failed", "best_val_loss": 1.0, "best_val_bpb": 0.5},  # left out
        {"status": "ok", "best_val_loss": "5.5"},  # read from a csv; no bpb (an older run)
        {"status": "ok", "best_val_loss": float("nan"), "best_val_bpb": True},
    ]
    assert job_values(jobs, "best_val_loss") == [4.5, 5.5]
    assert job_values(jobs, "best_val_bpb") == [1.25]


def test_sort_key_puts_numbers_first_by_value_then_text():
    values = ["10", None, "b", 2, "a", 1.5]
    assert sorted(values, key=sort_key) == [1.5, 2, "10", None, "a", "b"]
