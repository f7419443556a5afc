"""Starting again where a run stopped.

`gptlab-train resume=<run dir>` replays that run's own overrides (the newest set saved under
its `.hydra/`), then the ones on the new command line (later wins), into the same run
directory, from its `checkpoints/last.ckpt`. This run's own config and overrides are saved
under `.hydra/resume-<time>/`, so nothing of the original run is overwritten.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from gptlab.checkpoints import load_checkpoint
from gptlab.errors import ConfigError

# Model keys that decide the shapes of the weights; the others (dropout, attention kernel,
# compile) may change between a checkpoint and the run that continues it.
ARCHITECTURE_KEYS = ("vocab_size", "context_length", "d_model", "num_heads", "num_blocks", "ffn_mult",
                     "norm", "positional", "tie_weights", "bias")


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def newest_overrides(run_dir: Path) -> list[str]:
    """The overrides of the latest start of the run: the original or its latest resume."""
    saved = [run_dir / ".hydra" / "overrides.yaml", *(run_dir / ".hydra").glob("resume-*/overrides.yaml")]
    saved = [p for p in saved if p.is_file()]
    if not saved:
        raise ConfigError(
            f"resume: '{run_dir}' is not a gptlab run directory (no .hydra/overrides.yaml). "
            "Give the directory a run printed at its start, e.g. outputs/<date>/<time>."
        )
    return yaml.safe_load(max(saved, key=lambda p: p.stat().st_mtime).read_text()) or []


def resume_argv(argv: list[str]) -> list[str]:
    """Rewrite `gptlab-train resume=<dir> [overrides]` into a plain run that continues <dir>."""
    requests = [a for a in argv[1:] if a.startswith("resume=")]
    if not requests:
        return argv
    if any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError("resume= continues one run; it cannot be combined with -m/--multirun.")
    run_dir = Path(requests[-1].split("=", 1)[1]).expanduser().resolve()
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        raise ConfigError(
            f"resume: no checkpoint to continue from in '{run_dir}' (looked for {checkpoint}). "
            "The run stopped before its first checkpoint: start it again instead."
        )
    flags = [a for a in argv[1:] if a.startswith("-")]
    new = [a for a in argv[1:] if not a.startswith("-") and not a.startswith("resume=")]
    merged: dict[str, str] = {}
    for override in [*newest_overrides(run_dir), *new]:
        merged[override_key(override)] = override
    merged["ckpt_path"] = f"ckpt_path='{checkpoint}'"
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    hydra_overrides = [f"hydra.run.dir='{run_dir}'", f"hydra.output_subdir=.hydra/resume-{stamp}"]
    return [argv[0], *flags, *merged.values(), *hydra_overrides]


def check_checkpoint(path: str, model: dict, tokenizer: dict) -> int:
    """Refuse a checkpoint that is unreadable or was trained with another architecture or
    vocabulary, naming what differs; return the step it was saved at."""
    checkpoint = load_checkpoint(path)
    saved = checkpoint.get("hyper_parameters", {})
    saved_model = saved.get("model", {})
    differ = [f"model.{k}: checkpoint {saved_model.get(k)!r}, now {model[k]!r}"
              for k in ARCHITECTURE_KEYS if saved_model.get(k) != model[k]]
    if saved.get("tokenizer") != tokenizer:
        differ.append("the tokenizer (data.encoding / data.compact_vocab / corpus)")
    if differ:
        raise ConfigError(
            f"ckpt_path: '{path}' was trained with another architecture ({'; '.join(differ)}). "
            "Drop the overrides that change it, or start a new run without ckpt_path."
        )
    return int(checkpoint.get("global_step", 0))
