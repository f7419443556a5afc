"""Every checkpoint the Trainer saves, loads or removes passes through this Lightning plugin,
so the run directory's rules (docs/security.md) hold by construction."""

import contextlib
import logging
from pathlib import Path

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from gptlab import files
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership, restore
from gptlab.run.checkpoints import load_checkpoint, weights
from gptlab.run.resume import Start

log = logging.getLogger(__name__)
FRESH = Start()  # nothing continued


class RunCheckpointIO(TorchCheckpointIO):
    def __init__(self, run_dir: str | Path, start: Start = FRESH, optimizer: str = "adamw"):
        """`start`: what this start continues; `optimizer`: whose state it can take."""
        self.run_dir = Path(run_dir)
        given = Path(start.ckpt_path) if start.ckpt_path else None
        self.continued = given if start.whole else None  # own last.ckpt, continued whole
        self.started_from = None if start.whole else given  # ckpt_path=: its tensors only
        self.optimizer = optimizer
        self.hand_over: Path | None = None  # spawned DDP's weights file, once read
        self.saved: set[Path] = set()  # the checkpoints this process wrote: all it may remove

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        if path.parent == directory.checkpoint_dir(self.run_dir):
            rel = f"{directory.CHECKPOINTS}/{path.name}"
            ownership.write_recorded(self.run_dir, rel, lambda f: torch.save(checkpoint, f), "wb")
            self.saved.add(path.absolute())
        else:  # Lightning's own (hpc_ckpt on SLURM): whole, not relied upon
            with files.atomic(path, "wb") as f:
                torch.save(checkpoint, f)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        path = Path(path)
        if path == self.continued:
            return restore.own_state(load_checkpoint(path), self.run_dir)
        if path == self.started_from:
            return restore.tensors_only(load_checkpoint(path), path, self.optimizer)
        if restore.in_checkpoint_dir(str(path.absolute()), self.run_dir):
            return restore.weights_only(load_checkpoint(path), path)
        if restore.is_weights_hand_over(path):
            self.hand_over = path
            return weights({"state_dict": load_checkpoint(path)}, path)  # tensors, nothing else
        raise ConfigError(
            f"Lightning was about to load '{path}', a checkpoint gptlab did not choose for this "
            "run (gptlab loads the run's own checkpoints and the one ckpt_path= names). Remove "
            "it, or give it as ckpt_path= to train on from its weights."
        )

    def remove_checkpoint(self, path) -> None:
        absolute = Path(path).absolute()
        if absolute in self.saved and restore.in_checkpoint_dir(str(absolute), self.run_dir):
            absolute.unlink()
            self.saved.discard(absolute)
        elif self.hand_over is not None and Path(path) == self.hand_over:
            self.hand_over.unlink(missing_ok=True)  # read: nothing of it stays in the temp folder
            with contextlib.suppress(OSError):  # Lightning's mkdtemp() folder, empty now
                self.hand_over.parent.rmdir()
            self.hand_over = None
        else:
            log.warning("Not removing '%s': it is not a checkpoint file of this run.", path)
