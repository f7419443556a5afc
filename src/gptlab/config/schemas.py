"""Typed schemas for the configs.

A group's schema is a dataclass derived from its target's signature, stored outside the groups
(`model_schema`, ...) for their YAML files to extend: a mistyped key or a wrong type fails when
Hydra composes the config."""

import dataclasses
import inspect
import types
import typing
from typing import Any, Optional, Union

import lightning as L
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from gptlab.config import resolvers as r
from gptlab.data.datamodule import GPTDataModule
from gptlab.model.gpt import GPTConfig
from gptlab.training.module import OptimConfig
from hydra_plugins.gptlab_optuna_sweeper import register as register_optuna_sweeper

PRIMITIVES = (int, float, bool, str)
# Passed to the Trainer by gptlab itself, from the callbacks/ and logger/ groups.
TRAINER_EXCLUDED = {"callbacks", "logger"}


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
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in PRIMITIVES:
            return Optional[rest[0]]  # noqa: UP045 - OmegaConf wants typing.Optional
    if origin is list and len(args) == 1 and args[0] in PRIMITIVES:
        return list[args[0]]
    return Any


def schema_for(target: type, exclude: set[str] = frozenset()) -> type:
    """A dataclass with `_target_` plus one typed field per constructor argument of `target`."""
    fields = [
        ("_target_", str, dataclasses.field(default=f"{target.__module__}.{target.__qualname__}"))
    ]
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


def register_configs() -> None:
    """Make the schemas, resolvers and gptlab's Optuna sweeper known to Hydra; safe to call more
    than once."""
    register_optuna_sweeper()  # an editable install hides it from Hydra's plugin scan
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(name="data_schema", node=schema_for(GPTDataModule))
    cs.store(name="model_schema", node=schema_for(GPTConfig))
    cs.store(name="optim_schema", node=schema_for(OptimConfig))
    cs.store(name="trainer_schema", node=schema_for(L.Trainer, TRAINER_EXCLUDED))
    r.register()
