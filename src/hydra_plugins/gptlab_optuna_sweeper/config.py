"""The sweeper's config nodes: `hydra/sweeper=gptlab_optuna` (also under the old plugin's name
`optuna`, so existing configs keep working) and the samplers of `hydra/sweeper/sampler`."""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class TPESamplerConf:
    _target_: str = "optuna.samplers.TPESampler"
    _partial_: bool = True
    seed: int | None = None
    n_startup_trials: int = 10
    n_ei_candidates: int = 24
    multivariate: bool = False


@dataclass
class RandomSamplerConf:
    _target_: str = "optuna.samplers.RandomSampler"
    _partial_: bool = True
    seed: int | None = None


@dataclass
class CmaEsSamplerConf:
    _target_: str = "optuna.samplers.CmaEsSampler"
    _partial_: bool = True
    seed: int | None = None
    n_startup_trials: int = 1


@dataclass
class GridSamplerConf:
    """The grid is the search space (`params`), built when the sweep starts."""

    _target_: str = "optuna.samplers.GridSampler"
    _partial_: bool = True
    seed: int | None = None


@dataclass
class MedianPrunerConf:
    n_startup_trials: int = 5  # trials that finish before any is pruned
    n_warmup_steps: int = 0  # steps (global_step) of a trial before it may be pruned
    interval_steps: int = 1


@dataclass
class HyperbandPrunerConf:
    min_resource: int = 1  # steps (global_step) of the first rung
    max_resource: Any = "auto"
    reduction_factor: int = 3


@dataclass
class PrunersConf:
    median: MedianPrunerConf = field(default_factory=MedianPrunerConf)
    hyperband: HyperbandPrunerConf = field(default_factory=HyperbandPrunerConf)


@dataclass
class GptlabOptunaSweeperConf:
    _target_: str = "hydra_plugins.gptlab_optuna_sweeper.sweeper.GptlabOptunaSweeper"
    defaults: list[Any] = field(default_factory=lambda: [{"sampler": "tpe"}])
    sampler: Any = MISSING
    direction: Any = "minimize"  # or a list, one per objective
    objectives: list[str] = field(default_factory=lambda: ["best_val_loss"])  # metrics.json keys
    storage: str | None = None  # null: sqlite:///<sweep dir>/optuna.db
    study_name: str = "gptlab"
    n_trials: int = 20  # the study ends with this many finished trials
    n_jobs: int = 1  # trials asked for and launched at a time
    max_failure_rate: float = 1.0  # failed share of a batch that stops the search
    pruner: str = "none"  # none | median | hyperband
    pruners: PrunersConf = field(default_factory=PrunersConf)
    params: dict[str, str] | None = None  # the search space, in Hydra's sweep grammar
    # grids run once the study is done (experiment=mutransfer): each a dict of overrides in
    # Hydra's sweep grammar ("1,2": every value); `best: true` adds the best trial's parameters
    after: Any = None


store = ConfigStore.instance()
for name in ("gptlab_optuna", "optuna"):
    store.store(group="hydra/sweeper", name=name, node=GptlabOptunaSweeperConf, provider="gptlab")
for name, node in (
    ("tpe", TPESamplerConf),
    ("random", RandomSamplerConf),
    ("cmaes", CmaEsSamplerConf),
    ("grid", GridSamplerConf),
):
    store.store(group="hydra/sweeper/sampler", name=name, node=node, provider="gptlab")
