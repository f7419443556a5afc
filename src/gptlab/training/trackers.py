"""A run's results published to its experiment trackers at the end of fit, and the run's
TensorBoard logger (one TensorBoard run per training run)."""

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2, summary_v2
from torch.utils.tensorboard.summary import scalar
from torch.utils.tensorboard.writer import FileWriter

from gptlab.run import directory
from gptlab.run.overrides import override_key, split_override
from gptlab.run.place import PLACE, in_multirun

HPARAMS_EVENTS = "events.out.tfevents.hparams"  # the event file of a run's HPARAMS
# the results beside the hyperparameters: a group TensorBoard lists after train/ and val/
RESULTS = "val_results"
# TensorBoard's custom scalars: train and val loss on one chart (tags are regular expressions)
LOSS_CHART = {"losses": {"train and val loss": ["Multiline", ["^train/loss$", "^val/loss$"]]}}


STEP_METRICS = ("train/", "vitals/")  # what a training step logs (the module, RunStats)


class RunTensorBoardLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger without `epoch` (always 0: training is one endless epoch);
    a metric once a step (StepLoggedBeforeSave may write it first); the train and val loss on
    one chart; the HPARAMS tab in an event file replaced at each start's end (TensorBoard keeps
    the first hparams it reads)."""

    _written: dict[str, int | None] | None = None  # each metric's last step

    @rank_zero_only
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self._written = self._written or {}
        fresh = {
            k: v
            for k, v in metrics.items()
            if k != "epoch" and (k not in self._written or self._written[k] != step)
        }
        self._written.update(dict.fromkeys(fresh, step))
        super().log_metrics(fresh, step)

    @rank_zero_only
    def log_graph(self, model, input_array=None) -> None:
        """Lightning's one call at the start of fit: the loss chart from the first step too."""
        super().log_graph(model, input_array)
        self.experiment.add_custom_scalars(LOSS_CHART)

    @rank_zero_only
    def log_results(self, params: dict, metrics: dict, shown: list[str], step: int) -> None:
        """The HPARAMS tab: `shown` first (TensorBoard shows five columns, those that "differ"
        first, by name), each job a trial named by its TensorBoard run (its swept settings)."""
        infos = [hparam_info(name, value, name in shown) for name, value in params.items()]
        metric_infos = [
            api_pb2.MetricInfo(name=api_pb2.MetricName(tag=k), display_name=k.split("/")[-1])
            for k in metrics
        ]
        experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metric_infos)
        ended = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS)
        # a single run: its run directory's last parts (2026-12-01/20-15-33), not a name of
        # overrides that another run can share (nor its save_dir, which runs can share)
        run_dir = PLACE.run_dir or Path(self.save_dir)
        trial = str(self.version) if in_multirun() else "/".join(run_dir.parts[-2:])
        folder = Path(self.log_dir)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".hparams.") as fresh:
            writer = FileWriter(fresh)
            writer.add_summary(hparams_summary(metadata.EXPERIMENT_TAG, experiment=experiment))
            writer.add_summary(summary_v2.hparams_pb(params, trial_id=trial), step)
            writer.add_summary(
                hparams_summary(metadata.SESSION_END_INFO_TAG, session_end_info=ended)
            )
            for name, value in metrics.items():
                writer.add_summary(scalar(name, value), step)
            writer.close()
            [written] = Path(fresh).iterdir()
            os.replace(written, PLACE.inside(folder / HPARAMS_EVENTS))  # an earlier start's goes


class StepLoggedBeforeSave(L.Callback):
    """Lightning logs a step's metrics after its callbacks save the step's checkpoint: a kill in
    between would lose them for good (a resume starts at the next step). They reach TensorBoard's
    file before each save; its logger skips Lightning's own write of them that follows."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        every = trainer.log_every_n_steps
        if not trainer.training or not every or trainer.global_step % every:
            return  # not a step Lightning logs (its rule: the step count, after the step)
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith(STEP_METRICS)}
        for logger in trainer.loggers:
            if isinstance(logger, RunTensorBoardLogger) and metrics:
                logger.log_metrics(metrics, step=trainer.global_step - 1)  # Lightning's step
                logger.save()  # flushed: on disk before the checkpoint is


def hparams_summary(tag: str, **data) -> Summary:
    """An event of TensorBoard's hparams plugin, as its summary_v2 writes one (no TensorFlow)."""
    content = metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(**data))
    return Summary(value=[Summary.Value(tag=tag, metadata=content, tensor=metadata.NULL_TENSOR)])


def hparam_info(name: str, value, shown: bool) -> api_pb2.HParamInfo:
    """A column of the HPARAMS table, typed (no domain: TensorBoard filters by none)."""
    kind = api_pb2.DATA_TYPE_STRING
    if isinstance(value, bool):
        kind = api_pb2.DATA_TYPE_BOOL
    elif isinstance(value, (int, float)):
        kind = api_pb2.DATA_TYPE_FLOAT64
    return api_pb2.HParamInfo(name=name, type=kind, differs=shown)


def swept_params(cfg: DictConfig, swept: list[str]) -> dict:
    """The sweep's keys as columns: model.num_heads=4 -> model/num_heads; a group's option
    (model=modern) by its name."""
    params = {}
    for override in swept:
        key = override_key(override)
        value = OmegaConf.select(cfg, key, default=None)
        if value is None or OmegaConf.is_config(value):
            value = split_override(override)[1]
        params[key.replace(".", "/")] = value
    return params


def hparams_of(cfg: DictConfig, metrics: dict, model: dict, swept: list[str] = ()) -> dict:
    """The knobs worth comparing runs by, flat and of plain types (`model`: as built), the
    sweep's first, then the model's size."""
    params = {
        **swept_params(cfg, list(swept)),
        "num_params": metrics["num_params"],
        **{f"model/{k}": v for k, v in model.items()},
        **{f"optim/{k}": v for k, v in OmegaConf.to_container(cfg.optim, resolve=True).items()},
        **{
            f"data/{k}": cfg.data[k]
            for k in ("encoding", "compact_vocab", "batch_size", "context_length")
        },
        "trainer/max_steps": cfg.trainer.max_steps,
        "seed": cfg.seed,
    }
    return {
        k: (str(v) if isinstance(v, (list, tuple, dict, type(None))) else v)
        for k, v in params.items()
        if not k.endswith("_target_")
    }


def run_files(output_dir: Path) -> list[Path]:
    """What a tracker keeps of the run directory: `.hydra/` and metrics.json."""
    saved = (output_dir / directory.HYDRA).rglob("*")
    hydra_files = sorted(p for p in saved if p.is_file() and not p.is_symlink())
    return [*hydra_files, directory.metrics_file(output_dir)]


@dataclass
class Results:
    """What a run publishes at its end: the hyperparameters, and its results in the forms the
    trackers take them."""

    params: dict  # hparams_of's columns
    metrics: dict  # metrics.json as written
    numbers: dict  # its finite numbers, as floats
    results: dict  # the val results beside the hyperparameters (val_results/...)
    shown: list[str]  # TensorBoard's first HPARAMS columns: the swept keys, the model's size
    step: int
    output_dir: Path


def publish(logger: Logger, results: Results) -> None:
    """Any logger, through Lightning's interface: the hyperparameters with the val results."""
    logger.log_hyperparams(results.params)
    logger.log_metrics(results.results, step=results.step)


def publish_mlflow(logger: MLFlowLogger, results: Results) -> None:
    """Every number of metrics.json; the status as a tag and the run's files as artifacts
    through MLflow's client (Lightning's interface has neither)."""
    client, run = logger.experiment, logger.run_id
    held = client.get_run(run).data.params  # MLflow refuses to change a logged parameter
    logger.log_hyperparams({k: v for k, v in results.params.items() if k not in held})
    logger.log_metrics(results.numbers, step=results.step)
    client.set_tag(run, "gptlab.status", results.metrics["status"])
    for path in run_files(results.output_dir):
        folder = path.parent.relative_to(results.output_dir).as_posix()
        folder = folder.replace(directory.HYDRA, "hydra", 1)
        artifact_path = None if folder == "." else folder
        client.log_artifact(run, str(path), artifact_path)


def publish_wandb(logger: WandbLogger, results: Results) -> None:
    """metrics.json in the run's summary (a value each, not a step of its history) and the run's
    files, through the W&B run (Lightning's interface has neither); the run then finishes."""
    logger.log_hyperparams(results.params)  # W&B's config: a resumed run's values may change
    run = logger.experiment
    summary = {
        k: v for k, v in results.metrics.items() if isinstance(v, str) or k in results.numbers
    }
    run.summary.update(summary)
    for path in run_files(results.output_dir):
        run.save(str(path), base_path=str(results.output_dir), policy="now")
    run.finish()  # the next job of a sweep in this process starts a W&B run of its own


def publish_tensorboard(logger: RunTensorBoardLogger, results: Results) -> None:
    """The HPARAMS tab, into the run itself."""
    logger.log_results(results.params, results.results, results.shown, results.step)


# the loggers whose tracker keeps more than Lightning's interface gives (by class, or a base)
PUBLISHERS = {
    MLFlowLogger: publish_mlflow,
    WandbLogger: publish_wandb,
    RunTensorBoardLogger: publish_tensorboard,
}


def publisher(logger: Logger):
    """The logger's own way to publish (its class's, or the nearest base's), else `publish`."""
    for kind in type(logger).__mro__:
        if kind in PUBLISHERS:
            return PUBLISHERS[kind]
    return publish


def log_results(
    trainer: L.Trainer, cfg: DictConfig, metrics: dict, output_dir: Path, swept: list[str]
) -> None:
    """Hyperparameters beside the results: each tracker compares runs (MLflow, W&B keep files);
    `swept`: the overrides the job's sweep varies."""
    params = hparams_of(cfg, metrics, trainer.lightning_module.hparams["model"], swept)
    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    val_results = {
        f"{RESULTS}/{k.replace('_val', '')}": metrics[k]
        for k in ("best_val_loss", "best_val_bpb", "final_val_loss")
    }
    shown = [*swept_params(cfg, swept), "num_params"]
    results = Results(params, metrics, numbers, val_results, shown, trainer.global_step, output_dir)
    for logger in trainer.loggers:
        publisher(logger)(logger, results)
