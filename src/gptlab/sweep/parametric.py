"""Chinchilla's approach 3: L(N, D) = E + A/N^alpha + B/D^beta fitted as Besiroglu et al. 2024 do
(the Huber loss on log L, L-BFGS from a grid of starts), with bootstrap intervals, and the
compute-optimal frontier it implies for C = 6ND. The method: docs/scaling.md."""

import itertools
import math

import numpy as np

from gptlab.sweep.stats import bootstrap, percentile_interval

DELTA = 1e-3  # Huber's: residuals of log L beyond it count linearly (robust to outliers)
# Hoffmann et al. 2022's grid of starts (as Besiroglu et al. 2024)
COEFFICIENTS = np.arange(0.0, 25.1, 5.0)  # log A, log B
LOG_E = np.arange(-1.0, 1.01, 0.5)
EXPONENTS = np.arange(0.0, 2.01, 0.5)  # alpha, beta
STARTS = 32  # L-BFGS runs from the grid's best starts by their objective (the whole grid: 4,500)
CANDIDATES = 64  # a bootstrap draw's starts: the full fit's optimum and these best grid starts,
DRAW_STARTS = 2  # of which L-BFGS runs from the best two on the draw's own points
# L-BFGS-B's box (E from 5e-5 to 2e4 nats): it only stops a fit of too few points from running
# off towards E = 0 or exponents without end
BOUNDS = [(-20.0, 60.0), (-20.0, 60.0), (-10.0, 10.0), (0.0, 5.0), (0.0, 5.0)]
NAMES = ("E", "A", "alpha", "B", "beta")
THETA = ("A", "B", "E", "alpha", "beta")  # theta's order, and BOUNDS'
OPTIONS = {"maxiter": 1000, "ftol": 1e-12, "gtol": 1e-10}
LBFGS = {"jac": True, "method": "L-BFGS-B", "bounds": BOUNDS, "options": OPTIONS}  # minimize's


def start_grid() -> np.ndarray:
    """Every start of the grid, one row each: theta = [log A, log B, log E, alpha, beta]."""
    rows = itertools.product(COEFFICIENTS, COEFFICIENTS, LOG_E, EXPONENTS, EXPONENTS)
    return np.array(list(rows))


def predicted_log_loss(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """log L(N, D) for each row of theta and each point, [starts, n]: a log-sum-exp (stable)."""
    theta = np.atleast_2d(theta)
    terms = np.stack(
        [
            theta[:, [0]] - theta[:, [3]] * log_n,  # log(A / N^alpha)
            theta[:, [1]] - theta[:, [4]] * log_d,  # log(B / D^beta)
            np.broadcast_to(theta[:, [2]], (len(theta), len(log_n))),  # log E
        ]
    )  # [3, starts, n]
    return np.logaddexp.reduce(terms, axis=0)


def objective(theta: np.ndarray, log_n, log_d, log_loss) -> tuple[float, np.ndarray]:
    """The summed Huber loss of log L and its gradient in theta."""
    from scipy.special import huber

    log_a, log_b, log_e, alpha, beta = theta
    terms = np.array([log_a - alpha * log_n, log_b - beta * log_d, np.full_like(log_n, log_e)])
    top = terms.max(axis=0)
    scaled = np.exp(terms - top)  # [3, n]
    total = scaled.sum(axis=0)
    residual = top + np.log(total) - log_loss  # predicted minus measured log L
    # Huber's derivative times each term's share of L: d(log L)/d(log A, log B, log E)
    shares = scaled * (np.clip(residual, -DELTA, DELTA) / total)
    grad = np.empty(5)
    grad[:3] = shares.sum(axis=1)
    grad[3] = -(shares[0] * log_n).sum()  # not BLAS: its threads cost more than they save here
    grad[4] = -(shares[1] * log_d).sum()
    return float(huber(DELTA, residual).sum()), grad


def fit_law(
    points: list[dict], starts: np.ndarray | None = None, count: int = STARTS
) -> dict | None:
    """The law by L-BFGS from the `count` best `starts` (the grid's); None below 5 points."""
    from scipy.optimize import minimize

    if len({(p["N"], p["D"]) for p in points}) < len(NAMES):
        return None
    log_n, log_d, log_loss = logs(points)
    starts = start_grid() if starts is None else starts
    results = [
        minimize(objective, start, args=(log_n, log_d, log_loss), **LBFGS)
        for start in best_starts(starts, points, count)
    ]
    return law_of(min(results, key=lambda result: result.fun).x)


def logs(points: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.log([p[key] for p in points]) for key in ("N", "D", "L"))


def best_starts(starts: np.ndarray, points: list[dict], count: int) -> np.ndarray:
    from scipy.special import huber

    log_n, log_d, log_loss = logs(points)
    at_start = huber(DELTA, predicted_log_loss(starts, log_n, log_d) - log_loss).sum(axis=1)
    return starts[np.argsort(at_start, kind="stable")[:count]]


def law_of(theta: np.ndarray) -> dict:
    """E, A, alpha, B, beta and the allocation they imply, a = beta / (alpha + beta)."""
    log_a, log_b, log_e, alpha, beta = (float(v) for v in theta)
    law = {"E": math.exp(log_e), "A": math.exp(log_a), "alpha": alpha}
    law.update(B=math.exp(log_b), beta=beta)
    law["a"] = beta / (alpha + beta) if alpha + beta else None
    return law


def theta_of(law: dict) -> np.ndarray:
    return np.array(
        [math.log(law["A"]), math.log(law["B"]), math.log(law["E"]), law["alpha"], law["beta"]]
    )


def at_bounds(law: dict) -> list[str]:
    """The parameters L-BFGS-B left at an end of BOUNDS: the data did not pin them down."""
    ends = zip(THETA, theta_of(law), BOUNDS, strict=True)
    return [name for name, value, (lo, hi) in ends if min(value - lo, hi - value) < 1e-6]


def law_loss(law: dict, n: float, d: float) -> float:
    return law["E"] + law["A"] / n ** law["alpha"] + law["B"] / d ** law["beta"]


def frontier(law: dict, compute: float) -> dict | None:
    """The compute-optimal N, D and loss at `compute` FLOPs (C = 6ND); None for a law without a
    minimum (an exponent not positive)."""
    alpha, beta = law["alpha"], law["beta"]
    if alpha <= 0 or beta <= 0:
        return None
    scale = (alpha * law["A"] / (beta * law["B"])) ** (1 / (alpha + beta))
    n = scale * (compute / 6) ** (beta / (alpha + beta))
    d = compute / 6 / n
    return {"N": n, "D": d, "L": law_loss(law, n, d)}


def approach3(points: list[dict]) -> dict | None:
    """The law with bootstrap intervals of each parameter and of `a`; `_draws`: the draws' laws."""
    law = fit_law(points)
    if law is None:
        return None
    starts = np.vstack([theta_of(law), best_starts(start_grid(), points, CANDIDATES)])
    laws = bootstrap(lambda sample: fit_law(sample, starts, DRAW_STARTS), points)
    intervals = {}
    for key in (*NAMES, "a"):
        intervals[key] = percentile_interval([d[key] for d in laws if d[key] is not None])
    return {**law, "ci95": intervals, "draws_used": len(laws), "_draws": laws}
