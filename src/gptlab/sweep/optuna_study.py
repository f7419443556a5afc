"""The study on disk: opened (or continued), trials a killed search left running queued again,
and each job's result told to the study from its metrics.json."""

import logging
from pathlib import Path
from typing import Any

import optuna
from hydra.core.utils import JobReturn, JobStatus
from optuna.trial import FrozenTrial, Trial, TrialState

from gptlab.errors import ConfigError
from gptlab.sweep.jobs import number, read_json
from gptlab.training.pruning import make_pruner

log = logging.getLogger(__name__)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """The study's storage: the one given, else a SQLite file in the sweep directory."""
    return storage or f"sqlite:///{sweep_dir.resolve() / 'optuna.db'}"


def open_study(settings: dict[str, Any], url: str, sampler: Any) -> optuna.Study:
    """Create the study, or load it when the storage holds it already (a continued search)."""
    directions = settings["directions"]
    study = optuna.create_study(
        storage=url,
        study_name=settings["study_name"],
        sampler=sampler,
        pruner=make_pruner(settings["pruner_spec"]),
        directions=directions,
        load_if_exists=True,
    )
    held = [d.name.lower() for d in study.directions]
    if held != directions:
        raise ConfigError(
            f"hydra.sweeper.direction: the study '{study.study_name}' in {url} is {held}, not "
            f"{directions}. Give the same directions, or another hydra.sweeper.study_name."
        )
    study.set_user_attr("gptlab_pruner", settings["pruner_spec"])  # the jobs build the same
    study.set_user_attr("gptlab_objectives", settings["objectives"])
    return study


def rerun_killed(study: optuna.Study) -> None:
    """Trials left RUNNING by a killed search end FAIL; their parameters are queued again, to run in
    the same job directory (which continues from its last checkpoint)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        job = trial.user_attrs.get("job", str(trial.number))
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number, "job": job})
        log.info("Trial %d was running when the search stopped; it runs again", trial.number)


def done(study: optuna.Study) -> int:
    """Finished trials (complete, pruned, failed) but those a continued search runs again."""
    trials = study.get_trials(deepcopy=False)
    rerun = {t.user_attrs.get("rerun_of") for t in trials}
    return sum(t.state in FINISHED and t.number not in rerun for t in trials)


def tell(study: optuna.Study, trial: Trial, job_dir: Path, ret: JobReturn) -> FrozenTrial:
    """Tell the study how the trial's job ended: pruned, complete with its objectives, or failed."""
    metrics = read_json(job_dir / "metrics.json")
    values = [number(metrics.get(key)) for key in study.user_attrs["gptlab_objectives"]]
    if ret.status != JobStatus.COMPLETED:
        return study.tell(trial, state=TrialState.FAIL)
    if metrics.get("status") == "pruned":
        return study.tell(trial, state=TrialState.PRUNED)
    if metrics.get("status") == "ok" and None not in values:
        return study.tell(trial, values)
    return study.tell(trial, state=TrialState.FAIL)
