"""The runs behind each row: which processes start, with which overrides, and what is read."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from .processes import ChildFailed, competitor, failed, run_child
from .reference import reference_run
from .runs import Setup, best_of, tensorboard_scalars, time_to_loss, train_run, val_curve
from .table import BF16

BARE_LOOP = Path(__file__).resolve().parent / "bare_loop.py"
QUICK_VALIDATION = ["trainer.limit_val_batches=10", "trainer.num_sanity_val_steps=0"]
ONE_STEP = [
    "trainer.max_steps=1",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "logger=none",
    "callbacks=none",
]


def attempt(fn, *args, **kwargs) -> dict:
    """A failed child is recorded as the row's error; the other rows are still measured."""
    try:
        return fn(*args, **kwargs)
    except ChildFailed as e:
        return failed(e)


def warm_caches(setup: Setup) -> None:
    """One step of experiment=reference and of the default run: the corpus is there and both
    token caches are built before anything is timed (a first tokenization is a one-off)."""
    train_run(setup, "warm-reference", ["experiment=reference", *ONE_STEP], timeout=1200)
    train_run(setup, "warm-default", ONE_STEP, timeout=1200)


def gptlab_reference(setup: Setup, steps: int, name: str, quick: bool, extra=()) -> dict:
    """`gptlab-train experiment=reference` for `steps` steps."""
    overrides = ["experiment=reference", f"trainer.max_steps={steps}", *extra]
    if quick:  # a quick run validates on a few batches only
        overrides += QUICK_VALIDATION
    return train_run(setup, name, overrides)


def bare_run(setup: Setup, run_dir: str, steps: int, name: str) -> dict:
    """bare_loop.py on the model of a finished gptlab-train run, in a process of its own."""
    out = setup.workdir / f"{name}.json"
    command = [sys.executable, str(BARE_LOOP), run_dir, "--steps", str(steps)]
    command += ["--threads", str(setup.threads), "--device", setup.device, "--out", str(out)]
    run_child(command, setup.workdir, name)
    return json.loads(out.read_text())


def overhead(bare: dict, lightning: dict) -> dict:
    """Lightning's cost in % of a step: how much faster the bare loop runs the same model."""
    bare_rate = bare["train_steps_per_s"]
    lightning_rate = lightning["train_steps_per_s"]
    return {
        "bare": bare,
        "lightning": lightning,
        "overhead_pct": 100.0 * (bare_rate / lightning_rate - 1.0),
    }


def speed_comparison(setup: Setup, corpus: Path, steps: int, repeats: int, options: dict) -> dict:
    """Rows 1-3: the reference loop, gptlab-train experiment=reference in fp32 and bf16-mixed,
    and the bare loop on the model of that run; the sides alternate, so a burst of load on a
    shared machine hits each of them alike, and the best of each is kept."""
    quick = options.get("quick", False)
    sides = {"reference_loop": [], "gptlab_reference": [], "gptlab_reference_bf16": [], "bare": []}
    for i in range(repeats):
        stage(f"1. reference loop and gptlab-train experiment=reference ({i + 1}/{repeats})")
        sides["reference_loop"].append(
            reference_run(setup, corpus, steps, f"reference-loop-{i}", options)
        )
        fp32 = gptlab_reference(setup, steps, f"gptlab-reference-{i}", quick)
        sides["gptlab_reference"].append(fp32)
        sides["gptlab_reference_bf16"].append(
            attempt(gptlab_reference, setup, steps, f"gptlab-reference-bf16-{i}", quick, (BF16,))
        )
        stage(f"3. bare loop on the same model ({i + 1}/{repeats})")
        sides["bare"].append(bare_run(setup, fp32["run_dir"], steps, f"bare-loop-{i}"))
    best = {name: best_of(runs) for name, runs in sides.items()}
    best["overhead"] = overhead(best.pop("bare"), best["gptlab_reference"])
    return best


def startup(setup: Setup, repeats: int) -> dict:
    """Spawn of `gptlab-train debug=fast` to the wall time of its first train/loss record: what
    the TensorBoard logger writes at the end of the first training step."""
    overrides = ["debug=fast", "trainer.max_steps=3", "trainer.log_every_n_steps=1"]
    overrides.append("logger=tensorboard")
    times = []
    for i in range(repeats):
        run = train_run(setup, f"startup-{i}", overrides, timeout=600)
        records = tensorboard_scalars(Path(run["run_dir"]), "train/loss")
        if not records:
            raise ChildFailed(f"startup-{i}: no train/loss record in {run['run_dir']}")
        times.append(min(wall for _, wall, _ in records) - run["start"])
    return {
        "command": "gptlab-train " + " ".join(overrides),
        "seconds": statistics.median(times),
        "all_seconds": [round(t, 3) for t in times],
    }


def default_run(setup: Setup, steps: int | None, name: str, extra=()) -> dict:
    """The default run (its config's steps unless `steps`), with its val/loss curve."""
    overrides = []
    if steps:
        overrides = [f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps // 2 or 1}"]
    run = train_run(setup, name, [*overrides, *extra])
    run["val_curve"] = val_curve(run)
    return run


def busy_machine(setup: Setup, steps: int) -> dict:
    """The default run as shipped (torch's own thread count, gptlab's process defaults) quiet,
    then the same while one CPU-bound process competes for the cores."""
    overrides = [
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        "trainer.num_sanity_val_steps=0",
        "trainer.limit_val_batches=2",
    ]  # validation: not timed
    quiet = train_run(setup, "quiet", overrides, threads=False)
    load_before_busy = list(os.getloadavg())
    with competitor() as other:
        busy = train_run(setup, "busy", overrides, threads=False)
    return {
        "quiet": quiet,
        "busy": busy,
        "ratio": busy["tokens_per_sec"] / quiet["tokens_per_sec"],
        "competitor": other,
        "load_average_quiet_end_busy_start": load_before_busy,
    }


def reference_target(setup: Setup, settings: dict, gptlab: dict, startup_s: float) -> dict:
    """The final val loss experiment=reference ends with, and that run's wall time: given,
    measured by the throughput run when it ran the reference's steps, or a run of its own."""
    steps = settings["reference_steps"]
    if settings.get("reference_val_loss") is not None:
        wall = settings.get("reference_wall_s")
        source = "--reference-wall-s"
        if wall is None:
            wall = startup_s + steps / gptlab["steps_per_s_incl_val"]
            source = f"estimated: start-up + {steps} steps at the measured rate"
        loss = settings["reference_val_loss"]
        return {
            "loss": loss,
            "source": "--reference-val-loss",
            "wall_s": wall,
            "wall_source": source,
        }
    run = gptlab
    if steps != gptlab["steps"]:
        stage(f"5. gptlab-train experiment=reference, {steps} steps")
        run = gptlab_reference(setup, steps, "gptlab-reference-full", False)
    return {
        "loss": run["final_val_loss"],
        "source": f"experiment=reference, {steps} steps",
        "wall_s": run["command_wall_seconds"],
        "wall_source": "that run, command to exit",
        "run": run,
    }


def time_to_reference_loss(default: dict, target: dict) -> dict:
    return {
        "reference_val_loss": target["loss"],
        "source": target["source"],
        "reference_wall_s": target["wall_s"],
        "reference_wall_source": target["wall_source"],
        "default_seconds": time_to_loss(default["val_curve"], target["loss"]),
    }


ABLATIONS = [
    ("no periodic last.ckpt", ("~callbacks.last_checkpoint",)),
    ("progress bar refresh_rate=50", ("callbacks.progress_bar.refresh_rate=50",)),
    ("no progress bar", ("~callbacks.progress_bar", "+trainer.enable_progress_bar=false")),
    ("log_every_n_steps=50", ("trainer.log_every_n_steps=50",)),
    ("logger=none callbacks=none", ("logger=none", "callbacks=none")),
]


def ablations(setup: Setup, steps: int, bare: dict) -> list[dict]:
    """gptlab-train experiment=reference with parts of Lightning's set-up switched off, each
    against the bare loop: what each part of the overhead costs."""
    rows = []
    for i, (label, overrides) in enumerate(ABLATIONS):
        run = attempt(gptlab_reference, setup, steps, f"ablation-{i}", False, overrides)
        if "error" in run:
            rows.append({"variant": label, "error": run["error"]})
            continue
        pct = 100.0 * (bare["train_steps_per_s"] / run["train_steps_per_s"] - 1.0)
        rows.append({"variant": label, "overrides": list(overrides), "overhead_pct": pct})
    return rows


def stage(name: str) -> None:
    print(f"[benchmark] {name}", file=sys.stderr, flush=True)
