"""summary.png: a sweep's best val loss against the parameter count (where jobs differ in it) and
each swept knob, a colour per configuration."""

from gptlab.sweep.stats import group_configurations, number, sort_key
from gptlab.sweep.tables import Configuration

CATEGORIES = 10  # a knob of at most this many values is drawn by value, one position each
LEGEND = 20  # configurations named in the legend, at most (10 colours, then other markers)
NOT_DRAWN = ("seed", "branch_from")  # a branch's trunk is a long path: its step tells it apart


def summary_figure(
    rows: list[dict], knobs: list[str], configs: list[Configuration] | None, title: str
):
    """Best val loss against each panel's key: ok jobs, means ± 95% CI, a colour a configuration."""
    from matplotlib.figure import Figure

    ok = [r for r in rows if r["status"] == "ok"]
    groups = group_configurations(ok, knobs)
    means = {c.name: c for c in configs or [] if c.n_seeds}
    order = [*means, *(name for name in groups if name not in means)]  # best mean first
    panels = [k for k in knobs if k not in NOT_DRAWN]
    if len({r.get("num_params") for r in ok}) > 1 or not panels:
        panels.insert(0, "num_params")
    names = {panel: categories(panel, ok, list(means.values())) for panel in panels}
    widths = [max(4.0, 0.45 * len(names[panel])) for panel in panels]
    fig = Figure(figsize=(sum(widths) + 3, 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, width_ratios=widths)[0]
    drawn = [(label(groups[name][0], knobs), groups[name], means.get(name)) for name in order]
    for ax, panel in zip(axes, panels, strict=True):
        draw_panel(ax, panel, names[panel], drawn)
        if not names[panel]:
            numeric_axis(ax, [number(r.get(panel)) for r in ok], panel == "num_params")
    if 1 < len(order) <= LEGEND:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle(f"{title}: {len(ok)} ok jobs" + (", means ± 95% CI" if means else ""))
    return fig


def draw_panel(ax, panel: str, names: list[str], configurations: list[tuple]) -> None:
    """Each configuration's jobs and mean against `panel`: by position among `names`, else value."""
    position = {name: i for i, name in enumerate(names)}
    ax.ticklabel_format(useOffset=False)  # 6.8812, not 1e-5+6.881
    for i, (name, jobs, mean) in enumerate(configurations):
        color, marker = f"C{i % 10}", "osD^v"[i // 10 % 5]
        xs = [position.get(shown(r.get(panel)), r.get(panel)) for r in jobs]
        losses = [r["best_val_loss"] for r in jobs]
        faint = 0.4 if mean is not None else 1.0
        ax.scatter(xs, losses, s=12, color=color, marker=marker, alpha=faint, label=name)
        if mean is not None:
            x = position.get(shown(mean.value(panel)), mean.value(panel))
            stats = mean.stats["val_loss"]
            ax.errorbar(x, stats.mean, yerr=stats.ci95 or 0, fmt=marker, capsize=3, color=color)
    ax.set(xlabel=panel, ylabel="best val loss")
    if names:
        long = len(names) > 3 or max(map(len, names)) > 8
        ax.set_xticks(range(len(names)), names, rotation=90 if long else 0)


def categories(panel: str, ok: list[dict], means: list[Configuration]) -> list[str]:
    """A knob's values as categories: names in the order of the configurations' means (best
    first), up to CATEGORIES numbers by value; [] for the parameter count or more numbers."""
    values = [config.value(panel) for config in means] + [row.get(panel) for row in ok]
    numeric = all(number(value) is not None for value in values)
    if panel == "num_params":
        return []
    if numeric:
        if len(set(values)) > CATEGORIES:
            return []
        values = sorted(values, key=sort_key)
    return list(dict.fromkeys(map(shown, values)))


def label(job: dict, knobs: list[str]) -> str:
    """A configuration's name in the legend: heads=2 lr=0.003."""
    return " ".join(f"{k.split('.')[-1]}={shown(job.get(k))}" for k in knobs if k not in NOT_DRAWN)


def shown(value) -> str:
    """A category's label: 2e+10, not 20000000000.0."""
    return str(value) if number(value) is None else f"{number(value):g}"


def numeric_axis(ax, values: list[float | None], counts: bool) -> None:
    """A log scale over a decade or more (major labels only, so they never overlap), else a
    linear one with a few ticks; parameter counts as 254k, 1.2M."""
    from matplotlib.ticker import EngFormatter, MaxNLocator, NullFormatter

    known = [v for v in values if v]
    if known and min(known) > 0 and max(known) >= 10 * min(known):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_major_locator(MaxNLocator(4))
    if counts:
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
