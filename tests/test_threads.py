"""gptlab's OpenMP default (GOMP_SPINCOUNT=1000, set in gptlab/__init__.py before torch loads)
reaches the OpenMP runtime of real gptlab-train processes, and a user's own settings win.

The runtime itself says what it read: OMP_DISPLAY_ENV=VERBOSE makes libgomp (torch's CPU
OpenMP) print its settings when torch loads it, the spin count among them: 1000 under gptlab's
default, 300000 under libgomp's own, 0 under OMP_WAIT_POLICY=PASSIVE, 30000000000 under ACTIVE.
No timing is checked here (docs/performance.md has the measurements on a busy machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SPIN = re.compile(r"GOMP_SPINCOUNT = '(\d+)'")
POLICY = re.compile(r"OMP_WAIT_POLICY = '(\w+)'")


def clean_env(**extra: str) -> dict:
    """This environment without any OpenMP setting (pytest's own process may hold gptlab's),
    asking the runtime to print what it reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    return {**env, "PYTHONUNBUFFERED": "1", "OMP_DISPLAY_ENV": "VERBOSE", **extra}


def openmp_settings(cmd: list[str], cwd: Path, env: dict, timeout: float = 300) -> tuple[str, int]:
    """Run `cmd`; the wait policy and spin count its OpenMP runtime printed when it loaded."""
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    )
    spin, policy = SPIN.search(result.stderr), POLICY.search(result.stderr)
    if not (spin and policy):
        pytest.skip(
            "torch's OpenMP runtime is not libgomp (no GOMP_SPINCOUNT in its OMP_DISPLAY_ENV)"
        )
    return policy.group(1), int(spin.group(1))


def test_gptlab_train_runs_with_a_short_openmp_spin(tmp_path: Path):
    """A real training run of the console script, with its own thread count, gets the default."""
    run_dir = tmp_path / "run"
    cmd = [
        str(BIN / "gptlab-train"),
        "debug=fast",
        "trainer.max_steps=2",
        "trainer.accelerator=cpu",
        "num_threads=1",
        "logger=none",
        "callbacks=none",
        f"hydra.run.dir={run_dir}",
    ]
    assert openmp_settings(cmd, tmp_path, clean_env()) == ("PASSIVE", 1000)  # libgomp's name for it
    assert (run_dir / "metrics.json").is_file()


def test_python_m_gptlab_train_gets_the_default_too(tmp_path: Path):
    cmd = [
        sys.executable,
        "-m",
        "gptlab.cli.train",
        "--cfg",
        "job",
    ]  # imports torch, trains nothing
    assert openmp_settings(cmd, tmp_path, clean_env()) == ("PASSIVE", 1000)


def test_users_own_wait_policy_wins(tmp_path: Path):
    cmd = [str(BIN / "gptlab-train"), "--cfg", "job"]
    assert openmp_settings(cmd, tmp_path, clean_env(OMP_WAIT_POLICY="ACTIVE")) == (
        "ACTIVE",
        30_000_000_000,
    )


@pytest.mark.parametrize(
    ("user_env", "expected"),
    [
        (
            {"OMP_NUM_THREADS": "1"},
            ("PASSIVE", 300_000),
        ),  # any OpenMP setting: libgomp's default policy
        ({"GOMP_SPINCOUNT": "50"}, ("PASSIVE", 50)),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, ("PASSIVE", 0)),
        ({"MKL_NUM_THREADS": "1"}, ("PASSIVE", 1000)),  # not OpenMP's: the default still applies
    ],
)
def test_only_the_users_openmp_settings_turn_the_default_off(
    tmp_path: Path, user_env: dict, expected: tuple[str, int]
):
    cmd = [sys.executable, "-c", "import gptlab, torch"]  # what gptlab-train does first, cheaper
    assert openmp_settings(cmd, tmp_path, clean_env(**user_env)) == expected


def test_torch_imported_first_is_left_alone(tmp_path: Path):
    """Too late for this process: gptlab then leaves the environment as it was."""
    code = "import torch, gptlab, os; print(os.environ.get('GOMP_SPINCOUNT'))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "None"
