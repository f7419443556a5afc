#!/usr/bin/env python
"""Side-by-side performance of gptlab on this machine, printed as a table and written as JSON.

    python scripts/benchmark.py                     # the full run (about 20 min on 2 CPU cores)
    python scripts/benchmark.py --quick             # every row, few steps: a smoke run (< 1 min)
    python scripts/benchmark.py --device cuda       # on a GPU
    python scripts/benchmark.py --reference-val-loss 5.9 --reference-wall-s 400   # reuse a known reference
    python scripts/benchmark.py --profile --ablations   # + cProfile and the Lightning variants

What it measures, in one run on one machine (training steps/s always over training steps
only: the reference loop's estimate_loss and gptlab's validation are timed apart):

1. the reference script's style (scripts/reference_loop.py in a process of its own, as a user
   runs it: one module per head, the positional table rebuilt every forward, full cl100k
   vocabulary, batch 4 x context 16, 8 pre-LN blocks) against `gptlab-train experiment=reference`
   for the same number of steps (a subprocess; its steps/s comes from metrics.json:
   tokens_per_sec, which leaves validation out); informative: the reference loop again with
   gptlab's malloc settings (gptlab.malloc) as environment variables, to show that share apart;
2. gptlab's GPT in a bare PyTorch loop (same model, AdamW groups, data loader, no Lightning)
   against the same config under Lightning, in this process (gptlab.train.train): overhead in %;
3. start-up: from spawning `gptlab-train debug=fast` (token cache warm) to the end of its first
   training step (scripts/first_step_probe.py prints the time of that moment);
4. the peak resident memory of the default run (`gptlab-train`, token cache warm; its
   /proc/<pid>/status VmHWM, followed until it exits);
5. the wall time the default run takes to reach the val loss `experiment=reference` ends with
   (its TensorBoard val/loss events carry wall times), against the reference run's wall time.

Every child gets `num_threads=<--threads>` and OMP_NUM_THREADS, and this process calls
torch.set_num_threads with the same value. Children run in --workdir (default
outputs/benchmark/work), whose data/cache keeps the token caches warm between runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

import torch  # noqa: E402
from reference_loop import ReferenceSettings  # noqa: E402

from gptlab.malloc import MMAP_THRESHOLD, TRIM_THRESHOLD, keep_freed_memory  # noqa: E402

BIN = Path(sys.executable).parent
FIRST_STEP_MARKER = "GPTLAB_FIRST_STEP"
# gptlab-train's own malloc settings (gptlab.malloc), as environment variables for another process
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}

TARGETS = {  # id: (comparison, threshold, what is compared)
    "speedup_vs_reference": (">=", 1.5, "experiment=reference train steps/s / reference loop's"),
    "lightning_overhead_pct": ("<=", 10.0, "bare loop steps/s / Lightning steps/s - 1, in %"),
    "startup_s": ("<=", 6.0, "spawn of gptlab-train debug=fast to end of first step"),
    "time_to_reference_loss_fraction": ("<=", 0.1, "default run's time to the reference's final "
                                        "val loss / reference run's wall time"),
    "default_peak_rss_mb": ("<=", 1000.0, "peak RSS of the default run, MB (1e6 bytes)"),
}


# ------------------------------------------------------------------------------------------- helpers
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few steps everywhere: a smoke run of every row")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps of each throughput comparison (default 400; --quick 8)")
    p.add_argument("--reference-steps", type=int, default=None,
                   help="steps of the experiment=reference run giving the target val loss (default "
                        "5000 as the reference script; --quick reuses the throughput run)")
    p.add_argument("--reference-val-loss", type=float, default=None,
                   help="reuse a known final val loss of experiment=reference instead of running it")
    p.add_argument("--reference-wall-s", type=float, default=None,
                   help="with --reference-val-loss: that run's wall time (else estimated)")
    p.add_argument("--default-steps", type=int, default=None,
                   help="trainer.max_steps of the default run (default: its config; --quick 20)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads on both sides (default: the cores this process may use)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--repeats", type=int, default=1,
                   help="repeat the speed-up runs and the bare/Lightning loops, keep the best of each "
                        "(noisy machines)")
    p.add_argument("--startup-repeats", type=int, default=None, help="start-up runs (default 3; --quick 1)")
    p.add_argument("--no-reference-eval", action="store_true",
                   help="leave estimate_loss out of the reference loop (its train-only rate is kept anyway)")
    p.add_argument("--ablations", action="store_true",
                   help="also time Lightning variants (no callbacks, guard, progress bar, logging, threads)")
    p.add_argument("--profile", action="store_true",
                   help="cProfile the bare and the Lightning loop; host time by package in the JSON")
    p.add_argument("--workdir", type=Path, default=Path("outputs/benchmark/work"))
    p.add_argument("--out", type=Path, default=None,
                   help="the JSON (default outputs/benchmark/benchmark-<date>-<time>.json)")
    args = p.parse_args(argv)
    args.steps = args.steps or (8 if args.quick else 400)
    args.startup_repeats = args.startup_repeats or (1 if args.quick else 3)
    if args.default_steps is None and args.quick:
        args.default_steps = 20
    if args.reference_steps is None:
        args.reference_steps = args.steps if args.quick else 5000
    args.threads = args.threads or len(os.sched_getaffinity(0))
    if args.out is None:
        args.out = Path("outputs/benchmark") / time.strftime("benchmark-%Y-%m-%d-%H-%M-%S.json")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    return args


def machine_info(args) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import lightning

    info = {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": args.device,
        "load_average_start": list(os.getloadavg()),
    }
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def child_env(args) -> dict:
    threads = str(args.threads)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def train_command(args, *overrides: str, probe: bool = False) -> list[str]:
    """`gptlab-train overrides...` (or the first-step probe around the same main())."""
    if probe:
        head = [sys.executable, str(SCRIPTS / "first_step_probe.py")]
    elif (BIN / "gptlab-train").is_file():
        head = [str(BIN / "gptlab-train")]
    else:
        head = [sys.executable, "-m", "gptlab.train"]
    device = ["trainer.accelerator=cpu"] if args.device == "cpu" else ["trainer.accelerator=gpu"]
    return [*head, *device, f"num_threads={args.threads}", *overrides]


def peak_rss_poller(pid: int, peak: list[int]) -> threading.Thread:
    """Follow /proc/<pid>/status VmHWM (the child's own high-water mark, in kB) until it exits.

    Not getrusage: on Linux a child's ru_maxrss also counts the parent's resident set at the
    fork, and this process holds a 13M-parameter model by then."""

    def poll():
        status = Path(f"/proc/{pid}/status")
        while True:
            try:
                lines = [x for x in status.read_text().splitlines() if x.startswith("VmHWM:")]
            except OSError:
                return
            if not lines:  # a zombie: it has exited
                return
            peak[0] = max(peak[0], int(lines[0].split()[1]))
            time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def run_child(cmd: list[str], cwd: Path, env: dict, timeout: float, name: str) -> dict:
    """Run `cmd`; its own peak RSS (VmHWM), its wall time and output (saved under logs/)."""
    log_dir = cwd / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        peak = [0]
        poller = peak_rss_poller(proc.pid, peak)
        try:
            _, status, _ = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        poller.join()
        wall = time.time() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}: {' '.join(cmd)}\n{stderr[-3000:]}")
    return {"start": start, "wall_s": wall, "maxrss_mb": peak[0] * 1024 / 1e6,
            "stdout": stdout, "stderr": stderr}


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


@contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compose(args, run_dir: Path, *overrides: str):
    """gptlab's composed config, as `gptlab-train overrides...` would see it, with fixed paths."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    import gptlab.train  # noqa: F401  (registers the schemas and resolvers)

    workdir = args.workdir.resolve()
    device = "cpu" if args.device == "cpu" else "gpu"
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return hydra_compose("train", overrides=[
            f"paths.root_dir={workdir}", f"paths.output_dir={run_dir.resolve()}",
            f"trainer.accelerator={device}", f"num_threads={args.threads}", *overrides,
        ])


# ------------------------------------------------------------------------------ 1. reference vs gptlab
def reference_tokens(args) -> tuple[Path, object]:
    """The corpus as full cl100k_base ids (gptlab's token cache, compact_vocab=false), saved
    for the reference loop's process."""
    from gptlab.train import build

    cfg = compose(args, args.workdir / "runs" / "unused", "experiment=reference")
    datamodule = build(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    path = args.workdir / "reference-tokens.pt"
    torch.save(torch.cat([datamodule.train_tokens, datamodule.val_tokens]), path)
    return path, cfg


def bench_reference(args, tokens_file: Path, name: str, env: dict | None = None) -> dict:
    """The reference-style loop in a process of its own (scripts/reference_loop.py), as a user
    runs the reference script: plain python, glibc's malloc defaults unless `env` says otherwise."""
    settings = ReferenceSettings(eval_iters=2) if args.quick else ReferenceSettings()
    out = args.workdir / f"{name}.json"
    cmd = [sys.executable, str(SCRIPTS / "reference_loop.py"), str(tokens_file), "--steps", str(args.steps),
           "--eval-iters", str(settings.eval_iters), "--threads", str(args.threads),
           "--device", args.device, "--out", str(out), *(["--no-eval"] if args.no_reference_eval else [])]
    run_child(cmd, args.workdir, {**child_env(args), **(env or {})}, timeout=7200, name=name)
    result = json.loads(out.read_text())
    return {
        "steps": result["steps"],
        "train_steps_per_s": result["steps"] / result["train_seconds"],
        "steps_per_s_incl_eval": result["steps"] / result["wall_seconds"],
        "train_seconds": result["train_seconds"],
        "eval_seconds": result["eval_seconds"],
        "wall_seconds": result["wall_seconds"],
        "final_val_estimate": result["final_val_estimate"],
        "vocab_size": result["vocab_size"],
        "malloc_env": env or {},
        "eval": f"every {settings.eval_interval} steps, {settings.eval_iters} batches each of train "
                "and val" if not args.no_reference_eval else "none",
    }


def gptlab_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def bench_gptlab_reference(args, steps: int, name: str, extra: tuple[str, ...] = ()) -> dict:
    run_dir = fresh_dir(args.workdir.resolve() / "runs" / name)
    overrides = ["experiment=reference", f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}", *extra]
    if args.quick:  # a quick run validates on a few batches only
        overrides += ["trainer.limit_val_batches=10", "trainer.num_sanity_val_steps=0"]
    child = run_child(train_command(args, *overrides), args.workdir, child_env(args),
                      timeout=7200, name=name)
    m = gptlab_metrics(run_dir)
    tokens_per_step = 4 * 16
    return {
        "command": "gptlab-train " + " ".join(overrides),
        "steps": m["steps"],
        "train_steps_per_s": m["tokens_per_sec"] / tokens_per_step,
        "steps_per_s_incl_val": m["steps"] / m["wall_seconds"] if m["wall_seconds"] else math.nan,
        "fit_wall_seconds": m["wall_seconds"],
        "command_wall_seconds": child["wall_s"],
        "final_val_loss": m["final_val_loss"],
        "peak_rss_mb": child["maxrss_mb"],
        "validation": "exact val loss over the whole val split every 50 steps"
                      + (" (--quick: 10 batches)" if args.quick else ""),
    }


# ------------------------------------------------------------------------- 2. bare loop vs Lightning
def bare_loop(args, cfg, steps: int, num_threads: int | None = None) -> dict:
    """gptlab's GPT, its AdamW groups and its data loader in a plain loop, no Lightning."""
    from gptlab.module import GPTModule
    from gptlab.train import build

    if cfg.tune_malloc:  # as gptlab.train.train does
        keep_freed_memory()
    with threads(num_threads or args.threads):
        torch.manual_seed(cfg.seed)
        model_config, optim_config = build(cfg.model), build(cfg.optim)
        datamodule = build(cfg.data)
        datamodule.prepare_data()
        datamodule.setup("fit")
        model_config.vocab_size = datamodule.vocab_size
        module = GPTModule(**GPTModule.hparams_from(model_config, optim_config, datamodule.tokenizer))
        device = torch.device(args.device)
        module.to(device).train()
        optimizer = module.build_optimizer()  # the same AdamW as under Lightning
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        clip = cfg.trainer.get("gradient_clip_val")
        batches = iter(datamodule.train_dataloader())
        start = time.perf_counter()
        for _ in range(steps):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(datamodule.train_dataloader())
                x, y = next(batches)
            loss = module.loss((x.to(device, non_blocking=True), y.to(device, non_blocking=True)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
            optimizer.step()
            scheduler.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {"steps": steps, "train_steps_per_s": steps / seconds, "train_seconds": seconds,
            "last_loss": float(loss.detach())}


def lightning_run(args, steps: int, name: str, *overrides: str, num_threads: int | None = None) -> dict:
    """gptlab.train.train on the composed config, in this process: the Lightning side."""
    from gptlab.train import train

    run_dir = fresh_dir(args.workdir.resolve() / "runs" / name)
    cfg = compose(args, run_dir, "experiment=reference", f"trainer.max_steps={steps}",
                  # validation is timed apart by RunStats; keep it short here
                  "trainer.limit_val_batches=2", "trainer.num_sanity_val_steps=0",
                  *([f"num_threads={num_threads}"] if num_threads else []), *overrides)
    # Lightning's progress bar writes to stdout; keep stdout for the table
    with threads(num_threads or args.threads), redirect_stdout(sys.stderr):
        train(cfg)
    m = gptlab_metrics(run_dir)
    return {"steps": m["steps"], "train_steps_per_s": m["tokens_per_sec"] / (4 * 16),
            "overrides": list(overrides)}


def best_of(runs: list[dict]) -> dict:
    best = max(runs, key=lambda r: r["train_steps_per_s"])
    return {**best, "all_steps_per_s": [round(r["train_steps_per_s"], 3) for r in runs]}


def bench_overhead(args, cfg_reference) -> dict:
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    bare, lit = [], []
    for i in range(args.repeats):  # alternate, so a burst of load hits both sides alike
        bare.append(bare_loop(args, cfg_reference, args.steps))
        lit.append(lightning_run(args, args.steps, f"lightning-{i}"))
    bare, lit = best_of(bare), best_of(lit)
    return {"bare": bare, "lightning": {**lit, "config": "experiment=reference as shipped (default "
                                         "callbacks, TensorBoard logger); validation left out of the rate"},
            "overhead_pct": 100.0 * (bare["train_steps_per_s"] / lit["train_steps_per_s"] - 1.0)}


def guard_every_log_step():
    """DivergenceGuard checking every log_every_n_steps (and before checkpoints) on CPU too."""
    from gptlab.resilience import DivergenceGuard

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._loss = outputs["loss"].detach() if isinstance(outputs, dict) else outputs.detach()
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self._check(trainer, pl_module)

    original = DivergenceGuard.on_train_batch_end
    DivergenceGuard.on_train_batch_end = on_train_batch_end
    return lambda: setattr(DivergenceGuard, "on_train_batch_end", original)


def bench_ablations(args, cfg_reference, overhead: dict) -> list[dict]:
    """Lightning variants, each against the bare loop: what each part of the overhead costs."""
    variants = [
        ("no periodic checkpoint (~156 MB at full vocabulary, every 1,000 steps here)",
         ("~callbacks.periodic_checkpoint",), None),
        ("progress bar refresh_rate=50", ("callbacks.progress_bar.refresh_rate=50",), None),
        ("no progress bar", ("~callbacks.progress_bar", "+trainer.enable_progress_bar=false"), None),
        ("log_every_n_steps=50", ("trainer.log_every_n_steps=50",), None),
        ("DivergenceGuard every log_every_n_steps", (), guard_every_log_step),
        ("logger=none callbacks=none", ("logger=none", "callbacks=none"), None),
    ]
    rows = []
    for i, (label, overrides, patch) in enumerate(variants):
        undo = patch() if patch else None
        try:
            run = lightning_run(args, args.steps, f"ablation-{i}", *overrides)
        except Exception as e:  # a variant the current config cannot take: say so, go on
            rows.append({"variant": label, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        finally:
            if undo:
                undo()
        rows.append({"variant": label, "overrides": list(overrides),
                     "train_steps_per_s": run["train_steps_per_s"],
                     "overhead_pct": 100.0 * (overhead["bare"]["train_steps_per_s"]
                                              / run["train_steps_per_s"] - 1.0)})
    if args.threads != 1:
        bare1 = bare_loop(args, cfg_reference, args.steps, num_threads=1)
        rows.append({"variant": "bare loop, 1 thread (vs --threads on the same loop)",
                     "train_steps_per_s": bare1["train_steps_per_s"],
                     "vs_bare_pct": 100.0 * (bare1["train_steps_per_s"]
                                             / overhead["bare"]["train_steps_per_s"] - 1.0)})
        lit1 = lightning_run(args, args.steps, "ablation-threads1", num_threads=1)
        rows.append({"variant": "Lightning as shipped, num_threads=1",
                     "train_steps_per_s": lit1["train_steps_per_s"],
                     "overhead_pct_vs_1_thread_bare": 100.0 * (bare1["train_steps_per_s"]
                                                               / lit1["train_steps_per_s"] - 1.0)})
    return rows


def host_time_by_package(profile: cProfile.Profile) -> dict:
    """cProfile's own time (tottime) summed by where the code lives."""
    stats = pstats.Stats(profile)
    buckets: dict[str, float] = {}
    for (filename, _, func), (_, _, tottime, _, _) in stats.stats.items():
        path = filename.replace("\\", "/")
        if "/lightning/" in path:
            key = "lightning"
        elif "/gptlab/" in path or "reference_loop" in path or "benchmark" in path:
            key = "gptlab + benchmark"
        elif "/torch/optim/" in path:
            key = "torch.optim (python)"
        elif "/torch/" in path:
            key = "torch (python)"
        elif filename == "~":
            key = "built-ins and C ops (" + ("torch ops" if "torch" in func or "method '" in func
                                              else "other") + ")"
        elif "/tensorboard" in path or "/tqdm/" in path:
            key = "tensorboard + tqdm"
        else:
            key = "other python"
        buckets[key] = buckets.get(key, 0.0) + tottime
    total = sum(buckets.values()) or 1.0
    return {k: {"seconds": round(v, 3), "pct": round(100 * v / total, 1)}
            for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])}


def bench_profile(args, cfg_reference, out_dir: Path) -> dict:
    result = {}
    for name, fn in (("bare", lambda: bare_loop(args, cfg_reference, args.steps)),
                     ("lightning", lambda: lightning_run(args, args.steps, "profile-lightning"))):
        profile = cProfile.Profile()
        profile.enable()
        fn()
        profile.disable()
        path = out_dir / f"profile-{name}.prof"
        profile.dump_stats(path)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        (out_dir / f"profile-{name}.txt").write_text(text.getvalue())
        result[name] = {"prof": str(path), "top25": str(out_dir / f"profile-{name}.txt"),
                        "host_time_by_package": host_time_by_package(profile)}
    return result


# -------------------------------------------------------------------------- 3. start-up, 4./5. default
def warm_compact_cache(args) -> None:
    """The token cache of the default run and debug=fast (cl100k_base, compact) exists before
    they are measured: a first run's tokenization is a one-off cost, not start-up or memory."""
    from gptlab.train import build

    build(compose(args, args.workdir / "runs" / "unused").data).prepare_data()


def bench_startup(args) -> dict:
    times = []
    for i in range(args.startup_repeats):
        run_dir = fresh_dir(args.workdir.resolve() / "runs" / f"startup-{i}")
        overrides = ["debug=fast", "trainer.max_steps=3", f"hydra.run.dir={run_dir}"]
        child = run_child(train_command(args, *overrides, probe=True), args.workdir, child_env(args),
                          timeout=600, name=f"startup-{i}")
        marks = [line for line in child["stderr"].splitlines() if line.startswith(FIRST_STEP_MARKER)]
        if not marks:
            raise RuntimeError(f"startup-{i}: no {FIRST_STEP_MARKER} line on stderr")
        times.append(float(marks[0].split()[1]) - child["start"])
    return {"command": "gptlab-train debug=fast trainer.max_steps=3 (first-step probe)",
            "seconds": statistics.median(times), "all_seconds": [round(t, 3) for t in times],
            "min_seconds": min(times)}


def val_curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, wall time, val/loss) from the run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    if "val/loss" not in acc.Tags().get("scalars", []):
        return []
    return [(e.step, e.wall_time, e.value) for e in acc.Scalars("val/loss")]


def bench_default(args) -> dict:
    run_dir = fresh_dir(args.workdir.resolve() / "runs" / "default")
    overrides = [f"hydra.run.dir={run_dir}"]
    if args.default_steps:
        overrides += [f"trainer.max_steps={args.default_steps}",
                      f"trainer.val_check_interval={max(1, args.default_steps // 2)}"]
    child = run_child(train_command(args, *overrides), args.workdir, child_env(args), timeout=7200,
                      name="default")
    m = gptlab_metrics(run_dir)
    curve = [(step, wall - child["start"], loss) for step, wall, loss in val_curve(run_dir)]
    return {"command": "gptlab-train " + " ".join(overrides), "peak_rss_mb": child["maxrss_mb"],
            "command_wall_seconds": child["wall_s"], "steps": m["steps"],
            "final_val_loss": m["final_val_loss"], "best_val_loss": m["best_val_loss"],
            "val_curve": [{"step": s, "seconds_since_command": round(t, 3), "val_loss": v}
                          for s, t, v in curve]}


def time_to_loss(default: dict, target: float) -> float | None:
    for point in default["val_curve"]:
        if point["val_loss"] <= target:
            return point["seconds_since_command"]
    return None


# ----------------------------------------------------------------------------------------- the table
def status(target_id: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "FAIL"
    op, threshold, _ = TARGETS[target_id]
    return "PASS" if (value >= threshold if op == ">=" else value <= threshold) else "FAIL"


def row(row_id: str, name: str, value, unit: str, target_id: str | None = None, detail: str = "") -> dict:
    entry = {"id": row_id, "name": name, "value": value, "unit": unit, "detail": detail}
    if target_id:
        op, threshold, _ = TARGETS[target_id]
        entry["target"] = f"{op} {threshold:g}"
        entry["status"] = status(target_id, value)
    return entry


def fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    return str(value)


def print_table(rows: list[dict], info: dict) -> str:
    header = ("measurement", "value", "unit", "target", "status")
    lines = [[r["name"], fmt(r["value"]), r["unit"], r.get("target", ""), r.get("status", "")] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=True)]
    out = [f"gptlab benchmark: {info['cpu_model']}, {info['cpus_usable']} cores usable, "
           f"threads={info['threads']}, torch {info['torch']}, device {info['device']}",
           "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)) for line in lines]
    text = "\n".join(out)
    print(text, flush=True)
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    info = machine_info(args)
    began = time.time()
    results: dict = {"machine": info, "settings": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}

    def stage(name: str):
        print(f"[benchmark] {name} ({time.time() - began:.0f} s)", file=sys.stderr, flush=True)

    tokens_file, cfg_reference = reference_tokens(args)
    reference, gptlab_reference, reference_malloc = [], [], []
    for i in range(args.repeats):  # alternate, so a burst of load hits every side alike
        stage(f"1. reference-style loop ({i + 1}/{args.repeats})")
        reference.append(bench_reference(args, tokens_file, f"reference-loop-{i}"))
        stage(f"1. gptlab-train experiment=reference ({i + 1}/{args.repeats})")
        gptlab_reference.append(bench_gptlab_reference(args, args.steps, f"gptlab-reference-{i}"))
        stage(f"1. reference-style loop with gptlab's malloc settings ({i + 1}/{args.repeats})")
        reference_malloc.append(bench_reference(args, tokens_file, f"reference-loop-malloc-{i}",
                                                env=MALLOC_ENV))
    results["reference_loop"] = best_of(reference)
    results["gptlab_reference"] = best_of(gptlab_reference)
    results["reference_loop_gptlab_malloc"] = best_of(reference_malloc)
    stage("2. bare loop vs Lightning")
    results["overhead"] = bench_overhead(args, cfg_reference)
    if args.ablations:
        stage("2b. Lightning variants")
        results["ablations"] = bench_ablations(args, cfg_reference, results["overhead"])
    if args.profile:
        stage("2c. cProfile")
        results["profile"] = bench_profile(args, cfg_reference, args.out.parent)
    stage("4./5. default run")
    warm_compact_cache(args)
    results["default_run"] = bench_default(args)
    stage("3. start-up")
    results["startup"] = bench_startup(args)

    # the reference's final val loss and wall time
    ref = results["gptlab_reference"]
    if args.reference_val_loss is not None:
        target_loss, source = args.reference_val_loss, "--reference-val-loss"
        if args.reference_wall_s is not None:
            ref_wall, wall_source = args.reference_wall_s, "--reference-wall-s"
        else:
            ref_wall = results["startup"]["seconds"] + args.reference_steps / ref["steps_per_s_incl_val"]
            wall_source = f"estimated: start-up + {args.reference_steps} steps at the measured rate"
    elif args.reference_steps == args.steps:
        target_loss, source = ref["final_val_loss"], f"experiment=reference, {args.steps} steps"
        ref_wall, wall_source = ref["command_wall_seconds"], "that run, command to exit"
    else:
        stage(f"5. gptlab-train experiment=reference, {args.reference_steps} steps")
        full = bench_gptlab_reference(args, args.reference_steps, "gptlab-reference-full")
        results["gptlab_reference_full"] = full
        target_loss, source = full["final_val_loss"], f"experiment=reference, {args.reference_steps} steps"
        ref_wall, wall_source = full["command_wall_seconds"], "that run, command to exit"
    reached = time_to_loss(results["default_run"], target_loss)
    results["time_to_reference_loss"] = {
        "reference_val_loss": target_loss, "source": source, "reference_wall_s": ref_wall,
        "reference_wall_source": wall_source, "default_seconds": reached,
        "reference_script_wall_s_estimate": args.reference_steps / results["reference_loop"][
            "steps_per_s_incl_eval"],
    }

    rl, ov = results["reference_loop"], results["overhead"]
    rlm = results["reference_loop_gptlab_malloc"]
    speedup = ref["train_steps_per_s"] / rl["train_steps_per_s"]
    rows = [
        row("reference_loop_steps_per_s", "reference-style loop: train steps/s", rl["train_steps_per_s"],
            "steps/s", detail=f"{rl['steps']} steps, estimate_loss excluded"),
        row("gptlab_reference_steps_per_s", "gptlab-train experiment=reference: train steps/s",
            ref["train_steps_per_s"], "steps/s",
            detail="metrics.json tokens_per_sec / 64, validation excluded"),
        row("speedup_vs_reference", "speed-up, train steps only", speedup, "x", "speedup_vs_reference"),
        row("reference_loop_malloc_steps_per_s",
            "reference-style loop with gptlab's malloc settings (informative): train steps/s",
            rlm["train_steps_per_s"], "steps/s", detail=" ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())),
        row("speedup_same_malloc", "speed-up, same malloc settings on both sides (informative)",
            ref["train_steps_per_s"] / rlm["train_steps_per_s"], "x",
            detail="what the model and the loop gain alone, without gptlab.malloc's share"),
        row("speedup_incl_validation", "speed-up, validation included (informative)",
            ref["steps_per_s_incl_val"] / rl["steps_per_s_incl_eval"], "x",
            detail="each side with its own validation: exact val split every 50 vs 2x20 batches every 20"),
        row("bare_steps_per_s", "gptlab GPT, bare PyTorch loop: steps/s", ov["bare"]["train_steps_per_s"],
            "steps/s"),
        row("lightning_steps_per_s", "gptlab GPT under Lightning (as shipped): steps/s",
            ov["lightning"]["train_steps_per_s"], "steps/s"),
        row("lightning_overhead_pct", "Lightning overhead at batch 4 x context 16", ov["overhead_pct"], "%",
            "lightning_overhead_pct"),
        row("startup_s", "start-up to first training step (median)", results["startup"]["seconds"], "s",
            "startup_s"),
        row("default_peak_rss_mb", "peak RSS of the default run", results["default_run"]["peak_rss_mb"],
            "MB", "default_peak_rss_mb"),
        row("reference_val_loss", "reference's final val loss", target_loss, "nats", detail=source),
        row("default_time_to_reference_loss_s", "default run: time to that val loss", reached, "s",
            detail="command start to the first val/loss at or below it; n/a: not reached"),
        row("reference_wall_s", "reference run wall time", ref_wall, "s", detail=wall_source),
        row("time_to_reference_loss_fraction", "time to reference loss / reference wall time",
            None if reached is None else reached / ref_wall, "", "time_to_reference_loss_fraction"),
    ]
    for ablation in results.get("ablations", []):
        if "overhead_pct" in ablation:
            rows.append(row("ablation", f"  variant: {ablation['variant']}", ablation["overhead_pct"],
                            "% overhead"))
    info["load_average_end"] = list(os.getloadavg())
    info["benchmark_seconds"] = round(time.time() - began, 1)
    results["rows"] = rows
    results["targets"] = {k: {"op": v[0], "threshold": v[1], "what": v[2]} for k, v in TARGETS.items()}
    results["table"] = print_table(rows, info)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"Wrote {args.out} ({info['benchmark_seconds']:.0f} s; load average "
          f"{info['load_average_start'][0]:.1f} -> {info['load_average_end'][0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
