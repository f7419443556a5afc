"""What gptlab-train builds from its resolved config, each part once: a node (what its class
refuses is bad input, one paragraph), the module (its model bounded first), the Trainer (the
config's callbacks and loggers, gptlab's own callbacks, the checkpoint plugin)."""

from dataclasses import replace
from inspect import signature
from pathlib import Path
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from omegaconf import DictConfig

from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.meta import build_gpt
from gptlab.run import directory
from gptlab.run.checkpoints import check_architecture
from gptlab.run.directory import where
from gptlab.run.logs import own_checkpoint_dir
from gptlab.sweep.jobs import tensorboard_version
from gptlab.training.checkpoint_io import RunCheckpointIO
from gptlab.training.module import GPTModule
from gptlab.training.writers import OPENS_STORE, check_profiler, check_writers, own_version


def build(node: DictConfig, where: str, **kwargs) -> Any:
    """Instantiate a node of `resolved`'s config; any error is bad input (trainer.precision=17):
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


def target_class(node: DictConfig) -> type:
    """The class a node's `_target_` names; `object` where it names none (building it says why
    in one paragraph)."""
    try:
        found = get_object(str(node.get("_target_")))
    except ImportError:
        return object
    return found if isinstance(found, type) else object


def build_module(model, optim, tokenizer: Tokenizer, batch_size: int, start) -> GPTModule:
    """The GPTModule for the data's tokenizer, its GPT built once (build_gpt): bounded on torch's
    meta device (memory, and the weights it starts from: a checkpoint of the same architecture
    and vocabulary, or init_from's folder), then given those weights, or a new run's draws (also
    where Lightning then restores a checkpoint whole)."""
    model = replace(model, vocab_size=tokenizer.vocab_size)  # its settings final
    if start.init and not start.ckpt_path:  # init_from: the folder's architecture, run's training
        model = replace(model, **{k: start.init.model[k] for k in GPTConfig.architecture()})
    hparams = GPTModule.hparams_from(model, optim, tokenizer)
    if start.ckpt_path:
        check_architecture(start.ckpt_path, start.trained, hparams)
    weights = start.init.weights if start.init else {}
    built = build_gpt(model, weights, start.source, batch_size)
    return GPTModule(built, hparams["optim"], hparams["tokenizer"])


def build_writers(cfg: DictConfig, run_dir: Path, start) -> list[tuple]:
    """The config's callbacks and loggers, (key, part), built before any data and checked where
    each will write, in the job's directory (training/writers.py): a refusal comes first. One
    that opens (makes) its store as it is built (MLflow's client) is checked from its node, then
    built."""
    folder = directory.checkpoint_dir(run_dir)
    with_loggers = any("_target_" in node for node in cfg.logger.values())
    configured = [
        *callback_nodes(cfg, folder, with_loggers),
        *logger_nodes(cfg, start.step, run_dir),
    ]
    later = {key for key, node, _ in configured if issubclass(target_class(node), OPENS_STORE)}
    built = {key: build(node, key, **extra) for key, node, extra in configured if key not in later}
    check_writers(built, [(key, node) for key, node, _ in configured if key in later], cfg, run_dir)
    own_checkpoint_dir(folder)
    return [
        (key, built[key] if key in built else build(node, key, **extra))
        for key, node, extra in configured
    ]


def build_trainer(cfg: DictConfig, run_dir: Path, length, writers: list, ours: list) -> L.Trainer:
    """The Trainer on the processes `length` was counted for: the config's callbacks and loggers
    (`writers`, built and checked), then gptlab's own callbacks (`ours`), the checkpoint plugin."""
    callbacks = [part for key, part in writers if key.startswith("callbacks.")]
    loggers = [part for key, part in writers if key.startswith("logger.")]
    trainer = build(
        cfg.trainer,
        "trainer",
        callbacks=[*callbacks, *ours],
        logger=loggers or False,
        plugins=[RunCheckpointIO(run_dir)],
    )
    if trainer.world_size != length.ranks:
        raise ConfigError(
            f"trainer: gptlab counted {length.ranks} process(es) from trainer.devices and "
            f"trainer.num_nodes, Lightning {trainer.world_size}: a run's tokens per step and a "
            "FLOP budget's steps would be wrong. Give trainer.devices as a number."
        )
    check_profiler(trainer)
    return trainer


def callback_nodes(cfg: DictConfig, folder: Path, with_loggers: bool) -> list[tuple]:
    """(key, node, extra) of the callbacks group's, checkpoints into the run's own checkpoints/
    `folder` (resume looks there); no learning rate without a logger. A node without _target_
    was removed (`callbacks=none`)."""
    nodes = []
    for name, node in cfg.callbacks.items():
        kind = get_object(node._target_) if "_target_" in node else None
        if kind is None or (issubclass(kind, LearningRateMonitor) and not with_loggers):
            continue
        where = {}
        if issubclass(kind, ModelCheckpoint):
            where["dirpath"] = str(folder)
        if where and node.get("dirpath") is not None:
            raise ConfigError(
                f"callbacks.{name}.dirpath={node.dirpath}: checkpoints go to the run "
                "directory's checkpoints/, where resume, eval and generate look; drop it."
            )
        if where and node.get("filename") is None and "filename" in signature(kind).parameters:
            where["filename"] = directory.BEST
        nodes.append((f"callbacks.{name}", node, where))
    return nodes


def logger_nodes(cfg: DictConfig, resume_step: int | None, run_dir: Path) -> list[tuple]:
    """(key, node, extra) of the logger group's. A resumed TensorBoard log drops the steps after
    its checkpoint; a run is a TensorBoard run named by what it changes (unless the config names
    one); in a log folder outside the run (shared by runs), a TensorBoard or CSV run is named by
    its run directory (own_version)."""
    nodes = []
    for name, node in cfg.logger.items():
        if "_target_" not in node:  # an experiment may tune a logger that logger=none removed
            continue
        kind = target_class(node)
        extra = {}
        if issubclass(kind, TensorBoardLogger) and resume_step is not None:
            extra["purge_step"] = resume_step
        if issubclass(kind, (TensorBoardLogger, CSVLogger)) and not node.get("version"):
            folder = where(
                Path(str(node.get("save_dir"))) / str(node.get("name", "lightning_logs"))
            )
            version = own_version(run_dir) if not folder.is_relative_to(where(run_dir)) else None
            if version is None and issubclass(kind, TensorBoardLogger):
                version = tensorboard_version(folder)
            if version:
                extra["version"] = version
        nodes.append((f"logger.{name}", node, extra))
    return nodes
