"""scripts/benchmark.py --quick runs and writes its table. Benchmarks are not tests: no timing is checked."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROW_IDS = {
    "reference_loop_steps_per_s", "gptlab_reference_steps_per_s", "speedup_vs_reference",
    "reference_loop_malloc_steps_per_s", "speedup_same_malloc",
    "bare_steps_per_s", "lightning_steps_per_s", "lightning_overhead_pct", "startup_s",
    "default_peak_rss_mb", "reference_val_loss", "reference_wall_s",
}
TARGET_IDS = {"speedup_vs_reference", "lightning_overhead_pct", "startup_s", "default_peak_rss_mb",
              "time_to_reference_loss_fraction"}


def test_quick_benchmark_writes_its_table(tmp_path: Path):
    out = tmp_path / "b.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), "--quick", "--threads", "1",
         "--workdir", str(tmp_path / "work"), "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
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
    assert data["machine"]["threads"] == 1 and data["machine"]["torch"]
    assert data["machine"]["cpu_model"] and data["machine"]["cpus_usable"] >= 1

    # the table on stdout: a header, every row with its status
    assert "measurement" in result.stdout and "status" in result.stdout
    for row in data["rows"]:
        assert row["name"] in result.stdout
    assert result.stdout.count("PASS") + result.stdout.count("FAIL") == len(TARGET_IDS)
