"""gptlab: train small decoder-only GPTs written from scratch, with Lightning and Hydra."""

__version__ = "0.1.0"
