"""The one way a sweep's reports show a value and write a table (gptlab.sweep.tables), and which
columns summary.csv and summary_configs.csv hold."""

from gptlab.sweep.tables import (
    Configuration,
    Delta,
    Seeds,
    cell,
    config_columns,
    format_estimate,
    job_columns,
    markdown_table,
)


def test_a_cell_shows_floats_by_their_spec_and_none_as_nothing():
    assert cell(None) == "" and cell(3) == "3" and cell("ok") == "ok"
    assert cell(4.123456) == "4.1235" and cell(5.0583e-05) == "5.0583e-05"
    assert cell(67.412, ".1f") == "67.4"


def test_a_value_with_its_half_width_or_its_interval():
    assert format_estimate(None, 0.1) == ""
    assert format_estimate(3.1, None) == "3.1000"
    assert format_estimate(3.1, 1.2706) == "3.1000 ± 1.2706"
    assert format_estimate(-0.2173, 0.0281, "+.4f") == "-0.2173 ± 0.0281"  # a width: no sign
    assert format_estimate(0.0, None, "+.4f") == "+0.0000"
    assert format_estimate(-0.082, [-0.188, 0.064], "+.3f") == "-0.082 [-0.188, +0.064]"
    assert format_estimate(0.7512, (0.41, 0.84), ".3g") == "0.751 [0.41, 0.84]"


def test_a_markdown_table_escapes_pipes_and_formats_its_cells():
    lines = markdown_table(["a", "b|c"], [[1.23456789, None], ["x|y", 2]])
    assert lines == ["| a | b\\|c |", "| --- | --- |", "| 1.2346 |  |", "| x\\|y | 2 |"]
    assert markdown_table(["s"], [[12.34]], ".1f")[2] == "| 12.3 |"


def test_a_metric_over_a_configurations_seeds():
    seeds = Seeds.of([3.0, 3.2])
    assert seeds.values == [3.0, 3.2] and seeds.mean == 3.1
    assert seeds.estimate() == "3.1000 ± 1.2706"
    assert Seeds.of([]).estimate() == "" and Seeds.of([4.0]).ci95 is None


def test_a_configurations_row_holds_its_columns_by_name():
    """The typed configuration as summary_configs.csv and the Markdown tables read it."""
    stats = {"val_loss": Seeds.of([3.0, 3.2]), "test_loss": Seeds.of([])}
    config = Configuration("model.x=1", {"model.x": 1}, 2, 1, 1000, "1 2", "0 1", stats)
    config.deltas["val_loss"] = Delta(-0.1, 0.05, 0.01, "better")
    row = config.row()
    assert row["config"] == "model.x=1" and row["model.x"] == 1 and row["n_failed"] == 1
    assert row["val_loss_mean"] == 3.1 and row["val_loss ± ci95"] == "3.1000 ± 1.2706"
    assert row["test_loss_mean"] is None and row["test_loss ± ci95"] == ""
    assert row["delta_vs_baseline_mean"] == -0.1 and row["verdict_vs_baseline"] == "better"
    assert row["delta ± ci95"] == "-0.1000 ± 0.0500" and "test_delta ± ci95" not in row
    assert config.value("num_params") == 1000 and config.value("model.x") == 1


def test_optional_columns_only_where_a_row_has_them():
    rows = [{"best_val_bpb": 1.2, "test_loss": None}, {"time_to_val_loss": 2.0}]
    columns = job_columns(rows, ["model.num_heads", "lr_warmup"])
    assert "best_val_bpb" in columns and "time_to_val_loss" in columns
    assert (
        "test_loss" not in columns and "lr_warmup" in columns and "model.num_heads" not in columns
    )
    configs = [{"test_loss_mean": 4.0, "verdict_vs_baseline": "better"}]
    columns = config_columns(["ablation", "seed"], configs)
    assert columns[:2] == ["config", "ablation"] and "seed" not in columns
    assert "test_loss_mean" in columns and "test_verdict_vs_baseline" not in columns
