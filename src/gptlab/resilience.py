"""Surviving a run's accidents: kills, Ctrl-C, SIGTERM, a diverging loss.

- Checkpoints are written to a temporary file and renamed, so a SIGKILL at any moment leaves
  the previous checkpoint intact.
- SIGTERM or a first Ctrl-C finishes the current step, saves `last.ckpt` and stops; a second
  Ctrl-C aborts at once.
- The RNG state travels in every checkpoint, so a resumed run draws the same dropout masks.
- A NaN or infinite loss stops the run before any checkpoint of the broken weights is saved.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from gptlab.errors import ConfigError


class DivergenceError(ConfigError):
    """The loss became NaN or infinite: almost always a learning rate too high."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save to `.<name>.tmp` beside the target, then an atomic rename."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        os.replace(tmp, path)


class GracefulStop(L.Callback):
    """Turn SIGTERM and the first Ctrl-C into: finish this step, save last.ckpt, stop.

    Lightning already stops at a step boundary on SIGTERM (raising SIGTERMException); a first
    Ctrl-C is turned into a SIGTERM so it gets the same treatment.
    """

    def __init__(self, dirpath: str | Path):
        self.dirpath = Path(dirpath)
        self.signal_name = "SIGTERM"
        self.saved: Path | None = None
        self._previous_sigint = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts
        self.signal_name = "Ctrl-C"
        os.kill(os.getpid(), signal.SIGTERM)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            self.saved = self.dirpath / "last.ckpt"
            trainer.save_checkpoint(self.saved, weights_only=False)
        self._restore_sigint()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._restore_sigint()

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None


class PeriodicCheckpoint(L.Callback):
    """Save last.ckpt every N training steps, so a kill costs at most N steps."""

    def __init__(self, dirpath: str | Path, every_n_train_steps: int = 100):
        if every_n_train_steps < 1:
            raise ConfigError(
                f"callbacks.periodic_checkpoint.every_n_train_steps={every_n_train_steps}: "
                "it must be a positive number of steps."
            )
        self.dirpath, self.every = Path(dirpath), every_n_train_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0:
            trainer.save_checkpoint(self.dirpath / "last.ckpt", weights_only=False)


class RngState(L.Callback):
    """Carry torch's RNG state (CPU and CUDA) in checkpoints: exact dropout after a resume."""

    def state_dict(self) -> dict:
        state = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        torch.set_rng_state(state_dict["cpu"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


class DivergenceGuard(L.Callback):
    """Stop at the first NaN or infinite training loss, before it reaches a checkpoint.

    On CPU the check runs every step; on GPUs every `log_every_n_steps` steps (a check waits for
    the device) and always before a checkpoint is written.
    """

    def __init__(self):
        self._loss: torch.Tensor | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._loss = outputs["loss"].detach() if isinstance(outputs, dict) else outputs.detach()
        if pl_module.device.type == "cpu" or trainer.global_step % trainer.log_every_n_steps == 0:
            self._check(trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._check(trainer, pl_module)

    def _check(self, trainer, pl_module) -> None:
        if self._loss is None or bool(torch.isfinite(self._loss)):
            return
        value = float(self._loss)
        self._loss = None
        raise DivergenceError(
            f"Training diverged at step {trainer.global_step}: train/loss is {value}. The last good "
            f"checkpoint is kept. Lower optim.lr (now {pl_module.optim.lr}), add warmup "
            "(optim.warmup_steps) or clipping (trainer.gradient_clip_val), then train again."
        )
