"""gptlab: train small decoder-only GPTs written from scratch, with Lightning and Hydra.

Importing gptlab (every entry point does) sets OMP_WAIT_POLICY=PASSIVE before torch loads OpenMP,
so idle threads sleep instead of spinning beside another busy process (docs/performance.md);
a user's own OMP_*/GOMP_* settings are left alone."""

import os
import sys

__version__ = "0.1.0"

PRINT_ONLY = ("OMP_DISPLAY_ENV", "OMP_DISPLAY_AFFINITY")
if "torch" not in sys.modules and not any(
    k.startswith(("OMP_", "GOMP_")) and k not in PRINT_ONLY for k in os.environ
):
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
