"""gptlab-report <sweep dir>... [--scaling]: a sweep's summary written again from its jobs (as a
multirun's end writes it: docs/sweeps.md, docs/scaling.md), its headline and paths printed."""

import argparse
import sys
import time
from pathlib import Path

from gptlab.config.resolvers import unique_dir
from gptlab.errors import ConfigError
from gptlab.exits import BAD_INPUT
from gptlab.run import directory, ownership
from gptlab.run.directory import where
from gptlab.run.place import PLACE
from gptlab.sweep.scaling import METRICS, TooFewPoints, fitted_metric
from gptlab.sweep.summary import write_summary


def report_dir(sweep_dir: Path) -> Path:
    """Where the report goes: the sweep directory when it is the user's own; for anyone else's
    (read, never written) a new folder under ./outputs/sweep_report/."""
    found = ownership.owner(where(sweep_dir))
    if found.own:
        return PLACE.admit(sweep_dir, "sweep_dir", own=True)
    out = PLACE.admit(unique_dir(time.strftime("outputs/sweep_report/%Y-%m-%d/%H-%M-%S")), "out")
    print(
        f"{sweep_dir}: not a sweep directory gptlab made here for you ({found.why}); it is read as "
        f"data and its report written to {out}.",
        file=sys.stderr,
    )
    return out


def report(sweep_dir: Path, args: argparse.Namespace) -> int:
    """One sweep's summary written and its headline printed; the exit code."""
    if not any(directory.saved_config(job).is_file() for job in ownership.job_dirs(sweep_dir)):
        print(f"{sweep_dir}: no sweep jobs here (no */.hydra/config.yaml)", file=sys.stderr)
        return 1
    try:
        out = report_dir(sweep_dir)
    except ConfigError as e:
        print(f"gptlab-report: {e}", file=sys.stderr)
        return BAD_INPUT
    head, status = [], 0
    try:
        _, head = write_summary(
            sweep_dir, args.target_val_loss, out=out, scaling=args.scaling, metric=args.metric
        )
    except TooFewPoints as e:  # with --scaling: exit 2 once the rest is written
        print(f"{sweep_dir}: no scaling fit: {e}", file=sys.stderr)
        status = BAD_INPUT
    print(*head, f"Summary: {out / 'summary.md'} (also .csv, .png)", sep="\n")
    return status


def metric(name: str) -> str:
    """--metric's value, or argparse's refusal (exit 2) saying what a fit takes."""
    try:
        return fitted_metric(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptlab-report", description=__doc__)
    parser.add_argument("sweep_dir", nargs="+", type=Path, help="a multirun directory")
    parser.add_argument("--target-val-loss", type=float, help="seconds to reach this val loss")
    parser.add_argument("--scaling", action="store_true", help="fit scaling laws (docs/scaling.md)")
    parser.add_argument(
        "--metric",
        type=metric,
        default=METRICS[0],
        help=f"the loss fitted: {', '.join(METRICS)} or downstream/<task>/bpb",
    )
    args = parser.parse_args(argv)
    return max(report(sweep_dir, args) for sweep_dir in args.sweep_dir)
