"""The GPT itself, free of Lightning: attention.py and gpt.py read top to bottom."""

from gptlab.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
