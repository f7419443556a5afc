"""Typed schemas, plain dataclasses registered with Hydra: a mistyped key or type fails when Hydra
composes, before torch or Lightning loads. The model's, optimizer's and data's come from their
settings' dataclasses; the Trainer's keyword arguments are listed here (a test holds them to
Lightning's own signature)."""

import dataclasses
import types
import typing
from typing import Any, Optional, Union

from hydra.core.config_store import ConfigStore

from gptlab.config import resolvers as r
from gptlab.data.config import DataConfig
from gptlab.model.config import GPTConfig
from gptlab.training.optim_config import OptimConfig
from hydra_plugins.gptlab_optuna_sweeper import register as register_optuna_sweeper

PRIMITIVES = (int, float, bool, str)


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
    tokens_per_param: float = 20.0  # model.depth's token budget: this x the blocks' parameters
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


@dataclasses.dataclass
class TrainerSettings:
    """lightning.Trainer's keyword arguments and defaults, but callbacks and logger (gptlab
    passes those, from the callbacks/ and logger/ groups). A union is Any: OmegaConf types none."""

    accelerator: Any = "auto"
    strategy: Any = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    precision: Any = None
    fast_dev_run: Any = False
    max_epochs: int | None = None
    min_epochs: int | None = None
    max_steps: int = -1
    min_steps: int | None = None
    max_time: Any = None
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    limit_predict_batches: Any = None
    overfit_batches: Any = 0.0
    val_check_interval: Any = None
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int | None = None
    log_every_n_steps: int | None = None
    enable_checkpointing: bool | None = None
    enable_progress_bar: bool | None = None
    enable_model_summary: bool | None = None
    accumulate_grad_batches: int = 1
    gradient_clip_val: Any = None
    gradient_clip_algorithm: str | None = None
    deterministic: Any = None
    benchmark: bool | None = None
    inference_mode: bool = True
    use_distributed_sampler: bool = True
    profiler: Any = None
    detect_anomaly: bool = False
    barebones: bool = False
    plugins: Any = None
    sync_batchnorm: bool = False
    reload_dataloaders_every_n_epochs: int = 0
    default_root_dir: Any = None
    enable_autolog_hparams: bool = True
    model_registry: str | None = None


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


def schema_for(settings: type, target: str | None = None) -> type:
    """A dataclass with `_target_` (the settings' own class, or `target`) plus one typed field
    per field of the dataclass `settings`."""
    target = target or f"{settings.__module__}.{settings.__qualname__}"
    fields = [("_target_", str, dataclasses.field(default=target))]
    hints = typing.get_type_hints(settings)
    for f in dataclasses.fields(settings):
        default = dataclasses.field(default=f.default, default_factory=f.default_factory)
        fields.append((f.name, omegaconf_type(hints[f.name]), default))
    return dataclasses.make_dataclass(f"{settings.__name__}Schema", fields)


def register_configs() -> None:
    """The schemas, resolvers and gptlab's Optuna sweeper made known to Hydra; safe to repeat."""
    register_optuna_sweeper()  # an editable install hides it from Hydra's plugin scan
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(
        name="data_schema", node=schema_for(DataConfig, "gptlab.data.datamodule.GPTDataModule")
    )
    cs.store(name="model_schema", node=schema_for(GPTConfig))
    cs.store(name="optim_schema", node=schema_for(OptimConfig))
    cs.store(name="trainer_schema", node=schema_for(TrainerSettings, "lightning.Trainer"))
    r.register()
