"""Pruning an Optuna trial from inside its training run: val/loss reported at each validation,
rank 0's pruner decides for every rank (docs/sweeps.md)."""

import logging
import math
import os
from typing import Any

import lightning as L

from gptlab.errors import ConfigError

log = logging.getLogger(__name__)
ENV = ("GPTLAB_OPTUNA_STORAGE", "GPTLAB_OPTUNA_STUDY", "GPTLAB_OPTUNA_TRIAL")


def make_pruner(spec: dict[str, Any]) -> Any:
    """An Optuna pruner from {"name": none|median|hyperband, its settings}, stored in the study."""
    import optuna

    kinds = {"none": "NopPruner", "median": "MedianPruner", "hyperband": "HyperbandPruner"}
    settings = {k: v for k, v in spec.items() if k != "name"}
    if spec.get("name") not in kinds:
        raise ConfigError(
            f"hydra.sweeper.pruner={spec.get('name')!r}: choose none, median or hyperband."
        )
    try:
        return getattr(optuna.pruners, kinds[spec["name"]])(**settings)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"hydra.sweeper.pruners.{spec['name']}: {e}. Give the settings its Optuna pruner takes."
        ) from e


def job_trial() -> Any:
    """The job's Optuna trial, from the environment the sweeper set; None outside a search."""
    if not all(os.environ.get(name) for name in ENV):
        return None
    import optuna

    url, name, number = (os.environ[n] for n in ENV)
    storage = optuna.storages.get_storage(url)
    study_id = storage.get_study_id_from_name(name)
    study = optuna.load_study(study_name=name, storage=storage)
    study.pruner = make_pruner(study.user_attrs.get("gptlab_pruner", {"name": "none"}))
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(number))
    return optuna.trial.Trial(study, trial_id)


class OptunaPruning(L.Callback):
    """Report `monitor` at each validation to the job's trial (if any); stop when pruned."""

    def __init__(self, monitor: str = "val/loss"):
        self.monitor = monitor
        self.trial = None  # rank 0's, of a single-objective study (Optuna prunes no other)
        self.pruned = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            trial = job_trial()
            self.trial = trial if trial and len(trial.study.directions) == 1 else None

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.pruned:
            return
        prune = False
        value = trainer.callback_metrics.get(self.monitor)
        if self.trial is not None and value is not None and math.isfinite(float(value)):
            self.trial.report(float(value), step=trainer.global_step)
            prune = self.trial.should_prune()
        if trainer.strategy.broadcast(prune, src=0):  # rank 0 decides, every rank stops
            log.info("Pruned by the Optuna study at step %d", trainer.global_step)
            self.pruned = True
            trainer.should_stop = True


def pruning_result(trainer) -> dict[str, Any]:
    """What metrics.json gets from the pruning callback: "status": "pruned" when it stopped."""
    pruned = any(isinstance(c, OptunaPruning) and c.pruned for c in trainer.callbacks)
    return {"status": "pruned"} if pruned else {}
