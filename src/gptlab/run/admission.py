"""Hydra's callback that admits a start's directory (gptlab.run.place) before Hydra writes a
byte there, and pins it for Hydra: resolved once, whatever its spelling (a second resolution of
`${now:}` or `${unique_dir:}` could name another)."""

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

from gptlab.errors import ConfigError, Refusal
from gptlab.process import rank
from gptlab.run import directory, ownership
from gptlab.run.directory import where
from gptlab.run.overrides import as_override, escape_interpolation
from gptlab.run.place import PLACE, named_places
from gptlab.run.start import later_start, resumed

RANK_ZERO_WAIT = 600  # seconds another rank waits for rank 0's run directory
SUBDIR = re.compile(r"[\w.-]*\$\{hydra\.job\.(num|id)\}[\w.-]*")  # a sweep's job folders


@contextlib.contextmanager
def as_hydra_sees(config: DictConfig, run_dir: Path | None = None) -> Iterator[None]:
    """Resolve `config` as Hydra's job will: its `hydra:` node set (and the run directory, once
    known); both put back (set_config makes the hydra node read-only)."""
    saved = HydraConfig.instance().cfg
    writable = not OmegaConf.is_readonly(config.hydra)
    if run_dir is not None:
        with read_write(config.hydra.runtime):
            config.hydra.runtime.output_dir = str(run_dir)  # what Hydra sets next
    HydraConfig.instance().set_config(config)
    try:
        yield
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - OmegaConf's errors, said in one paragraph
        raise ConfigError(f"a place cannot be resolved ({' '.join(str(e).split())}).") from None
    finally:
        HydraConfig.instance().cfg = saved
        OmegaConf.set_readonly(config.hydra, None if writable else True)


def resolved_dir(config: DictConfig, key: str) -> Path:
    """The directory `key` names, resolved as Hydra will."""
    with as_hydra_sees(config):
        value = OmegaConf.select(config, key, throw_on_missing=True)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}={value!r}: give a directory.")
    if "${" in value:
        raise ConfigError(
            f"{key}: '{value}' holds `${{`, which Hydra reads as an interpolation wherever it "
            "names the run again (its runtime.output_dir), so nothing can run there. Rename the "
            "directory (a copy of a run: train on from it with ckpt_path=)."
        )
    return where(value)


def follow(place: Path, key: str) -> None:
    """Another rank of an srun or torchrun job: rank 0's run directory, once made."""
    deadline = time.monotonic() + RANK_ZERO_WAIT
    while not os.path.lexists(place / directory.MANIFEST):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"{key}: rank 0 of this job made no run directory at '{place}' in "
                f"{RANK_ZERO_WAIT} s; see rank 0's output for why."
            )
        time.sleep(0.1)


class Outputs(Callback):
    """Hydra's callback that decides a start's directory before Hydra writes a byte there, and
    pins it (a second resolution could name another); `signed`: gptlab-train's runs and sweeps."""

    def __init__(self, signed: bool = False) -> None:
        self.signed = signed

    # Hydra only warns about a callback's exception and goes on: a refusal passes through
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.start_run(config)
        except ConfigError as e:
            raise Refusal(e) from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.start_sweep(config)
        except ConfigError as e:
            raise Refusal(e) from None

    def start_run(self, config: DictConfig) -> None:
        key = "hydra.run.dir"
        place = resolved_dir(config, key)
        continued = later_start(config)  # resume= or a requeue (gptlab.run.start)
        subdir = directory.HYDRA if config.hydra.output_subdir else None  # null: none saved
        if rank() > 0:  # rank 0 makes it, and saves the config
            subdir = None
            if self.signed:
                follow(place, key)
        else:
            if self.signed and continued and os.path.lexists(place):
                PLACE.admit(place, key, own=True)
                subdir = subdir and directory.later_start_subdir()
            else:
                PLACE.admit(place, key, ownership.RUN if self.signed else None)
            if subdir:  # what Hydra makes at this start: its saved config, its log
                PLACE.expect(place / subdir, *(place / subdir / f for f in directory.HYDRA_FILES))
            PLACE.expect(place / f"{config.hydra.job.name}.log")
        PLACE.run_dir = place
        base = place if config.hydra.job.chdir else None  # where the job resolves a path
        with as_hydra_sees(config, place):  # the other keys that name places, where they lie
            PLACE.check_places(named_places(config), base)
        with read_write(config.hydra):
            config.hydra.run.dir = escape_interpolation(str(place))
            config.hydra.output_subdir = subdir

    def start_sweep(self, config: DictConfig) -> None:
        key = "hydra.sweep.dir"
        if not SUBDIR.fullmatch(str(OmegaConf.to_container(config.hydra.sweep)["subdir"])):
            raise ConfigError(
                "hydra.sweep.subdir: a job's folder is named by its number inside the sweep "
                "directory (${hydra.job.num}, with plain text around it); drop the override."
            )
        place = resolved_dir(config, key)
        if resumed(config):
            PLACE.admit(place, key, own=True)
            ownership.check_jobs(place)
        else:
            PLACE.admit(place, key, ownership.SWEEP if self.signed else None)
            PLACE.expect(place / directory.MULTIRUN)
        if not config.hydra.job.chdir:  # else each job checks them where it runs
            with as_hydra_sees(config):  # its jobs' shared stores
                PLACE.check_places(named_places(config, stores_only=True))
        PLACE.commit()  # a sweep's directory stays once made: its jobs write into it
        with read_write(config.hydra):
            config.hydra.sweep.dir = escape_interpolation(str(place))
            config.hydra.overrides.hydra.append(as_override(key, str(place)))
