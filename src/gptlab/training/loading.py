"""A trained model from a checkpoint, for the tools that read one (eval, generate, inspect): its
checked model and tokenizer settings and its weights only (gptlab.run.checkpoints), never
Lightning's `load_from_checkpoint`, which would build from whatever the file says."""

from pathlib import Path

from gptlab.run.checkpoints import bounded_model, load_checkpoint, model_settings, weights
from gptlab.training.module import GPTModule


def load_module(path: str | Path, map_location="cpu"):
    """The GPTModule saved in a checkpoint file, in eval mode (see module_from)."""
    checkpoint = load_checkpoint(path)  # an unreadable file fails before Lightning is imported
    return module_from(checkpoint, path, map_location)


def module_from(checkpoint: dict, path: str | Path, map_location="cpu"):
    """The GPTModule of a loaded checkpoint, in eval mode, from its checked model and tokenizer
    settings and its weights only."""
    model, tokenizer = model_settings(checkpoint, path)
    state = weights(checkpoint, path)
    bounded_model(model, state, path)  # before any memory is taken for it
    module = GPTModule(model={**model, "compile": False}, optim={}, tokenizer=tokenizer)
    module.load_state_dict(state)
    return module.to(map_location).eval()
