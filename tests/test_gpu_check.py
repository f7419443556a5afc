"""scripts/gpu_check.sh: its CPU variant runs the whole sequence (about a minute, torch.compile's
cache warm), and a failed step makes the script fail. No timing is checked."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = ("default", "large", "ddp", "generate")


def gpu_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {
        **os.environ,
        "GPU_CHECK_DEVICE": "cpu",
        "GPU_CHECK_DIR": str(tmp_path / "check"),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def table(stdout: str) -> dict[str, list[str]]:
    """The summary table's rows by step name."""
    return {
        line.split()[0]: line.split()
        for line in stdout.splitlines()
        if line.split() and line.split()[0] in STEPS
    }


def test_cpu_variant_runs_every_step_and_prints_the_table(tmp_path: Path):
    result = gpu_check(tmp_path)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-4000:]}"
    rows = table(result.stdout)
    assert set(rows) == set(STEPS), result.stdout
    assert all(row[1] == "ok" for row in rows.values()), result.stdout
    check = tmp_path / "check"
    for name in ("default", "large", "ddp"):
        metrics = json.loads((check / name / "metrics.json").read_text())
        assert metrics["status"] == "ok" and metrics["tokens_per_sec"] > 0
        assert rows[name][3] != "n/a"  # tokens/s
        assert rows[name][4] == "n/a"  # MFU: no known peak on a CPU
    assert float(rows["generate"][2].replace(",", "")) > 0  # tokens/s from gptlab-generate's log
    assert (check / "summary.txt").read_text() in result.stdout + "\n"
    overrides = (check / "large" / ".hydra" / "overrides.yaml").read_text()
    assert "model.compile=true" in overrides and "trainer=gpu" in overrides


def test_a_failed_step_fails_the_script(tmp_path: Path):
    """A python whose gptlab-train always fails: every training step FAILED, generation has no
    checkpoint, the table still comes, and the exit code says so."""
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = gptlab.cli.train ] && exit 3; done\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = gpu_check(tmp_path, PYTHON=str(fake))
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr[-4000:]}"
    rows = table(result.stdout)
    assert set(rows) == set(STEPS), result.stdout
    assert all(row[1] == "FAILED" for row in rows.values()), result.stdout


def test_unknown_device_is_refused(tmp_path: Path):
    result = gpu_check(tmp_path, GPU_CHECK_DEVICE="tpu")
    assert result.returncode == 2 and "GPU_CHECK_DEVICE=tpu" in result.stderr
