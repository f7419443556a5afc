"""What a config may build: only the kinds of class gptlab needs, checked on the config
resolved once and built from that same copy; what Hydra builds itself, checked first."""

import functools
from typing import Any

from hydra.errors import InstantiationException
from hydra.experimental.callback import Callback as HydraCallback
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gptlab.errors import ConfigError
from gptlab.run.overrides import escape_interpolation

# What a `_target_` may name: a class from these packages that is one of these kinds.
TRUSTED_PACKAGES = ("gptlab", "lightning", "torch")
TASK_KINDS = (
    "the Trainer, Lightning callbacks, loggers, profilers, strategies, accelerators and plugins, "
    "and gptlab's own classes"
)
# hydra.callbacks: Hydra's callback kind, from gptlab (SweepSummary) or Hydra itself.
HYDRA_CALLBACK_PACKAGES = ("gptlab", "hydra")
# Inside a sweep's launcher or sweeper: only Optuna's samplers (hparams_search=optuna).
PLUGIN_PART_PACKAGES = ("optuna",)


def check_class(target: Any, where: str, packages: tuple, kinds: tuple, what: str) -> None:
    """A class of `kinds` from `packages` (the package checked by name before any import)."""
    refusal = (
        f"{where}._target_={target!r}: gptlab only builds {what} here, from the packages "
        f"{', '.join(packages)}. Use one of those"
    )
    if not isinstance(target, str) or target.split(".")[0] not in packages:
        raise ConfigError(f"{refusal}.")
    try:
        cls = get_object(target)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{refusal} ({e}).") from None
    if not isinstance(cls, type):
        raise ConfigError(f"{refusal}; {target} is a {type(cls).__name__}, not a class.")
    if cls.__module__.split(".")[0] not in packages or not issubclass(cls, kinds):
        raise ConfigError(f"{refusal}; {target} is a {cls.__module__} class of another kind.")


@functools.cache
def buildable() -> tuple[type, ...]:
    """The kinds a task may build: Lightning's and gptlab's own (imported only when a task's
    `_target_` is checked: gptlab-generate and -inspect never load Lightning)."""
    import lightning as L
    from lightning.pytorch.accelerators import Accelerator
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.plugins import CheckpointIO, ClusterEnvironment, Precision
    from lightning.pytorch.profilers import Profiler
    from lightning.pytorch.strategies import Strategy

    from gptlab.data.datamodule import GPTDataModule
    from gptlab.model.config import GPTConfig
    from gptlab.training.optim_config import OptimConfig

    lightning = (L.Trainer, L.Callback, Logger, Profiler, Strategy, Accelerator)
    plugins = (Precision, CheckpointIO, ClusterEnvironment)
    return (*lightning, *plugins, GPTDataModule, GPTConfig, OptimConfig)  # gptlab's own last


def check_target(target: Any, where: str) -> None:
    """The rule for what a task builds: TRUSTED_PACKAGES, buildable() kinds."""
    check_class(target, where, TRUSTED_PACKAGES, buildable(), TASK_KINDS)


def check_targets(
    node: Any, where: str = "", rule=check_target, built: bool = False, factories: bool = False
) -> None:
    """`rule` on every `_target_` of a resolved container; `_partial_` only for `factories`.
    `built`: inside a built node, where instantiate would resolve a `${` a second time."""
    if isinstance(node, dict):
        here = where or "<root>"
        if "_target_" in node:
            rule(node["_target_"], here)
        if node.get("_partial_") and not factories:
            raise ConfigError(
                f"{here}._partial_: _partial_ is not supported here: gptlab builds each "
                f"{node.get('_target_')} itself and needs the object, not a factory. Remove "
                "_partial_ and give the arguments instead."
            )
        for key, value in node.items():
            inner = f"{where}.{key}" if where else str(key)
            check_targets(value, inner, rule, built or "_target_" in node, factories)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            check_targets(value, f"{where}[{i}]", rule, built, factories)
    elif built and isinstance(node, str) and "${" in node:
        raise ConfigError(
            f"{where}={node!r}: after resolving, the value still holds `${{`, which Hydra would "
            "resolve a second time when it builds the object, unchecked. Remove the `${`."
        )


def resolve(node: DictConfig | ListConfig, where: str) -> Any:
    try:
        return OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as e:
        key = f"{where}.{e.full_key}" if getattr(e, "full_key", None) else where
        reason = " ".join(str(e).split("\n")[0].split())
        raise ConfigError(
            f"{key}: cannot be resolved ({reason}). Fix or remove the override that sets it."
        ) from None


def escape(node: Any) -> Any:
    """Every `${` a resolved string holds, escaped: nothing resolves it a second time."""
    if isinstance(node, dict):
        return {key: escape(value) for key, value in node.items()}
    if isinstance(node, list):
        return [escape(value) for value in node]
    if isinstance(node, str):
        return escape_interpolation(node)
    return node


def checked(cfg: DictConfig) -> DictConfig:
    """The task config resolved once, every `_target_` checked: what is built."""
    plain = resolve(cfg, "config")
    check_targets(plain)
    resolved = OmegaConf.create(escape(plain))
    OmegaConf.set_struct(resolved, True)
    return resolved


def check_hydra_callback(plain: Any, where: str) -> None:
    """Hydra builds its callbacks unresolved: literal values and a Hydra callback class only."""
    text = str(plain) if isinstance(plain, dict | list) else repr(plain)
    if "${" in text or not isinstance(plain, dict):
        raise ConfigError(
            f"{where}: Hydra builds its callbacks from their literal settings, and this one is "
            f"{text}. Give it as `{where}._target_=<class>` with plain values (no interpolation)."
        )
    what = "Hydra callbacks"
    check_class(plain.get("_target_"), where, HYDRA_CALLBACK_PACKAGES, (HydraCallback,), what)
    check_targets({k: v for k, v in plain.items() if k != "_target_"}, where)


def check_plugin_part(target: Any, where: str) -> None:
    check_class(target, where, PLUGIN_PART_PACKAGES, (object,), "Optuna's classes (its samplers)")


def check_hydra_node(cfg: DictConfig, multirun: bool) -> None:
    """What Hydra builds before a task: hydra.callbacks; with -m, launcher's and sweeper's parts."""
    callbacks = OmegaConf.to_container(cfg.hydra, resolve=False).get("callbacks") or {}
    if not isinstance(callbacks, dict):
        check_hydra_callback(callbacks, "hydra.callbacks")
    for name, plain in callbacks.items():
        check_hydra_callback(plain, f"hydra.callbacks.{name}")
    for part in ("launcher", "sweeper") if multirun else ():
        plain = resolve(cfg.hydra[part], f"hydra.{part}") if part in cfg.hydra else {}
        nested = {k: v for k, v in plain.items() if k != "_target_"}
        check_targets(nested, f"hydra.{part}", check_plugin_part, factories=True)


def build(node: DictConfig, where: str, **kwargs) -> Any:
    """Instantiate a node of `checked`'s config; any error is bad input (trainer.precision=17):
    a ConfigError from the class as it is, else one naming the group."""
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
