"""experiment=mutransfer's verdict (docs/model.md): the widest model trained with the rate and
multipliers tuned at the narrowest width under μP, against the widest tuned directly on a rate
grid under the standard parametrisation; each side's val loss over its seeds with a 95% interval,
and the FLOPs its tuning spent (μP: the base trials; standard: its whole grid)."""

import statistics
from pathlib import Path

from gptlab import reader
from gptlab.sweep.stats import ci_half_width, job_values, number, verdict, welch
from gptlab.sweep.tables import format_estimate, markdown_table
from gptlab.sweep.transfer import EDGE


def flops(jobs: list[dict]) -> float:
    """What the jobs' training spent, pruned and failed ones included (metrics.json's)."""
    return sum(number(job.get("train_flops")) or 0.0 for job in jobs)


def loss(jobs: list[dict]) -> str:
    values = job_values(jobs, "best_val_loss")
    return format_estimate(statistics.fmean(values), ci_half_width(values)) if values else ""


def mutransfer_section(rows: list[dict], sweep_dir: Path) -> list[str]:
    """summary.md's lines where the sweep is an Optuna search with hydra.sweeper.after grids."""
    saved = reader.read_yaml(sweep_dir / "multirun.yaml")
    for key in ("hydra", "sweeper"):
        saved = saved.get(key) if isinstance(saved, dict) else {}
    if not isinstance(saved, dict) or not saved.get("after"):
        return []
    lines = ["## μTransfer against direct tuning", ""]
    widths = sorted({w for row in rows if (w := number(row.get("d_model"))) is not None})
    if len(widths) < 2:
        return [*lines, "No verdict: the sweep holds no wide model yet.", ""]
    base = [row for row in rows if number(row.get("d_model")) == widths[0]]
    wide = [row for row in rows if number(row.get("d_model")) == widths[-1]]
    mup = [row for row in wide if row.get("model.parametrization") == "mup"]
    by_lr = {}
    for row in wide:
        if row.get("model.parametrization") == "standard":
            by_lr.setdefault(number(row.get("lr")), []).append(row)
    means = {
        lr: statistics.fmean(v)
        for lr, jobs in by_lr.items()
        if (v := job_values(jobs, "best_val_loss"))
    }
    if not job_values(mup, "best_val_loss") or not means:
        return [*lines, "No verdict: the wide models of one side or both did not finish.", ""]
    best = min(means, key=means.get)
    edge = f" ({EDGE})" if best in (min(by_lr), max(by_lr)) else ""
    direct = by_lr[best]
    cost = (flops(base), sum(flops(jobs) for jobs in by_lr.values()))
    tuned = " ".join(f"{k}={v:.4g}" for k, v in tuned_values(mup).items())
    grid = ", ".join(f"{lr:g}" for lr in sorted(by_lr))
    table = [
        [
            "μTransfer (μP)",
            f"{len(base)} trials at d_model {widths[0]:g}: {tuned}",
            f"{cost[0]:.3g}",
            len(job_values(mup, "best_val_loss")),
            loss(mup),
        ],
        [
            "direct (standard)",
            f"optim.lr {grid} at d_model {widths[-1]:g}: best {best:g}{edge}",
            f"{cost[1]:.3g}",
            len(job_values(direct, "best_val_loss")),
            loss(direct),
        ],
    ]
    delta, half, p = welch(job_values(mup, "best_val_loss"), job_values(direct, "best_val_loss"))
    said = verdict(delta, p)
    share = cost[0] / cost[1] if cost[1] else float("inf")
    pays = (delta <= 0 or said == "not distinguishable") and share <= 0.25 and not edge
    header = [
        "side",
        "tuned by",
        "tuning FLOPs",
        "seeds",
        f"val loss at d_model {widths[-1]:g} [±95%]",
    ]
    return [
        *lines,
        *markdown_table(header, table),
        "",
        f"- Verdict: μTransfer {'pays' if pays else 'does not pay'}: its wide model's val loss is "
        f"{format_estimate(delta, half, '+.4f')} against the directly tuned one's (Welch: {said}), "
        f"for {share:.1%} of the standard side's tuning FLOPs (the bar: at most as good a loss, "
        "or one the test cannot tell apart, for at most 25%, with the standard optimum inside its"
        " grid).",
        "",
    ]


def tuned_values(jobs: list[dict]) -> dict[str, float]:
    """The transferred values: what the wide μP jobs were given besides width and seed."""
    keys = (
        "optim.lr",
        "model.mup_output",
        "model.mup_embedding",
        "model.mup_init",
        "model.mup_attention",
    )
    return {k.split(".")[-1]: number(jobs[0].get(k)) for k in keys if number(jobs[0].get(k))}
