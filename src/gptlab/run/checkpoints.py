"""Finding and loading gptlab checkpoints, for every tool that starts from one.

A checkpoint may come from anyone, so it is loaded with `weights_only=True` (tensors and plain
values; nothing is unpickled) and what gptlab builds from it is checked first: the model settings
against GPTConfig's fields and types, the tokenizer against tiktoken's encodings, the weights'
names and shapes against the model they load into. Light to import: torch and Lightning come in
with the functions that need them, so a tool checks its arguments in a fraction of a second."""

import dataclasses
import pickle
import types
import typing
from pathlib import Path
from typing import Any

from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.run import directory

# Model keys that decide the weights' shapes; dropout, attention kernel and compile may change.
ARCHITECTURE_KEYS = (
    "vocab_size",
    "context_length",
    "d_model",
    "num_heads",
    "num_blocks",
    "ffn_mult",
    "norm",
    "positional",
    "tie_weights",
    "bias",
    *("norm_layer", "qk_norm", "activation", "logit_softcap"),  # the toggles (not zero_init)
)


def find_checkpoint(path: str | Path | None, prefer: str = directory.BEST) -> Path:
    """A checkpoint file as given, or a run directory's checkpoint: `prefer` (best, for the tools
    that read weights; last, to train on), else the other."""
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
    candidates = [directory.best_checkpoint(given), directory.last_checkpoint(given)]
    if prefer == directory.LAST:
        candidates.reverse()
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
    except pickle.UnpicklingError:
        raise ConfigError(
            f"ckpt_path: '{path}' holds Python objects besides tensors and plain values. gptlab "
            "never unpickles them (unpickling runs whatever code the file names), and every "
            "checkpoint gptlab-train saves holds none. Use one saved by gptlab-train."
        ) from None
    except Exception as e:  # zip and EOF errors all mean the same thing here
        raise ConfigError(
            f"ckpt_path: '{path}' is truncated or not a checkpoint; torch could not read it "
            f"({first_line(e)}). Use another, e.g. the run's last checkpoint."
        ) from None
    if not isinstance(checkpoint, dict):
        raise ConfigError(
            f"ckpt_path: '{path}' is not a checkpoint (it holds a {type(checkpoint).__name__})"
        )
    return checkpoint


def fits(annotation: Any, value: Any) -> bool:
    """Whether `value` is of a field's type: int, float (an int too), bool, str, or Optional."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(fits(a, value) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def not_gptlab(path: str | Path, what: str) -> ConfigError:
    return ConfigError(
        f"ckpt_path: '{path}' does not hold a gptlab model this version can rebuild ({what}); "
        "give one saved by gptlab-train."
    )


def checked_model(model: Any, path: str | Path) -> dict:
    """The model settings of a checkpoint, each a field of GPTConfig of the field's type."""
    if not isinstance(model, dict):
        raise not_gptlab(path, "no model settings")
    hints = typing.get_type_hints(GPTConfig)
    for key, value in model.items():
        if key not in hints:
            raise not_gptlab(path, f"an unknown model setting {key!r}")
        if not fits(hints[key], value):
            raise not_gptlab(path, f"model.{key} is {value!r}, not a {hints[key]}")
    return dataclasses.asdict(GPTConfig(**model))  # sizes and choices checked too


def checked_tokenizer(tokenizer: Any, path: str | Path) -> dict:
    """A tiktoken encoding gptlab knows and, for a compact vocabulary, its sorted id list."""
    import tiktoken

    if not isinstance(tokenizer, dict) or set(tokenizer) != {"encoding", "vocab"}:
        raise not_gptlab(path, "no tokenizer settings")
    encoding, vocab = tokenizer["encoding"], tokenizer["vocab"]
    if encoding not in tiktoken.list_encoding_names():
        raise not_gptlab(path, f"an unknown tiktoken encoding {encoding!r}")
    if vocab is not None:
        ids = vocab if isinstance(vocab, list) else None
        ordered = ids is not None and all(type(i) is int for i in ids)
        ordered = ordered and all(0 <= a < b for a, b in zip(ids, ids[1:], strict=False))
        if not ordered or not ids:
            raise not_gptlab(path, "a compact vocabulary that is not a sorted list of token ids")
    return {"encoding": encoding, "vocab": vocab}


def model_settings(checkpoint: dict, path: str | Path) -> tuple[dict, dict]:
    """(model, tokenizer) settings of a checkpoint, checked: what gptlab builds a model from."""
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict):
        raise not_gptlab(path, "no hyperparameters")
    return checked_model(hparams.get("model"), path), checked_tokenizer(
        hparams.get("tokenizer"), path
    )


def weights(checkpoint: dict, path: str | Path) -> dict:
    """The checkpoint's weights: tensors by name (a torch.compile'd model's `_orig_mod.` prefix
    dropped)."""
    import torch

    state = checkpoint.get("state_dict")
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise not_gptlab(path, "no weights")
    return {k.replace("_orig_mod.", ""): v for k, v in state.items()}


def check_weights(module, state: dict, path: str | Path) -> None:
    """The weights must be the module's own: the same names and shapes."""
    own = module.state_dict()
    if set(own) != set(state):
        differ = sorted(set(own) ^ set(state))[:3]
        raise not_gptlab(path, f"its weights are named otherwise: {', '.join(differ)} ...")
    for name, tensor in own.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            shapes = f"{tuple(state[name].shape)} where the model has {tuple(tensor.shape)}"
            raise not_gptlab(path, f"{name} is {shapes}")


def step_of(checkpoint: dict) -> int:
    """The checkpoint's step counter, a whole number (0 when it has none)."""
    step = checkpoint.get("global_step", 0)
    return step if type(step) is int and step >= 0 else 0


def check_architecture(path: str | Path, checkpoint: dict, hparams: dict) -> None:
    """Refuse a checkpoint trained with another architecture or vocabulary, naming what differs."""
    saved_model, saved_tokenizer = model_settings(checkpoint, path)
    model = hparams["model"]
    differ = [
        f"model.{k}: checkpoint {saved_model.get(k)!r}, now {model[k]!r}"
        for k in ARCHITECTURE_KEYS
        if saved_model.get(k) != model[k]
    ]
    if saved_tokenizer != hparams["tokenizer"]:
        differ.append("the tokenizer (data.encoding / data.compact_vocab / corpus)")
    if differ:
        raise ConfigError(
            f"ckpt_path: '{path}' was trained with another architecture ({'; '.join(differ)}). "
            "Drop the overrides that change it, or start a new run without ckpt_path."
        )
