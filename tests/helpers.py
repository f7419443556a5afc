"""Running gptlab's console scripts as a user would: a real process in a chosen directory, or,
for a command line that ends before any training, the same entry point in this process."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

BIN = Path(sys.executable).parent


def run_cli(
    *args: str, cwd: Path, tool: str = "gptlab-train", timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `tool args...` in `cwd`; one torch thread so parallel runs do not fight over 2 cores."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [str(BIN / tool), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_main(
    *args: str, cwd: Path, tool: str = "gptlab-train", env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the console script `tool`'s entry point in this process, as `run_cli` does in a new
    one: the same argv, directory, exit code, stdout and stderr, without the seconds a new
    interpreter takes to import torch and Lightning. For command lines that end before training
    (bad input)."""
    [script] = entry_points(group="console_scripts", name=tool)
    main = script.load()
    out = io.StringIO()
    err = io.StringIO()
    code = 0
    with process_state(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.environ.update(env or {})
        os.chdir(cwd)
        sys.argv = [tool, *args]
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess([tool, *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def process_state():
    """What a tool changes in its process, put back afterwards: the environment, argv, the
    working directory, the root logger (Hydra's job logging), warning filters, Hydra's global
    state and job config, torch's thread count and gptlab's task-started flag."""
    import torch
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from gptlab.cli import app

    saved_env = dict(os.environ)
    saved_argv = sys.argv
    saved_cwd = Path.cwd()
    root = logging.getLogger()
    saved_handlers = root.handlers[:]
    saved_level = root.level
    saved_hydra_config = HydraConfig.instance().cfg
    saved_threads = torch.get_num_threads()  # num_threads is set before a data file is checked
    GlobalHydra.instance().clear()
    app.task_started = False
    try:
        with warnings.catch_warnings():
            yield
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = saved_hydra_config  # --help and --cfg set it too
        app.task_started = False
        torch.set_num_threads(saved_threads)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for handler in set(root.handlers) - set(saved_handlers):
            handler.close()  # the run's train.log
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (
        f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    )
    return result


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under log_dir, as {tag: [(step, value)]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
