"""What a starting run takes from the checkpoint it continues: its own last.ckpt whole (but
remembered paths outside its checkpoints/), anyone else's tensors only (docs/security.md)."""

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
    """A plain local file directly inside the run's own checkpoints/."""
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
            shown = ", ".join(repr(str(p))[:80] for p in forgotten[:3])
            log.warning(
                f"The checkpoint's {name.split('{')[0]} remembered paths outside this run's "
                f"checkpoints/ ({shown}); they are forgotten, never deleted or read."
            )
    return checkpoint


def plain_state(value: Any, where: str) -> Any:
    """`value` when it holds only tensors and plain values, else an error naming where."""
    import torch

    if isinstance(value, dict):
        return {k: plain_state(v, f"{where}.{k}") for k, v in value.items() if type(k) in PLAIN}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_state(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, (torch.Tensor, *PLAIN)):
        return value
    raise ConfigError(f"ckpt_path: the checkpoint's {where} holds a {type(value).__name__}.")


def set_progress(progress: dict, count: int) -> None:
    for part in ("total", "current"):
        for key in progress.get(part, {}):
            progress[part][key] = count


def fit_loop_at(template: dict, step: int) -> dict:
    """Lightning's fit-loop progress `step` batches into its one epoch, from a fresh Trainer's."""
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
    """What a new run takes from someone's checkpoint: weights_only's, and the optimizer state
    when it is `optimizer`'s (else a fresh optimizer, said in a warning)."""
    states = checkpoint.get("optimizer_states")
    states = plain_state(states, "optimizer_states") if isinstance(states, list) else []
    muon = [isinstance(s, dict) and set(s) == {"muon", "adamw"} for s in states]
    if len(states) != 1 or muon[0] != (optimizer == "muon"):
        log.warning(
            f"ckpt_path: '{path}' holds no {optimizer} optimizer state; training goes on from its "
            "weights with a fresh optimizer."
        )
        states = []
    only = weights_only(checkpoint, path)
    return {**only, "optimizer_states": states, "lr_schedulers": [], "callbacks": {}}


def weights_only(checkpoint: dict, path: str | Path) -> dict:
    """A checkpoint of the run's own read for its weights (best.ckpt, for the test split)."""
    import lightning

    return {
        "state_dict": weights(checkpoint, path),
        "global_step": step_of(checkpoint),
        "epoch": 0,
        "pytorch-lightning_version": lightning.__version__,
    }


# spawned DDP hands rank 0's weights back in this file, in a fresh folder of the temp directory
HAND_OVER = ".temp.ckpt"


def is_weights_hand_over(path: Path) -> bool:
    """The file in which Lightning hands spawned rank 0's weights back."""
    folder = Path(os.path.realpath(path.parent))
    return path.name == HAND_OVER and folder.parent == Path(os.path.realpath(tempfile.gettempdir()))
