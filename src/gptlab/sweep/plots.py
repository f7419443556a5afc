"""summary.png: a sweep's best val loss against the parameter count and each swept knob."""

from gptlab.sweep.stats import number


def summary_figure(rows: list[dict], knobs: list[str], configs: list[dict] | None, title: str):
    """Best val loss against the parameter count and each swept knob: ok jobs, configurations'
    means with their 95% CIs. A knob of names (ablation=rope, ...) is drawn by name, in the order
    of the configurations' means."""
    from matplotlib.figure import Figure

    ok = [r for r in rows if r["status"] == "ok"]
    means = [c for c in configs or [] if c["n_seeds"]]
    panels = ["num_params", *[k for k in knobs if k != "seed"]]
    names = {panel: categories(panel, ok, means) for panel in panels}
    widths = [max(4.0, 0.45 * len(names[panel])) for panel in panels]
    fig = Figure(figsize=(sum(widths), 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, width_ratios=widths)[0]
    for ax, panel in zip(axes, panels, strict=True):
        xs = [item.get(panel) for item in ok + means]
        if names[panel]:  # by name: a position each, labelled
            position = {name: i for i, name in enumerate(names[panel])}
            xs = [position[str(x)] for x in xs]
            long = len(names[panel]) > 3 or max(map(len, names[panel])) > 8
            ax.set_xticks(range(len(names[panel])), names[panel], rotation=90 if long else 0)
        losses = [r["best_val_loss"] for r in ok]
        ax.scatter(xs[: len(ok)], losses, s=12, alpha=0.4 if means else 1.0)
        ax.errorbar(
            xs[len(ok) :],
            [c["val_loss_mean"] for c in means],
            yerr=[c["val_loss_ci95"] or 0 for c in means],
            fmt="o",
            capsize=3,
            color="C1",
        )
        ax.set(xlabel=panel, ylabel="best val loss")
        if panel == "num_params":
            parameter_axis(ax, [number(x) for x in xs])
    fig.suptitle(f"{title}: {len(ok)} ok jobs" + (", means ± 95% CI" if means else ""))
    return fig


def categories(panel: str, ok: list[dict], means: list[dict]) -> list[str]:
    """The values of a knob that is not a number, configurations' (best first) then the rest;
    [] for a numeric knob."""
    values = [item.get(panel) for item in means + ok]
    if all(number(value) is not None for value in values):
        return []
    return list(dict.fromkeys(str(value) for value in values))


def parameter_axis(ax, counts: list[float | None]) -> None:
    """Parameter counts as 254k, 1.2M: a log scale over a decade or more, else a linear one
    with a few ticks, so the labels never overlap."""
    from matplotlib.ticker import EngFormatter, MaxNLocator, NullFormatter

    known = [c for c in counts if c]
    if known and max(known) >= 10 * min(known):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
