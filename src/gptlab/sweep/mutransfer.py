"""experiment=mutransfer's verdict (docs/model.md): the widest model trained with the values tuned
at the narrowest width under μP, against the widest tuned directly on a rate grid under standard;
each side's val loss over its seeds with a 95% interval, and the FLOPs its tuning spent (μP: the
base trials; standard: its whole grid, whose best rate's jobs are its wide models)."""

import statistics
from pathlib import Path

from gptlab import reader
from gptlab.sweep.stats import ci_half_width, job_values, number, verdict, welch
from gptlab.sweep.tables import format_estimate, markdown_table
from gptlab.sweep.transfer import EDGE


def side(name: str, how: str, tuning: list[dict], jobs: list[dict]) -> list:
    """A row: the side, how it was tuned, its tuning FLOPs, its seeds, mean val loss ± 95%."""
    spent = sum(number(job.get("train_flops")) or 0.0 for job in tuning)  # pruned, failed too
    losses = job_values(jobs, "best_val_loss")
    loss = format_estimate(statistics.fmean(losses), ci_half_width(losses)) if losses else ""
    return [name, how, f"{spent:.3g}", len(losses), loss, spent, losses]


def mutransfer_section(rows: list[dict], sweep_dir: Path) -> list[str]:
    """summary.md's lines where the sweep is an Optuna search with hydra.sweeper.after grids."""
    saved = reader.read_yaml(sweep_dir / "multirun.yaml")
    for key in ("hydra", "sweeper"):
        saved = saved.get(key) if isinstance(saved, dict) else {}
    if not isinstance(saved, dict) or not saved.get("after"):
        return []
    widths = sorted({number(row.get("d_model")) for row in rows} - {None})
    base = [row for row in rows if widths and number(row.get("d_model")) == widths[0]]
    wide = [row for row in rows if len(widths) > 1 and number(row.get("d_model")) == widths[-1]]
    mup = [row for row in wide if row.get("model.parametrization") == "mup"]
    standard = [row for row in wide if row.get("model.parametrization") == "standard"]
    by_lr = {}
    for row in standard:
        by_lr.setdefault(number(row.get("lr")), []).append(row)
    means = {}
    for lr, jobs in by_lr.items():
        losses = job_values(jobs, "best_val_loss")
        if losses:
            means[lr] = statistics.fmean(losses)
    lines = ["## μTransfer against direct tuning", ""]
    if not job_values(mup, "best_val_loss") or not means:
        return [*lines, "No verdict: a side's wide models did not finish.", ""]
    best = min(means, key=means.get)
    edge = f" ({EDGE})" if best in (min(by_lr), max(by_lr)) else ""
    tuned = " ".join(
        f"{k}={mup[0][k]:.3g}" for k in mup[0] if k.startswith(("optim.lr", "model.mup_"))
    )
    grid = ", ".join(f"{lr:g}" for lr in sorted(by_lr))
    table = [
        side("μTransfer (μP)", f"{len(base)} trials at d_model {widths[0]:g}: {tuned}", base, mup),
        side("direct (standard)", f"optim.lr {grid}: best {best:g}{edge}", standard, by_lr[best]),
    ]
    delta, half, p = welch(table[0][-1], table[1][-1])
    share = table[0][-2] / table[1][-2] if table[1][-2] else float("inf")
    faults = ((delta > 0, "a higher loss"), (share > 0.25, "over 25% of the FLOPs"))
    why = [fault for bad, fault in (*faults, (edge, "the standard optimum at its edge")) if bad]
    said = f"does not pay ({'; '.join(why)})" if why else "pays"
    header = [
        "side",
        "tuned by",
        "tuning FLOPs",
        "seeds",
        f"val loss ± 95%, d_model {widths[-1]:g}",
    ]
    return [
        *lines,
        *markdown_table(header, [row[:5] for row in table]),
        "",
        f"- Verdict: μTransfer {said}: its wide model's val loss is "
        f"{format_estimate(delta, half, '+.4f')} against the directly tuned one's (Welch: "
        f"{verdict(delta, p)}), for {share:.1%} of the standard side's tuning FLOPs (it pays at "
        "a loss at most the other's for at most 25%, the standard optimum inside its grid).",
        "",
    ]
