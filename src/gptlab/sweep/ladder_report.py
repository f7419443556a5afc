"""A ladder's report (gptlab.sweep.ladder): summary.md's "Ladder" section, ladder.json and
ladder.png in the sweep directory, each loss a panel; and the scans of the rules beside it
(gptlab.sweep.ladder_scan)."""

import statistics
from pathlib import Path

from gptlab.run.place import PLACE
from gptlab.sweep import ladder, ladder_scan
from gptlab.sweep.stats import ci_half_width, number
from gptlab.sweep.tables import format_estimate, markdown_table

SHOWN = ("d_model", "num_heads", "batch_size", "lr", "max_steps")  # a rung's derived settings


def rung_rows(rows: list[dict], labels: dict[str, str]) -> list[list]:
    """summary.md's table: a line a rung, its settings (of its first job), C, epochs, each loss
    as mean ± 95% CI over its seeds."""
    table = []
    jobs = ladder.ladder_jobs(rows)
    for depth in sorted({ladder.rung_of(row) for row in jobs}):
        group = [row for row in jobs if ladder.rung_of(row) == depth]
        first = group[0]
        cells = [depth, len(group), *(first.get(key) for key in SHOWN)]
        cells += [f"{number(first.get('train_flops')) or 0:.3g}"]
        cells += [f"{max(number(r.get('epochs')) or 0 for r in group):.2f}"]
        for column in labels.values():
            values = [v for v in (number(r.get(column)) for r in group) if v is not None]
            mean = statistics.fmean(values) if values else None
            cells.append(format_estimate(mean, ci_half_width(values)))
        table.append(cells)
    return table


def fitted(rows: list[dict]) -> dict[str, dict]:
    """Each loss's fit of the rungs but the largest, its held-out prediction and its verdict."""
    jobs = ladder.ladder_jobs(rows)
    found = {}
    for label, column in ladder.losses(jobs).items():
        pts = ladder.points(jobs, column)
        if not pts:
            continue
        means = ladder.rung_means(pts)
        held = ladder.holdout(pts)
        found[label] = {
            "column": column,
            "points": pts,
            "rungs": means,
            "holdout": held,
            "verdict": ladder.verdict(label, held, means),
        }
    return found


def ladder_figure(found: dict[str, dict], title: str):
    """ladder.png: per loss, its jobs and rung means against C (log-log), the fit of the smaller
    rungs drawn on to the largest, the held-out rung's prediction marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    fig, axes = plt.subplots(1, len(found), figsize=(4.2 * len(found), 3.6), squeeze=False)
    for ax, (label, result) in zip(axes[0], found.items(), strict=True):
        pts, held = result["points"], result["holdout"]
        ax.scatter([p["C"] for p in pts], [p["L"] for p in pts], s=14, alpha=0.5, label="jobs")
        means = result["rungs"]
        ax.plot([m["C"] for m in means.values()], [m["L"] for m in means.values()], "o")
        for depth, m in means.items():
            ax.annotate(f"d{depth}", (m["C"], m["L"]), textcoords="offset points", xytext=(4, 4))
        if held is not None:
            cs = np.geomspace(min(p["C"] for p in pts), held["C"], 50)
            ax.plot(cs, [ladder.predict(held["fit"], c) for c in cs], "--", label="fit (held out)")
            ax.plot([held["C"]], [held["predicted"]], "x", ms=10, mew=2, label="prediction")
        ax.set(xscale="log", yscale="log", xlabel="training FLOPs C", ylabel=label, title=label)
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def as_json(found: dict[str, dict], scans: list[dict], head: str) -> dict:
    return {
        "verdict": head,
        "losses": {
            label: {key: result[key] for key in ("column", "rungs", "holdout", "verdict")}
            for label, result in found.items()
        },
        "scans": scans,
    }


def headline(found: dict[str, dict]) -> str:
    """One line: how many of the losses the rules predicted on the held-out rung."""
    held = [r for r in found.values() if r["holdout"] is not None]
    if not held:
        return "Ladder: too few rungs to hold the largest out (see summary.md)."
    holds = [r for r in held if ladder.within(r["holdout"])]
    depth = held[0]["holdout"]["depth"]
    return (
        f"Ladder: the rung {depth} held out, {len(holds)} of {len(held)} losses predicted within "
        f"their interval; see summary.md's Ladder section and ladder.png."
    )


def ladder_section(rows: list[dict], out: Path) -> tuple[str | None, list[str]]:
    """The headline's line and summary.md's Ladder section (ladder.json, ladder.png beside it):
    (None, []) for a sweep of no ladder and no scan of its rules."""
    scans = ladder_scan.scans(rows)
    if not ladder.is_ladder(rows) and not scans:
        return None, []
    lines = ["## Ladder (model.depth: docs/training.md, One knob)", ""]
    found = fitted(rows) if ladder.is_ladder(rows) else {}
    head = headline(found) if found else "Ladder: no rungs, only scans of the rules."
    if found:
        labels = {label: result["column"] for label, result in found.items()}
        columns = ["depth", "seeds", *SHOWN, "C (FLOPs)", "epochs", *labels]
        lines += [*markdown_table(columns, rung_rows(rows, labels)), ""]
        lines += [f"- {result['verdict']}" for result in found.values()]
        lines += [f"- Fit of the smaller rungs: {form_line(found)}", ""]
        figure = ladder_figure(found, out.name)
        PLACE.save_figure(figure, out / "ladder.png", dpi=80)
        lines += ["![ladder](ladder.png)", ""]
    lines += ladder_scan.scan_lines(scans)
    PLACE.write_json(out / "ladder.json", as_json(found, scans, head))
    return head, lines


def form_line(found: dict[str, dict]) -> str:
    parts = []
    for label, result in found.items():
        law = (result["holdout"] or {}).get("fit")
        if law:
            e = f", E {law['E']:.3f}" if law["E"] else ""
            parts.append(f"{label}: {law['form']}, alpha {law['alpha']:.3f}{e}")
    return "; ".join(parts) or "none (too few rungs)"
