"""Checkpoints as Lightning saves and restores them, with two rules of gptlab's (docs/security.md):
a save is whole, its temporary file beside its target (Lightning's own goes through the temp
folder, a copy where that is another file system, which a kill can leave half done); and a
checkpoint of another run directory (an own run this one goes on from, a branch's trunk) is
restored without its callbacks' state, whose ModelCheckpoint would remove the files it remembers
there."""

import contextlib
import tempfile
from pathlib import Path

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from gptlab import files
from gptlab.run import directory


class RunCheckpointIO(TorchCheckpointIO):
    def __init__(self, run_dir: str | Path):
        self.folder = directory.where(directory.checkpoint_dir(run_dir))

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        """Into the run's checkpoints/ (gptlab.cli.fit sends every saving callback there),
        or Lightning's own hand-over between DDP processes in a fresh temporary folder."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with files.atomic(path, "wb") as f:
            torch.save(checkpoint, f)

    def remove_checkpoint(self, path) -> None:
        """And the folder Lightning made in the temp folder to hand spawned DDP's weights back,
        once empty (Lightning leaves it behind)."""
        super().remove_checkpoint(path)
        folder = directory.where(path).parent
        if folder.parent == directory.where(tempfile.gettempdir()):
            with contextlib.suppress(OSError):
                folder.rmdir()

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        checkpoint = super().load_checkpoint(path, map_location, weights_only)
        if directory.where(path).parent != self.folder:
            checkpoint.pop("callbacks", None)
        return checkpoint
