#!/usr/bin/env python
"""Write summary.csv, summary.md and summary.png of a finished (or interrupted) sweep directory.

    python scripts/sweep_report.py outputs/multirun/2026-11-29/12-00-00 [--scaling]

The files a multirun writes at its end (gptlab.sweep.summary.write_summary; docs/sweeps.md), then
prints summary.md. --scaling also fits scaling laws (scaling.json, .md, .png; docs/scaling.md), as
a sweep whose jobs set flops_budget does by itself; with too few budgets or sizes to fit, exit 2
once the rest of the summary is written.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "sweep_dir", nargs="+", type=Path, help="a multirun directory (holding 0/, 1/, ...)"
    )
    parser.add_argument(
        "--target-val-loss", type=float, help="time_to_val_loss: seconds to reach this val loss"
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="fit scaling laws: scaling.json, .md, .png (by default when jobs set flops_budget)",
    )
    parser.add_argument(
        "--metric", choices=METRICS, default=METRICS[0], help="the loss a scaling fit reads"
    )
    args = parser.parse_args(argv)
    status = 0
    for sweep_dir in args.sweep_dir:
        if not any(directory.saved_config(job).is_file() for job in ownership.job_dirs(sweep_dir)):
            print(f"{sweep_dir}: no sweep jobs here (no */.hydra/config.yaml)", file=sys.stderr)
            status = 1
            continue
        out = report_dir(sweep_dir)
        try:
            write_summary(
                sweep_dir,
                args.target_val_loss,
                out=out,
                scaling=args.scaling,
                metric=args.metric,
            )
        except TooFewPoints as e:
            print(f"{sweep_dir}: no scaling fit: {e}", file=sys.stderr)
            status = BAD_INPUT
        print((out / "summary.md").read_text())
    return status


if __name__ == "__main__":
    sys.exit(main())
