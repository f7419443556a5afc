#!/usr/bin/env python
"""Side-by-side performance of gptlab on this machine, printed as a table and written as JSON.

    python scripts/benchmark.py                     # the full run (about 25 min on 2 quiet CPU cores)
    python scripts/benchmark.py --repeats 3         # ... each throughput side 3 times (about 35 min)
    python scripts/benchmark.py --quick             # every row, few steps: a smoke run (about 1.5 min)
    python scripts/benchmark.py --device cuda       # on a GPU
    python scripts/benchmark.py --reference-val-loss 4.75 --reference-wall-s 628   # reuse a known reference
    python scripts/benchmark.py --profile --ablations   # + cProfile and the Lightning variants

gptlab-train is measured from the outside, as a user runs it: real `gptlab-train` processes,
read through what they write anyway (metrics.json, their TensorBoard event files) and their
/proc/<pid>/status. Nothing in gptlab is patched.

What it measures, in one run on one machine (training steps/s always over training steps
only: the reference loop's estimate_loss and gptlab's validation are timed apart):

1. the reference script's style (scripts/reference_loop.py in a process of its own, as a user
   runs it: one module per head, the positional table rebuilt every forward, full cl100k
   vocabulary, batch 4 x context 16, 8 pre-LN blocks) against `gptlab-train experiment=reference`
   for the same number of steps (its steps/s comes from metrics.json: tokens_per_sec, which
   leaves validation out);
2. precision: the same experiment=reference run with `trainer.precision=bf16-mixed`, and the
   default run (5.) again with it: steps/s and the final val loss each reaches after the same
   steps, fp32 against bf16-mixed;
3. gptlab's GPT in a bare PyTorch loop (same model, AdamW groups, data loader, no Lightning)
   against the same config under Lightning, in this process (gptlab.train.train): overhead in %;
4. start-up: from spawning `gptlab-train debug=fast` (token cache warm) to its first `train/loss`
   record in its TensorBoard event file (written at the end of the first training step; the
   record carries its wall time);
5. the default run (`gptlab-train`, token cache warm): its peak resident memory (its own
   /proc/<pid>/status VmHWM, followed until it exits) and the wall time it takes to reach the
   val loss `experiment=reference` ends with (its TensorBoard val/loss events carry wall times),
   against the reference run's wall time;
6. a busy machine: the default run as shipped (torch's own thread count, gptlab's OpenMP
   defaults), quiet, then again while one CPU-bound process (`python -c "while True: pass"`)
   competes for the cores: the ratio of the two tokens/s.

The CPU model and its bf16 instructions (/proc/cpuinfo flags amx_bf16, amx_tile, avx512_bf16)
head the table and are in the JSON with the core count, thread count and versions.

Children start from the environment this script was started with: every gptlab-train child
applies gptlab's own OpenMP defaults (gptlab/__init__.py), the reference loop runs as a user's
plain script would. This process imports gptlab before torch, so its in-process rows (3.) run
under the same defaults as gptlab-train. Every child but the busy-machine pair gets
`num_threads=<--threads>` (the reference loop `--threads`), and this process calls
torch.set_num_threads with the same value. Children run in --workdir (default
outputs/benchmark/work), whose data/cache keeps the token caches warm between runs.
"""

from __future__ import annotations

import os

# The environment as the user gave it, before gptlab's OpenMP defaults: what children start from.
USER_ENV = dict(os.environ)
import gptlab  # noqa: E402, F401, I001  (before torch: its OpenMP defaults must reach torch's runtime)

# what importing gptlab set (GOMP_SPINCOUNT=1000 unless the user set OpenMP variables)
GPTLAB_OPENMP = {k: v for k, v in os.environ.items() if USER_ENV.get(k) != v}

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager, redirect_stdout  # noqa: E402
from pathlib import Path  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

import torch  # noqa: E402
from reference_loop import ReferenceSettings  # noqa: E402

BIN = Path(sys.executable).parent
BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")  # /proc/cpuinfo flags
COMPETITOR = "while True: pass"  # one CPU-bound process, for the busy-machine row
BF16 = "trainer.precision=bf16-mixed"

TARGETS = {  # id: (comparison, threshold, what is compared)
    "speedup_vs_reference": (">=", 1.5, "experiment=reference train steps/s / reference loop's"),
    "lightning_overhead_pct": ("<=", 10.0, "bare loop steps/s / Lightning steps/s - 1, in %"),
    "startup_s": ("<=", 6.0, "spawn of gptlab-train debug=fast to its first train/loss record"),
    "time_to_reference_loss_fraction": (
        "<=",
        0.1,
        "default run's time to the reference's final val loss / reference run's wall time",
    ),
    "default_peak_rss_mb": ("<=", 1000.0, "peak RSS of the default run, MB (1e6 bytes)"),
    "busy_quiet_ratio": (
        ">=",
        0.45,
        "default run's tokens/s with one CPU-bound competitor / quiet",
    ),
}


# ------------------------------------------------------------------------------------------- helpers
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="few steps everywhere: a smoke run of every row"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps of each throughput comparison (default 400; --quick 8)",
    )
    p.add_argument(
        "--reference-steps",
        type=int,
        default=None,
        help="steps of the experiment=reference run giving the target val loss (default "
        "5000 as the reference script; --quick reuses the throughput run)",
    )
    p.add_argument(
        "--reference-val-loss",
        type=float,
        default=None,
        help="reuse a known final val loss of experiment=reference instead of running it",
    )
    p.add_argument(
        "--reference-wall-s",
        type=float,
        default=None,
        help="with --reference-val-loss: that run's wall time (else estimated)",
    )
    p.add_argument(
        "--default-steps",
        type=int,
        default=None,
        help="trainer.max_steps of the default runs, fp32 and bf16 (default: its config; "
        "--quick 20)",
    )
    p.add_argument(
        "--busy-steps",
        type=int,
        default=None,
        help="trainer.max_steps of the quiet and the busy run (default 300; --quick 20)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads on both sides (default: the cores this process may use)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="repeat the speed-up runs and the bare/Lightning loops, keep the best of each "
        "(noisy machines)",
    )
    p.add_argument(
        "--startup-repeats", type=int, default=None, help="start-up runs (default 3; --quick 1)"
    )
    p.add_argument(
        "--no-reference-eval",
        action="store_true",
        help="leave estimate_loss out of the reference loop (its train-only rate is kept anyway)",
    )
    p.add_argument(
        "--ablations",
        action="store_true",
        help="also time Lightning variants (no callbacks, progress bar, logging, threads)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the bare and the Lightning loop; host time by package in the JSON",
    )
    p.add_argument("--workdir", type=Path, default=Path("outputs/benchmark/work"))
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON (default outputs/benchmark/benchmark-<date>-<time>.json)",
    )
    args = p.parse_args(argv)
    args.steps = args.steps or (8 if args.quick else 400)
    args.startup_repeats = args.startup_repeats or (1 if args.quick else 3)
    args.busy_steps = args.busy_steps or (20 if args.quick else 300)
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


def cpu_info() -> dict:
    """The CPU model and its bf16 instructions, from /proc/cpuinfo (None where unknown)."""
    model, flags = None, None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
    features = {flag: (flag in flags) if flags is not None else None for flag in BF16_FLAGS}
    if flags is None:
        summary = "unknown"
    else:
        summary = ", ".join(flag for flag in BF16_FLAGS if features[flag]) or "none"
    return {
        "cpu_model": model or platform.processor() or platform.machine(),
        "cpu_bf16_flags": features,
        "cpu_bf16": summary,
        "cpu_has_amx": None
        if flags is None
        else bool(features["amx_bf16"] and features["amx_tile"]),
        "cpu_has_avx512_bf16": features["avx512_bf16"],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def machine_info(args) -> dict:
    import lightning

    info = {
        **cpu_info(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "torch_default_threads": torch.get_num_threads(),
        "openmp_user_env": {k: v for k, v in USER_ENV.items() if k.startswith(("OMP_", "GOMP_"))},
        "openmp_gptlab_defaults": GPTLAB_OPENMP,
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


def child_env(extra: dict | None = None) -> dict:
    """The user's environment, without the OpenMP defaults gptlab set in this process: each
    gptlab-train child sets its own; the reference loop runs as a user's plain script."""
    return {**USER_ENV, "PYTHONUNBUFFERED": "1", **(extra or {})}


def train_command(args, *overrides: str, threads: bool = True) -> list[str]:
    """`gptlab-train overrides...` (threads=False: torch's own thread count, as shipped)."""
    if (BIN / "gptlab-train").is_file():
        head = [str(BIN / "gptlab-train")]
    else:
        head = [sys.executable, "-m", "gptlab.cli.train"]
    device = ["trainer.accelerator=cpu"] if args.device == "cpu" else ["trainer.accelerator=gpu"]
    return [*head, *device, *([f"num_threads={args.threads}"] if threads else []), *overrides]


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
    return {
        "start": start,
        "wall_s": wall,
        "maxrss_mb": peak[0] * 1024 / 1e6,
        "stdout": stdout,
        "stderr": stderr,
    }


def failed(error: Exception) -> dict:
    """A run that failed, as a result: its first line and the last line of its stderr."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    reason = lines[0] if len(lines) < 2 else f"{lines[0][:300]} ... {lines[-1][:300]}"
    print(f"[benchmark] FAILED: {reason}", file=sys.stderr, flush=True)
    return {"error": reason}


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

    import gptlab.cli.train  # noqa: F401  (registers the schemas and resolvers)

    workdir = args.workdir.resolve()
    device = "cpu" if args.device == "cpu" else "gpu"
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return hydra_compose(
            "train",
            overrides=[
                f"paths.root_dir={workdir}",
                f"paths.output_dir={run_dir.resolve()}",
                f"trainer.accelerator={device}",
                f"num_threads={args.threads}",
                *overrides,
            ],
        )


def build(node):
    """An object of the composed config (Hydra's instantiate, as gptlab-train builds them)."""
    from hydra.utils import instantiate

    return instantiate(node, _convert_="all")


def gptlab_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def bench_train(
    args, name: str, overrides: list[str], *, threads: bool = True, timeout: float = 7200
) -> dict:
    """One `gptlab-train` process in a fresh run directory: its metrics.json, peak RSS, times."""
    run_dir = fresh_dir(args.workdir / "runs" / name)
    overrides = [*overrides, f"hydra.run.dir={run_dir}"]
    child = run_child(
        train_command(args, *overrides, threads=threads),
        args.workdir,
        child_env(),
        timeout=timeout,
        name=name,
    )
    m = gptlab_metrics(run_dir)
    tokens_per_step = m["tokens_seen"] / m["steps"] if m["steps"] else math.nan
    return {
        "command": "gptlab-train " + " ".join(overrides),
        "run_dir": str(run_dir),
        "start": child["start"],
        "steps": m["steps"],
        "tokens_per_sec": m["tokens_per_sec"],
        "train_steps_per_s": m["tokens_per_sec"] / tokens_per_step,
        "steps_per_s_incl_val": m["steps"] / m["wall_seconds"] if m["wall_seconds"] else math.nan,
        "fit_wall_seconds": m["wall_seconds"],
        "command_wall_seconds": child["wall_s"],
        "final_val_loss": m["final_val_loss"],
        "best_val_loss": m["best_val_loss"],
        "peak_rss_mb": child["maxrss_mb"],
        "metrics": m,
    }


# ------------------------------------------------------------- 1./2. reference vs gptlab, precision
def reference_tokens(args) -> tuple[Path, object]:
    """The corpus as full cl100k_base ids (gptlab's token cache, compact_vocab=false), saved
    for the reference loop's process."""

    cfg = compose(args, args.workdir / "runs" / "unused", "experiment=reference")
    datamodule = build(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    path = args.workdir / "reference-tokens.pt"
    torch.save(torch.cat([datamodule.train_tokens, datamodule.val_tokens]), path)
    return path, cfg


def bench_reference(args, tokens_file: Path, name: str) -> dict:
    """The reference-style loop in a process of its own (scripts/reference_loop.py), as a user
    runs the reference script: plain python, the user's environment."""
    settings = ReferenceSettings(eval_iters=2) if args.quick else ReferenceSettings()
    out = args.workdir / f"{name}.json"
    cmd = [
        sys.executable,
        str(SCRIPTS / "reference_loop.py"),
        str(tokens_file),
        "--steps",
        str(args.steps),
        "--eval-iters",
        str(settings.eval_iters),
        "--threads",
        str(args.threads),
        "--device",
        args.device,
        "--out",
        str(out),
        *(["--no-eval"] if args.no_reference_eval else []),
    ]
    run_child(cmd, args.workdir, child_env(), timeout=7200, name=name)
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
        "eval": f"every {settings.eval_interval} steps, {settings.eval_iters} batches each of train "
        "and val"
        if not args.no_reference_eval
        else "none",
    }


def bench_gptlab_reference(args, steps: int, name: str, extra: tuple[str, ...] = ()) -> dict:
    overrides = ["experiment=reference", f"trainer.max_steps={steps}", *extra]
    if args.quick:  # a quick run validates on a few batches only
        overrides += ["trainer.limit_val_batches=10", "trainer.num_sanity_val_steps=0"]
    result = bench_train(args, name, overrides)
    result["validation"] = "exact val loss over the whole val split every 50 steps" + (
        " (--quick: 10 batches)" if args.quick else ""
    )
    return result


# ------------------------------------------------------------------------- 3. bare loop vs Lightning
def bare_loop(args, cfg, steps: int, num_threads: int | None = None) -> dict:
    """gptlab's GPT, its AdamW groups and its data loader in a plain loop, no Lightning."""
    from gptlab.training.module import GPTModule

    with threads(num_threads or args.threads):
        torch.manual_seed(cfg.seed)
        model_config, optim_config = build(cfg.model), build(cfg.optim)
        datamodule = build(cfg.data)
        datamodule.prepare_data()
        datamodule.setup("fit")
        model_config.vocab_size = datamodule.vocab_size
        module = GPTModule(
            **GPTModule.hparams_from(model_config, optim_config, datamodule.tokenizer)
        )
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
    return {
        "steps": steps,
        "train_steps_per_s": steps / seconds,
        "train_seconds": seconds,
        "last_loss": float(loss.detach()),
    }


def lightning_run(
    args, steps: int, name: str, *overrides: str, num_threads: int | None = None
) -> dict:
    """gptlab.train.train on the composed config, in this process: the Lightning side."""
    from gptlab.train import train

    run_dir = fresh_dir(args.workdir.resolve() / "runs" / name)
    cfg = compose(
        args,
        run_dir,
        "experiment=reference",
        f"trainer.max_steps={steps}",
        # validation is timed apart by gptlab's throughput statistics; keep it short here
        "trainer.limit_val_batches=2",
        "trainer.num_sanity_val_steps=0",
        *([f"num_threads={num_threads}"] if num_threads else []),
        *overrides,
    )
    # Lightning's progress bar writes to stdout; keep stdout for the table
    with threads(num_threads or args.threads), redirect_stdout(sys.stderr):
        train(cfg)
    m = gptlab_metrics(run_dir)
    return {
        "steps": m["steps"],
        "train_steps_per_s": m["tokens_per_sec"] / (4 * 16),
        "overrides": list(overrides),
    }


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


def bench_overhead(args, cfg_reference) -> dict:
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    bare, lit = [], []
    for i in range(args.repeats):  # alternate, so a burst of load hits both sides alike
        bare.append(bare_loop(args, cfg_reference, args.steps))
        lit.append(lightning_run(args, args.steps, f"lightning-{i}"))
    bare, lit = best_of(bare), best_of(lit)
    return {
        "bare": bare,
        "lightning": {
            **lit,
            "config": "experiment=reference as shipped (default "
            "callbacks, TensorBoard logger); validation left out of the rate",
        },
        "overhead_pct": 100.0 * (bare["train_steps_per_s"] / lit["train_steps_per_s"] - 1.0),
    }


def bench_ablations(args, cfg_reference, overhead: dict) -> list[dict]:
    """Lightning variants (config overrides only), each against the bare loop: what each part
    of the overhead costs."""
    variants = [
        (
            "no periodic last.ckpt (~156 MB at full vocabulary, every 1,000 steps here)",
            ("~callbacks.last_checkpoint",),
        ),
        ("progress bar refresh_rate=50", ("callbacks.progress_bar.refresh_rate=50",)),
        ("no progress bar", ("~callbacks.progress_bar", "+trainer.enable_progress_bar=false")),
        ("log_every_n_steps=50", ("trainer.log_every_n_steps=50",)),
        ("logger=none callbacks=none", ("logger=none", "callbacks=none")),
    ]
    rows = []
    for i, (label, overrides) in enumerate(variants):
        try:
            run = lightning_run(args, args.steps, f"ablation-{i}", *overrides)
        except Exception as e:  # a variant the current config cannot take: say so, go on
            rows.append({"variant": label, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        rows.append(
            {
                "variant": label,
                "overrides": list(overrides),
                "train_steps_per_s": run["train_steps_per_s"],
                "overhead_pct": 100.0
                * (overhead["bare"]["train_steps_per_s"] / run["train_steps_per_s"] - 1.0),
            }
        )
    if args.threads != 1:
        bare1 = bare_loop(args, cfg_reference, args.steps, num_threads=1)
        rows.append(
            {
                "variant": "bare loop, 1 thread (vs --threads on the same loop)",
                "train_steps_per_s": bare1["train_steps_per_s"],
                "vs_bare_pct": 100.0
                * (bare1["train_steps_per_s"] / overhead["bare"]["train_steps_per_s"] - 1.0),
            }
        )
        lit1 = lightning_run(args, args.steps, "ablation-threads1", num_threads=1)
        rows.append(
            {
                "variant": "Lightning as shipped, num_threads=1",
                "train_steps_per_s": lit1["train_steps_per_s"],
                "overhead_pct_vs_1_thread_bare": 100.0
                * (bare1["train_steps_per_s"] / lit1["train_steps_per_s"] - 1.0),
            }
        )
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
            key = (
                "built-ins and C ops ("
                + ("torch ops" if "torch" in func or "method '" in func else "other")
                + ")"
            )
        elif "/tensorboard" in path or "/tqdm/" in path:
            key = "tensorboard + tqdm"
        else:
            key = "other python"
        buckets[key] = buckets.get(key, 0.0) + tottime
    total = sum(buckets.values()) or 1.0
    return {
        k: {"seconds": round(v, 3), "pct": round(100 * v / total, 1)}
        for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])
    }


def bench_profile(args, cfg_reference, out_dir: Path) -> dict:
    result = {}
    for name, fn in (
        ("bare", lambda: bare_loop(args, cfg_reference, args.steps)),
        ("lightning", lambda: lightning_run(args, args.steps, "profile-lightning")),
    ):
        profile = cProfile.Profile()
        profile.enable()
        fn()
        profile.disable()
        path = out_dir / f"profile-{name}.prof"
        profile.dump_stats(path)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        (out_dir / f"profile-{name}.txt").write_text(text.getvalue())
        result[name] = {
            "prof": str(path),
            "top25": str(out_dir / f"profile-{name}.txt"),
            "host_time_by_package": host_time_by_package(profile),
        }
    return result


# --------------------------------------------------------------- 4. start-up, 5. default, 6. busy
def warm_compact_cache(args) -> None:
    """The token cache of the default run and debug=fast (cl100k_base, compact) exists before
    they are measured: a first run's tokenization is a one-off cost, not start-up or memory."""

    build(compose(args, args.workdir / "runs" / "unused").data).prepare_data()


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float, float]]:
    """(step, wall time, value) of one scalar in the run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags().get("scalars", []):
        return []
    return [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]


def bench_startup(args) -> dict:
    """Spawn of `gptlab-train debug=fast` to the wall time of its first train/loss record: what
    the TensorBoard logger writes at the end of the first training step (log_every_n_steps=1)."""
    times = []
    for i in range(args.startup_repeats):
        overrides = [
            "debug=fast",
            "trainer.max_steps=3",
            "trainer.log_every_n_steps=1",
            "logger=tensorboard",
        ]
        run = bench_train(args, f"startup-{i}", overrides, timeout=600)
        records = tensorboard_scalars(Path(run["run_dir"]), "train/loss")
        if not records:
            raise RuntimeError(f"startup-{i}: no train/loss record in {run['run_dir']}/tensorboard")
        times.append(min(wall for _, wall, _ in records) - run["start"])
    return {
        "command": "gptlab-train debug=fast trainer.max_steps=3 trainer.log_every_n_steps=1 "
        "logger=tensorboard (first train/loss record in its TensorBoard events)",
        "seconds": statistics.median(times),
        "all_seconds": [round(t, 3) for t in times],
        "min_seconds": min(times),
    }


def default_overrides(args) -> list[str]:
    if not args.default_steps:
        return []
    return [
        f"trainer.max_steps={args.default_steps}",
        f"trainer.val_check_interval={max(1, args.default_steps // 2)}",
    ]


def bench_default(args, name: str = "default", extra: tuple[str, ...] = ()) -> dict:
    """The default run (its config's steps unless --default-steps), with its val/loss curve."""
    run = bench_train(args, name, [*default_overrides(args), *extra])
    curve = [
        (step, wall - run["start"], loss)
        for step, wall, loss in tensorboard_scalars(Path(run["run_dir"]), "val/loss")
    ]
    run["val_curve"] = [
        {"step": s, "seconds_since_command": round(t, 3), "val_loss": v} for s, t, v in curve
    ]
    return run


def time_to_loss(default: dict, target: float) -> float | None:
    for point in default["val_curve"]:
        if point["val_loss"] <= target:
            return point["seconds_since_command"]
    return None


def bench_busy(args) -> dict:
    """The default run as shipped (no num_threads: torch's own thread count; gptlab's OpenMP
    defaults), `--busy-steps` steps quiet, then the same while one CPU-bound process competes."""
    n = args.busy_steps
    overrides = [
        f"trainer.max_steps={n}",
        f"trainer.val_check_interval={n}",
        "trainer.num_sanity_val_steps=0",
        "trainer.limit_val_batches=2",
    ]  # validation: not timed
    quiet = bench_train(args, "quiet", overrides, threads=False)
    load_before_busy = list(os.getloadavg())
    competitor = subprocess.Popen(
        [sys.executable, "-c", COMPETITOR],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    began = time.time()
    try:
        busy = bench_train(args, "busy", overrides, threads=False)
    finally:
        competitor.kill()
        _, status, usage = os.wait4(competitor.pid, 0)
        competitor.returncode = os.waitstatus_to_exitcode(status)
        competitor_seconds = time.time() - began
    return {
        "quiet": quiet,
        "busy": busy,
        "ratio": busy["tokens_per_sec"] / quiet["tokens_per_sec"],
        "competitor": f"{sys.executable} -c '{COMPETITOR}'",
        # CPU time the competitor got over its life: ~1.0 when it held one core all along
        "competitor_cores": (usage.ru_utime + usage.ru_stime) / competitor_seconds,
        "load_average_quiet_end_busy_start": load_before_busy,
        "threads": "no num_threads: torch's default in the child (here: "
        f"{args.torch_default_threads})",
    }


# ----------------------------------------------------------------------------------------- the table
def status(target_id: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "FAIL"
    op, threshold, _ = TARGETS[target_id]
    return "PASS" if (value >= threshold if op == ">=" else value <= threshold) else "FAIL"


def row(
    row_id: str,
    name: str,
    value,
    unit: str,
    target_id: str | None = None,
    detail: str = "",
    error: str | None = None,
) -> dict:
    entry = {"id": row_id, "name": name, "value": value, "unit": unit, "detail": detail}
    if target_id:
        op, threshold, _ = TARGETS[target_id]
        entry["target"] = f"{op} {threshold:g}"
        entry["status"] = status(target_id, value)
    if error:
        entry["status"], entry["error"] = "ERROR", error
    return entry


def fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    return str(value)


def header(info: dict) -> str:
    amx = {True: "AMX", False: "no AMX", None: "AMX unknown"}[info["cpu_has_amx"]]
    avx = {True: "AVX512-BF16", False: "no AVX512-BF16", None: "AVX512-BF16 unknown"}[
        info["cpu_has_avx512_bf16"]
    ]
    return (
        f"gptlab benchmark: {info['cpu_model']} ({amx}, {avx}), {info['cpus_usable']} cores usable, "
        f"threads={info['threads']}, torch {info['torch']}, device {info['device']}"
    )


def print_table(rows: list[dict], info: dict) -> str:
    columns = ("measurement", "value", "unit", "target", "status")
    lines = [
        [r["name"], fmt(r["value"]), r["unit"], r.get("target", ""), r.get("status", "")]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *lines, strict=True)]
    out = [
        header(info),
        "  ".join(h.ljust(w) for h, w in zip(columns, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    out += [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    errors = [f"  {r['name']}: {r['error']}" for r in rows if r.get("error")]
    if errors:
        out += ["", "ERROR rows (their run failed):", *errors]
    text = "\n".join(out)
    print(text, flush=True)
    return text


def precision_rows(setting: str, fp32: dict, bf16: dict, steps_label: str) -> list[dict]:
    """fp32 against bf16-mixed: steps/s of each, their ratio, the final val loss each reaches."""
    error = bf16.get("error")
    key = setting.replace("=", "_").replace(" ", "_")
    return [
        row(
            f"{key}_fp32_steps_per_s",
            f"{setting}, fp32: train steps/s",
            fp32["train_steps_per_s"],
            "steps/s",
        ),
        row(
            f"{key}_bf16_steps_per_s",
            f"{setting}, bf16-mixed: train steps/s",
            None if error else bf16["train_steps_per_s"],
            "steps/s",
            detail=BF16,
            error=error,
        ),
        row(
            f"{key}_bf16_vs_fp32",
            f"{setting}: bf16-mixed / fp32 steps/s",
            None if error else bf16["train_steps_per_s"] / fp32["train_steps_per_s"],
            "x",
            error=error,
        ),
        row(
            f"{key}_fp32_val_loss",
            f"{setting}, fp32: final val loss after {steps_label}",
            fp32["final_val_loss"],
            "nats",
        ),
        row(
            f"{key}_bf16_val_loss",
            f"{setting}, bf16-mixed: final val loss after {steps_label}",
            None if error else bf16["final_val_loss"],
            "nats",
            error=error,
        ),
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    info = machine_info(args)  # before set_num_threads: torch_default_threads is torch's own
    args.torch_default_threads = info["torch_default_threads"]
    torch.set_num_threads(args.threads)
    began = time.time()
    results: dict = {
        "machine": info,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }

    def stage(name: str):
        print(f"[benchmark] {name} ({time.time() - began:.0f} s)", file=sys.stderr, flush=True)

    def attempt(fn, *a, **kw) -> dict:
        try:
            return fn(*a, **kw)
        except RuntimeError as e:  # a failed child: recorded, the other rows still measured
            return failed(e)

    tokens_file, cfg_reference = reference_tokens(args)
    reference, gptlab_reference, gptlab_reference_bf16 = [], [], []
    for i in range(args.repeats):  # alternate, so a burst of load hits every side alike
        stage(f"1. reference-style loop ({i + 1}/{args.repeats})")
        reference.append(bench_reference(args, tokens_file, f"reference-loop-{i}"))
        stage(f"1. gptlab-train experiment=reference ({i + 1}/{args.repeats})")
        gptlab_reference.append(bench_gptlab_reference(args, args.steps, f"gptlab-reference-{i}"))
        stage(f"2. gptlab-train experiment=reference {BF16} ({i + 1}/{args.repeats})")
        gptlab_reference_bf16.append(
            attempt(bench_gptlab_reference, args, args.steps, f"gptlab-reference-bf16-{i}", (BF16,))
        )
    results["reference_loop"] = best_of(reference)
    results["gptlab_reference"] = best_of(gptlab_reference)
    results["gptlab_reference_bf16"] = best_of(gptlab_reference_bf16)
    stage("3. bare loop vs Lightning")
    results["overhead"] = bench_overhead(args, cfg_reference)
    if args.ablations:
        stage("3b. Lightning variants")
        results["ablations"] = bench_ablations(args, cfg_reference, results["overhead"])
    if args.profile:
        stage("3c. cProfile")
        results["profile"] = bench_profile(args, cfg_reference, args.out.parent)
    stage("5. default run")
    warm_compact_cache(args)
    results["default_run"] = bench_default(args)
    stage(f"2. default run, {BF16}")
    results["default_run_bf16"] = attempt(bench_default, args, "default-bf16", (BF16,))
    stage("6. quiet, then busy (one CPU-bound competitor)")
    results["busy_machine"] = bench_busy(args)
    stage("4. start-up")
    results["startup"] = bench_startup(args)

    # the reference's final val loss and wall time
    ref = results["gptlab_reference"]
    if args.reference_val_loss is not None:
        target_loss, source = args.reference_val_loss, "--reference-val-loss"
        if args.reference_wall_s is not None:
            ref_wall, wall_source = args.reference_wall_s, "--reference-wall-s"
        else:
            ref_wall = (
                results["startup"]["seconds"] + args.reference_steps / ref["steps_per_s_incl_val"]
            )
            wall_source = f"estimated: start-up + {args.reference_steps} steps at the measured rate"
    elif args.reference_steps == args.steps:
        target_loss, source = ref["final_val_loss"], f"experiment=reference, {args.steps} steps"
        ref_wall, wall_source = ref["command_wall_seconds"], "that run, command to exit"
    else:
        stage(f"5. gptlab-train experiment=reference, {args.reference_steps} steps")
        full = bench_gptlab_reference(args, args.reference_steps, "gptlab-reference-full")
        results["gptlab_reference_full"] = full
        target_loss, source = (
            full["final_val_loss"],
            f"experiment=reference, {args.reference_steps} steps",
        )
        ref_wall, wall_source = full["command_wall_seconds"], "that run, command to exit"
    reached = time_to_loss(results["default_run"], target_loss)
    results["time_to_reference_loss"] = {
        "reference_val_loss": target_loss,
        "source": source,
        "reference_wall_s": ref_wall,
        "reference_wall_source": wall_source,
        "default_seconds": reached,
        "reference_script_wall_s_estimate": args.reference_steps
        / results["reference_loop"]["steps_per_s_incl_eval"],
    }

    rl, ov, busy = results["reference_loop"], results["overhead"], results["busy_machine"]
    default, default_bf16 = results["default_run"], results["default_run_bf16"]
    speedup = ref["train_steps_per_s"] / rl["train_steps_per_s"]
    default_steps = f"{default['steps']} steps"
    rows = [
        row(
            "cpu_bf16",
            "CPU bf16 instructions (/proc/cpuinfo flags)",
            info["cpu_bf16"],
            "",
            detail=f"{info['cpu_model']}; amx_bf16/amx_tile: AMX, avx512_bf16: AVX512-BF16",
        ),
        row(
            "reference_loop_steps_per_s",
            "reference-style loop: train steps/s",
            rl["train_steps_per_s"],
            "steps/s",
            detail=f"{rl['steps']} steps, estimate_loss excluded",
        ),
        row(
            "gptlab_reference_steps_per_s",
            "gptlab-train experiment=reference: train steps/s",
            ref["train_steps_per_s"],
            "steps/s",
            detail="metrics.json tokens_per_sec / 64, validation excluded",
        ),
        row(
            "speedup_vs_reference",
            "speed-up, train steps only",
            speedup,
            "x",
            "speedup_vs_reference",
        ),
        row(
            "speedup_incl_validation",
            "speed-up, validation included (informative)",
            ref["steps_per_s_incl_val"] / rl["steps_per_s_incl_eval"],
            "x",
            detail="each side with its own validation: exact val split every 50 vs 2x20 batches every 20",
        ),
        *precision_rows(
            "experiment=reference", ref, results["gptlab_reference_bf16"], f"{ref['steps']} steps"
        ),
        row(
            "bare_steps_per_s",
            "gptlab GPT, bare PyTorch loop: steps/s",
            ov["bare"]["train_steps_per_s"],
            "steps/s",
        ),
        row(
            "lightning_steps_per_s",
            "gptlab GPT under Lightning (as shipped): steps/s",
            ov["lightning"]["train_steps_per_s"],
            "steps/s",
        ),
        row(
            "lightning_overhead_pct",
            "Lightning overhead at batch 4 x context 16",
            ov["overhead_pct"],
            "%",
            "lightning_overhead_pct",
        ),
        row(
            "startup_s",
            "start-up to first train/loss record (median)",
            results["startup"]["seconds"],
            "s",
            "startup_s",
        ),
        row(
            "default_peak_rss_mb",
            "peak RSS of the default run",
            default["peak_rss_mb"],
            "MB",
            "default_peak_rss_mb",
        ),
        *precision_rows("default run", default, default_bf16, default_steps),
        row("reference_val_loss", "reference's final val loss", target_loss, "nats", detail=source),
        row(
            "default_time_to_reference_loss_s",
            "default run: time to that val loss",
            reached,
            "s",
            detail="command start to the first val/loss at or below it; n/a: not reached",
        ),
        row("reference_wall_s", "reference run wall time", ref_wall, "s", detail=wall_source),
        row(
            "time_to_reference_loss_fraction",
            "time to reference loss / reference wall time",
            None if reached is None else reached / ref_wall,
            "",
            "time_to_reference_loss_fraction",
        ),
        row(
            "quiet_tokens_per_s",
            "default run as shipped, quiet: tokens/s",
            busy["quiet"]["tokens_per_sec"],
            "tokens/s",
            detail=f"{args.busy_steps} steps, no num_threads (torch's default: "
            f"{info['torch_default_threads']} threads)",
        ),
        row(
            "busy_tokens_per_s",
            "... with one CPU-bound competitor: tokens/s",
            busy["busy"]["tokens_per_sec"],
            "tokens/s",
            detail=f"competitor held {busy['competitor_cores']:.2f} cores meanwhile",
        ),
        row("busy_quiet_ratio", "busy / quiet tokens/s", busy["ratio"], "", "busy_quiet_ratio"),
    ]
    for ablation in results.get("ablations", []):
        if "overhead_pct" in ablation:
            rows.append(
                row(
                    "ablation",
                    f"  variant: {ablation['variant']}",
                    ablation["overhead_pct"],
                    "% overhead",
                )
            )
    info["load_average_end"] = list(os.getloadavg())
    info["benchmark_seconds"] = round(time.time() - began, 1)
    results["rows"] = rows
    results["targets"] = {
        k: {"op": v[0], "threshold": v[1], "what": v[2]} for k, v in TARGETS.items()
    }
    results["table"] = print_table(rows, info)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(
        f"Wrote {args.out} ({info['benchmark_seconds']:.0f} s; load average "
        f"{info['load_average_start'][0]:.1f} -> {info['load_average_end'][0]:.1f})",
        flush=True,
    )
    errors = [r["name"] for r in rows if r.get("error")]
    if errors:
        print(
            f"benchmark: {len(errors)} row(s) without a value, their run failed (see ERROR rows)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
