"""The sweep summary's learning-rate transfer section: the best rate per size, its interval."""

import math

import pytest

from gptlab.sweep.transfer import best_rate, transfer_section

RATES = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def jobs(best: dict, seeds=(1, 2), parametrization="mup") -> list[dict]:
    """Val loss a parabola in log10 lr around each width's best rate; seeds shift it by ±0.01."""
    rows = []
    for width, optimum in best.items():
        for lr in RATES:
            for seed in seeds:
                loss = 4 + (math.log10(lr / optimum)) ** 2 + 0.01 * (-1) ** seed
                rows.append(
                    {
                        "status": "ok",
                        "best_val_loss": loss,
                        "optim.lr": lr,
                        "model.d_model": width,
                        "model.parametrization": parametrization,
                        "seed": seed,
                    }
                )
    return rows


def test_best_rate_is_the_parabolas_vertex_within_the_grid():
    assert best_rate(jobs({32: 5e-3})) == pytest.approx(5e-3)
    assert best_rate(jobs({32: 1e-4})) == pytest.approx(1e-3)  # beyond the grid: its edge
    assert best_rate(jobs({32: 5e-3})[:4]) is None  # two rates: no parabola


def test_transfer_section_gives_each_width_its_rate_and_how_far_it_moved(tmp_path):
    rows = jobs({32: 1e-2, 256: 2e-3}, parametrization="standard") + jobs({32: 1e-2, 256: 1e-2})
    knobs = ["seed", "model.parametrization", "model.d_model", "optim.lr"]
    lines = transfer_section(rows, knobs, tmp_path)
    text = "\n".join(lines)
    row = (
        "| model.parametrization=standard | 256 | 10 | 0.003 | 4.0310 | 0.002 [0.00192, 0.00208] |"
    )
    assert row in text  # the interval: the seeds' ±0.01 resampled at each rate
    assert "model.parametrization=standard: best lr 0.01 at model.d_model=32, 0.002 at" in text
    assert "model.parametrization=mup: best lr 0.01 at model.d_model=32, 0.01 at" in text
    assert "x0.20 (-2.32 octaves)" in text and "x1.00 (+0.00 octaves)" in text
    assert (tmp_path / "summary_transfer.png").stat().st_size > 5_000
    assert transfer_section(rows, ["seed", "model.d_model"], tmp_path) == []  # no lr swept


def test_one_seed_gives_no_interval(tmp_path):
    rows = jobs({32: 1e-2, 64: 5e-3}, seeds=(1,))
    text = "\n".join(transfer_section(rows, ["model.d_model", "optim.lr"], tmp_path))
    assert "| (every job) | 64 | 5 | 0.003 | 4.0392 | 0.005 |" in text


def test_an_optimum_at_the_grids_edge_is_marked_and_gives_no_ratio(tmp_path):
    """The wide model's optimum lies below the grid (1e-4): its best rate is the grid's lowest,
    marked, and no transfer ratio is reported from it; the narrow one's, inside, stands."""
    rows = jobs({32: 1e-2, 256: 1e-4})
    text = "\n".join(transfer_section(rows, ["seed", "model.d_model", "optim.lr"], tmp_path))
    [wide] = [line for line in text.splitlines() if line.startswith("| (every job) | 256 |")]
    assert wide.endswith("(at the edge: the optimum may lie beyond) |")
    assert "octaves" not in text and "x0." not in text
    [narrow] = [line for line in text.splitlines() if line.startswith("| (every job) | 32 |")]
    assert "edge" not in narrow
