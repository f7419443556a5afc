"""Continuing a run or a sweep where it stopped.

`resume=<run dir>` replays the run's newest saved overrides, then the new command line's (later
wins), into the same directory, which continues from its `checkpoints/last.ckpt`; so does a
requeued SLURM job. `resume=<sweep dir>` re-launches the sweep into its directory. A directory is
input like any other: overrides that could run code (`_target_`, `hydra.*`) are not replayed."""

import logging
import os
import sys
import time
from pathlib import Path

import yaml
from omegaconf import DictConfig

from gptlab.errors import ConfigError

log = logging.getLogger(__name__)
LAST = Path("checkpoints") / "last.ckpt"
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


def override_key(override: str) -> str:
    """`+model.x=1` -> `model.x`"""
    return str(override).split("=", 1)[0].lstrip("+~")


def newest_overrides(run_dir: Path) -> list[str]:
    """The overrides of the latest start of the run: the original or its latest resume."""
    saved = [
        run_dir / ".hydra" / "overrides.yaml",
        *(run_dir / ".hydra").glob("resume-*/overrides.yaml"),
    ]
    saved = [p for p in saved if p.is_file()]
    if not saved:
        raise ConfigError(
            f"resume: '{run_dir}' is not a gptlab run directory (no .hydra/overrides.yaml) "
            "nor a sweep directory (no multirun.yaml). Give the directory a run printed at its "
            "start, e.g. outputs/<date>/<time>, or outputs/multirun/<date>/<time>."
        )
    return yaml.safe_load(max(saved, key=lambda p: p.stat().st_mtime).read_text()) or []


def sweep_overrides(sweep_dir: Path) -> list[str]:
    """The task overrides a sweep was launched with; Optuna searches continue from their storage."""
    saved = yaml.safe_load((sweep_dir / "multirun.yaml").read_text()) or {}
    hydra = saved.get("hydra", {})
    if "optuna" in str(hydra.get("sweeper", {}).get("_target_", "")):
        raise ConfigError(
            f"resume: '{sweep_dir}' is an Optuna search. It continues from its study's "
            "storage: run the same command again with hydra.sweeper.storage=sqlite:///<file> "
            "(as the first run had); it adds hydra.sweeper.n_trials new trials in a new sweep "
            "directory."
        )
    return list(hydra.get("overrides", {}).get("task", []))


def trusted(overrides: list[str], source: Path) -> list[str]:
    """The overrides minus those that could run code; the skipped ones are named on stderr."""
    replayable = [o for o in overrides if override_key(o) not in ("resume", "ckpt_path")]
    kept = [
        o for o in replayable if "_target_" not in o and not override_key(o).startswith("hydra")
    ]
    skipped = [o for o in replayable if o not in kept]
    if skipped:
        print(
            f"gptlab-train: resume: not replaying {len(skipped)} override(s) saved in {source} that "
            f"could run code or move the run: {' '.join(skipped)}. Give them on the command line if "
            "you trust them.",
            file=sys.stderr,
        )
    return kept


def resume_argv(argv: list[str]) -> list[str]:
    """Rewrite `gptlab-train resume=<dir> [overrides]` into the run or sweep that continues <dir>."""
    requests = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("resume=")]
    if not requests:
        return argv
    run_dir = Path(requests[-1]).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(
            f"resume={requests[-1]}: the directory '{run_dir}' does not exist. Give the "
            "directory a run printed at its start (outputs/<date>/<time>) or a sweep's "
            "(outputs/multirun/<date>/<time>)."
        )
    flags = [a for a in argv[1:] if a.startswith("-") and a not in ("-m", "--multirun")]
    new = [a for a in argv[1:] if not a.startswith("-") and not a.startswith("resume=")]
    if (run_dir / "multirun.yaml").is_file():
        saved, place = sweep_overrides(run_dir), ["-m", f"hydra.sweep.dir='{run_dir}'"]
    else:
        if any(a in ("-m", "--multirun") for a in argv):
            raise ConfigError("resume= of a run directory continues one run; drop -m/--multirun.")
        if not (run_dir / LAST).is_file():
            raise ConfigError(
                f"resume: '{run_dir}' holds no {LAST}: the run stopped before its first "
                "checkpoint (callbacks.last_checkpoint.every_n_train_steps). Start it again "
                "instead."
            )
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        saved = newest_overrides(run_dir)
        place = [f"hydra.run.dir='{run_dir}'", f"hydra.output_subdir=.hydra/resume-{stamp}"]
    merged = {override_key(o): o for o in [*trusted(saved, run_dir), *new]}
    return [argv[0], *flags, *place, *merged.values(), f"resume='{run_dir}'"]


def checkpoint_to_continue(cfg: DictConfig, output_dir: Path) -> str | None:
    """`ckpt_path` when given; else the run directory's last.ckpt when this run continues it
    (resume=, or a SLURM job that was requeued); else None: a fresh start."""
    if cfg.ckpt_path:
        if not Path(cfg.ckpt_path).is_file():
            raise ConfigError(
                f"ckpt_path: no checkpoint file at '{cfg.ckpt_path}'. Give the path of a "
                ".ckpt file, or resume=<run dir> to continue a run."
            )
        return str(cfg.ckpt_path)
    requeued = int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0
    if (cfg.resume or requeued) and (output_dir / LAST).is_file():
        log.info(
            "Continuing from %s (%s)",
            output_dir / LAST,
            "resume=" if cfg.resume else "SLURM requeue",
        )
        return str(output_dir / LAST)
    return None


def check_architecture(path: str, checkpoint: dict, hparams: dict) -> None:
    """Refuse a checkpoint trained with another architecture or vocabulary, naming what differs."""
    saved = checkpoint.get("hyper_parameters", {})
    saved_model, model = saved.get("model", {}), hparams["model"]
    differ = [
        f"model.{k}: checkpoint {saved_model.get(k)!r}, now {model[k]!r}"
        for k in ARCHITECTURE_KEYS
        if saved_model.get(k) != model[k]
    ]
    if saved.get("tokenizer") != hparams["tokenizer"]:
        differ.append("the tokenizer (data.encoding / data.compact_vocab / corpus)")
    if differ:
        raise ConfigError(
            f"ckpt_path: '{path}' was trained with another architecture ({'; '.join(differ)}). "
            "Drop the overrides that change it, or start a new run without ckpt_path."
        )
