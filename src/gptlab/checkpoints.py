"""Finding and loading gptlab checkpoints, for every tool that starts from one.

`find_checkpoint` turns what a user typed (a .ckpt file, or a run directory) into a file;
`load_checkpoint` reads it safely (`weights_only=True`: gptlab checkpoints hold plain types);
`load_module` rebuilds the GPTModule from the checkpoint alone (its hyperparameters hold the
model config and the tokenizer). Bad input raises ConfigError naming `ckpt_path` and the path.
The module is light to import: torch and Lightning come in with the functions that need them,
so a tool can check its arguments and find its checkpoint in a fraction of a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gptlab.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from gptlab.module import GPTModule

# Where a run directory keeps its checkpoints, in order of preference.
RUN_DIR_CHECKPOINTS = ("checkpoints/best.ckpt", "checkpoints/last.ckpt")
COMPILE_PREFIX = "_orig_mod."  # torch.compile wraps the model; its state_dict keys carry this


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or a run directory's checkpoints/best.ckpt, else last.ckpt."""
    if path is None or str(path).strip() == "":
        raise ConfigError(
            "ckpt_path is not set. Give a checkpoint file or a run directory, "
            "e.g. ckpt_path=outputs/<date>/<time>."
        )
    given = Path(path).expanduser()
    if given.is_file():
        return given
    if given.is_dir():
        for name in RUN_DIR_CHECKPOINTS:
            if (given / name).is_file():
                return given / name
        raise ConfigError(
            f"ckpt_path: the directory '{given}' holds no checkpoint (looked for "
            f"{' and '.join(RUN_DIR_CHECKPOINTS)}). Give a .ckpt file or the directory of a run "
            "that saved one."
        )
    raise ConfigError(
        f"ckpt_path: '{given}' does not exist. Give a .ckpt file or a run directory "
        "(e.g. outputs/<date>/<time>)."
    )


def load_checkpoint(path: str | Path) -> dict:
    """torch.load on the CPU with weights_only=True; an unreadable file is a ConfigError."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"ckpt_path: '{path}' does not exist.") from None
    except Exception as e:  # zip, unpickling and EOF errors all mean the same thing here
        raise ConfigError(
            f"ckpt_path: '{path}' is truncated or not a checkpoint; torch could not read it "
            f"({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else 'no details'}). "
            "Use another checkpoint, e.g. the run's checkpoints/last.ckpt."
        ) from None
    if not isinstance(checkpoint, dict):
        kind = type(checkpoint).__name__
        raise ConfigError(f"ckpt_path: '{path}' is not a checkpoint (it holds a {kind}, not a dict).")
    return checkpoint


def strip_compile_prefix(state_dict: dict) -> dict:
    """Keys saved from a torch.compile'd model, `model._orig_mod.x`, back to `model.x`."""
    return {key.replace(COMPILE_PREFIX, ""): value for key, value in state_dict.items()}


def load_module(path: str | Path, map_location: str | torch.device = "cpu") -> GPTModule:
    """The GPTModule saved in a checkpoint file, in eval mode, on `map_location`."""
    checkpoint = load_checkpoint(path)  # an unreadable file fails before Lightning is imported
    from gptlab.module import GPTModule

    if "hyper_parameters" not in checkpoint or "state_dict" not in checkpoint:
        raise ConfigError(
            f"ckpt_path: '{path}' is not a gptlab checkpoint (no hyper_parameters or state_dict); "
            "give one saved by gptlab-train."
        )
    try:
        hparams = dict(checkpoint["hyper_parameters"])
        hparams["model"] = {**hparams["model"], "compile": False}  # nothing to compile to load or sample
        module = GPTModule(**hparams)
        module.load_state_dict(strip_compile_prefix(checkpoint["state_dict"]))
    except (KeyError, TypeError, RuntimeError) as e:  # hyperparameters or weights of another model
        raise ConfigError(
            f"ckpt_path: '{path}' does not hold a gptlab model this version can rebuild "
            f"({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else 'no details'})."
        ) from None
    return module.to(map_location).eval()
