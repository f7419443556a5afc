"""gptlab: train small decoder-only GPTs written from scratch, with Lightning and Hydra.

Importing gptlab first (every entry point does) sets OMP_WAIT_POLICY=PASSIVE before torch loads
its OpenMP runtime, which reads the variable once: waiting threads then sleep instead of
spinning, so a run keeps most of its speed beside another CPU-bound process (on 2 cores: 0.17
of the quiet tokens/s spinning, ~0.55 passive; docs/performance.md). A user's own OpenMP
settings (any OMP_* variable but the two that only print, GOMP_SPINCOUNT) are left alone.
"""

import os
import sys

__version__ = "0.1.0"

PRINT_ONLY = ("OMP_DISPLAY_ENV", "OMP_DISPLAY_AFFINITY")
if "torch" not in sys.modules and not any(
    k.startswith(("OMP_", "GOMP_")) and k not in PRINT_ONLY for k in os.environ
):
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
