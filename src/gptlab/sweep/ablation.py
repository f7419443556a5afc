"""An ablation against a baseline: each configuration's delta in loss with its Welch interval and
verdict, on val and test; summary.md leads with them (docs/ablation.md)."""

from pathlib import Path

from gptlab.run.place import PLACE
from gptlab.sweep.curves import add_time_to_loss, write_curves
from gptlab.sweep.stats import CONFIDENCE, verdict, welch
from gptlab.sweep.tables import DELTA_METRICS, Configuration, Delta, markdown_table

BASELINE = "ablation=baseline"  # the configuration the others are compared with


def add_deltas(configs: list[Configuration], baseline: str = BASELINE) -> Configuration | None:
    """Set each configuration's deltas against `baseline`; the baseline (None, and no deltas,
    when no configuration has that name)."""
    base = next((c for c in configs if c.name == baseline), None)
    if base is None:
        return None
    for config in configs:
        for metric in DELTA_METRICS.values():
            a, b = config.stats[metric].values, base.stats[metric].values
            if not a or not b:
                continue
            if config is base:
                config.deltas[metric] = Delta(0.0, None, None, "baseline")
            else:
                delta, half, p = welch(a, b)
                config.deltas[metric] = Delta(delta, half, p, verdict(delta, p))
    return base


def delta_figure(configs: list[Configuration], base: Configuration):
    """Each configuration's delta vs the baseline with its 95% interval, on val and on test."""
    from matplotlib.figure import Figure

    rows = [c for c in configs if "val_loss" in c.deltas]
    rows.sort(key=lambda c: c.deltas["val_loss"].mean, reverse=True)
    fig = Figure(figsize=(7, 0.35 * len(rows) + 1.7), layout="constrained")
    ax = fig.subplots()
    ys = range(len(rows))
    for offset, metric, label in ((-0.15, "val_loss", "val"), (0.15, "test_loss", "test")):
        points = [
            (y, c.deltas[metric]) for y, c in zip(ys, rows, strict=True) if metric in c.deltas
        ]
        if points:
            ax.errorbar(
                [delta.mean for _, delta in points],
                [y + offset for y, _ in points],
                xerr=[delta.ci95 or 0 for _, delta in points],
                fmt="o",
                capsize=3,
                label=f"{label} loss",
            )
    ax.axvline(0, color="grey", lw=1)
    ax.set_yticks(list(ys), [c.name.removeprefix("ablation=") for c in rows])
    ax.set_xlabel("loss minus the baseline's (nats; < 0 is better), mean ± 95% CI")
    handles, labels = ax.get_legend_handles_labels()
    if handles:  # no job finished: nothing to label; below the axes, never on a point
        fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8)
    fig.suptitle(f"Against {base.name} ({base.n_seeds} seeds each)", fontsize=10)
    return fig


def baseline_section(
    configs: list[Configuration], sweep_dir: Path, baseline: str = BASELINE
) -> list[str]:
    """summary.md's first section and summary_deltas.png; nothing without the baseline."""
    base = add_deltas(configs, baseline)
    if base is None:
        return []
    PLACE.save_figure(delta_figure(configs, base), sweep_dir / "summary_deltas.png", dpi=80)
    ordered = sorted(configs, key=lambda c: val_delta(c) or 0.0)
    columns = {
        "config": "config",
        "n_seeds": "seeds",
        "val_loss ± ci95": "best val loss",
        "delta ± ci95": "Δ val vs baseline",
        "verdict_vs_baseline": "val verdict",
        "test_loss ± ci95": "test loss",
        "test_delta ± ci95": "Δ test vs baseline",
        "test_verdict_vs_baseline": "test verdict",
        "time_to_val_loss": "s to target val loss",
    }
    rows = [[config.row().get(key) for key in columns] for config in ordered]
    return [
        f"## Against the baseline ({baseline})",
        "",
        f"Δ: mean loss minus the baseline's mean, ± the half-width of its {CONFIDENCE:.0%} Welch "
        "interval; verdict by Welch's t-test at that level (*not distinguishable*: no evidence "
        "of a difference with these seeds, not proof of none).",
        "",
        *markdown_table(list(columns.values()), rows, ".1f"),
        "",
        "![deltas against the baseline](summary_deltas.png)",
        "",
    ]


def val_delta(config: Configuration) -> float | None:
    """Its mean val loss minus the baseline's; None without one."""
    delta = config.deltas.get("val_loss")
    if delta is None:
        return None
    return delta.mean


def leading_sections(
    rows: list[dict],
    configs: list[Configuration] | None,
    sweep_dir: Path,
    target_val_loss: float | None = None,
    baseline: str = BASELINE,
) -> list[str]:
    """The lines that lead summary.md: the deltas against the baseline and the time to a val loss
    (their columns added to the rows and configurations)."""
    target = add_time_to_loss(rows, configs, target_val_loss)
    lines = []
    if configs:
        lines += baseline_section(configs, sweep_dir, baseline)
    if write_curves(rows, configs, sweep_dir / "summary_curves.png"):
        lines += [
            f"Time to val loss {target:.4f} (`time_to_val_loss`, seconds): "
            "the first validation at or below it.",
            "",
            "![val loss against wall time and training FLOPs](summary_curves.png)",
            "",
        ]
    return lines
