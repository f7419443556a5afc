"""gptlab: train small decoder-only GPTs written from scratch, with Lightning and Hydra.
Importing it applies the process defaults (gptlab.process) and ignores Lightning's noise."""

import os

from gptlab.noise import ignore_known_warnings
from gptlab.process import keep_freed_memory, set_openmp_default

__version__ = "0.1.0"

# which defaults this process got
PROCESS_DEFAULTS = {
    "openmp": set_openmp_default(os.environ),
    "malloc": keep_freed_memory(os.environ),
}
ignore_known_warnings()
