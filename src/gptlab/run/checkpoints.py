"""A gptlab checkpoint read for a tool: found, read by gptlab.reader (bounded, nothing
unpickled), its settings checked and the model its weights describe built once, bounded first
(gptlab.model.meta). Light to import: torch comes in when needed."""

import dataclasses
from pathlib import Path
from typing import NamedTuple

from gptlab import reader
from gptlab.data.tokenizer import check_state
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.run import directory
from gptlab.run.overrides import as_override

MAX_BLOCKS = 1024  # blocks a file may ask gptlab to build (real GPTs have a hundred at most)

MAX_STEP = 2**53  # a step counter beyond any run


def find_checkpoint(path: str | Path | None, prefer: str = directory.BEST) -> Path:
    """A checkpoint file as given, or a run directory's: `prefer` (best or last), else the other."""
    if path is None or str(path).strip() == "":
        raise ConfigError(
            "ckpt_path is not set. Give a checkpoint file or a run directory, "
            "e.g. ckpt_path=outputs/<date>/<time>."
        )
    given = Path(path).expanduser()
    if given.is_file():
        return given
    if given.exists() and not given.is_dir():  # a FIFO, a device, a link to /dev/zero
        raise ConfigError(
            f"ckpt_path: '{given}' is not a regular file (nor a directory). Give a .ckpt file "
            "or a run directory (e.g. outputs/<date>/<time>)."
        )
    if not given.is_dir():
        raise ConfigError(
            f"ckpt_path: '{given}' does not exist. Give a .ckpt file or a run directory "
            "(e.g. outputs/<date>/<time>)."
        )
    candidates = [directory.best_checkpoint(given), directory.last_checkpoint(given)]
    if prefer == directory.LAST:
        candidates.reverse()
    for candidate in candidates:
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    raise ConfigError(
        f"ckpt_path: the directory '{given}' holds no checkpoint (looked for "
        f"{' and '.join(str(c) for c in candidates)}). Give a .ckpt file or the directory of a "
        "run that saved one."
    )


def not_gptlab(path: str | Path, what: str) -> ConfigError:
    return ConfigError(
        f"ckpt_path: '{path}' does not hold a gptlab model this version can rebuild ({what}); "
        "give one saved by gptlab-train."
    )


def model_settings(checkpoint: dict, path: str | Path) -> tuple[dict, dict]:
    """Its model settings, each a field of GPTConfig, checked by GPTConfig; its tokenizer a
    tiktoken encoding on this machine and, for a compact vocabulary, its sorted id list."""
    hparams = checkpoint.get("hyper_parameters")
    model = hparams.get("model") if isinstance(hparams, dict) else None
    if not isinstance(model, dict):
        raise not_gptlab(path, "no model settings")
    unknown = set(model) - {f.name for f in dataclasses.fields(GPTConfig)}
    if unknown:
        raise not_gptlab(path, f"an unknown model setting {sorted(unknown)[0]!r}")
    try:
        model = dataclasses.asdict(GPTConfig(**model))
    except ConfigError as e:
        raise not_gptlab(path, str(e).rstrip(".")) from None
    tokenizer = hparams.get("tokenizer")
    problem = check_state(tokenizer)
    if problem:
        raise not_gptlab(path, problem)
    return model, {"encoding": tokenizer["encoding"], "vocab": tokenizer["vocab"]}


def weights(checkpoint: dict, path: str | Path) -> dict:
    """The checkpoint's tensors by name (reader.load_checkpoint checked each is one), finite
    (torch.compile's `_orig_mod.` dropped)."""
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict):
        raise not_gptlab(path, "no weights")
    broken = [k for k, v in state.items() if v.is_floating_point() and not v.isfinite().all()]
    if broken:
        raise ConfigError(
            f"ckpt_path: '{path}' holds weights that are not finite numbers (NaN or infinity in "
            f"{', '.join(broken[:3])}): its run diverged or the file is damaged. Use an earlier "
            "checkpoint, e.g. the run's best.ckpt."
        )
    return {k.replace("_orig_mod.", ""): v for k, v in state.items()}


def count_blocks(model: dict, state: dict, path: str | Path) -> None:
    """The blocks a checkpoint's weights name, counted before any model is built: as many as
    its settings say, and few enough to build (a file naming 20,000 would take minutes)."""
    blocks = {k.split(".")[2] for k in state if k.startswith("model.blocks.")}
    if len(blocks) > MAX_BLOCKS:
        raise not_gptlab(path, f"its weights name {len(blocks):,} blocks")
    if model["num_blocks"] != len(blocks):
        found = f"model.num_blocks is {model['num_blocks']} but its weights hold {len(blocks)}"
        raise not_gptlab(path, found)


class Trained(NamedTuple):
    """A checkpoint read for a tool: checked settings, weights (their model bounded), step."""

    model: dict
    tokenizer: dict
    weights: dict
    step: int


def read_trained(path: str | Path, tensors: bool = True) -> Trained:
    """A checkpoint's settings checked and, for its `tensors`, its weights (dense, finite, the
    blocks its settings say); the model they describe is bounded where it is built
    (gptlab.model.meta.build_gpt)."""
    checkpoint = reader.load_checkpoint(path)
    model, tokenizer = model_settings(checkpoint, path)
    state = {}
    if tensors:
        state = weights(checkpoint, path)
        count_blocks(model, state, path)
    return Trained({**model, "compile": False}, tokenizer, state, step_of(checkpoint))


def load_model(path: str | Path, map_location="cpu"):
    """(the GPT in eval mode, its Tokenizer, its step), from checked settings and weights only:
    never Lightning's load_from_checkpoint (which builds whatever the file says)."""
    from gptlab.data.tokenizer import Tokenizer
    from gptlab.model.meta import build_gpt

    trained = read_trained(path)
    model = build_gpt(GPTConfig(**trained.model), trained.weights, f"ckpt_path: '{path}'")
    tokenizer = Tokenizer(**trained.tokenizer)
    return model.to(map_location).eval(), tokenizer, trained.step


def step_of(checkpoint: dict) -> int:
    """The checkpoint's step counter, a whole number (0 when it has none)."""
    step = checkpoint.get("global_step", 0)
    if type(step) is not int or step < 0:
        return 0
    if step >= MAX_STEP:
        raise ConfigError(
            f"ckpt_path: the checkpoint's step counter is {step}, a step no run reaches: the "
            "file is damaged or crafted. Give one saved by gptlab-train."
        )
    return step


def check_architecture(path: str | Path, trained: Trained, hparams: dict) -> None:
    """Refuse a checkpoint trained with another architecture or vocabulary, naming what differs."""
    model, old = hparams["model"], trained.model
    changed = [k for k in GPTConfig.architecture() if old[k] != model[k]]
    differ = [f"model.{k}: checkpoint {old[k]!r}, now {model[k]!r}" for k in changed]
    if trained.tokenizer != hparams["tokenizer"]:
        differ.append("the tokenizer (data.encoding / data.compact_vocab / corpus)")
    # the checkpoint's own settings as overrides (the context length is the data's)
    wanted = [
        as_override("data.context_length" if k == "context_length" else f"model.{k}", old[k])
        for k in changed
        if k != "vocab_size"
    ]
    add = f"add its settings ({' '.join(wanted)}), or " if wanted else ""
    if differ:
        raise ConfigError(
            f"ckpt_path: '{path}' was trained with another architecture ({'; '.join(differ)}). "
            f"To continue from it, give the command line it was trained with (its run's "
            f".hydra/overrides.yaml, e.g. debug=fast): {add}drop the overrides of yours that "
            "change it. Or start a new run without ckpt_path."
        )
