"""What a starting run takes from the checkpoint it continues.

- Its own last checkpoint, continued in place (resume=, a requeue, a sweep's resume, once the
  directory is found own): everything Lightning saved, but the paths Lightning's ModelCheckpoint
  remembers. Lightning later deletes "old" best checkpoints by those paths, through fsspec,
  recursively and for any protocol, so a crafted checkpoint would delete or fetch whatever it
  names: each must be a plain file in the run's own checkpoints/, or it is forgotten, with a
  warning.
- Any other checkpoint (ckpt_path=, a file or a directory of anyone's): its tensors only, the
  weights and the optimizer's state, and its step counter as a whole number. Lightning's loop
  progress at that step is built from a fresh Trainer's own (fit_loop_at, never read from the
  file); the callbacks', the learning-rate scheduler's (the schedule follows the step) and the
  precision plugin's saved states are left out.
- A checkpoint of the run's own read for its weights (best.ckpt, for the test split): its weights.
"""

import copy
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.checkpoints import step_of, weights

log = logging.getLogger(__name__)
REMEMBERED_PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")
PLAIN = (str, int, float, bool, type(None))


def in_checkpoint_dir(path: Any, run_dir: str | Path) -> bool:
    """A plain local file directly inside the run's own checkpoints/ (no link, no protocol)."""
    if not isinstance(path, str) or "://" in path or not os.path.isabs(path):
        return False
    candidate = Path(os.path.normpath(path))
    folder = Path(os.path.realpath(directory.checkpoint_dir(run_dir)))
    return (
        candidate.parent == folder
        and candidate.suffix == directory.CKPT
        and candidate.is_file()
        and not candidate.is_symlink()
    )


def own_state(checkpoint: dict, run_dir: str | Path) -> dict:
    """The run's own checkpoint, whole, with ModelCheckpoint's remembered paths checked."""
    for name, state in (checkpoint.get("callbacks") or {}).items():
        if not isinstance(state, dict) or "best_k_models" not in state:
            continue  # not a ModelCheckpoint's state
        forgotten = [state[k] for k in REMEMBERED_PATHS if state.get(k)]
        forgotten = [p for p in forgotten if not in_checkpoint_dir(p, run_dir)]
        for key in REMEMBERED_PATHS:
            if state.get(key) in forgotten:
                state[key] = ""
        best = state.get("best_k_models")
        best = best if isinstance(best, dict) else {}
        forgotten += [p for p in best if not in_checkpoint_dir(p, run_dir)]
        state["best_k_models"] = {p: v for p, v in best.items() if in_checkpoint_dir(p, run_dir)}
        if forgotten:
            log.warning(
                "The checkpoint's %s remembered paths outside this run's checkpoints/ (%s); "
                "they are forgotten, never deleted or read.",
                name.split("{")[0],
                ", ".join(repr(str(p))[:80] for p in forgotten[:3]),
            )
    return checkpoint


def plain_state(value: Any, where: str) -> Any:
    """`value` when it holds only tensors and plain values (an optimizer's state), else an
    error naming where."""
    import torch

    if isinstance(value, dict):
        return {k: plain_state(v, f"{where}.{k}") for k, v in value.items() if type(k) in PLAIN}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_state(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, (torch.Tensor, *PLAIN)):
        return value
    raise ConfigError(f"ckpt_path: the checkpoint's {where} holds a {type(value).__name__}.")


def set_progress(progress: dict, count: int) -> None:
    """Every counter of a Lightning progress record (total and current) set to `count`."""
    for part in ("total", "current"):
        for key in progress.get(part, {}):
            progress[part][key] = count


def fit_loop_at(template: dict, step: int) -> dict:
    """Lightning's fit-loop progress of a run `step` batches into its one epoch, one optimizer
    step a batch, built from a fresh Trainer's own state (`template`)."""
    state = copy.deepcopy(template)
    state["epoch_loop.state_dict"]["_batches_that_stepped"] = step
    set_progress(state["epoch_loop.batch_progress"], step)
    set_progress(state["epoch_loop.scheduler_progress"], step)
    optimizer = state["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]
    set_progress(optimizer["step"], step)
    set_progress(optimizer["zero_grad"], step)
    for part in ("total", "current"):  # the epoch has started, not ended
        state["epoch_progress"][part].update(ready=1, started=1, processed=0, completed=0)
    return state


def tensors_only(checkpoint: dict, path: str | Path, optimizer: str) -> dict:
    """What a new run takes from someone's checkpoint: weights, optimizer state, step (the
    module builds the loops' state at that step from a fresh Trainer's, fit_loop_at). The
    optimizer state is dropped (a fresh optimizer, said in a warning) when it is another
    optimizer's than `optimizer` (adamw or muon) or the file holds none."""
    import lightning

    step = step_of(checkpoint)
    states = checkpoint.get("optimizer_states")
    states = plain_state(states, "optimizer_states") if isinstance(states, list) else []
    muon = [isinstance(s, dict) and set(s) == {"muon", "adamw"} for s in states]
    if len(states) != 1 or muon[0] != (optimizer == "muon"):
        log.warning(
            "ckpt_path: '%s' holds no %s optimizer state; training goes on from its weights "
            "with a fresh optimizer.",
            path,
            optimizer,
        )
        states = []
    return {
        "state_dict": weights(checkpoint, path),
        "optimizer_states": states,
        "lr_schedulers": [],
        "callbacks": {},
        "global_step": step,
        "epoch": 0,
        "pytorch-lightning_version": lightning.__version__,
    }


def weights_only(checkpoint: dict, path: str | Path) -> dict:
    """A checkpoint of the run's own read for its weights (the test split's best.ckpt)."""
    import lightning

    return {
        "state_dict": weights(checkpoint, path),
        "global_step": step_of(checkpoint),
        "epoch": 0,
        "pytorch-lightning_version": lightning.__version__,
    }


# Lightning's spawned DDP hands rank 0's weights to the main process in this file, in a fresh
# folder of the system's temporary directory (lightning.pytorch.strategies.launchers).
HAND_OVER = ".temp.ckpt"


def is_weights_hand_over(path: Path) -> bool:
    """The file in which Lightning hands spawned rank 0's weights back."""
    folder = Path(os.path.realpath(path.parent))
    return path.name == HAND_OVER and folder.parent == Path(os.path.realpath(tempfile.gettempdir()))


def handed_over(state: dict, path: str | Path) -> dict:
    """The weights Lightning handed over: tensors by name, nothing else."""
    return weights({"state_dict": state}, path)
