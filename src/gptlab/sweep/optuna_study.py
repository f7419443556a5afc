"""The study on disk: opened (or continued), trials a killed search left running queued again,
and each job's result told to the study from its metrics.json."""

import logging
from pathlib import Path
from typing import Any

import optuna
from hydra.core.utils import JobReturn, JobStatus
from optuna.trial import FrozenTrial, Trial, TrialState

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.sweep.search import counts, storage_url  # noqa: F401 - the sweeper's too
from gptlab.sweep.stats import number
from gptlab.training.pruning import make_pruner

log = logging.getLogger(__name__)


def open_study(settings: dict[str, Any], url: str, sampler: Any, resumed: bool) -> optuna.Study:
    """Create the study, or load the one the storage holds (a continued search must find it)."""
    try:
        storage = optuna.storages.get_storage(url)
    except Exception as e:  # SQLAlchemy's errors: a bad URL, a missing driver, no server
        reason = " ".join(str(e).split())[:300]
        raise ConfigError(
            f"hydra.sweeper.storage: Optuna cannot open the study's storage '{url}' "
            f"({type(e).__name__}: {reason}). Give a storage URL Optuna reads "
            "(sqlite:///path.db, postgresql://...), or null for sqlite:///<sweep dir>/optuna.db."
        ) from None
    name = settings["study_name"]
    held = [s.study_name for s in optuna.study.get_all_study_summaries(storage)]
    if resumed and name not in held:
        raise ConfigError(
            f"hydra.sweeper.study_name={name!r}: the continued search's storage {url} holds no "
            f"study of that name (it holds {', '.join(map(repr, held)) or 'none'}). Give the "
            "study's name as hydra.sweeper.study_name (and its hydra.sweeper.storage, if it was "
            "not the sweep's own optuna.db)."
        )
    directions = settings["directions"]
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=sampler,
        pruner=make_pruner(settings["pruner_spec"]),
        directions=directions,
        load_if_exists=True,
    )
    saved = [d.name.lower() for d in study.directions]
    if saved != directions:
        raise ConfigError(
            f"hydra.sweeper.direction: the study '{study.study_name}' in {url} is {saved}, not "
            f"{directions}. Give the same directions, or another hydra.sweeper.study_name."
        )
    study.set_user_attr("gptlab_pruner", settings["pruner_spec"])  # the jobs build the same
    study.set_user_attr("gptlab_objectives", settings["objectives"])
    return study


def job_of(study: optuna.Study, trial: Trial | FrozenTrial) -> str:
    """The job a trial names in its attributes (a trial it runs again), else its own number; a
    study is data: a path never becomes one."""
    job = trial.user_attrs.get("job")
    numbers = {str(t.number) for t in study.get_trials(deepcopy=False)}
    return job if isinstance(job, str) and job.isdigit() and job in numbers else str(trial.number)


def within(distribution: Any, value: Any) -> bool:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return value in distribution.choices
    numeric = isinstance(value, (int, float)) and distribution is not None
    return numeric and distribution.low <= value <= distribution.high


def rerun_killed(study: optuna.Study, space: dict) -> None:
    """Trials a killed search left RUNNING end FAIL; their parameters (when in the search space)
    run again in the same job directory, from its last checkpoint."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
        if not all(within(space.get(k), v) for k, v in trial.params.items()):
            log.warning("Trial %d ran outside the search space; it is not run again", trial.number)
            continue
        attrs = {"rerun_of": trial.number, "job": job_of(study, trial)}
        study.enqueue_trial(trial.params, user_attrs=attrs)
        log.info("Trial %d was running when the search stopped; it runs again", trial.number)


def done(study: optuna.Study) -> int:
    """Finished trials (complete, pruned, failed) but those a continued search runs again."""
    found = counts(study)
    return found["complete"] + found["pruned"] + found["fail"]


def tell(study: optuna.Study, trial: Trial, job_dir: Path, ret: JobReturn) -> FrozenTrial:
    """Tell the study how the trial's job ended: pruned, complete with its objectives, or failed."""
    metrics = reader.read_json(job_dir / "metrics.json")
    metrics = metrics if isinstance(metrics, dict) else {}
    values = [number(metrics.get(key)) for key in study.user_attrs["gptlab_objectives"]]
    if ret.status != JobStatus.COMPLETED:
        return study.tell(trial, state=TrialState.FAIL)
    if metrics.get("status") == "pruned":
        return study.tell(trial, state=TrialState.PRUNED)
    if metrics.get("status") == "ok" and None not in values:
        return study.tell(trial, values)
    return study.tell(trial, state=TrialState.FAIL)
