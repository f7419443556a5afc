"""Typed schemas for the configs, their resolvers, and what a config may build.

A group's schema is a dataclass derived from its target's signature, stored outside the groups
(`model_schema`, ...) for their YAML files to extend: a mistyped key or a wrong type fails when
Hydra composes the config. The `gptlab.*` resolvers name the loggers' runs after the run directory.
A `_target_` is code that runs, so only the kinds of class gptlab needs are built (`check_target`)."""

import dataclasses
import hashlib
import inspect
import itertools
import os
import types
import typing
from pathlib import Path
from typing import Any, Optional, Union

import lightning as L
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import CheckpointIO, ClusterEnvironment, Precision
from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.strategies import Strategy
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from gptlab.data.datamodule import GPTDataModule
from gptlab.errors import ConfigError
from gptlab.model.gpt import GPTConfig
from gptlab.module import OptimConfig

PRIMITIVES = (int, float, bool, str)
# Passed to the Trainer by gptlab itself, from the callbacks/ and logger/ groups.
TRAINER_EXCLUDED = {"callbacks", "logger"}
# What a `_target_` may name: a class from these packages that is one of these kinds.
TRUSTED_PACKAGES = ("gptlab", "lightning", "torch")
BUILDABLE = (L.Trainer, L.Callback, Logger, Profiler, Strategy, Accelerator, Precision, CheckpointIO,
             ClusterEnvironment, GPTDataModule, GPTConfig, OptimConfig)


@dataclasses.dataclass
class TrainSchema:
    """gptlab-train's top-level keys; the groups are typed by their own schemas."""

    task_name: str = "train"
    seed: int = 1337
    ckpt_path: Optional[str] = None  # noqa: UP045 - OmegaConf wants typing.Optional
    resume: Optional[str] = None  # noqa: UP045
    num_threads: Optional[int] = None  # noqa: UP045
    sample_prompt: str = "The salesperson"
    paths: Any = None
    data: Any = None
    model: Any = None
    optim: Any = None
    trainer: Any = None
    callbacks: Any = None
    logger: Any = None


def omegaconf_type(annotation: Any) -> Any:
    """The closest type OmegaConf can check: primitives, Optional primitives, lists of them."""
    if annotation in PRIMITIVES:
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in PRIMITIVES:
            return Optional[rest[0]]  # noqa: UP045 - OmegaConf wants typing.Optional
    if origin is list and len(args) == 1 and args[0] in PRIMITIVES:
        return list[args[0]]
    return Any


def schema_for(target: type, exclude: set[str] = frozenset()) -> type:
    """A dataclass with `_target_` plus one typed field per constructor argument of `target`."""
    fields = [("_target_", str, dataclasses.field(default=f"{target.__module__}.{target.__qualname__}"))]
    if dataclasses.is_dataclass(target):
        hints = typing.get_type_hints(target)
        for f in dataclasses.fields(target):
            default = dataclasses.field(default=f.default, default_factory=f.default_factory)
            fields.append((f.name, omegaconf_type(hints[f.name]), default))
    else:
        signature = inspect.signature(target.__init__, eval_str=True)
        for name, p in list(signature.parameters.items())[1:]:
            if name in exclude or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            default = MISSING if p.default is p.empty else p.default
            fields.append((name, omegaconf_type(p.annotation), dataclasses.field(default=default)))
    return dataclasses.make_dataclass(f"{target.__name__}Schema", fields)


def unique_dir(path: str) -> str:
    """`path`, or `path_1`, `path_2`, ...: the first that did not exist, claimed by creating it, so
    two runs started in the same second get one each (other ranks of a SLURM job share rank 0's)."""
    if rank_zero_only.rank > 0:
        return path
    candidate = Path(path)
    for n in itertools.count(1):
        try:
            candidate.mkdir(parents=True)
            return str(candidate)
        except FileExistsError:
            candidate = Path(f"{path}_{n}")


def ddp_start_method() -> str:
    """How DDP starts its ranks: spawn (each job of a `-m` sweep its own; re-running the command
    line would re-run the sweep), popen where SLURM or torchrun already started one per rank."""
    return "popen" if SLURMEnvironment.detect() or TorchElasticEnvironment.detect() else "spawn"


def _dirs() -> tuple[Path, Path | None, Path] | None:
    """(run dir, sweep dir or None, cwd) of this Hydra job; None outside one (--cfg job)."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir).resolve()
    return out, out.parent if hc.mode == RunMode.MULTIRUN else None, Path(hc.runtime.cwd).resolve()


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def run_name() -> str | None:
    dirs = _dirs()
    return None if dirs is None else _relative(dirs[0], dirs[2])


def sweep_name(default=None):
    dirs = _dirs()
    return default if dirs is None or dirs[1] is None else _relative(dirs[1], dirs[2])


def run_info(prefix: str = "") -> dict:
    dirs = _dirs()
    if dirs is None:
        return {}
    info = {"run_dir": str(dirs[0]), "overrides": " ".join(HydraConfig.get().overrides.task)}
    if dirs[1] is not None:
        info.update(sweep_dir=str(dirs[1]), job=dirs[0].name)
    return {f"{prefix}{k}": v for k, v in info.items()}


def run_id() -> str | None:
    dirs = _dirs()
    return None if dirs is None else hashlib.sha1(str(dirs[0]).encode()).hexdigest()[:16]


def mlflow_artifacts(tracking_uri: str) -> str | None:
    """`<folder>/mlartifacts` for a local SQLite store in <folder>; a server chooses for itself."""
    if not str(tracking_uri).startswith("sqlite:///"):
        return None
    return str(Path(str(tracking_uri)[len("sqlite:///"):]).parent / "mlartifacts")


def mlflow_run(tracking_uri: str, experiment_name: str, resume=None) -> str | None:
    """The id of the MLflow run of this run directory (its tag gptlab.run_dir, from run_info) when the
    run continues it (resume=, a SLURM requeue): the run goes on instead of a second one starting."""
    dirs = _dirs()
    requeued = int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0
    if dirs is None or not (resume or requeued) or not (dirs[0] / "checkpoints" / "last.ckpt").is_file():
        return None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = [] if experiment is None else client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`gptlab.run_dir` = '{dirs[0]}'", max_results=1)
    return runs[0].info.run_id if runs else None


def register_configs() -> None:
    """Make the schemas and resolvers known to Hydra; safe to call more than once."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(name="data_schema", node=schema_for(GPTDataModule))
    cs.store(name="model_schema", node=schema_for(GPTConfig))
    cs.store(name="optim_schema", node=schema_for(OptimConfig))
    cs.store(name="trainer_schema", node=schema_for(L.Trainer, TRAINER_EXCLUDED))
    resolvers = {"unique_dir": unique_dir, "ddp_start_method": ddp_start_method, "gptlab.run_name": run_name,
                 "gptlab.sweep_name": sweep_name, "gptlab.run_info": run_info, "gptlab.run_id": run_id,
                 "gptlab.mlflow_run": mlflow_run, "gptlab.mlflow_artifacts": mlflow_artifacts}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver, use_cache=name == "unique_dir")


def check_target(target: str, where: str) -> None:
    """Refuse a `_target_` that is not a class of a kind gptlab builds, defined in a trusted package
    (a function such as torch.load is refused). The name is checked before anything is imported."""
    refusal = (
        f"{where}._target_={target!r}: gptlab only builds the Trainer, Lightning callbacks, loggers, "
        "profilers, strategies, accelerators and plugins, and gptlab's own classes, from the packages "
        f"{', '.join(TRUSTED_PACKAGES)}. Use one of those"
    )
    if str(target).split(".")[0] not in TRUSTED_PACKAGES:
        raise ConfigError(f"{refusal}.")
    try:
        cls = get_class(str(target))
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{refusal} ({e}).") from None
    if cls.__module__.split(".")[0] not in TRUSTED_PACKAGES or not issubclass(cls, BUILDABLE):
        raise ConfigError(f"{refusal}; {target} is a {cls.__module__} class of another kind.")


def check_targets(node: Any, where: str = "") -> None:
    """check_target on every `_target_` in `node`, before anything is built."""
    if isinstance(node, DictConfig):
        target = node.get("_target_")
        if target is not None:
            check_target(target, where or "<root>")
        for key, value in node.items_ex(resolve=False):
            check_targets(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, ListConfig):
        for i, value in enumerate(node):
            check_targets(value, f"{where}[{i}]")


def build(node: DictConfig, where: str, **kwargs) -> Any:
    """Instantiate a node whose targets passed check_targets. Any error while building is bad input
    (e.g. trainer.precision=17): a ConfigError from the class as it is, else one naming the group."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        reason = " ".join(str(e.__cause__ or e).split())
        raise ConfigError(f"{where}: {node.get('_target_')} refused its settings: {reason}") from None
