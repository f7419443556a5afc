"""The console's progress: Lightning's bar counting optimizer steps up to max_steps, or, where
stdout is not a terminal (a file, SLURM, CI, tee), a plain line every N steps instead."""

import sys
import time
from datetime import timedelta

from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar counting steps up to max_steps: a resume keeps its total and ETA.
    Into a file a redrawn bar is a flood of fragments: there, a line every `line_every_n_steps`
    steps and at the last one (docs/reading-runs.md)."""

    def __init__(self, refresh_rate: int = 1, line_every_n_steps: int = 100, **kwargs) -> None:
        super().__init__(refresh_rate, **kwargs)
        self.line_every_n_steps = line_every_n_steps
        self.lines = False
        self.started = (0.0, 0)  # (the clock, the step) when this start began training

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.lines = trainer.is_global_zero and not sys.stdout.isatty()
        if self.lines:
            self.disable()  # every bar (sanity check, train, validation) drawn by none

    def on_train_start(self, trainer, *args) -> None:
        super().on_train_start(trainer, *args)
        self.started = (time.monotonic(), trainer.global_step)
        self.count_steps(trainer)  # a resume mid-epoch starts no epoch

    def on_train_epoch_start(self, trainer, *args) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.count_steps(trainer)

    def count_steps(self, trainer) -> None:
        if trainer.max_steps > 0 and self.train_progress_bar is not None:
            bar = self.train_progress_bar
            bar.reset(total=trainer.max_steps)
            bar.initial = trainer.global_step  # the rate and ETA count this start's steps only
            bar.n = trainer.global_step
            bar.set_description(self.train_description)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.lines:
            self.line(trainer, pl_module)
            return
        if trainer.max_steps <= 0:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar = self.train_progress_bar
        step = trainer.global_step
        if bar is None or bar.disable or not self.refresh_rate:
            return
        if step % self.refresh_rate == 0 or step >= trainer.max_steps:
            bar.update(step - bar.n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def line(self, trainer, pl_module) -> None:
        """`step 100/1200 (8%), 0:00:25 elapsed, 0:04:35 left, train/loss 4.81` on stdout (the
        val loss: the validation's own line)."""
        step, total = trainer.global_step, trainer.max_steps
        every = self.line_every_n_steps
        if not every or (step % every and step != total):
            return
        began, first = self.started
        elapsed = time.monotonic() - began
        parts = [f"step {step}/{total} ({step / total:.0%})" if total > 0 else f"step {step}"]
        parts.append(f"{timedelta(seconds=round(elapsed))} elapsed")
        if total > step > first:
            left = elapsed / (step - first) * (total - step)
            parts.append(f"{timedelta(seconds=round(left))} left")
        train = {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k[:3] != "val"}
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in train.items()]
        print(", ".join(parts), flush=True)

    def get_metrics(self, trainer, pl_module) -> dict:
        """Without the logger's version (v_num): a sweep job's is its name, cut to four letters."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
