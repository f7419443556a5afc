"""gptlab: train small decoder-only GPTs written from scratch, with Lightning and Hydra.

Importing gptlab (every entry point does) applies its process defaults before torch loads:
OpenMP threads spin briefly, then sleep, and glibc malloc keeps freed memory for the next step
(gptlab/process.py). A user's own OMP_*/GOMP_* or MALLOC_* settings are left alone. Lightning's
known noise is ignored in every process, spawned DDP ranks too (gptlab/noise.py)."""

from gptlab.noise import ignore_known_warnings
from gptlab.process import apply_defaults

__version__ = "0.1.0"

PROCESS_DEFAULTS = apply_defaults()  # which defaults this process got: {"openmp": .., "malloc": ..}
ignore_known_warnings()
