"""gptlab: train small decoder-only GPTs written from scratch, with Lightning and Hydra.

Importing gptlab (every entry point does) sets GOMP_SPINCOUNT=1000 before torch loads OpenMP: an
idle thread spins briefly, then sleeps, so a run keeps its speed alone and beside another busy
process (docs/performance.md). A user's own OMP_*/GOMP_* settings are left alone."""

import os
import sys

__version__ = "0.1.0"

PRINT_ONLY = ("OMP_DISPLAY_ENV", "OMP_DISPLAY_AFFINITY")
if "torch" not in sys.modules and not any(
    k.startswith(("OMP_", "GOMP_")) and k not in PRINT_ONLY for k in os.environ
):
    os.environ["GOMP_SPINCOUNT"] = "1000"
