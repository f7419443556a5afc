"""A sweep's jobs: each runs on its own, a failure is recorded in its metrics.json and the sweep
goes on, and a finished job is kept when the sweep is continued."""

import itertools
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.run import directory, place
from gptlab.run.overrides import NOT_REPLAYED, override_key, short_label, split_override
from gptlab.run.place import PLACE, in_multirun, named_places, sweep_dir
from gptlab.run.start import Plan, plan_of, resumed
from gptlab.sweep.stats import number

# groups whose keys say where a job writes, caches or logs, or how it was launched
WHERE_GROUPS = ("paths", "logger", "hydra")

log = logging.getLogger(__name__)


def job_overrides() -> list[str]:
    """The running job's task overrides: what a continued sweep recognises the job by."""
    if not HydraConfig.initialized():  # not a Hydra job
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def job_identity(overrides: list[str]) -> list[str]:
    """The overrides that decide what a job trains (not how it was launched, nor where it writes,
    caches or logs): a job continued by resume=, or started with another cache or output
    directory, is the same job."""
    kept = []
    for override in map(str, overrides):
        key = override_key(override)
        parts = key.split(".")
        in_where_group = parts[0] in WHERE_GROUPS and len(parts) > 1
        where = in_where_group or parts[-1] in place.WHERE_KEYS
        if key not in NOT_REPLAYED and not where:
            kept.append(override)
    return kept


def swept_overrides() -> list[str]:
    """This job's overrides that the sweep varies: its identity (job_identity) less what every
    job of the sweep was given alike (the sweep's command line, in its multirun.yaml)."""
    saved = reader.read_yaml(sweep_dir() / directory.MULTIRUN) if in_multirun() else None
    for key in ("hydra", "overrides", "task"):  # read as data
        saved = saved.get(key) if isinstance(saved, dict) else None
    alike = {str(o) for o in saved} if isinstance(saved, list) else set()
    return [o for o in job_identity(job_overrides()) if o not in alike]


def tensorboard_version(folder: Path) -> str | None:
    """A run's TensorBoard run in `folder`, named by what it changes: a sweep's job by what the
    sweep varies ("heads=2,blocks=4"), a single run by its overrides; or as its first start
    logged (None: into `folder` itself, a run of no overrides) (docs/reading-runs.md)."""
    if folder.is_dir() and not folder.is_symlink():
        logged = [p for p in folder.iterdir() if not p.is_symlink() and not p.name.startswith(".")]
        if any(p.is_file() for p in logged):
            return None  # into the folder itself, as its first start did
        if logged:
            return min(p.name for p in logged)
    changed = swept_overrides() if in_multirun() else job_identity(job_overrides())
    # a path by its last part (branch_from=.../trunk -> branch_from=trunk): the name stays short
    changed = [f"{k}={v.rstrip('/').rsplit('/', 1)[-1]}" for k, v in map(split_override, changed)]
    name = short_label(changed).replace("/", "_").replace("\\", "_").lstrip(".")[:200]
    return name or ("job" if in_multirun() else None)


def job_threads(cfg: DictConfig) -> None:
    """In a joblib sweep, the job's share of the cores, not all of them; `num_threads` wins."""
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


def finished_result(output_dir: Path, overrides: list[str]) -> float | None:
    """Best val loss of a job finished with these overrides, by its metrics.json (Hydra rewrites
    .hydra/); None when it must run."""
    metrics = reader.read_json(directory.metrics_file(output_dir))
    metrics = metrics if isinstance(metrics, dict) else {}
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
    plain = isinstance(error, (str, ConfigError))  # else a crash: its type and traceback
    reason = str(error) if plain else f"{type(error).__name__}: {error}"
    reason = " ".join(reason.split())[:500]
    log.error("Job failed: %s", reason, exc_info=not plain)
    metrics = reader.read_json(directory.metrics_file(output_dir))
    if not isinstance(metrics, dict):  # none yet, or not a record
        metrics = {}
    metrics.update(status="failed", reason=reason, bad_input=bad_input, overrides=overrides)
    PLACE.write_json(directory.metrics_file(output_dir), metrics)
    return math.inf


def sweep_job(train: Callable[[DictConfig, Plan], float], cfg: DictConfig) -> float:
    """`train(cfg, plan)` as a job of a sweep, its start planned in its own folder: a failure is
    recorded and returns +inf (the sweep goes on)."""
    output_dir = Path(cfg.paths.output_dir)
    overrides = job_overrides()
    try:
        PLACE.admit_job(output_dir)  # inside its sweep, where it resolves: where it may write
        PLACE.check_places(named_places(cfg))
    except ConfigError as e:
        log.error("Job not run: %s", e)
        return math.inf
    if resumed(cfg):  # a continued sweep keeps the jobs that finished
        best = finished_result(output_dir, overrides)
        if best is not None:
            return best
    job_threads(cfg)
    try:
        value = float(train(cfg, plan_of(cfg, output_dir)))
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


def job_ranges(jobs: list[str]) -> str:
    """Job numbers as ranges: "jobs 0-3, 7" ("job 5" for one)."""
    numbers = sorted(int(job) for job in jobs if job.isdigit())
    parts = []
    for _, group in itertools.groupby(enumerate(numbers), key=lambda pair: pair[1] - pair[0]):
        run = [n for _, n in group]  # consecutive numbers
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    parts += sorted(job for job in jobs if not job.isdigit())  # a job dir someone renamed
    return ("job " if len(jobs) == 1 else "jobs ") + ", ".join(parts)


def failure_message(failed: list[dict], rows: list[dict], sweep_dir: Path) -> str:
    """One paragraph: each distinct reason once, with the jobs that failed for it."""
    by_reason = {}
    for row in failed:
        reason = str(row.get("reason") or "no reason recorded")  # metrics.json is data
        by_reason.setdefault(reason.rstrip("."), []).append(row)
    causes = []
    for reason, jobs in by_reason.items():
        where = job_ranges([r["job"] for r in jobs])
        if len(jobs) == 1:
            where += f" ({jobs[0]['overrides']})"
        causes.append(f"{where}: {reason}")
    rest = "No job finished" if len(failed) == len(rows) else "The other jobs finished"
    return (
        f"Sweep failed: {len(failed)} of {len(rows)} jobs failed: {'; '.join(causes)}. "
        f"{rest}; see {sweep_dir / 'summary.md'}."
    )
