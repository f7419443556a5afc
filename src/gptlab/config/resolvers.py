"""The resolvers configs use: values only, no effects. Light to import: every tool registers
them first."""

import functools
import hashlib
import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from gptlab.config import depth
from gptlab.process import rank
from gptlab.run import directory
from gptlab.run.place import in_multirun
from gptlab.run.start import continues


def unique_dir(path: str) -> str:
    """`path`, or `path_1`, ...: the first free name (place creates it; other ranks share it)."""
    if rank() > 0:
        return path
    candidate, n = path, 0
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{path}_{n}"
    return candidate


def start_subdir() -> str | None:
    """hydra.output_subdir (`start_subdir_of`); `.hydra` outside a Hydra job."""
    dirs = _dirs()
    return directory.HYDRA if dirs is None else start_subdir_of(str(dirs[0]))


@functools.cache
def start_subdir_of(output_dir: str) -> str | None:
    """`.hydra` for a job's first start, a new folder for a later one (a sweep continued, a
    requeue: none overwrites another's); None on other ranks. A single run's start has its own
    pinned by gptlab.run.place."""
    if rank() > 0:
        return None
    if not os.path.lexists(Path(output_dir) / directory.HYDRA):
        return directory.HYDRA
    return directory.later_start_subdir()


def ddp_start_method() -> str:
    """spawn (re-running the command line would re-run a `-m` sweep), popen where SLURM or
    torchrun already started one process per rank."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    return "popen" if SLURMEnvironment.detect() or TorchElasticEnvironment.detect() else "spawn"


def _dirs() -> tuple[Path, Path | None, Path] | None:
    """(run dir, sweep dir or None, cwd) of this Hydra job; None outside one (--cfg, --help)."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if OmegaConf.is_missing(hc.runtime, "output_dir"):
        return None
    out = Path(hc.runtime.output_dir).resolve()
    return out, out.parent if in_multirun() else None, Path(hc.runtime.cwd).resolve()


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def run_name() -> str | None:
    dirs = _dirs()
    return None if dirs is None else _relative(dirs[0], dirs[2])


def sweep_name(default=None):
    dirs = _dirs()
    return default if dirs is None or dirs[1] is None else _relative(dirs[1], dirs[2])


def run_info(prefix: str = "") -> DictConfig:
    """The run's tags: a DictConfig, which OmegaConf.resolve (`--cfg job`, resolved) can put in
    place of the interpolation, as it cannot a dict."""
    dirs = _dirs()
    if dirs is None:
        return OmegaConf.create({})
    info = {"run_dir": str(dirs[0]), "overrides": " ".join(HydraConfig.get().overrides.task)}
    if dirs[1] is not None:
        info.update(sweep_dir=str(dirs[1]), job=dirs[0].name)
    return OmegaConf.create({f"{prefix}{k}": v for k, v in info.items()})


def run_id() -> str | None:
    dirs = _dirs()
    return None if dirs is None else hashlib.sha1(str(dirs[0]).encode()).hexdigest()[:16]


def mlflow_artifacts(tracking_uri: str) -> str | None:
    """`<folder>/mlartifacts` for a local SQLite store in <folder>; a server chooses for itself."""
    if not str(tracking_uri).startswith("sqlite:///"):
        return None
    return str(Path(str(tracking_uri)[len("sqlite:///") :]).parent / "mlartifacts")


def mlflow_run(tracking_uri: str, experiment_name: str, _root_: DictConfig) -> str | None:
    """The id of this run directory's MLflow run (tag gptlab.run_dir) when the start continues
    it (its plan's: resume=, a SLURM requeue): it goes on instead of a second one starting."""
    dirs = _dirs()
    if dirs is None or not continues(_root_, dirs[0]):
        return None
    from mlflow.tracking import MlflowClient

    from gptlab.run.place import PLACE
    from gptlab.training.writers import mlflow_folder

    store = mlflow_folder(str(tracking_uri))
    if store is not None:  # the client opens (makes) it: checked first, as check_writers does
        PLACE.check_store(store, f"logger.mlflow.tracking_uri={tracking_uri}")
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    tag = f"tags.`gptlab.run_dir` = '{dirs[0]}'"
    runs = client.search_runs([experiment.experiment_id], filter_string=tag, max_results=1)
    return runs[0].info.run_id if runs else None


def register() -> None:
    """Make the resolvers known to OmegaConf (every tool's config uses some); safe to repeat."""
    resolvers = {
        "unique_dir": unique_dir,
        "gptlab.start_subdir": start_subdir,
        "ddp_start_method": ddp_start_method,
        "gptlab.run_name": run_name,
        "gptlab.sweep_name": sweep_name,
        "gptlab.run_info": run_info,
        "gptlab.run_id": run_id,
        "gptlab.mlflow_run": mlflow_run,
        "gptlab.mlflow_artifacts": mlflow_artifacts,
        depth.RESOLVER: depth.derived,
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
