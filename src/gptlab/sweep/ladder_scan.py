"""The rules checked, not assumed (docs/training.md, One knob): on a rung, a scan of optim.lr or
data.batch_size given around the value the depth derives (every other setting derived, the batch's
learning rate too), read as: is the derived value within one grid step of the scan's best? A best
at the scan's edge is no optimum: the rule cannot be judged there."""

import math
import statistics

from gptlab.sweep import ladder
from gptlab.sweep.stats import number
from gptlab.sweep.tables import markdown_table


def losses_by_value(jobs: list[dict], key: str) -> tuple[float | None, dict[float, list]]:
    """A scan's rule value and its jobs' best val losses by the scanned value."""
    by, rule = {}, None
    for row in jobs:
        given = row["depth_rules"][key]
        value, loss = number(given.get("value")), number(row.get("best_val_loss"))
        rule = number(given.get("rule"))
        if value is not None and loss is not None:
            by.setdefault(value, []).append(loss)
    return rule, by


def judged(depth: int, key: str, rule: float | None, by: dict[float, list[float]]) -> dict:
    """One scan's reading: its grid, mean losses, best, grid step, and how many steps the
    derived value lies from the best."""
    grid = sorted(by)
    means = {value: statistics.fmean(by[value]) for value in grid}
    best = min(grid, key=means.get)
    ratios = [b / a for a, b in zip(grid, grid[1:], strict=False)]
    step = math.exp(statistics.median(math.log(r) for r in ratios))
    away = abs(math.log(rule / best)) / math.log(step) if rule else None
    edge = best in (grid[0], grid[-1])
    return {
        "depth": depth,
        "key": key,
        "grid": grid,
        "mean_loss": [means[v] for v in grid],
        "seeds": max(len(v) for v in by.values()),
        "best": best,
        "rule": rule,
        "step": step,
        "steps_away": away,
        "at_edge": edge,
        "holds": away is not None and away <= 1 + 1e-9 and not edge,
    }


def scans(rows: list[dict]) -> list[dict]:
    """Every scan's reading (ladder.scan_groups: MIN_GRID values at least), by depth then key."""
    found = []
    for (depth, key), jobs in sorted(ladder.scan_groups(rows).items()):
        rule, by = losses_by_value(jobs, key)
        if len(by) >= ladder.MIN_GRID:
            found.append(judged(depth, key, rule, by))
    return found


def reading(scan: dict) -> str:
    """A scan in words: the rule holds, fails by how much, or cannot be judged (edge)."""
    said = (
        f"depth {scan['depth']}, {scan['key']}: derived {scan['rule']:.4g}; the scan's best "
        f"{scan['best']:.4g} of {scan['grid'][0]:.4g} to {scan['grid'][-1]:.4g} (grid step "
        f"x{scan['step']:.2f}, {scan['seeds']} seed{'s' if scan['seeds'] > 1 else ''})"
    )
    if scan["at_edge"]:
        return f"{said}: the best is at the scan's edge, no optimum; the rule cannot be judged."
    factor = max(scan["rule"], scan["best"]) / min(scan["rule"], scan["best"])
    if scan["holds"]:
        return f"{said}: the derived value lies {scan['steps_away']:.2f} grid steps from it: holds."
    return (
        f"{said}: the derived value lies {scan['steps_away']:.2f} grid steps from it, a factor "
        f"{factor:.2f} {'above' if scan['rule'] > scan['best'] else 'below'} the best: the rule "
        "fails here."
    )


def scan_lines(found: list[dict]) -> list[str]:
    if not found:
        return []
    columns = ["depth", "key", "derived", "best", "grid", "mean val loss", "steps away", "holds"]
    cells = [
        [
            s["depth"],
            s["key"],
            f"{s['rule']:.4g}",
            f"{s['best']:.4g}",
            " ".join(f"{v:.4g}" for v in s["grid"]),
            " ".join(f"{v:.4f}" for v in s["mean_loss"]),
            "" if s["steps_away"] is None else f"{s['steps_away']:.2f}",
            "edge" if s["at_edge"] else ("yes" if s["holds"] else "no"),
        ]
        for s in found
    ]
    lines = ["### The rules checked: scans around the derived values", ""]
    return [*lines, *markdown_table(columns, cells), "", *(f"- {reading(s)}" for s in found), ""]
