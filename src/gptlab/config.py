"""Typed schemas for the config groups, derived from the classes they build.

Each schema is a dataclass made from its target's signature (or fields), registered in
Hydra's ConfigStore as `<group>/schema`; the YAML files of the group extend it. A mistyped
key (`model.num_head=4`) or a wrong type (`trainer.max_steps=abc`) then fails when Hydra
composes the config, before any work. Deriving the schema keeps it in step with the class.
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
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import MISSING, OmegaConf

from gptlab.data.datamodule import GPTDataModule
from gptlab.model.gpt import GPTConfig
from gptlab.module import OptimConfig

PRIMITIVES = (int, float, bool, str)
# Passed to the Trainer by gptlab itself, from the callbacks/ and logger/ groups.
TRAINER_EXCLUDED = {"callbacks", "logger"}


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


def register_configs() -> None:
    """Make the schemas and resolvers known to Hydra; safe to call more than once."""
    cs = ConfigStore.instance()
    cs.store(group="data", name="schema", node=schema_for(GPTDataModule))
    cs.store(group="model", name="schema", node=schema_for(GPTConfig))
    cs.store(group="optim", name="schema", node=schema_for(OptimConfig))
    cs.store(group="trainer", name="schema", node=schema_for(L.Trainer, TRAINER_EXCLUDED))
    if not OmegaConf.has_resolver("unique_dir"):
        OmegaConf.register_new_resolver("unique_dir", unique_dir, use_cache=True)
