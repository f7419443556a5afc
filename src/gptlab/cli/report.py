"""gptlab-report: the summary of a finished (or interrupted) sweep directory, written again.

    gptlab-report outputs/multirun/2026-11-29/12-00-00 [--scaling]

The files a multirun writes at its end (docs/sweeps.md); prints their headline and where they are.
--scaling also fits scaling laws (docs/scaling.md), as a sweep whose jobs set flops_budget does by
itself; with too few budgets or sizes to fit, exit 2 once the rest of the summary is written.
"""

import argparse
import sys
import time
from pathlib import Path

from gptlab.config.resolvers import unique_dir
from gptlab.exits import BAD_INPUT
from gptlab.run import directory, ownership
from gptlab.sweep.scaling import METRICS, TooFewPoints
from gptlab.sweep.summary import write_summary


def report_dir(sweep_dir: Path) -> Path:
    """Where the report goes: the sweep directory when it is the user's own; for anyone else's
    (read, never written) a new folder under ./outputs/sweep_report/."""
    try:
        ownership.check_sweep(sweep_dir)
        return sweep_dir
    except ownership.ForeignDirectory as e:
        out = Path(unique_dir(time.strftime("outputs/sweep_report/%Y-%m-%d/%H-%M-%S")))
        print(
            f"{sweep_dir}: not a sweep directory gptlab made here for you ({e}); it is read as "
            f"data and its report written to {out}.",
            file=sys.stderr,
        )
        return out


def report(sweep_dir: Path, args: argparse.Namespace) -> int:
    """One sweep's summary written and its headline printed; the exit code."""
    if not any(directory.saved_config(job).is_file() for job in ownership.job_dirs(sweep_dir)):
        print(f"{sweep_dir}: no sweep jobs here (no */.hydra/config.yaml)", file=sys.stderr)
        return 1
    out = report_dir(sweep_dir)
    try:
        _, head = write_summary(
            sweep_dir, args.target_val_loss, out=out, scaling=args.scaling, metric=args.metric
        )
    except TooFewPoints as e:
        print(f"{sweep_dir}: no scaling fit: {e}", file=sys.stderr)
        head, status = [], BAD_INPUT
    else:
        status = 0
    print(*head, f"Summary: {out / 'summary.md'} (also .csv, .png)", sep="\n")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptlab-report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "sweep_dir", nargs="+", type=Path, help="a multirun directory (0/, 1/, ...)"
    )
    parser.add_argument("--target-val-loss", type=float, help="seconds to reach this val loss")
    parser.add_argument("--scaling", action="store_true", help="fit scaling laws (docs/scaling.md)")
    parser.add_argument("--metric", choices=METRICS, default=METRICS[0], help="the loss fitted")
    args = parser.parse_args(argv)
    return max(report(sweep_dir, args) for sweep_dir in args.sweep_dir)
