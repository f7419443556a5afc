"""From a text file to batches of token ids.

Names load on first use: `from gptlab.data.tokenizer import Tokenizer` (what gptlab-generate
needs) then does not pay for importing Lightning, which only the data module needs.
"""

from importlib import import_module

_EXPORTS = {"GPTDataModule": "gptlab.data.datamodule", "Tokenizer": "gptlab.data.tokenizer"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gptlab.data' has no attribute {name!r}")
