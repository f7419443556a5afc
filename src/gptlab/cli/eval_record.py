"""gptlab-eval's record of results: eval.json beside an own run (else in the output directory),
and which run a checkpoint is of; shared by the val loss, the downstream tasks and gptlab-export."""

import logging
from pathlib import Path

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.run.place import PLACE

log = logging.getLogger("gptlab.eval")


def read_results(path: Path) -> dict:
    """The results saved in `path` before ({} if none); anything else there is refused, not lost."""
    if not path.is_file() or path.is_symlink():  # never read through a link
        return {}
    saved = reader.read_json(path)
    if not isinstance(saved, dict):
        raise ConfigError(
            f"'{path}' is not gptlab-eval's JSON record of results, so the new result cannot be "
            "added to it. Move it away (or delete it) and run gptlab-eval again."
        )
    return saved


def own_run_of(checkpoint: Path) -> Path | None:
    """The run directory of a checkpoint in the checkpoints/ of a run of the user's own (its
    settings are read), else None."""
    if checkpoint.parent.name != directory.CHECKPOINTS:
        return None
    run_dir = checkpoint.parent.parent
    found = ownership.owner(directory.where(run_dir))
    if not found.own:
        log.info(
            "'%s' is not a run directory of yours (%s): its settings are not read.",
            run_dir,
            found.why,
        )
        return None
    return run_dir


def write_result(outs: list[Path], label: str, result: dict) -> list[str]:
    """Add the result to eval.json beside an own run, else (or read-only) in the output dir."""
    notes = []
    for out in outs:
        eval_file = out / directory.EVAL
        try:
            saved = read_results(eval_file)
            PLACE.write_json(eval_file, {**saved, label: result})
            return [*notes, f"Written: {eval_file}"]
        except OSError as e:
            notes.append(f"Could not write {eval_file} ({e.strerror}).")
    return notes
