"""The figures a person reads, drawn by real matplotlib from rows as a sweep's summary holds them:
tick labels that do not overlap, lines and points named by their settings, legends off the data,
an attention figure readable at its own size; and a smoke test's summary that says so."""

from __future__ import annotations

import itertools

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from gptlab.cli.inspect_figures import attention_figure
from gptlab.sweep.ablation import add_deltas, delta_figure
from gptlab.sweep.curves import curve_groups, curves_figure
from gptlab.sweep.plots import summary_figure
from gptlab.sweep.summary import headline, short_horizon
from gptlab.sweep.tables import CONFIG_METRICS, Configuration, Seeds

NAMES = ["baseline", "rope", "rmsnorm", "qk_norm", "relu2", "swiglu", "more_weight_decay", "all"]


def drawn(fig):
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def overlapping(labels, renderer) -> list[tuple[str, str]]:
    """Pairs of shown tick labels whose boxes overlap on the drawn figure."""
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_text()]
    return [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
        if box_a.overlaps(box_b)
    ]


def job(i: int, loss: float, **extra) -> dict:
    return {"job": str(i), "status": "ok", "best_val_loss": loss, **extra}


def configuration(name: str, val_losses: list[float] = (), **fields) -> Configuration:
    """A configuration of these val losses (its seeds'), none for the other metrics."""
    stats = {metric: Seeds.of([]) for metric in CONFIG_METRICS}
    stats["val_loss"] = Seeds.of(list(val_losses))
    return Configuration(name, {}, len(val_losses), 0, None, "", "", stats, **fields)


@pytest.mark.parametrize("counts", [[254_048, 266_752], [50_000, 400_000, 3_000_000], [10**6]])
def test_parameter_count_labels_never_overlap(counts):
    rows = [job(i, 5.0 - i / 10, num_params=n) for i, n in enumerate(counts)]
    fig = summary_figure(rows, [], None, "sweep")
    renderer = drawn(fig)
    [ax] = fig.axes
    labels = [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)]
    assert [t.get_text() for t in labels if t.get_text()], "no parameter count is labelled"
    assert overlapping(labels, renderer) == []


def test_a_knob_of_names_is_drawn_by_name_in_the_order_of_the_means():
    rows = [job(i, 5.0 + i / 10, num_params=254_048, ablation=name) for i, name in enumerate(NAMES)]
    configs = [configuration(f"ablation={row['ablation']}", [row["best_val_loss"]]) for row in rows]
    for config, row in zip(configs, rows, strict=True):
        config.knobs["ablation"] = row["ablation"]
    fig = summary_figure(rows, ["ablation", "seed"], configs, "ablation")
    renderer = drawn(fig)
    [panel] = fig.axes  # every job has 254,048 parameters: no panel against that
    assert [t.get_text() for t in panel.get_xticklabels()] == NAMES
    assert overlapping(panel.get_xticklabels(), renderer) == []


def test_numeric_knobs_of_few_values_are_categories_a_colour_a_configuration_no_offset():
    """num_heads 2 and 4 are two positions (no 2.5), each configuration its colour in a legend,
    and losses 6.88101 to 6.88106 read as such, not as an offset ("1e-5+6.881")."""
    grid = [(h, b) for h in (2, 4) for b in (1, 2)]
    rows = [
        job(
            i,
            6.88101 + i / 1e5,
            num_params=1000 * b,
            **{"model.num_heads": h, "model.num_blocks": b},
        )
        for i, (h, b) in enumerate(grid)
    ]
    knobs = ["model.num_heads", "model.num_blocks"]
    fig = summary_figure(rows, knobs, None, "sweep")
    renderer = drawn(fig)
    params, heads, blocks = fig.axes
    assert [t.get_text() for t in heads.get_xticklabels()] == ["2", "4"]
    assert [t.get_text() for t in blocks.get_xticklabels()] == ["1", "2"]
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        f"num_heads={h} num_blocks={b}" for h, b in grid
    ]
    colors = {tuple(c.get_facecolor()[0]) for c in heads.collections}
    assert len(colors) == 4
    for ax in fig.axes:
        assert (
            ax.yaxis.get_offset_text().get_text() == ""
            and ax.xaxis.get_offset_text().get_text() == ""
        )
        labels = [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)]
        assert overlapping(labels, renderer) == []
    assert "6.881020" in [t.get_text() for t in heads.get_yticklabels()]
    same = [{**row, "num_params": 1000} for row in rows]  # a panel against one value: none
    assert len(summary_figure(same, knobs, None, "sweep").axes) == 2


def test_twelve_configurations_each_have_their_own_colour_and_marker_in_the_legend():
    rows = [job(i, 5.0 + i / 100, num_params=1000, **{"optim.lr": i / 1000}) for i in range(12)]
    fig = summary_figure(rows, ["optim.lr"], None, "sweep")
    drawn(fig)
    [legend] = fig.legends
    assert len(legend.get_texts()) == 12
    looks = {
        (tuple(c.get_facecolor()[0]), len(c.get_paths()[0].vertices))
        for c in fig.axes[0].collections
    }
    assert len(looks) == 12


def test_the_best_configuration_s_verdicts_read_plainly(tmp_path):
    def configs(*verdicts):
        best = configuration("a=1", [3.9, 4.0, 4.1], vs_best="best")
        others = [configuration(f"a={i}", vs_best=v) for i, v in enumerate(verdicts, 2)]
        return [best, *others]

    rows = [job(0, 4.0, overrides="", num_params=1)]
    [line] = [
        line
        for line in headline(rows, configs("not distinguishable"), tmp_path)
        if "Best con" in line
    ]
    assert "Against it by Welch's t-test, the other configuration: not distinguishable." in line
    assert "Best configuration: a=1: val loss 4.0000 ± 0.2484 over 3 seeds." in line
    verdicts = ("not distinguishable", "worse", "not distinguishable")
    [line] = [line for line in headline(rows, configs(*verdicts), tmp_path) if "Best con" in line]
    assert "Against it by Welch's t-test, 2 not distinguishable, 1 worse." in line


def test_curves_are_named_by_their_settings():
    curve = [[10, 1.0, 5.0], [20, 2.0, 4.5]]
    rows = [
        job(
            i,
            4.5,
            overrides=f"debug=fast model.num_heads={h} model.num_blocks={b}",
            val_curve=curve,
        )
        | {"steps": 20, "tokens_seen": 20 * 256, "tokens_per_step": 256, "flops_per_token": 1000}
        for i, (h, b) in enumerate([(1, 1), (1, 2), (2, 1)])
    ]
    groups = curve_groups(rows, None)
    assert list(groups) == ["heads=1, blocks=1", "heads=1, blocks=2", "heads=2, blocks=1"]
    fig = curves_figure(groups, seeds=False, title="sweep")
    drawn(fig)
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == list(groups)  # once, not once an axis
    assert "mean over" not in fig.get_suptitle() and "one line a job" in fig.get_suptitle()


def test_the_deltas_legend_lies_outside_the_data():
    configs = [
        configuration(f"ablation={name}", [4.0 + i / 10 + d for d in (0, 0.01, 0.02)])
        for i, name in enumerate(NAMES)
    ]
    base = add_deltas(configs)
    fig = delta_figure(configs, base)
    renderer = drawn(fig)
    [ax] = fig.axes
    [legend] = fig.legends
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    assert [t.get_text() for t in ax.get_yticklabels()] == NAMES[::-1]


@pytest.mark.parametrize("length", [16, 64])
def test_the_attention_figure_is_readable_at_its_own_size(length):
    """Tokens at 8 points or more, on a figure no wider than a screen at its own 100 dpi."""
    tokens = [f"token{i}" for i in range(length)]
    scores = torch.randn(1, 4, length, length)
    fig = attention_figure({"softmax": scores.softmax(-1)}, tokens, "softmax", block=0)
    renderer = drawn(fig)
    width, height = fig.get_size_inches() * 100
    assert width <= 1600 and height <= 1600
    for ax in fig.axes[:4]:
        labels = ax.get_xticklabels()
        assert min(t.get_fontsize() for t in labels) >= 8
        assert overlapping(labels, renderer) == []
    assert ("first 40 of 64 tokens" in fig.get_suptitle()) == (length == 64)


def test_a_sweep_of_debug_or_warmup_long_runs_says_it_is_a_smoke_test(tmp_path):
    real = {"trainer": {"max_steps": 1200}, "optim": {"warmup_steps": 100}}
    short = {"trainer": {"max_steps": 150}, "optim": {"warmup_steps": 100}}
    assert short_horizon(real, ["model.num_heads=2"]) is None
    assert short_horizon(real, ["debug=fast", "model.num_heads=2"]) == "debug=fast"
    assert short_horizon(short, []) == "150 steps for a 100-step warmup"
    assert short_horizon(real, [], max_steps=150) == "150 steps for a 100-step warmup"  # a budget's
    assert short_horizon(short, [], max_steps=1200) is None
    for horizon, smoke in ((None, False), ("debug=fast", True)):
        rows = [job(i, 5.0, overrides="", num_params=1) for i in range(2)]
        horizons = {} if horizon is None else {"0": horizon}
        head = headline(rows, None, tmp_path, horizons)
        assert any("A smoke test, not a finding" in line for line in head) == smoke
