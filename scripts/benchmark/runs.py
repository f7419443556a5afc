"""`gptlab-train` as a process, and what its run directory says: metrics.json, TensorBoard."""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .processes import run_child

BIN = Path(sys.executable).parent


@dataclass
class Setup:
    """What every gptlab-train child of one benchmark shares."""

    workdir: Path  # the children's working directory: data/ (token caches), runs/, logs/
    device: str = "cpu"  # cpu | cuda
    threads: int = 1  # num_threads of each child, except those run as shipped


def train_command(setup: Setup, overrides: list[str], threads: bool = True) -> list[str]:
    """`gptlab-train overrides...` (threads=False: torch's own thread count, as shipped)."""
    accelerator = "cpu" if setup.device == "cpu" else "gpu"
    head = [str(BIN / "gptlab-train"), f"trainer.accelerator={accelerator}"]
    if threads:
        head.append(f"num_threads={setup.threads}")
    return [*head, *overrides]


def rates(metrics: dict) -> dict:
    """Steps/s from a metrics.json: training steps only (its tokens_per_sec leaves validation
    out), and with validation (steps over the fit's wall time)."""
    steps = metrics["steps"]
    tokens_per_step = metrics["tokens_per_step"] if steps else math.nan
    wall = metrics["wall_seconds"]
    return {
        "steps": steps,
        "tokens_per_sec": metrics["tokens_per_sec"],
        "train_steps_per_s": metrics["tokens_per_sec"] / tokens_per_step,
        "steps_per_s_incl_val": steps / wall if wall else math.nan,
        "fit_wall_seconds": wall,
        "final_val_loss": metrics["final_val_loss"],
        "best_val_loss": metrics["best_val_loss"],
    }


def train_run(
    setup: Setup, name: str, overrides: list[str], threads: bool = True, timeout: float = 7200
) -> dict:
    """One `gptlab-train` process in a fresh run directory: its rates, peak RSS and times."""
    run_dir = setup.workdir / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [*overrides, f"hydra.run.dir={run_dir}"]
    command = train_command(setup, overrides, threads)
    child = run_child(command, setup.workdir, name, timeout)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {
        "command": "gptlab-train " + " ".join(command[1:]),
        "run_dir": str(run_dir),
        "start": child["start"],
        "command_wall_seconds": child["wall_s"],
        "peak_rss_mb": child["peak_rss_mb"],
        **rates(metrics),
    }


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float, float]]:
    """(step, wall time, value) of one scalar in the run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gptlab.run.directory import tensorboard_run

    events = EventAccumulator(str(tensorboard_run(run_dir)), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags().get("scalars", []):
        return []
    return [(e.step, e.wall_time, e.value) for e in events.Scalars(tag)]


def val_curve(run: dict) -> list[dict]:
    """The run's val/loss records, in seconds since its command started."""
    records = tensorboard_scalars(Path(run["run_dir"]), "val/loss")
    return [
        {"step": step, "seconds_since_command": round(wall - run["start"], 3), "val_loss": loss}
        for step, wall, loss in records
    ]


def time_to_loss(curve: list[dict], target: float) -> float | None:
    """Seconds until the first val loss at or below `target`; None when never reached."""
    for point in curve:
        if point["val_loss"] <= target:
            return point["seconds_since_command"]
    return None


def best_of(runs: list[dict]) -> dict:
    """The fastest of the runs that finished (the last failure when none did)."""
    done = [r for r in runs if "error" not in r]
    if not done:
        return runs[-1]
    best = max(done, key=lambda r: r["train_steps_per_s"])
    return {
        **best,
        "all_steps_per_s": [round(r["train_steps_per_s"], 3) for r in done],
        "failed_runs": len(runs) - len(done),
    }
