"""Where the built Trainer, its loggers and its callbacks will write, asked of each one in the
directory the job runs in (after Hydra's chdir), and checked by the place (docs/security.md): a
key's value says little (a relative path, a logger's `name`, a checkpoint's file name, an MLflow
URI each move it), the resolved folder says where the bytes go."""

import os
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger
from omegaconf import DictConfig

from gptlab.errors import ConfigError
from gptlab.run.directory import where
from gptlab.run.place import PLACE, SHARED, STORE, Want

# loggers whose client opens (makes) its store as it is built: checked from their node, built after
OPENS_STORE = (MLFlowLogger,)


def own_version(run_dir: Path) -> str:
    """A run's own folder in a log folder shared by several runs (a TensorBoard run): named by
    its run directory's last two parts, the same at each of its starts."""
    return "_".join(Path(run_dir).parts[-2:])


def mlflow_folder(address: str) -> str | None:
    """The file or folder an MLflow address names on this disk, relative to the job's directory
    as MLflow reads it (sqlite:///mlflow.db, sqlite:////abs/mlflow.db, file:mlruns, a plain
    path); None for a server (http:, databricks, ...) or an in-memory store."""
    scheme = urlparse(address).scheme
    if scheme == "" and address != "databricks":  # MLflow's one name of a server
        return address
    if scheme == "file":
        path = address[len("file:") :]
        return "/" + path.lstrip("/") if path.startswith("//") else path
    if scheme.startswith("sqlite") and ":///" in address:  # sqlite+pysqlite:/// too
        path = address.split(":///", 1)[1].split("?", 1)[0]
        return path if path not in ("", ":memory:") else None
    return None


def check_checkpoints(key: str, callback: ModelCheckpoint, run_dir: Path) -> None:
    """Every checkpoint the callback names lies in its folder, and that folder in the run: a
    file name with `..` or an absolute one would write over any run's checkpoint."""
    folder = where(callback.dirpath)
    names = [callback.format_checkpoint_name({})]
    if callback.save_last:
        names.append(callback.format_checkpoint_name({}, filename=callback.CHECKPOINT_NAME_LAST))
    for name in names:
        if not folder.is_relative_to(run_dir) or not where(name).parent.is_relative_to(folder):
            raise ConfigError(
                f"{key}.filename={callback.filename}: this callback would write '{where(name)}', "
                f"outside the run's checkpoints folder '{folder}' (where resume, eval and "
                "generate look). Give a plain file name, without folders above it (no `..`, not "
                "an absolute path)."
            )


def mlflow_places(key: str, node: DictConfig) -> list[Want]:
    """MLflow's store and artifacts, shared by runs (each writes its own entries): outside every
    run or sweep directory but the user's own. Asked of the node: MLflow's client opens (makes)
    its store as the logger is built (OPENS_STORE)."""
    default = f"file:{node.get('save_dir') or './mlruns'}"  # Lightning's
    uri = node.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or default
    addresses = {"tracking_uri": uri, "artifact_location": node.get("artifact_location")}
    wants = []
    for part, address in addresses.items():
        folder = mlflow_folder(str(address)) if address else None
        if folder is not None:
            wants.append(Want(folder, f"{key}.{part}={address}", SHARED))
    return wants


def logger_place(key: str, logger) -> Want:
    """Where a built logger writes: a log folder of the run's own (TensorBoard's, CSV's:
    save_dir/name/version) lies in the run, or is admitted as its own store; a store shared by
    runs (W&B's folder) lies outside every run or sweep directory but the user's own: each run
    writes its own entries there."""
    if isinstance(logger, (TensorBoardLogger, CSVLogger)):
        way = f"another {key}.version, or a save_dir of the run's (its default)."
        return Want(logger.log_dir, f"{key}'s log folder (save_dir/name/version)", STORE, way)
    return Want(logger.save_dir or ".", f"{key}.save_dir", SHARED)  # W&B: <it>/wandb/run-*/


def check_writers(built: dict, unbuilt: list[tuple], cfg: DictConfig, run_dir: Path) -> None:
    """Each place the config's loggers and callbacks (`built`: key to part; `unbuilt`: (key,
    node) of those that open their store as they are built) and the Trainer's default_root_dir
    will write, resolved where the job runs, checked before anything is written there: the
    checkpoints' names here, then every folder, handed to the place at once."""
    run_dir = where(run_dir)
    wants = [want for key, node in unbuilt for want in mlflow_places(key, node)]
    for key, part in built.items():
        if isinstance(part, ModelCheckpoint):
            check_checkpoints(key, part, run_dir)
        elif key.startswith("logger."):
            wants.append(logger_place(key, part))
    root = cfg.trainer.get("default_root_dir")
    if root:  # a finder's checkpoints, a profile: the run's
        wants.append(Want(root, "trainer.default_root_dir", STORE))
    else:  # Lightning's default: the job's directory
        wants.append(Want(os.getcwd(), "trainer.default_root_dir", SHARED))
    PLACE.admit_writers(wants)


def check_profiler(trainer: L.Trainer) -> None:
    """A profiler's report folder, where it has one: the run's own."""
    folder = getattr(trainer.profiler, "dirpath", None)
    if folder:
        PLACE.admit_writers([Want(folder, "trainer.profiler.dirpath", STORE)])
