"""A sweep's jobs: each runs on its own, a failure is recorded in its metrics.json and the sweep
goes on, and a finished job is kept when the sweep is continued."""

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from gptlab.cli.app import mark_task_started
from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.resume import override_key

log = logging.getLogger(__name__)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_dir() -> Path | None:
    """The sweep directory of this job (what resume= continues), None outside a sweep."""
    return Path(HydraConfig.get().sweep.dir).resolve() if in_multirun() else None


def job_overrides() -> list[str]:
    """The running job's task overrides: what a continued sweep recognises the job by."""
    return [str(o) for o in HydraConfig.get().overrides.task] if HydraConfig.initialized() else []


def job_identity(overrides: list[str]) -> list[str]:
    """The overrides but those that say how the job was launched: a job continued by resume= is the
    same."""
    return [str(o) for o in overrides if override_key(o) not in ("resume", "ckpt_path")]


def job_threads(cfg: DictConfig) -> None:
    """In a joblib sweep, give the job its share of the cores, not all of them; `num_threads`
    wins."""
    launcher = HydraConfig.get().launcher if HydraConfig.initialized() else {}
    if cfg.get("num_threads") or "joblib" not in str(launcher.get("_target_", "")):
        return
    import torch

    cores = len(os.sched_getaffinity(0))
    n_jobs = int(launcher.get("n_jobs") or -1)
    if n_jobs < 0:  # joblib's convention: -1 all cores, -2 all but one, ...
        n_jobs = max(1, cores + 1 + n_jobs)
    threads = max(1, cores // n_jobs)
    torch.set_num_threads(threads)
    log.info("%d torch thread(s) for this job (cores shared between the launcher's jobs)", threads)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def finished_result(output_dir: Path, overrides: list[str]) -> float | None:
    """Best val loss of a job finished with these overrides, by its metrics.json (Hydra rewrites
    .hydra/)."""
    metrics = read_json(directory.metrics_file(output_dir))
    best = number(metrics.get("best_val_loss"))
    recorded = metrics.get("overrides")
    same = isinstance(recorded, list)
    same = same and sorted(job_identity(recorded)) == sorted(job_identity(overrides))
    if metrics.get("status") == "ok" and best is not None and same:
        log.info(
            "Kept job %s: finished with the same overrides (best val loss %.4f)",
            output_dir.name,
            best,
        )
        return best
    log.info(
        "Job %s runs: its metrics.json is not of a finished job with these overrides",
        output_dir.name,
    )
    return None


def record_failure(
    output_dir: Path, overrides: list[str], error: str | BaseException, bad_input: bool = False
) -> float:
    """Mark the job failed in its metrics.json with a one-line reason, and whether its input was
    bad (a sweep of nothing but bad input exits 2); +inf, the worst to every sweeper."""
    bad_input = bad_input or isinstance(error, ConfigError)
    reason = (
        str(error) if isinstance(error, (str, ConfigError)) else f"{type(error).__name__}: {error}"
    )
    reason = " ".join(reason.split())[:500]
    log.error("Job failed: %s", reason, exc_info=not isinstance(error, (str, ConfigError)))
    metrics_file = directory.metrics_file(output_dir)
    metrics = {**read_json(metrics_file), "status": "failed", "reason": reason}
    metrics["bad_input"] = bad_input
    directory.write_text(
        metrics_file, json.dumps({**metrics, "overrides": overrides}, indent=2) + "\n"
    )
    return math.inf


def sweep_job(train: Callable[[DictConfig], float], cfg: DictConfig) -> float:
    """Run `train(cfg)` as a job of a sweep: a failure is recorded and returns +inf, so the sweep
    goes on."""
    mark_task_started()  # a job runs: its exit codes are its own (gptlab.cli.app)
    output_dir = Path(cfg.paths.output_dir)
    overrides = job_overrides()
    if cfg.get("resume"):  # a continued sweep keeps the jobs that finished
        best = finished_result(output_dir, overrides)
        if best is not None:
            return best
    job_threads(cfg)
    try:
        value = float(train(cfg))
    except SystemExit as e:
        if e.code != 2:  # stopped (143 SIGTERM, 130 Ctrl-C): recorded, then the sweep stops
            record_failure(output_dir, overrides, f"stopped (exit code {e.code})")
            raise
        error = e.__context__ or "exited with code 2"
        return record_failure(output_dir, overrides, error, bad_input=True)
    except Exception as e:
        return record_failure(output_dir, overrides, e)
    if not math.isfinite(value):
        return record_failure(
            output_dir, overrides, f"diverged: no finite validation loss (best {value})"
        )
    return value


def number(value: Any) -> float | None:
    """value as a finite float, else None: missing, text, nan, a bool."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and not isinstance(value, bool) else None
