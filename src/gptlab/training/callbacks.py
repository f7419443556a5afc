"""Lightning callbacks around the training loop: checkpoints that survive a kill, stops at a
step boundary, exact resumes, divergence, samples."""

import logging
import os
import signal
import threading

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from gptlab.errors import ConfigError
from gptlab.run import directory

log = logging.getLogger(__name__)


class LastCheckpoint(ModelCheckpoint):
    """The run's last checkpoint every `every_n_train_steps` steps, after the final validation and
    on a stop; never after an error (a crashed or diverged step must not replace the last good)."""

    def __init__(self, every_n_train_steps: int = 100, dirpath: str | None = None):
        super().__init__(  # every_n_train_steps=0: only at the end and on a stop
            dirpath=dirpath,  # gptlab-train gives the run's checkpoints/
            filename=directory.LAST,
            every_n_train_steps=every_n_train_steps,
            enable_version_counter=False,
        )

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs) -> None:
        """No periodic save at the final step: the final one follows its validation."""
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            return
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    def on_train_end(self, trainer, pl_module) -> None:
        self.save_now(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):  # Lightning stops at a step boundary
            self.save_now(trainer)

    def save_now(self, trainer) -> None:
        path = self.format_checkpoint_name({})
        trainer.save_checkpoint(path, weights_only=False)
        log.info("Saved %s at step %d", path, trainer.global_step)


class BranchCheckpoints(L.Callback):
    """wsd's stable-phase checkpoints at optim.branch_at's steps, whole, kept for cooldown
    branches (branch_from=): named by their step, never removed."""

    def __init__(self, steps: list[int], run_dir: str):
        self.steps = set(steps)
        self.run_dir = run_dir
        self.saved_at = -1  # once a step, also when gradients accumulate over several batches

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs) -> None:
        step = trainer.global_step
        if step in self.steps and step != self.saved_at:
            trainer.save_checkpoint(directory.branch_checkpoint(self.run_dir, step))
            self.saved_at = step


class FinalValidation(L.Callback):
    """Validate after the last step too (Lightning does when a callback sets `should_stop`)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class ValidationStep(L.Callback):
    """Validation's values at their own step (Lightning logs them one step early without `step`)."""

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        pl_module.log("step", float(trainer.global_step), sync_dist=True)


class GracefulStop(L.Callback):
    """A first Ctrl-C becomes a SIGTERM (finish the step, save, stop); a second aborts."""

    signal_name = "SIGTERM"
    _previous = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.signal_name = "Ctrl-C"
        os.kill(os.getpid(), signal.SIGTERM)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.on_exception(trainer, pl_module, None)

    def on_exception(self, trainer, pl_module, exception) -> None:  # no teardown follows
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


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
    """Stop at the first NaN or infinite training loss, before it reaches a checkpoint: every step
    on CPU, every `log_every_n_steps` on GPUs (a check waits for the device), before a save."""

    _loss: torch.Tensor | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._loss = outputs["loss"].detach()
        if pl_module.device.type == "cpu" or trainer.global_step % trainer.log_every_n_steps == 0:
            self._check(trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._check(trainer, pl_module)

    def _check(self, trainer, pl_module) -> None:
        if self._loss is None or bool(torch.isfinite(self._loss)):
            return
        value = float(self._loss)
        self._loss = None
        raise ConfigError(
            f"Training diverged at step {trainer.global_step}: train/loss is {value}. The last "
            f"good checkpoint is kept. Lower optim.lr (now {pl_module.optim.lr}), add warmup "
            "(optim.warmup_steps) or clipping (trainer.gradient_clip_val), then train again."
        )


class TextSample(L.Callback):
    """After each validation, a sample for a fixed prompt goes to TensorBoard's Text tab."""

    def __init__(
        self,
        prompt: str = "The salesperson",
        max_new_tokens: int = 40,
        temperature: float = 0.8,
        top_k: int | None = 50,
    ):
        self.prompt = prompt
        self.skipped = False  # warned once that the prompt cannot be encoded
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        try:
            text = pl_module.sample(self.prompt, self.max_new_tokens, self.temperature, self.top_k)
        except ConfigError as e:  # a prompt the corpus cannot encode never stops a run
            if not self.skipped:
                log.warning("No text sample for prompt %r: %s", self.prompt, e)
            self.skipped = True
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                # two trailing spaces: a Markdown line break, so newlines survive in the Text tab
                logger.experiment.add_text(
                    "samples", text.replace("\n", "  \n"), trainer.global_step
                )
