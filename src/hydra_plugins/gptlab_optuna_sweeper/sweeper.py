"""The sweeper: asks the study for `n_jobs` trials at a time, hands them to the launcher as jobs,
and tells the study how each ended, until it holds `n_trials` finished trials. Each job learns its
trial through three environment variables (set by `hydra.job.env_set`, so they reach joblib's
processes and SLURM's nodes alike), and reports to it through the storage (training/pruning.py)."""

import functools
import itertools
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.exits import BAD_INPUT
from gptlab.run.overrides import as_override, override_key, quote
from gptlab.run.place import PLACE
from gptlab.run.start import resumed

log = logging.getLogger(__name__)
PRUNERS = ("none", "median", "hyperband")
# what a continued search takes from its first start (its multirun.yaml), unless given again;
# never where its study lives (storage, study_name): those come from the command line, or the
# sweep's own directory (sqlite:///<sweep dir>/optuna.db)
RESUMED = ("n_trials", "n_jobs", "direction", "objectives", "pruner", "pruners")
RESUMED += ("max_failure_rate", "after")


def check(settings: dict[str, Any]) -> dict[str, Any]:
    """Refuse settings that cannot make a search, before any job runs; add the derived ones."""
    for key in ("n_trials", "n_jobs"):
        if not isinstance(settings[key], int) or settings[key] < 1:
            raise ConfigError(f"hydra.sweeper.{key}={settings[key]!r}: give a whole number >= 1.")
    if settings["pruner"] not in PRUNERS:
        raise ConfigError(
            f"hydra.sweeper.pruner={settings['pruner']!r}: choose one of {', '.join(PRUNERS)}."
        )
    objectives = [str(o) for o in settings["objectives"]]
    direction = settings["direction"]
    directions = [str(d) for d in (direction if isinstance(direction, list) else [direction])]
    if len(directions) != len(objectives) or not set(directions) <= {"minimize", "maximize"}:
        raise ConfigError(
            f"hydra.sweeper.direction={directions}: give minimize or maximize once per objective "
            f"(hydra.sweeper.objectives={objectives}), e.g. direction=[minimize,minimize]."
        )
    pruner = settings["pruner"]
    spec = {"name": pruner, **dict(settings["pruners"].get(pruner) or {})}
    return {**settings, "objectives": objectives, "directions": directions, "pruner_spec": spec}


def rounded(values: dict) -> str:
    """key=value pairs for a log line, floats to 4 significant digits."""
    pairs = []
    for key, value in values.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        pairs.append(f"{key}={value}")
    return " ".join(pairs)


class GptlabOptunaSweeper(Sweeper):
    """Hydra's Sweeper API on Optuna; the config is `hydra/sweeper=gptlab_optuna` (config.py)."""

    def __init__(self, **settings: Any) -> None:
        self.settings = {
            k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
            for k, v in settings.items()
        }
        self.config: DictConfig | None = None
        self.launcher = None
        self.job_idx = 0

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def resumed_settings(self, sweep_dir: Path) -> dict[str, Any]:
        """The settings of the search `resume=` continues (an own sweep: gptlab.run.place
        checked it), from its multirun.yaml; a key given again on the command line wins."""
        saved = reader.read_yaml(sweep_dir / "multirun.yaml")
        for key in ("hydra", "sweeper"):
            saved = saved.get(key) if isinstance(saved, dict) else {}
        given = [override_key(o) for o in self.config.hydra.overrides.hydra]
        given = {k.split(".")[2] for k in given if k.startswith("hydra.sweeper.")}
        kept = {k: saved[k] for k in RESUMED if k in saved and k not in given}
        return {**self.settings, **kept}

    def sampler(self, space: dict) -> Any:
        """The configured sampler; a grid sampler gets the search space as its grid."""
        from gptlab.sweep.optuna_study import grid

        sampler = self.settings["sampler"]
        if not isinstance(sampler, functools.partial):
            return sampler
        if sampler.func.__name__ == "GridSampler":
            return sampler(grid(space))
        return sampler()

    def prepare(self, arguments: list[str]) -> tuple[Any, dict, list[str], dict[str, Any]]:
        """The study (created or continued), the search space, the fixed overrides, the settings."""
        from gptlab.sweep import optuna_study as studies

        sweep_dir = Path(self.config.hydra.sweep.dir)
        resume = resumed(self.config)  # the sweep resume= continues (gptlab.run.start)
        settings = check(self.resumed_settings(sweep_dir) if resume else self.settings)
        params = [f"{k}={v}" for k, v in (settings.get("params") or {}).items()]
        space, fixed = studies.search_space([*params, *arguments])
        sampler = self.sampler(space)
        settings["url"] = studies.storage_url(settings["storage"], sweep_dir)
        study = studies.open_study(settings, settings["url"], sampler, resumed=bool(resume))
        record = OmegaConf.to_container(self.config)  # what a later resume= takes up again
        record["hydra"]["sweeper"].update({k: settings[k] for k in RESUMED})
        PLACE.write_text(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(record))
        # every job's environment, set once in the overrides the launcher composes each job with
        # but does not log; TRIAL declared here, so a job's own override needs no ++ (and, as
        # hydra.*, stays out of the launcher's log line too)
        env = {"STORAGE": settings["url"], "STUDY": study.study_name, "TRIAL": ""}
        added = [f"++hydra.job.env_set.GPTLAB_OPTUNA_{k}={quote(v)}" for k, v in env.items()]
        self.config.hydra.overrides.hydra.extend(added)
        if resume:
            studies.rerun_killed(study, space)
        return study, space, fixed, settings

    def sweep(self, arguments: list[str]) -> None:
        """Trials in batches of n_jobs until the study holds n_trials finished ones. Bad settings
        end the search before any trial: one paragraph, exit code 2."""
        from gptlab.sweep import optuna_study as studies

        try:
            study, space, fixed, settings = self.prepare(arguments)
        except ConfigError as e:
            print(f"gptlab-train: {e}", file=sys.stderr, flush=True)
            sys.exit(BAD_INPUT)
        n_trials = settings["n_trials"]
        log.info("Study %s in %s: %d trials to finish", study.study_name, settings["url"], n_trials)
        while (left := n_trials - studies.done(study)) > 0:
            trials = [study.ask(space) for _ in range(min(settings["n_jobs"], left))]
            self.run_batch(study, trials, fixed, settings["max_failure_rate"])
        self.report(study, Path(self.config.hydra.sweep.dir))
        self.run_after(study, fixed, settings.get("after") or [])

    def run_after(self, study, fixed: list[str], grids: list[dict]) -> None:
        """hydra.sweeper.after's grids, each launched as one batch after the study, numbered on
        from its trials; an override of the grid or the best trial replaces a fixed one."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        for grid in grids:
            grid = dict(grid)
            chosen = study.best_params if grid.pop("best", False) and study.best_trials else {}
            given = [as_override(k, v) for k, v in chosen.items()]
            given += [f"{k}={v}" for k, v in grid.items()]
            axes = [
                [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
                if o.is_sweep_override()
                else [o.input_line]
                for o in OverridesParser.create().parse_overrides(given)
            ]
            keys = {override_key(a[0]) for a in axes}
            kept = [f for f in fixed if override_key(f) not in keys]
            batch = [[*kept, *combo] for combo in itertools.product(*axes)]
            log.info("After the study: %d jobs of %s", len(batch), " ".join(given))
            self.job_idx = max(self.job_idx, len(study.trials))
            self.launcher.launch(batch, initial_job_idx=self.job_idx)
            self.job_idx += len(batch)

    def job_overrides(self, trial: Any, fixed: list[str]) -> list[str]:
        """The trial's parameters, the fixed overrides, its job directory and its trial number (the
        study's: prepare): a continued trial runs in its first job's directory."""
        from gptlab.sweep import optuna_study as studies

        job = studies.job_of(trial.study, trial)
        trial.set_user_attr("job", job)
        return [
            *(as_override(k, v) for k, v in trial.params.items()),
            *fixed,
            f"hydra.sweep.subdir={job}",
            f"hydra.job.env_set.GPTLAB_OPTUNA_TRIAL='{trial.number}'",
        ]

    def run_batch(self, study, trials: list, fixed: list[str], max_failure_rate) -> None:
        """Launch the trials' jobs together; tell the study each result; a job that raised (a stop)
        ends the search once the study knows, if more raised than max_failure_rate allows."""
        from gptlab.sweep import optuna_study as studies

        batch = [self.job_overrides(t, fixed) for t in trials]
        names = study.user_attrs["gptlab_objectives"]
        for trial in trials:
            log.info("Trial %d: %s", trial.number, rounded(trial.params))
        sweep_dir = Path(self.config.hydra.sweep.dir)
        returns = self.launcher.launch(batch, initial_job_idx=self.job_idx)
        self.job_idx += len(returns)
        for trial, ret in zip(trials, returns, strict=True):
            frozen = studies.tell(study, trial, sweep_dir / trial.user_attrs["job"], ret)
            values = dict(zip(names, frozen.values or [], strict=False))  # none unless complete
            log.info("Trial %d: %s %s", frozen.number, frozen.state.name, rounded(values))
        raised = [r for r in returns if r.status.name != "COMPLETED"]
        if raised and len(raised) / len(returns) > max_failure_rate:
            raised[0].return_value  # noqa: B018 - raises the job's own exception

    def report(self, study, sweep_dir: Path) -> None:
        """The best trial (or the Pareto front) in the log and in optimization_results.yaml."""
        from optuna.trial import TrialState

        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            log.warning("No trial completed: no best trial.")
            return
        if len(study.directions) == 1:
            best = study.best_trial
            results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
            log.info("Best parameters: %s", best.params)
            log.info("Best value: %s", best.value)
        else:
            front = [{"params": t.params, "values": t.values} for t in study.best_trials]
            results = {"name": "optuna", "solutions": front}
            log.info("Pareto front: %d trials", len(front))
        PLACE.write_text(sweep_dir / "optimization_results.yaml", OmegaConf.to_yaml(results))
