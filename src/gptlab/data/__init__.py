"""From a text file to batches of token ids."""

from gptlab.data.datamodule import GPTDataModule
from gptlab.data.tokenizer import Tokenizer

__all__ = ["GPTDataModule", "Tokenizer"]
