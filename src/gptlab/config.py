"""Typed schemas for the configs, and what a config may build.

Each group's schema is a dataclass made from its target's signature (or fields), stored in
Hydra's ConfigStore under a name outside every group (`model_schema`, ...): the YAML files of
the group extend it (`- /model_schema@_here_`), users cannot select it. A mistyped key
(`model.num_head=4`) or a wrong type (`trainer.max_steps=abc`, `seed=abc`) then fails when
Hydra composes the config, before any work. Deriving the schema keeps it in step with the class.

A `_target_` is code that runs, so `build` only instantiates the classes gptlab needs (see
`check_targets`), whatever the config says.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from pathlib import Path
from typing import Any, Optional, Union

import lightning as L
from hydra.core.config_store import ConfigStore
from hydra.errors import InstantiationException
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
    fields: list[tuple] = [
        ("_target_", str, dataclasses.field(default=f"{target.__module__}.{target.__qualname__}"))
    ]
    if dataclasses.is_dataclass(target):
        hints = typing.get_type_hints(target)
        for f in dataclasses.fields(target):
            default = (
                dataclasses.field(default_factory=f.default_factory)
                if f.default_factory is not dataclasses.MISSING
                else dataclasses.field(default=f.default)
            )
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
    """`path`, or `path_1`, `path_2`, ...: the first that did not exist, claimed by creating it.

    Two runs started in the same second then still get a directory each. Ranks other than 0
    of a job started by SLURM or torchrun share rank 0's directory instead of claiming one.
    """
    if rank_zero_only.rank > 0:
        return path
    candidate, n = Path(path), 0
    while True:
        try:
            candidate.mkdir(parents=True, exist_ok=False)
            return str(candidate)
        except FileExistsError:
            n += 1
            candidate = Path(f"{path}_{n}")


def ddp_start_method() -> str:
    """How Lightning's DDP starts its ranks: spawn (each job of a `-m` sweep starts its own; a
    re-run of the command line would re-run the sweep), popen where SLURM or torchrun already
    started one process per rank (Lightning then starts none)."""
    return "popen" if SLURMEnvironment.detect() or TorchElasticEnvironment.detect() else "spawn"


def register_configs() -> None:
    """Make the schemas and resolvers known to Hydra; safe to call more than once."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(name="data_schema", node=schema_for(GPTDataModule))
    cs.store(name="model_schema", node=schema_for(GPTConfig))
    cs.store(name="optim_schema", node=schema_for(OptimConfig))
    cs.store(name="trainer_schema", node=schema_for(L.Trainer, TRAINER_EXCLUDED))
    if not OmegaConf.has_resolver("unique_dir"):
        OmegaConf.register_new_resolver("unique_dir", unique_dir, use_cache=True)
        OmegaConf.register_new_resolver("ddp_start_method", ddp_start_method)


# ---------------------------------------------------------------- what a config may build
def check_target(target: str, where: str) -> None:
    """Refuse a `_target_` that is not a trusted class. The package is checked by name before
    anything is imported; then the object itself: a class, defined in a trusted package, of a
    kind gptlab builds (a function such as torch.load, or any other class, is refused)."""
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
    """Instantiate a node whose targets check_targets passed (gptlab-train checks the whole
    config first). A ConfigError from the class surfaces as itself; any other error raised while
    building is bad input too (e.g. trainer.precision=17): one paragraph naming the group."""
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
