#!/usr/bin/env python
"""Write summary.csv, summary.md and summary.png of a finished (or interrupted) sweep directory.

    python scripts/sweep_report.py outputs/multirun/2026-11-29/12-00-00

The same files a multirun writes at its end (gptlab.sweep.write_summary): one row a job, sorted
by best val loss, failed jobs last with their reason; the plot of val loss against parameter
count and against each swept knob. Prints the best job and the table.
"""

import sys

from gptlab.sweep import main

if __name__ == "__main__":
    sys.exit(main())
