"""The benchmark (scripts/benchmark/): its rows computed right from known measurements, each
verdict both ways, and a real --quick run writing every row with a finite number.

Benchmarks are not tests: no timing is checked here, only that the numbers exist and that each
row and verdict follows from the measurements it names."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.benchmark.cli import parse_args
from scripts.benchmark.generation import generation_rows
from scripts.benchmark.machine import cpu_info
from scripts.benchmark.reference import reference_rates
from scripts.benchmark.report import render
from scripts.benchmark.runs import best_of, rates, time_to_loss
from scripts.benchmark.stages import overhead
from scripts.benchmark.table import TARGETS, all_rows, precision_rows, row, target_verdict

REPO = Path(__file__).resolve().parents[1]
PRECISION_ROWS = {
    f"{setting}_{what}"
    for setting in ("experiment_reference", "default_run")
    for what in ("fp32_steps_per_s", "bf16_steps_per_s", "bf16_vs_fp32")
    + ("fp32_val_loss", "bf16_val_loss")
}
NUMBER_ROWS = {
    "reference_loop_steps_per_s",
    "gptlab_reference_steps_per_s",
    "speedup_vs_reference",
    "speedup_incl_validation",
    "bare_steps_per_s",
    "lightning_steps_per_s",
    "lightning_overhead_pct",
    "startup_s",
    "default_peak_rss_mb",
    "reference_val_loss",
    "reference_wall_s",
    "quiet_tokens_per_s",
    "busy_tokens_per_s",
    "busy_quiet_ratio",
    *PRECISION_ROWS,
    # row 7: --quick judges the book's tokenization in the default run
    "corpus_tokenize_vs_bare",
    "corpus_peak_rss_mb",
    "corpus_store_bytes_per_byte",
    "corpus_tokens_per_s_vs_book",
    # row 8: generation with and without the KV cache
    *{
        f"generation_{model}_batch{batch}_{what}"
        for model, batches in (("default", (1, 8)), ("d512x8", (1, 8)), ("d512x8_context64", (1,)))
        for batch in batches
        for what in ("cache_tokens_per_s", "no_cache_tokens_per_s")
    },
    "generation_cache_speedup",
}
INFO = {
    "cpu_model": "Test CPU",
    "cpu_bf16": "avx512_bf16",
    "cpu_has_amx": False,
    "cpu_has_avx512_bf16": True,
    "cpus_usable": 2,
    "threads": 2,
    "torch": "2.x",
    "device": "cpu",
}


# ----------------------------------------------------------------------- made-up measurements
def gptlab_run(steps_per_s: float, val_loss: float, steps: int = 100) -> dict:
    """What runs.rates makes of a metrics.json, at batch 4 x context 16 (64 tokens a step)."""
    metrics = {
        "steps": steps,
        "tokens_seen": 64 * steps,
        "tokens_per_step": 64,
        "tokens_per_sec": 64 * steps_per_s,
        "wall_seconds": 2 * steps / steps_per_s,  # validation takes as long as training
        "final_val_loss": val_loss,
        "best_val_loss": val_loss,
    }
    return {**rates(metrics), "peak_rss_mb": 700.0, "command_wall_seconds": 60.0}


def corpus_size(megabytes: float, bare_s: float, tokenize_s: float, rss: float) -> dict:
    """What corpus.corpus_size makes of its three processes."""
    warm = gptlab_run(8.0, 7.0, steps=50) | {"peak_rss_mb": rss}
    return {
        "megabytes": megabytes,
        "bare": {"seconds": bare_s},
        "cold": warm,
        "warm": warm,
        "tokenize_s": tokenize_s,
        "tokenize_mb_per_s": megabytes / tokenize_s,
        "tokenize_vs_bare": tokenize_s / bare_s,
        "store_bytes_per_text_byte": 0.34,
        "peak_rss_mb": rss,
    }


def measurements(speedup: float = 2.5, busy_ratio: float = 0.6, reached: float | None = 20.0):
    reference_loop = {"steps": 100, "train_steps_per_s": 10.0, "steps_per_s_incl_eval": 8.0}
    gptlab = gptlab_run(10.0 * speedup, 6.5)
    bare = {"train_steps_per_s": 10.0 * speedup * 1.05}
    quiet = gptlab_run(10.0, 4.5) | {"tokens_per_sec": 9000.0}
    busy = gptlab_run(5.0, 4.5) | {"tokens_per_sec": 9000.0 * busy_ratio}
    return {
        "reference_loop": reference_loop,
        "gptlab_reference": gptlab,
        "gptlab_reference_bf16": gptlab_run(5.0, 6.51),
        "overhead": overhead(bare, gptlab),
        "startup": {"seconds": 4.0},
        "default_run": gptlab_run(8.0, 4.4, steps=400),
        "default_run_bf16": {"error": "exit 1: gptlab-train ..."},
        "busy_machine": {
            "quiet": quiet,
            "busy": busy,
            "ratio": busy["tokens_per_sec"] / quiet["tokens_per_sec"],
            "competitor": {"cores": 0.9},
        },
        "time_to_reference_loss": {
            "reference_val_loss": 4.75,
            "source": "given",
            "reference_wall_s": 400.0,
            "reference_wall_source": "given",
            "default_seconds": reached,
        },
        "corpus": {
            "sizes": [corpus_size(100.3, 10.0, 30.0, 2000.0), corpus_size(400, 40, 44, 900)]
        },
        "generation": generation(),
    }


def generation(speedup: float = 20.0) -> dict:
    """What generation_stage makes of bare_generate.py's JSON, for the judged model only."""
    batch = {"batch": 1, "cache_tokens_per_s": 60.0 * speedup, "no_cache_tokens_per_s": 60.0}
    return {
        "d512x8": {
            "model": {"d_model": 512, "num_blocks": 8, "context_length": 512},
            "prompt": 32,
            "new_tokens": 256,
            "batches": [batch | {"speedup": speedup, "same_tokens": True}],
        }
    }


def by_id(rows: list[dict]) -> dict:
    return {r["id"]: r for r in rows}


def every_row(results: dict) -> list[dict]:
    """The rows as the benchmark's main makes them."""
    return all_rows(results, INFO) + generation_rows(results["generation"])


# ---------------------------------------------------------------------------- unit: the rows
@pytest.mark.parametrize(
    ("target_id", "passing", "failing"),
    [
        ("speedup_vs_reference", 2.0, 1.99),
        ("busy_quiet_ratio", 0.45, 0.44),
        ("lightning_overhead_pct", 10.0, 10.01),
        ("startup_s", 6.0, 6.5),
        ("default_peak_rss_mb", 999.0, 1001.0),
        ("time_to_reference_loss_fraction", 0.1, 0.11),
        ("generation_cache_speedup", 5.0, 4.99),
    ],
)
def test_each_verdict_goes_both_ways(target_id: str, passing: float, failing: float):
    assert target_verdict(target_id, passing) == "PASS"
    assert target_verdict(target_id, failing) == "FAIL"
    assert target_verdict(target_id, None) == "FAIL"  # no number is no pass
    assert target_verdict(target_id, math.nan) == "FAIL"


def test_the_reference_speedup_target_is_two():
    assert TARGETS["speedup_vs_reference"][:2] == (">=", 2.0)


def test_rows_follow_from_the_measurements():
    rows = by_id(every_row(measurements(speedup=2.5, busy_ratio=0.6)))
    assert rows["speedup_vs_reference"]["value"] == pytest.approx(2.5)
    assert rows["speedup_vs_reference"]["status"] == "PASS"
    assert rows["speedup_incl_validation"]["value"] == pytest.approx(12.5 / 8.0)
    assert rows["lightning_overhead_pct"]["value"] == pytest.approx(5.0)
    assert rows["busy_quiet_ratio"]["value"] == pytest.approx(0.6)
    assert rows["time_to_reference_loss_fraction"]["value"] == pytest.approx(20.0 / 400.0)
    assert rows["experiment_reference_bf16_vs_fp32"]["value"] == pytest.approx(5.0 / 25.0)
    assert rows["cpu_bf16"]["value"] == "avx512_bf16"
    assert all(rows[t]["status"] == "PASS" for t in TARGETS)


def test_corpus_rows_judge_the_largest_size():
    """The 100 MB size misses every target but is not judged; the 400 MB one is."""
    rows = by_id(all_rows(measurements(), INFO))
    assert rows["corpus_tokenize_vs_bare"]["value"] == pytest.approx(1.1)
    assert rows["corpus_peak_rss_mb"]["value"] == 900
    assert rows["corpus_100mb_tokenize_vs_bare"]["value"] == pytest.approx(3.0)
    assert "status" not in rows["corpus_100mb_tokenize_vs_bare"]  # informative
    assert rows["corpus_400mb_bare_s"]["value"] == 40
    assert rows["corpus_tokens_per_s_vs_book"]["value"] == pytest.approx(64 * 8.0 / (64 * 8.0))
    slow = measurements()
    slow["corpus"]["sizes"][-1] = corpus_size(400, 40, 53, 1600)
    rows = by_id(all_rows(slow, INFO))
    assert rows["corpus_tokenize_vs_bare"]["status"] == "FAIL"
    assert rows["corpus_peak_rss_mb"]["status"] == "FAIL"


def test_generation_rows_judge_the_larger_model_at_batch_1():
    rows = by_id(generation_rows(generation(speedup=4.0)))
    judged = rows["generation_cache_speedup"]
    assert judged["value"] == 4.0 and judged["status"] == "FAIL"
    assert rows["generation_d512x8_batch1_cache_tokens_per_s"]["value"] == 240.0
    assert rows["generation_d512x8_batch1_no_cache_tokens_per_s"]["value"] == 60.0
    assert "prompt 32, 256 new" in judged["detail"] and "same tokens" in judged["detail"]
    assert generation_rows(None) == []


def test_rows_fail_when_the_measurements_miss_their_targets():
    rows = by_id(all_rows(measurements(speedup=1.57, busy_ratio=0.3, reached=None), INFO))
    assert rows["speedup_vs_reference"]["status"] == "FAIL"
    assert rows["busy_quiet_ratio"]["status"] == "FAIL"
    # the default run never reached the reference's loss: no number, and no pass
    assert rows["time_to_reference_loss_fraction"]["value"] is None
    assert rows["time_to_reference_loss_fraction"]["status"] == "FAIL"


def test_a_failed_run_is_an_error_row_with_no_value():
    fp32 = gptlab_run(8.0, 4.4)
    rows = by_id(precision_rows("default run", fp32, {"error": "exit 1: boom"}))
    assert rows["default_run_fp32_steps_per_s"]["value"] == pytest.approx(8.0)
    for key in ("bf16_steps_per_s", "bf16_vs_fp32", "bf16_val_loss"):
        assert rows[f"default_run_{key}"]["value"] is None
        assert rows[f"default_run_{key}"]["status"] == "ERROR"
    text = render(list(rows.values()), INFO)
    assert "ERROR rows (their run failed):" in text and "exit 1: boom" in text
    assert text.splitlines()[0].startswith("gptlab benchmark: Test CPU (no AMX, AVX512-BF16)")


def test_an_error_overrides_a_verdict():
    assert row("startup_s", "start-up", 1.0, "s", "startup_s")["status"] == "PASS"
    assert row("startup_s", "start-up", None, "s", "startup_s", error="x")["status"] == "ERROR"


# ------------------------------------------------------------------- unit: reading what runs wrote
def test_rates_leave_validation_out():
    run = gptlab_run(12.5, 6.0)
    assert run["train_steps_per_s"] == pytest.approx(12.5)
    assert run["steps_per_s_incl_val"] == pytest.approx(6.25)


def test_reference_rates_from_the_loops_json():
    result = {
        "steps": 400,
        "train_seconds": 40.0,
        "eval_seconds": 10.0,
        "wall_seconds": 50.0,
        "final_val_estimate": 6.9,
        "vocab_size": 100_070,
        "settings": {"eval_interval": 20, "eval_iters": 20},
    }
    rates_ = reference_rates(result)
    assert rates_["train_steps_per_s"] == pytest.approx(10.0)
    assert rates_["steps_per_s_incl_eval"] == pytest.approx(8.0)
    assert rates_["eval"] == "every 20 steps, 20 batches each of train and val"
    assert reference_rates({**result, "eval_seconds": 0.0})["eval"] == "none"


def test_time_to_loss_is_the_first_point_at_or_below_it():
    curve = [
        {"step": 50, "seconds_since_command": 10.0, "val_loss": 5.0},
        {"step": 100, "seconds_since_command": 15.0, "val_loss": 4.75},
        {"step": 150, "seconds_since_command": 20.0, "val_loss": 4.5},
    ]
    assert time_to_loss(curve, 4.8) == 15.0
    assert time_to_loss(curve, 4.75) == 15.0
    assert time_to_loss(curve, 4.0) is None


def test_best_of_keeps_the_fastest_finished_run():
    runs = [{"train_steps_per_s": 9.0}, {"error": "exit 1"}, {"train_steps_per_s": 11.0}]
    best = best_of(runs)
    assert best["train_steps_per_s"] == 11.0
    assert best["all_steps_per_s"] == [9.0, 11.0] and best["failed_runs"] == 1
    assert best_of([{"error": "exit 1"}]) == {"error": "exit 1"}


def test_cpu_flags_from_cpuinfo():
    amd = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx512f avx512_bf16\n"
    info = cpu_info(amd + amd)  # one block per core: the first one counts
    assert info["cpu_model"] == "AMD EPYC"
    assert info["cpu_bf16_flags"] == {"amx_bf16": False, "amx_tile": False, "avx512_bf16": True}
    assert info["cpu_has_amx"] is False and info["cpu_bf16"] == "avx512_bf16"
    intel = cpu_info("model name : Xeon\nflags : amx_bf16 amx_tile avx512_bf16\n")
    assert intel["cpu_has_amx"] is True
    assert intel["cpu_bf16"] == "amx_bf16, amx_tile, avx512_bf16"
    unknown = cpu_info(None)
    assert unknown["cpu_has_amx"] is None and unknown["cpu_bf16"] == "unknown"


def test_quick_defaults(tmp_path: Path):
    args = parse_args(["--quick", "--workdir", str(tmp_path)])
    assert (args.steps, args.busy_steps, args.default_steps, args.startup_repeats) == (8, 20, 20, 1)
    assert args.reference_steps == args.steps  # the throughput run gives the reference's loss
    full = parse_args(["--workdir", str(tmp_path)])
    assert (full.steps, full.reference_steps, full.default_steps) == (400, 5000, None)


# ----------------------------------------------------------------------- a real --quick run
def test_quick_benchmark_writes_every_row(tmp_path: Path):
    out = tmp_path / "b.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "MALLOC_"))}
    command = [sys.executable, "-m", "scripts.benchmark", "--quick", "--threads", "1"]
    command += ["--workdir", str(tmp_path / "work"), "--out", str(out)]
    command += ["--steps", "2", "--default-steps", "2", "--busy-steps", "2"]  # rows, not speed
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-4000:]}"

    data = json.loads(out.read_text())
    rows = by_id(data["rows"])
    assert NUMBER_ROWS <= rows.keys()
    for row_id in NUMBER_ROWS:
        value = rows[row_id]["value"]  # the overhead may come out negative on a noisy machine
        assert isinstance(value, (int, float)) and math.isfinite(value), (row_id, value)
        assert value > 0 or row_id == "lightning_overhead_pct", (row_id, value)
    for target_id in TARGETS:  # each verdict is the one its value gives
        assert rows[target_id]["status"] == target_verdict(target_id, rows[target_id]["value"])
    assert rows["speedup_vs_reference"]["value"] == pytest.approx(
        rows["gptlab_reference_steps_per_s"]["value"] / rows["reference_loop_steps_per_s"]["value"]
    )

    # every side a process of its own: gptlab-train with overrides, the loops as scripts
    assert "trainer.precision=bf16-mixed" in data["default_run_bf16"]["command"]
    assert "experiment=reference" in data["gptlab_reference"]["command"]
    assert "num_threads" not in data["busy_machine"]["quiet"]["command"]
    assert data["corpus"]["sizes"][0]["cold"]["run_dir"] == data["default_run"]["run_dir"]
    assert data["busy_machine"]["competitor"]["cores"] > 0
    assert data["reference_loop"]["vocab_size"] == 100_070  # the full cl100k_base vocabulary
    # greedy decoding: the KV cache gives the same tokens as the whole window each step
    assert all(b["same_tokens"] for g in data["generation"].values() for b in g["batches"])
    if sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION"):
        assert data["overhead"]["bare"]["process_defaults"] == {"openmp": True, "malloc": True}
    machine = data["machine"]
    assert machine["threads"] == 1 and machine["cpu_model"] and machine["torch"]
    assert set(machine["cpu_bf16_flags"]) == {"amx_bf16", "amx_tile", "avx512_bf16"}

    # the table on stdout: a header naming the CPU, every row
    assert result.stdout.startswith(f"gptlab benchmark: {machine['cpu_model']}")
    for entry in data["rows"]:
        assert entry["name"] in result.stdout
    assert "ERROR" not in result.stdout
