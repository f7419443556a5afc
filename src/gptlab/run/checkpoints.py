"""Finding and loading gptlab checkpoints, for every tool that starts from one.

Light to import: torch and Lightning come in with the functions that need them, so a tool checks
its arguments and finds its checkpoint in a fraction of a second. Bad input is a ConfigError.
"""

from pathlib import Path

from gptlab.errors import ConfigError
from gptlab.run import directory


def find_checkpoint(path: str | Path | None) -> Path:
    """A checkpoint file as given, or a run directory's best checkpoint, else its last."""
    if path is None or str(path).strip() == "":
        raise ConfigError(
            "ckpt_path is not set. Give a checkpoint file or a run directory, "
            "e.g. ckpt_path=outputs/<date>/<time>."
        )
    given = Path(path).expanduser()
    if given.is_file():
        return given
    if not given.is_dir():
        raise ConfigError(
            f"ckpt_path: '{given}' does not exist. Give a .ckpt file or a run directory "
            "(e.g. outputs/<date>/<time>)."
        )
    candidates = (directory.best_checkpoint(given), directory.last_checkpoint(given))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"ckpt_path: the directory '{given}' holds no checkpoint (looked for "
        f"{' and '.join(str(c) for c in candidates)}). Give a .ckpt file or the directory of a "
        "run that saved one."
    )


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no details'}"


def load_checkpoint(path: str | Path) -> dict:
    """torch.load on the CPU with weights_only=True (gptlab checkpoints hold plain types)."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"ckpt_path: '{path}' does not exist.") from None
    except Exception as e:  # zip, unpickling and EOF errors all mean the same thing here
        raise ConfigError(
            f"ckpt_path: '{path}' is truncated or not a checkpoint; torch could not read it "
            f"({first_line(e)}). Use another, e.g. the run's last checkpoint."
        ) from None
    if not isinstance(checkpoint, dict):
        raise ConfigError(
            f"ckpt_path: '{path}' is not a checkpoint (it holds a {type(checkpoint).__name__})"
        )
    return checkpoint


def load_module(path: str | Path, map_location="cpu"):
    """The GPTModule saved in a checkpoint, in eval mode: its hyperparameters hold the model config
    and the tokenizer, so the file alone rebuilds both."""
    checkpoint = load_checkpoint(path)  # an unreadable file fails before Lightning is imported
    from gptlab.training.module import GPTModule

    try:
        hparams = dict(checkpoint["hyper_parameters"])
        hparams["model"] = {
            **hparams["model"],
            "compile": False,
        }  # nothing to compile to load or sample
        module = GPTModule(**hparams)
        # keys saved from a torch.compile'd model (`model._orig_mod.x`) load as `model.x`
        module.load_state_dict(
            {k.replace("_orig_mod.", ""): v for k, v in checkpoint["state_dict"].items()}
        )
    except (KeyError, TypeError, RuntimeError) as e:  # not gptlab's, or another model's weights
        raise ConfigError(
            f"ckpt_path: '{path}' does not hold a gptlab model this version can rebuild "
            f"({first_line(e)}); give one saved by gptlab-train."
        ) from None
    return module.to(map_location).eval()
