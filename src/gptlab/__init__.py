"""gptlab: train small decoder-only GPTs written from scratch, with Lightning and Hydra.
Importing it applies the process defaults (gptlab.process) and ignores Lightning's noise."""

from gptlab.noise import ignore_known_warnings
from gptlab.process import apply_defaults

__version__ = "0.1.0"

PROCESS_DEFAULTS = apply_defaults()  # which defaults this process got: {"openmp": .., "malloc": ..}
ignore_known_warnings()
