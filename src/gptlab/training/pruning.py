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
        self.trial = None
        self.pruned = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            self.trial = job_trial()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.pruned:
            return
        prune = False
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.is_global_zero and value is not None and math.isfinite(float(value)):
            prune = self.ask(trainer.global_step, float(value))
        prune = trainer.strategy.broadcast(prune, src=0)  # rank 0 decides, every rank stops
        if prune:
            self.pruned = True
            trainer.should_stop = True

    def ask(self, step: int, value: float) -> bool:
        """Report the value at this step; True when the study's pruner says stop."""
        if self.trial is None or len(self.trial.study.directions) > 1:  # Optuna: one objective only
            return False
        self.trial.report(value, step=step)
        if not self.trial.should_prune():
            return False
        log.info("Pruned by the Optuna study at step %d (%s %.4f)", step, self.monitor, value)
        return True


def pruning_result(trainer) -> dict[str, Any]:
    """What metrics.json gets from the pruning callback: "status": "pruned" when it stopped."""
    pruned = any(isinstance(c, OptunaPruning) and c.pruned for c in trainer.callbacks)
    if pruned:
        return {"status": "pruned"}
    return {}
