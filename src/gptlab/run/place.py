"""Where a start writes, decided once before Hydra writes a byte, on the output directory as
Hydra resolved it; the rules: docs/security.md. In a job: whether it is a sweep's, and which."""

import os
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from gptlab import files
from gptlab.errors import ConfigError
from gptlab.process import rank
from gptlab.run import directory, ownership

OUTPUT_DIR = "GPTLAB_OUTPUT_DIR"  # the directory this start writes into, as Hydra reads it
FROM_ENV = "${oc.env:" + OUTPUT_DIR + "}"
RANK_ZERO_WAIT = 600  # seconds another rank waits for rank 0's run directory


def claim(run_dir: Path) -> None:
    """Before a run writes anything (rank 0): this start and its hydra.output_subdir recorded."""
    if rank() == 0:
        saved_in = HydraConfig.get().output_subdir if HydraConfig.initialized() else None
        ownership.claim(run_dir, saved_in)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_dir() -> Path | None:
    """The sweep directory of this job (what resume= continues), None outside a sweep."""
    return Path(HydraConfig.get().sweep.dir).resolve() if in_multirun() else None


def refuse_inside_run(place: Path, key: str) -> None:
    """`place` must not lie inside a run or sweep directory (checked where it resolves)."""
    run = directory.enclosing_run(place)
    if run is not None:
        raise ConfigError(
            f"{key}: '{place}' lies inside the run or sweep directory '{run}', which gptlab does "
            "not write into (it may be anyone's). Run gptlab from another directory (cd out of "
            f"'{run}'), or give {key} a place outside it."
        )


def check_data_places(data_dir: str | Path, cache_dir: str | Path) -> None:
    """Data and caches never go into a run or sweep directory (a tool run from inside one)."""
    for folder, key in ((data_dir, "data.data_dir"), (cache_dir, "data.cache_dir")):
        refuse_inside_run(Path(os.path.abspath(folder)), key)


def refuse_used(place: Path, key: str) -> None:
    """A fresh start into a directory that already holds files: refused, with the way on."""
    way = f"Continue it with `gptlab-train resume={place}`, or give a new directory"
    if (place / directory.MULTIRUN).is_file() or (place / ownership.MANIFEST).is_file():
        what = "a sweep or a run"
    elif directory.holds_run(place):
        what = "a run (its checkpoints or metrics.json)"
    else:
        way = "Give a new or empty directory"
        what = "files"
    raise ConfigError(
        f"{key}: '{place}' already holds {what}; a fresh start goes into a new or empty "
        f"directory only, and writes nothing into it. {way}, or drop {key} for a fresh one of "
        "gptlab's."
    )


def fresh(place: Path, key: str, kind: str | None) -> None:
    """`place` made this start's own (created, or an empty one adopted), its manifest signed."""
    if not directory.is_new_or_empty(place):
        refuse_used(place, key)
    refuse_inside_run(place, key)
    if os.path.lexists(place):
        files.adopt(place)
    else:
        files.make_dir(place)
    try:
        if kind is not None:
            ownership.Manifest.new(place, kind).save()
    except BaseException:  # the key refused, say: nothing of this start stays
        files.remove_created(place)
        raise


def continued(place: Path, key: str, sweep: bool) -> None:
    """A requeued start continues its own run or sweep, and only that."""
    try:
        (ownership.check_sweep if sweep else ownership.check_run)(place)
    except ownership.ForeignDirectory as e:
        raise ConfigError(
            f"{key}: '{place}' is not a {'sweep' if sweep else 'run'} directory gptlab made here "
            f"for you ({e}), so this requeued start writes nothing into it. Continue its "
            "training in a new run directory of yours with `gptlab-train ckpt_path=<it>`."
        ) from None


def prepare(place: Path, key: str, kind: str | None) -> str:
    """Decide and make the output directory `place` (at `key`); the override that hands it to
    Hydra. `kind`: a fresh one's manifest (None: a tool's output folder, not a run)."""
    place = Path(os.path.abspath(place))
    if rank() > 0:
        follow(place, key, kind)
    elif kind is not None and directory.requeued() and os.path.lexists(place):
        continued(place, key, sweep=kind == ownership.SWEEP)
    else:
        fresh(place, key, kind)
    os.environ[OUTPUT_DIR] = str(place)
    return f"{key}={FROM_ENV}"


def follow(place: Path, key: str, kind: str | None) -> None:
    """Another rank of an srun or torchrun job: rank 0's directory, once made; nothing made."""
    deadline = time.monotonic() + RANK_ZERO_WAIT
    while kind is not None and not os.path.lexists(place / ownership.MANIFEST):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"{key}: rank 0 of this job made no run directory at '{place}' in "
                f"{RANK_ZERO_WAIT} s; see rank 0's output for why."
            )
        time.sleep(0.1)


def undo(place: str | Path) -> None:
    """After a failed start: what it created, removed when it holds no more than a stub."""
    if directory.is_stub(Path(place)):
        files.remove_created(place)
