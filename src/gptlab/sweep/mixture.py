"""A sweep over data mixtures (docs/sweeps.md): each source's columns of summary.csv, read from its
jobs' metrics.json ("sources", "averages": values, epochs, share of the mix), the summary's line on
epochs, and mixture.png: each source's val loss against
its share of the mix, means ± 95% CI over seeds."""

from pathlib import Path

from gptlab.data.mixture import AVERAGES
from gptlab.run.place import PLACE
from gptlab.sweep.stats import ci_half_width, job_values, mean_std, number, sort_key
from gptlab.sweep.tables import format_estimate, markdown_table

# a source's (or average's) columns: column suffix, the key in its metrics.json entry
SOURCE_METRICS = {
    "val_loss": "best_val_loss",  # at the best val/loss: best.ckpt's
    "val_bpb": "best_val_bpb",
    "test_loss": "test_loss",
    "test_bpb": "test_bpb",
    "epochs": "epochs",  # of its train split, over the steps trained
    "share": "share",  # of the train tokens planned: its weight, over every stage
}
STATISTICS = ("val_loss", "val_bpb", "test_loss")  # a configuration's statistics over seeds


def source_cells(metrics: dict) -> dict:
    """A job's mixture columns from its metrics.json: <source>_val_loss, ..., <source>_share,
    micro_val_loss, macro_val_loss, ... ({} for a single source)."""
    cells = {}
    for table in ("sources", "averages"):
        entries = metrics.get(table)
        for name, values in (entries if isinstance(entries, dict) else {}).items():
            for column, key in SOURCE_METRICS.items():
                value = number(values.get(key)) if isinstance(values, dict) else None
                if value is not None:
                    cells[f"{name}_{column}"] = value
    return cells


def mixture_names(rows: list[dict]) -> list[str]:
    """The sources named in the jobs' metrics, in the order first seen, then the averages."""
    names = {}
    for row in rows:
        sources = row.get("sources")
        names.update(dict.fromkeys(sources if isinstance(sources, dict) else {}))
    return [*names, *AVERAGES] if names else []


def job_mixture_columns(rows: list[dict]) -> list[str]:
    """summary.csv's mixture columns, each where a job has it."""
    names = mixture_names(rows)
    columns = [f"{n}_{c}" for n in names for c in SOURCE_METRICS]
    return [c for c in columns if any(row.get(c) is not None for row in rows)]


def statistics_of(rows: list[dict]) -> list[str]:
    """The mixture columns a configuration has statistics of (over seeds): <name>_val_loss, ..."""
    names = mixture_names(rows)
    columns = [f"{n}_{c}" for n in names for c in STATISTICS]
    return [c for c in columns if any(row.get(c) is not None for row in rows)]


def shown_estimates(rows: list[dict]) -> list[str]:
    """summary.md's configuration cells of a mixture: each source's val loss ± ci95, both
    averages'."""
    return [
        f"{n}_val_loss ± ci95"
        for n in mixture_names(rows)
        if f"{n}_val_loss" in statistics_of(rows)
    ]


def epochs_note(rows: list[dict]) -> list[str]:
    """The headline's line on repetition in a mixture sweep: whether every ok job trained on
    less than one epoch of every source, and which jobs did not."""
    ok = [row for row in rows if row["status"] == "ok"]
    sources = [n for n in mixture_names(rows) if n not in AVERAGES]
    if not ok or not sources:
        return []
    most = {}  # job -> (epochs, source) of its most repeated source
    for row in ok:
        known = [(number(row.get(f"{s}_epochs")), s) for s in sources]
        known = [(e, s) for e, s in known if e is not None]
        if known:
            most[row["job"]] = max(known)
    if not most:
        return []
    over = {job: pair for job, pair in most.items() if pair[0] >= 1}
    highest, source = max(most.values())
    if not over:
        return [
            f"Under one epoch: each of the {len(most)} ok jobs trained on less than one epoch of "
            f"every source (the most: {highest:.2f} epochs of {source})."
        ]
    listed = ", ".join(
        f"{job} ({epochs:.2f} of {name})"
        for job, (epochs, name) in sorted(over.items(), key=lambda item: sort_key(item[0]))
    )
    return [
        f"Repeated data: {len(over)} of {len(most)} ok jobs trained on a source for one epoch or "
        f"more, so they measure a model that has seen its text before: job {listed}."
    ]


def mixture_figure(rows: list[dict], title: str):
    """Each source's best val loss against its share of the mix: its jobs faint, its mean ± 95%
    CI over seeds at each share; None where no job has both (not a mixture)."""
    from matplotlib.figure import Figure

    ok = [row for row in rows if row["status"] == "ok"]
    sources = [n for n in mixture_names(rows) if n not in AVERAGES]
    points = {
        source: [
            (row[f"{source}_share"], row[f"{source}_val_loss"])
            for row in ok
            if row.get(f"{source}_share") is not None and row.get(f"{source}_val_loss") is not None
        ]
        for source in sources
    }
    if not any(points.values()):
        return None
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    ax.ticklabel_format(useOffset=False)
    for i, (source, pairs) in enumerate(points.items()):
        color = f"C{i % 10}"
        ax.scatter(*zip(*pairs, strict=True), s=12, color=color, alpha=0.4)
        by_share = {}
        for share, loss in pairs:
            by_share.setdefault(round(share, 9), []).append(loss)
        xs = sorted(by_share)
        means = [mean_std(by_share[x])[0] for x in xs]
        errors = [ci_half_width(by_share[x]) or 0.0 for x in xs]
        ax.errorbar(xs, means, yerr=errors, fmt="o-", capsize=3, color=color, label=source)
    ax.set(xlabel="the source's share of the mix (its weight)", ylabel="best val loss (nats/token)")
    ax.legend(title="source", fontsize=8)
    fig.suptitle(f"{title}\neach source's val loss against its share, means ± 95% CI", fontsize=10)
    return fig


def share_table(rows: list[dict]) -> list[list]:
    """mixture.png's numbers: per source and share, its mean val loss, ± ci95, and its seeds."""
    ok = [row for row in rows if row["status"] == "ok"]
    table = []
    for source in [n for n in mixture_names(rows) if n not in AVERAGES]:
        groups = {}
        for row in ok:
            share = number(row.get(f"{source}_share"))
            if share is not None:
                groups.setdefault(round(share, 9), []).append(row)
        for share in sorted(groups):
            values = job_values(groups[share], f"{source}_val_loss")
            mean, _ = mean_std(values)
            if mean is not None:
                table.append([source, share, mean, ci_half_width(values), len(values)])
    return table


def mixture_section(rows: list[dict], out: Path) -> list[str]:
    """summary.md's section of a sweep over a mixture's weights, and mixture.png beside it."""
    figure = mixture_figure(rows, out.name)
    if figure is None:
        return []
    PLACE.save_figure(figure, out / "mixture.png", dpi=80)
    cells = [
        [source, f"{share:.3g}", format_estimate(mean, ci95), n]
        for source, share, mean, ci95, n in share_table(rows)
    ]
    header = ["source", "share of the mix", "best val loss ± ci95", "seeds"]
    return [
        "## Mixture",
        "",
        "Each source's best val loss (at the checkpoint of the best val/loss) against its share "
        "of the mix: the trade-off a mixture study starts from. ![mixture](mixture.png)",
        "",
        *markdown_table(header, cells),
        "",
    ]
