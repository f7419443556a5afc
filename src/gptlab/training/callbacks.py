"""Lightning callbacks (and a checkpoint plugin) around the training loop: checkpoints that
survive a kill, stops at a step boundary, exact resumes, divergence, throughput, samples."""

import datetime
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from gptlab.errors import ConfigError
from gptlab.run import directory

log = logging.getLogger(__name__)


class LastCheckpoint(ModelCheckpoint):
    """The run's last checkpoint every `every_n_train_steps` steps, after the final validation and
    on a stop; never after an error (a crashed or diverged step's weights must not replace the
    last good ones). Where it goes is the run directory's, not a setting: resume looks there."""

    def __init__(self, every_n_train_steps: int = 100):  # 0: only at the end and on a stop
        super().__init__(
            filename=directory.LAST,
            every_n_train_steps=every_n_train_steps,
            enable_version_counter=False,
        )

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs) -> None:
        """No periodic save at the final step: the final one follows its validation, so a
        checkpoint at max_steps always holds the run's final val loss."""
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


def into_run_dir(callbacks: list, run_dir: str | Path) -> None:
    """Every checkpoint goes to the run directory's checkpoints/, where resume, eval and generate
    find it: the run directory decides, not a setting that could send it elsewhere."""
    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint):
            callback.dirpath = str(directory.checkpoint_dir(run_dir))
            if callback.filename is None:
                callback.filename = directory.BEST


class FinalValidation(L.Callback):
    """Validate after the last step too (Lightning does when a callback sets `should_stop`)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class ValidationStep(L.Callback):
    """Validation's values at the step they belong to in every logger, as in metrics.json and the
    text samples: Lightning logs them one step early (before it counts the step that ran before
    them), unless the logged values hold a `step` (Lightning's way to set the x axis)."""

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        pl_module.log("step", float(trainer.global_step), sync_dist=True)


class GracefulStop(L.Callback):
    """A first Ctrl-C becomes a SIGTERM (finish the step, save the last checkpoint, stop); a
    second aborts."""

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

    def on_exception(
        self, trainer, pl_module, exception
    ) -> None:  # Lightning calls no teardown then
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
    on CPU, every `log_every_n_steps` on GPUs (a check waits for the device), and before a save."""

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


class RunStats(L.Callback):
    """Seconds of training (validation left out) and in all, over the run's whole life (resumes
    included); logs tokens/s and model FLOPs utilisation (where Lightning knows the device's peak);
    keeps the val curve, [step, wall seconds, val loss] at each validation: quality per second."""

    def __init__(self):
        self.train_seconds = 0.0
        self.wall_seconds = 0.0
        self.val_curve: list[list[float]] = []
        self.tokens_per_step = 0
        self.peak_flops: float | None = None
        self._fit_start = 0.0
        self._wall_before = 0.0  # of the runs this one continues
        self._clock: float | None = None  # when the stretch of training being timed began
        # since the last logged rate
        self._steps = 0
        self._seconds = 0.0
        # val/loss and val/bpb of the latest validation, its step
        self.last_validation: dict = {}
        # since the previous validation: the summed train loss (on its device), steps, seconds
        self._loss_sum: torch.Tensor | None = None
        self._since = {"steps": 0, "train_seconds": 0.0}

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()
        self._since["train_seconds"] = self.train_seconds  # a resume's: the earlier starts'
        dtype = torch.bfloat16 if "bf16" in str(trainer.precision) else torch.float32
        self.peak_flops = get_available_flops(trainer.strategy.root_device, dtype)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.tokens_per_step = batch[0].numel() * trainer.world_size
        if self._clock is None:
            self._clock = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._steps += 1
        loss = outputs["loss"].detach()  # summed where it is: no wait for the device
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._since["steps"] += 1
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self.pause()
            rate = self._steps * self.tokens_per_step / self._seconds
            pl_module.log("vitals/tokens_per_sec", rate)
            if self.peak_flops:
                pl_module.log("vitals/mfu", self.mfu(rate, pl_module, trainer.world_size))
            self._steps = 0
            self._seconds = 0.0

    def on_validation_start(self, trainer, pl_module) -> None:
        self.pause()

    def on_validation_end(self, trainer, pl_module) -> None:
        """Kept in checkpoints: the val curve, and the final values a run resumed after its last
        step reports."""
        metrics = trainer.callback_metrics
        if trainer.sanity_checking or "val/loss" not in metrics:
            return
        self.last_validation = {
            k: float(metrics[k]) for k in ("val/loss", "val/bpb") if k in metrics
        }
        step = trainer.global_step
        self.last_validation["step"] = step
        wall = self._wall_before + time.perf_counter() - self._fit_start
        # a resume may validate a step again that the checkpoint's curve already holds
        self.val_curve = [point for point in self.val_curve if point[0] < step]
        self.val_curve.append([step, round(wall, 3), self.last_validation["val/loss"]])
        line = self.validation_line(trainer, wall)
        if trainer.is_global_zero:
            log.info("%s", line)

    def validation_line(self, trainer, wall: float) -> str:
        """nanoGPT's line per validation: the step, the mean train loss since the previous
        validation, val loss and bpb, tokens/s of training since then, the run's time so far."""
        steps = self._since["steps"]
        seconds = self.train_seconds - self._since["train_seconds"]
        train = f"{float(self._loss_sum) / steps:.4f}" if steps else "-"
        rate = steps * self.tokens_per_step / seconds if seconds > 0 else 0.0
        self._loss_sum = None
        self._since = {"steps": 0, "train_seconds": self.train_seconds}
        total = f"/{trainer.max_steps}" if trainer.max_steps > 0 else ""
        bpb = self.last_validation.get("val/bpb", math.nan)
        return (
            f"step {trainer.global_step}{total}: train loss {train}, "
            f"val loss {self.last_validation['val/loss']:.4f}, val bpb {bpb:.4f}, "
            f"{rate:,.0f} tokens/s, {datetime.timedelta(seconds=round(wall))} elapsed"
        )

    def pause(self) -> None:
        """End the stretch of training being timed (at a logged rate, a validation, the end)."""
        if self._clock is not None:
            seconds = time.perf_counter() - self._clock
            self.train_seconds += seconds
            self._seconds += seconds
            self._clock = None

    def mfu(self, tokens_per_sec: float, pl_module, world_size: int) -> float | None:
        if not self.peak_flops:
            return None
        flops_per_token = pl_module.flops_per_batch / pl_module.example_input_array.numel()
        return tokens_per_sec * flops_per_token / (self.peak_flops * world_size)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.pause()
        self.wall_seconds = self._wall_before + time.perf_counter() - self._fit_start

    def state_dict(self) -> dict:
        """Carried in checkpoints, so a resumed run reports totals over its whole life."""
        wall = self._wall_before + time.perf_counter() - self._fit_start
        return {
            "train_seconds": self.train_seconds,
            "wall_seconds": wall,
            "tokens_per_step": self.tokens_per_step,
            "last_validation": self.last_validation,
            "val_curve": self.val_curve,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.train_seconds = state_dict["train_seconds"]
        self._wall_before = state_dict["wall_seconds"]
        self.tokens_per_step = state_dict.get("tokens_per_step", 0)
        self.last_validation = state_dict.get("last_validation", {})
        self.val_curve = state_dict.get("val_curve", [])  # a checkpoint of an older gptlab


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
