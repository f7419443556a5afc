"""Typed schemas derived from the classes a group builds: a mistyped key or type fails when
Hydra composes. Nothing heavy is imported (signatures read with `ast` from their source)."""

import ast
import dataclasses
import importlib.util
import types
import typing
from pathlib import Path
from typing import Any, Optional, Union

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from gptlab.config import resolvers as r
from gptlab.model.config import GPTConfig
from gptlab.training.optim_config import OptimConfig
from hydra_plugins.gptlab_optuna_sweeper import register as register_optuna_sweeper

PRIMITIVES = (int, float, bool, str)
BY_NAME = {t.__name__: t for t in PRIMITIVES} | {"List": list}
# Passed to the Trainer by gptlab itself, from the callbacks/ and logger/ groups.
TRAINER_EXCLUDED = {"callbacks", "logger"}
DATA_MODULE = ("gptlab.data.datamodule", "GPTDataModule")
TRAINER = ("lightning.pytorch.trainer.trainer", "Trainer")


@dataclasses.dataclass
class TrainSchema:
    """gptlab-train's top-level keys; the groups are typed by their own schemas."""

    task_name: str = "train"
    seed: int = 1337
    ckpt_path: Optional[str] = None  # noqa: UP045 - OmegaConf wants typing.Optional
    resume: Optional[str] = None  # noqa: UP045
    init_from: Optional[str] = None  # noqa: UP045 - a Hugging Face folder: new run from its weights
    num_threads: Optional[int] = None  # noqa: UP045
    flops_budget: Optional[float] = None  # noqa: UP045 - training FLOPs: sets trainer.max_steps
    branch_from: Optional[str] = None  # noqa: UP045 - a wsd run directory: a cooldown branch
    branch_step: Optional[int] = None  # noqa: UP045
    sample_prompt: str = "The salesperson"
    paths: Any = None
    data: Any = None
    model: Any = None
    optim: Any = None
    trainer: Any = None
    callbacks: Any = None
    logger: Any = None


def omegaconf_type(annotation: Any) -> Any:
    """The closest type OmegaConf can check: primitives, Optional ones, lists of them."""
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


def schema_for(target: type) -> type:
    """A dataclass with `_target_` plus one typed field per field of the dataclass `target`."""
    fields = [
        ("_target_", str, dataclasses.field(default=f"{target.__module__}.{target.__qualname__}"))
    ]
    hints = typing.get_type_hints(target)
    for f in dataclasses.fields(target):
        default = dataclasses.field(default=f.default, default_factory=f.default_factory)
        fields.append((f.name, omegaconf_type(hints[f.name]), default))
    return dataclasses.make_dataclass(f"{target.__name__}Schema", fields)


def annotation_type(node: ast.expr | None) -> Any:
    """omegaconf_type of an annotation as the source writes it (a name unknown here: Any)."""
    if node is None:
        return Any
    text = node.value if isinstance(node, ast.Constant) else ast.unparse(node)  # "a string"
    names = {**BY_NAME, "None": None, "Optional": Optional, "Union": Union, "list": list}
    try:
        return omegaconf_type(eval(str(text), {"__builtins__": {}}, names))  # noqa: S307
    except Exception:  # noqa: BLE001 - a name of the module's own (a class, a typing alias)
        return Any


def source_of(module: str) -> Path:
    """A module's source file, found without importing it or its packages."""
    top, *rest = module.split(".")
    origin = Path(importlib.util.find_spec(top).origin)  # a package's __init__.py, or a file
    if not rest:
        return origin
    path = origin.parent.joinpath(*rest)
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"


def constructor_fields(module: str, name: str) -> list[tuple[str, Any, Any]]:
    """(name, OmegaConf type, default or MISSING) of each argument of `module.name.__init__`."""
    tree = ast.parse(source_of(module).read_text())
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            try:
                constants[getattr(node.targets[0], "id", "")] = ast.literal_eval(node.value)
            except ValueError:
                pass
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    [init] = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    args = init.args
    positional = args.args[1:]  # not self
    defaults = [MISSING] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = [
        *zip(positional, defaults, strict=True),
        *zip(args.kwonlyargs, args.kw_defaults, strict=True),
    ]
    fields = []
    for arg, default in pairs:
        if isinstance(default, ast.Name) and default.id in constants:
            value = constants[default.id]
        else:
            value = MISSING if default in (MISSING, None) else ast.literal_eval(default)
        fields.append((arg.arg, annotation_type(arg.annotation), value))
    return fields


def source_schema(module: str, name: str, exclude: set[str] = frozenset()) -> type:
    """schema_for a class's constructor, read from its source."""
    fields = [("_target_", str, dataclasses.field(default=f"{module}.{name}"))]
    for arg, kind, default in constructor_fields(module, name):
        if arg not in exclude:
            fields.append((arg, kind, dataclasses.field(default=default)))
    return dataclasses.make_dataclass(f"{name}Schema", fields)


def register_configs() -> None:
    """The schemas, resolvers and gptlab's Optuna sweeper made known to Hydra; safe to repeat."""
    register_optuna_sweeper()  # an editable install hides it from Hydra's plugin scan
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(name="data_schema", node=source_schema(*DATA_MODULE))
    cs.store(name="model_schema", node=schema_for(GPTConfig))
    cs.store(name="optim_schema", node=schema_for(OptimConfig))
    cs.store(name="trainer_schema", node=source_schema(*TRAINER, TRAINER_EXCLUDED))
    r.register()
