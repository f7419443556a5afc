#!/usr/bin/env python
"""The summary of a sweep directory, written again: `gptlab-report` (gptlab.cli.report), kept
runnable as `python scripts/sweep_report.py <sweep dir> [--scaling]`."""

import sys

from gptlab.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
