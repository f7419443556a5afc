"""The command-line tools (train, eval, generate, inspect, report, export) over one shared
wrapper. Run as one (a console script gptlab-*), Ctrl-C is one line and exit 130 from here on,
before the tool's imports (gptlab.exits.stop_at_ctrl_c)."""

import sys
from pathlib import Path

from gptlab.exits import stop_at_ctrl_c

if Path(sys.argv[0]).name.startswith("gptlab-"):
    stop_at_ctrl_c(Path(sys.argv[0]).name)
