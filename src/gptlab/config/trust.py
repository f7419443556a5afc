"""What a config may build. A `_target_` is code that runs, so only the kinds of class gptlab needs
are built (`check_target`), and `build` turns a class's refusal into a ConfigError."""

from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import CheckpointIO, ClusterEnvironment, Precision
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.strategies import Strategy
from omegaconf import DictConfig, ListConfig

from gptlab.data.datamodule import GPTDataModule
from gptlab.errors import ConfigError
from gptlab.model.gpt import GPTConfig
from gptlab.training.module import OptimConfig

# What a `_target_` may name: a class from these packages that is one of these kinds.
TRUSTED_PACKAGES = ("gptlab", "lightning", "torch")
BUILDABLE = (
    L.Trainer,
    L.Callback,
    Logger,
    Profiler,
    Strategy,
    Accelerator,
    Precision,
    CheckpointIO,
    ClusterEnvironment,
    GPTDataModule,
    GPTConfig,
    OptimConfig,
)


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
        raise ConfigError(
            f"{where}: {node.get('_target_')} refused its settings: {reason}"
        ) from None
