"""scripts/benchmark.py --quick runs and writes its table. Benchmarks are not tests: no timing is checked."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRECISION_ROWS = {
    f"{setting}_{what}"
    for setting in ("experiment_reference", "default_run")
    for what in (
        "fp32_steps_per_s",
        "bf16_steps_per_s",
        "bf16_vs_fp32",
        "fp32_val_loss",
        "bf16_val_loss",
    )
}
ROW_IDS = {
    "reference_loop_steps_per_s",
    "gptlab_reference_steps_per_s",
    "speedup_vs_reference",
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
}
TARGET_IDS = {
    "speedup_vs_reference",
    "lightning_overhead_pct",
    "startup_s",
    "default_peak_rss_mb",
    "time_to_reference_loss_fraction",
    "busy_quiet_ratio",
}


def test_quick_benchmark_writes_its_table(tmp_path: Path):
    out = tmp_path / "b.json"
    # no OpenMP settings of the user's: the gptlab-train children apply gptlab's own defaults
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["PYTHONUNBUFFERED"] = "1"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "benchmark.py"),
            "--quick",
            "--threads",
            "1",
            "--workdir",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-4000:]}"

    data = json.loads(out.read_text())
    rows = {r["id"]: r for r in data["rows"]}
    assert ROW_IDS <= rows.keys()
    for row_id in ROW_IDS:
        value = rows[row_id]["value"]  # the overhead may come out negative on a noisy machine
        assert isinstance(value, (int, float)) and math.isfinite(value), (row_id, value)
        assert value > 0 or row_id == "lightning_overhead_pct", (row_id, value)
    for target_id in TARGET_IDS:
        assert rows[target_id]["status"] in ("PASS", "FAIL")
        assert rows[target_id]["target"]
    assert rows["busy_quiet_ratio"]["target"] == ">= 0.45"
    machine = data["machine"]
    assert machine["threads"] == 1 and machine["torch"]
    assert machine["cpu_model"] and machine["cpus_usable"] >= 1
    assert set(machine["cpu_bf16_flags"]) == {"amx_bf16", "amx_tile", "avx512_bf16"}
    assert machine["cpu_has_amx"] in (True, False, None)
    assert machine["cpu_has_avx512_bf16"] in (True, False, None)
    assert rows["cpu_bf16"]["value"] == machine["cpu_bf16"]
    assert machine["openmp_gptlab_defaults"] == {"GOMP_SPINCOUNT": "1000"}

    # measured from the outside: each side a real gptlab-train, bf16 through its own override
    assert "trainer.precision=bf16-mixed" in data["default_run_bf16"]["command"]
    assert "trainer.precision=bf16-mixed" in data["gptlab_reference_bf16"]["command"]
    busy = data["busy_machine"]
    assert "num_threads" not in busy["quiet"]["command"] and busy["competitor_cores"] > 0

    # the table on stdout: a header naming the CPU, every row with its status
    assert machine["cpu_model"] in result.stdout and "AMX" in result.stdout
    assert "measurement" in result.stdout and "status" in result.stdout
    for row in data["rows"]:
        assert row["name"] in result.stdout
    assert result.stdout.count("PASS") + result.stdout.count("FAIL") == len(TARGET_IDS)
    assert "ERROR" not in result.stdout
