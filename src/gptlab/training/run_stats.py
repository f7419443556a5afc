"""RunStats: a run's throughput and time, its val curve, and nanoGPT's line per validation."""

import datetime
import logging
import math
import time

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops

log = logging.getLogger(__name__)


class RunStats(L.Callback):
    """Seconds of training and in all over the run's whole life (resumes included; a branch's
    own), tokens/s of the steps trained in them, MFU (where the device's peak is known), the val
    curve: [step, wall seconds, val loss]."""

    def __init__(self, tokens_per_step: int, flops_per_token: int):
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.train_seconds = 0.0
        self.wall_seconds = 0.0
        self.val_curve: list[list[float]] = []
        self.peak_flops: float | None = None
        self.timed_from: int | None = None  # the step train_seconds counts from (a branch's own)
        self._fit_start = 0.0
        self._wall_before = 0.0  # of the runs this one continues
        self._clock: float | None = None  # when the stretch of training being timed began
        self._rate_since = (0, 0.0)  # (step, train seconds) of the last logged rate
        # val/loss, val/bpb (a mixture's: also val/<source or average>/loss and /bpb) and step
        self.last_validation: dict = {}
        # since the previous validation: summed train loss (on its device), batches, (step, secs)
        self._loss_sum: torch.Tensor | None = None
        self._batches = 0
        self._line_since = (0, 0.0)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()
        dtype = torch.bfloat16 if "bf16" in str(trainer.precision) else torch.float32
        self.peak_flops = get_available_flops(trainer.strategy.root_device, dtype)

    def on_train_start(self, trainer, pl_module) -> None:
        """After Lightning restored the step (on_fit_start comes before it)."""
        self._rate_since = self._line_since = (trainer.global_step, self.train_seconds)
        if self.timed_from is None:  # none restored: a new run, or a branch (trunk's state dropped)
            self.timed_from = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._clock is None:
            self._clock = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"].detach()  # summed where it is: no wait for the device
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._batches += 1
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self.pause()
            rate = self.rate(trainer.global_step, self._rate_since)
            self._rate_since = (trainer.global_step, self.train_seconds)
            pl_module.log("vitals/tokens_per_sec", rate)
            if self.peak_flops:
                pl_module.log("vitals/mfu", self.mfu(rate, trainer.world_size))

    def rate(self, step: int, since: tuple[int, float]) -> float:
        """Tokens per second of training from `since` (a step and the train seconds then)."""
        seconds = self.train_seconds - since[1]
        return (step - since[0]) * self.tokens_per_step / seconds if seconds > 0 else 0.0

    def on_validation_start(self, trainer, pl_module) -> None:
        self.pause()

    def on_validation_end(self, trainer, pl_module) -> None:
        """Kept in checkpoints: the val curve, the last values a resume after the end reports."""
        metrics = trainer.callback_metrics
        if trainer.sanity_checking or "val/loss" not in metrics:
            return
        step = trainer.global_step
        latest = {k: float(v) for k, v in metrics.items() if is_validation_value(k)}
        self.last_validation = {**latest, "step": step}
        wall = self._wall_before + time.perf_counter() - self._fit_start
        # a resume may validate a step again that the checkpoint's curve already holds
        self.val_curve = [point for point in self.val_curve if point[0] < step]
        self.val_curve.append([step, round(wall, 3), self.last_validation["val/loss"]])
        line = self.validation_line(trainer, wall)
        if trainer.is_global_zero:
            log.info("%s", line)

    def validation_line(self, trainer, wall: float) -> str:
        """nanoGPT's line per validation: train loss and tokens/s since the last, val loss, bpb."""
        batches = self._batches
        train = f"{float(self._loss_sum) / batches:.4f}" if batches else "-"
        rate = self.rate(trainer.global_step, self._line_since)
        self._loss_sum = None
        self._batches = 0
        self._line_since = (trainer.global_step, self.train_seconds)
        total = f"/{trainer.max_steps}" if trainer.max_steps > 0 else ""
        bpb = self.last_validation.get("val/bpb", math.nan)
        return (
            f"step {trainer.global_step}{total}: train loss {train}, "
            f"val loss {self.last_validation['val/loss']:.4f}{self.sources_part()}, "
            f"val bpb {bpb:.4f}, "
            f"{rate:,.0f} tokens/s, {datetime.timedelta(seconds=round(wall))} elapsed"
        )

    def sources_part(self) -> str:
        """A mixture's val loss of each source and of both averages: " [book 5.0123, ...]"."""
        losses = [
            f"{name.split('/')[1]} {value:.4f}"
            for name, value in self.last_validation.items()
            if name.count("/") == 2 and name.endswith("/loss")
        ]
        return f" [{', '.join(losses)}]" if losses else ""

    def pause(self) -> None:
        """End the stretch of training being timed (at a logged rate, a validation, the end)."""
        if self._clock is not None:
            self.train_seconds += time.perf_counter() - self._clock
            self._clock = None

    def mfu(self, tokens_per_sec: float, world_size: int) -> float | None:
        if not self.peak_flops:
            return None
        return tokens_per_sec * self.flops_per_token / (self.peak_flops * world_size)

    def on_train_end(self, trainer, pl_module) -> None:
        self.pause()
        self.wall_seconds = self._wall_before + time.perf_counter() - self._fit_start

    def state_dict(self) -> dict:
        """Carried in checkpoints, so a resumed run reports totals over its whole life."""
        self.pause()  # seconds up to the saved step: a stop saves between logged steps
        wall = self._wall_before + time.perf_counter() - self._fit_start
        return {
            "train_seconds": self.train_seconds,
            "timed_from": self.timed_from,
            "wall_seconds": wall,
            "last_validation": self.last_validation,
            "val_curve": self.val_curve,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.train_seconds = state_dict["train_seconds"]
        self.timed_from = state_dict.get("timed_from", 0)
        self._wall_before = state_dict["wall_seconds"]
        self.last_validation = state_dict.get("last_validation", {})
        self.val_curve = state_dict.get("val_curve", [])  # a checkpoint of an older gptlab


def is_validation_value(name: str) -> bool:
    """val/loss, val/bpb, and a mixture's val/<source or average>/loss and /bpb."""
    return name in ("val/loss", "val/bpb") or (name.startswith("val/") and name.count("/") == 2)
