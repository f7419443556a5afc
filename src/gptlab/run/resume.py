"""Continuing a run or a sweep where it stopped.

`resume=<run dir>` re-applies the run's newest recorded settings, then the new command line's
(later wins), into the same directory, which continues from its last checkpoint; so does a
requeued SLURM job. `resume=<sweep dir>` re-launches the sweep into its directory. A directory is
input like any other: its settings are checked as data (gptlab.run.settings), and the directory
reaches Hydra through an environment variable, never through the override grammar."""

import logging
import os
import time
from pathlib import Path

import yaml
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig

from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.settings import replayable

log = logging.getLogger(__name__)
RESUME_DIR = "GPTLAB_RESUME_DIR"  # the directory resume= continues, as Hydra reads it
FROM_ENV = "${oc.env:" + RESUME_DIR + "}"
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


def read_yaml(path: Path):
    """A YAML file of the run directory as plain data (safe_load: no tags, no objects)."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"resume: cannot read '{path}' ({e}). Is it a gptlab run?") from None


def newest_overrides(run_dir: Path) -> list:
    """The overrides of the latest start of the run: the original or its latest resume."""
    saved = [p for p in directory.saved_overrides(run_dir) if p.is_file()]
    if not saved:
        raise ConfigError(
            f"resume: '{run_dir}' is not a gptlab run directory (no .hydra/overrides.yaml) "
            "nor a sweep directory (no multirun.yaml). Give the directory a run printed at its "
            "start, e.g. outputs/<date>/<time>, or outputs/multirun/<date>/<time>."
        )
    return read_yaml(max(saved, key=lambda p: p.stat().st_mtime)) or []


def sweep_overrides(sweep_dir: Path) -> list:
    """The task overrides a sweep was launched with. An Optuna search takes its own settings (and
    study) from the directory when it starts again (hydra_plugins/gptlab_optuna_sweeper)."""
    saved = read_yaml(sweep_dir / "multirun.yaml")
    hydra = saved.get("hydra", {}) if isinstance(saved, dict) else {}
    return hydra.get("overrides", {}).get("task", [])


def run_place(run_dir: Path, argv: list[str]) -> list[str]:
    """Where a continued run goes: its own directory (from the environment) and a new .hydra/."""
    if any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError("resume= of a run directory continues one run; drop -m/--multirun.")
    if not directory.last_checkpoint(run_dir).is_file():
        raise ConfigError(
            f"resume: '{run_dir}' holds no {directory.last_checkpoint(run_dir)}: the run stopped "
            "before its "
            "first checkpoint (callbacks.last_checkpoint.every_n_train_steps). Start it again "
            "instead."
        )
    directory.refuse_linked_folders(run_dir)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    return [f"hydra.run.dir={FROM_ENV}", f"hydra.output_subdir={directory.resume_subdir(stamp)}"]


def resume_argv(argv: list[str]) -> list[str]:
    """Rewrite `gptlab-train resume=<dir> [overrides]` into the run or sweep that continues
    <dir>."""
    requests = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("resume=")]
    if not requests:
        refuse_fresh_start(argv)
        return argv
    run_dir = Path(requests[-1]).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(
            f"resume={requests[-1]}: the directory '{run_dir}' does not exist. Give the "
            "directory a run printed at its start (outputs/<date>/<time>) or a sweep's "
            "(outputs/multirun/<date>/<time>)."
        )
    if "${" in str(run_dir):
        raise ConfigError(
            f"resume={requests[-1]}: Hydra reads `${{` in its output directory's name as an "
            "interpolation, so no run can continue in this directory. Rename it (or copy it) "
            "to a name without `${`, then resume= that."
        )
    os.environ[RESUME_DIR] = str(run_dir)
    flags = [a for a in argv[1:] if a.startswith("-") and a not in ("-m", "--multirun")]
    new = [a for a in argv[1:] if not a.startswith("-") and not a.startswith("resume=")]
    if (run_dir / "multirun.yaml").is_file():
        saved = replayable(sweep_overrides(run_dir), run_dir / "multirun.yaml", sweep=True)
        place = ["-m", f"hydra.sweep.dir={FROM_ENV}"]
    else:
        place = run_place(run_dir, argv)
        saved = replayable(newest_overrides(run_dir), run_dir / ".hydra")
    merged = {override_key(o): o for o in [*saved, *new]}
    return [argv[0], *flags, *place, *merged.values(), f"resume={FROM_ENV}"]


def refuse_fresh_start(argv: list[str]) -> None:
    """A fresh start whose hydra.run.dir (or -m hydra.sweep.dir) holds a run or a sweep is
    refused before Hydra writes anything there."""
    for arg in argv[1:]:
        key, _, raw = arg.partition("=")
        if key not in ("hydra.run.dir", "hydra.sweep.dir") or "${" in raw:
            continue
        place = Path(raw.strip("'\"")).expanduser()
        if key == "hydra.sweep.dir" and (place / "multirun.yaml").is_file():
            raise ConfigError(
                f"hydra.sweep.dir={raw}: '{place}' already holds a sweep. Continue it with "
                f"`gptlab-train resume={place}`, or give a new sweep directory."
            )
        if key == "hydra.run.dir" and not directory.requeued():
            directory.refuse_fresh_run_over(place)


def checkpoint_to_continue(cfg: DictConfig, output_dir: Path) -> str | None:
    """`ckpt_path` when given; else the run directory's last checkpoint when this start continues
    the run (resume=, a sweep's resume=, a SLURM requeue); else None: a fresh start, refused
    when the directory already holds a run."""
    if cfg.ckpt_path:
        if not Path(cfg.ckpt_path).is_file():
            raise ConfigError(
                f"ckpt_path: no checkpoint file at '{cfg.ckpt_path}'. Give the path of a "
                ".ckpt file, or resume=<run dir> to continue a run."
            )
        return str(cfg.ckpt_path)
    if directory.continues(output_dir, cfg.resume):
        last = directory.last_checkpoint(output_dir)
        log.info("Continuing from %s (%s)", last, "resume=" if cfg.resume else "SLURM requeue")
        return str(last)
    if not cfg.resume and not directory.requeued() and rank_zero_only.rank == 0:
        directory.refuse_fresh_run_over(output_dir)
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
