"""The Optuna sweeper's parts: the search space (Hydra's sweep grammar, `choice`, `range`,
`interval`, `tag(log, ...)`, parsed by Hydra's own override parser, as Optuna distributions; plain
overrides stay fixed) and the study on disk: opened (or continued), trials a killed search left
running queued again, and each job's result told to the study from its metrics.json."""

import logging
import math
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.utils import JobReturn, JobStatus
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
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
    if isinstance(distribution, CategoricalDistribution):
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


def distribution(override: Override) -> BaseDistribution | None:
    """The override's distribution; None for a plain value (the same in every trial). A range's
    stop is excluded, as Hydra's grid sweeps read it."""
    key, value = override.get_key_element(), override.value()
    if not override.is_sweep_override():
        return None
    if override.is_interval_sweep():
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    if override.is_range_sweep() and not value.shuffle:
        count = math.ceil((value.stop - value.start) / value.step)
        last = value.start + (count - 1) * value.step
        if any(isinstance(v, float) for v in (value.start, value.stop, value.step)):
            return FloatDistribution(value.start, last, step=value.step)
        return IntDistribution(int(value.start), int(last), step=int(value.step))
    if not (override.is_choice_sweep() or override.is_range_sweep()):
        raise ConfigError(
            f"hydra.sweeper.params.{key}: the Optuna sweeper takes choice(), range(), interval() "
            "and tag(log, interval()); not a glob."
        )
    values = list(override.sweep_iterator(transformer=Transformer.encode))
    for found in values:
        if not isinstance(found, (str, int, float, bool, type(None))):
            raise ConfigError(
                f"hydra.sweeper.params.{key}: a choice takes numbers, text, booleans or null; "
                f"got {found!r}."
            )
    return CategoricalDistribution(values)


def search_space(arguments: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
    """The swept keys' distributions, and the fixed overrides every trial's job gets."""
    chosen = {}  # a later override of the same key wins, as in Hydra
    for override in OverridesParser.create().parse_overrides(arguments):
        chosen.pop(override.get_key_element(), None)
        chosen[override.get_key_element()] = distribution(override) or override.input_line
    space = {k: v for k, v in chosen.items() if not isinstance(v, str)}
    return space, [v for v in chosen.values() if isinstance(v, str)]


def grid(space: dict[str, BaseDistribution]) -> dict[str, list[Any]]:
    """Every value of each discrete distribution, for Optuna's GridSampler."""
    values = {}
    for name, found in space.items():
        if isinstance(found, CategoricalDistribution):
            values[name] = list(found.choices)
        elif found.step is not None and not found.log:
            count = int(round((found.high - found.low) / found.step)) + 1
            values[name] = [found.low + i * found.step for i in range(count)]
        else:
            raise ConfigError(
                f"hydra.sweeper.params.{name}: sampler=grid needs choice() or range(), "
                "not a continuous interval."
            )
    return values
