"""gptlab's process defaults (gptlab/process.py, applied when gptlab is imported) reach real
processes, and a user's own settings win.

OpenMP (GOMP_SPINCOUNT=1000, set before torch loads):

The runtime itself says what it read: OMP_DISPLAY_ENV=VERBOSE makes libgomp (torch's CPU
OpenMP) print its settings when torch loads it, the spin count among them: 1000 under gptlab's
default, 300000 under libgomp's own, 0 under OMP_WAIT_POLICY=PASSIVE, 30000000000 under ACTIVE.

glibc malloc (mallopt: a fixed 32 MiB mmap threshold, a 1 GiB trim threshold): the page faults of
full-vocabulary training steps say which thresholds glibc applies. With glibc's defaults each step
hands its 25.6 MB buffers back to the kernel and faults them in again; with gptlab's, the pages
stay in the process. No timing is checked here (docs/performance.md has the measurements).
"""

from __future__ import annotations

import json
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
    spin = SPIN.search(result.stderr)
    policy = POLICY.search(result.stderr)
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
    cmd = [sys.executable, "-c", "import gptlab, torch"]  # (spinning threads: keep it short)
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


# ---------------------------------------------------------------------------------------- malloc
# A full-vocabulary step (the reference setting's 100,070 rows, one block) in a fresh process that
# imports gptlab first, as every entry point does; prints which defaults it got and the minor
# page faults of each step.
STEPS = """
import json, resource, sys
import gptlab
import torch
import torch.nn.functional as F
from gptlab.model.gpt import GPT, GPTConfig
torch.set_num_threads(1)
torch.manual_seed(0)
config = GPTConfig(vocab_size=100_070, context_length=16, d_model=64, num_heads=4, num_blocks=1)
model = GPT(config)
optimizer = torch.optim.AdamW(model.parameters())
x, y = torch.randint(0, 100_070, (2, 4, 16))
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"defaults": gptlab.PROCESS_DEFAULTS, "faults": faults}))
"""
PAGES_PER_BUFFER = 6_250  # 25.6 MB in 4 KiB pages
GPTLAB_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc malloc only",
)


def malloc_env(**extra: str) -> dict:
    """This environment without malloc settings of its own."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    return {**env, **extra}


def python_json(code: str, env: dict, tmp_path: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def steady_faults(env: dict, tmp_path: Path) -> tuple[dict, int]:
    """The defaults the process got, and the page faults of its last six steps."""
    out = python_json(STEPS, env, tmp_path)
    return out["defaults"], sum(out["faults"][6:])


@glibc_only
def test_steps_keep_their_memory_under_gptlabs_malloc_default(tmp_path: Path):
    defaults, tuned = steady_faults(malloc_env(), tmp_path)
    assert defaults["malloc"] is True
    # the user's own thresholds (glibc's default 128 KiB, fixed): gptlab leaves malloc alone, and
    # each step faults its buffers in again
    defaults, user_small = steady_faults(malloc_env(MALLOC_MMAP_THRESHOLD_="131072"), tmp_path)
    assert defaults["malloc"] is False
    assert user_small > PAGES_PER_BUFFER
    assert tuned * 4 < user_small
    # the same values as environment variables: the same effect, gptlab calls nothing
    defaults, user_same = steady_faults(malloc_env(**GPTLAB_MALLOC), tmp_path)
    assert defaults["malloc"] is False
    assert user_same * 4 < user_small


@glibc_only
@pytest.mark.parametrize(
    ("user_env", "applied"),
    [
        ({}, True),
        ({"MALLOC_TRIM_THRESHOLD_": "131072"}, False),
        ({"MALLOC_ARENA_MAX": "2"}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, False),
        ({"GLIBC_TUNABLES": "glibc.cpu.x86_ibt=0"}, True),  # not malloc's: the default applies
        ({"OMP_NUM_THREADS": "1"}, True),  # OpenMP's own: malloc's default still applies
    ],
)
def test_only_the_users_malloc_settings_turn_the_default_off(
    tmp_path: Path, user_env: dict, applied: bool
):
    code = "import json, gptlab; print(json.dumps(gptlab.PROCESS_DEFAULTS))"
    assert python_json(code, malloc_env(**user_env), tmp_path)["malloc"] is applied


@glibc_only
def test_malloc_default_applies_after_torch_too(tmp_path: Path):
    """mallopt works at any time in a running process; only OpenMP's default comes too late."""
    code = "import json, torch, gptlab; print(json.dumps(gptlab.PROCESS_DEFAULTS))"
    assert python_json(code, malloc_env(), tmp_path) == {"openmp": False, "malloc": True}


# A real SIGINT, sent by the process to itself the moment it starts importing `module` (as a
# user's Ctrl-C would land), then the console script run as its own __main__.
CTRL_C_WHILE_IMPORTING = """
import os, runpy, signal, sys
module, tool = sys.argv[1:3]
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, CtrlC())
sys.argv = sys.argv[2:]
runpy.run_path(tool, run_name="__main__")
"""


@pytest.mark.parametrize(
    ("tool", "module"),
    [
        ("gptlab-train", "hydra"),  # the tool's own imports, before main
        ("gptlab-train", "torch"),  # its task's, once Hydra has composed
        ("gptlab-eval", "hydra"),
        ("gptlab-report", "gptlab.sweep.summary"),
    ],
)
def test_ctrl_c_while_a_tool_imports_is_one_line_and_130(tool: str, module: str, tmp_path: Path):
    args = {"gptlab-report": [str(tmp_path)], "gptlab-eval": ["ckpt_path=run"]}.get(
        tool, ["debug=fast", "hydra.run.dir=run"]
    )
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_IMPORTING, module, str(BIN / tool), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stderr.strip() == f"{tool}: stopped by Ctrl-C.", result.stderr[-3000:]
    assert not (tmp_path / "run").exists()
